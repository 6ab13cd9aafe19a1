"""``vpsshop backup`` / ``vpsshop restore`` (vpsshop/backup.py): a backup restored into a fresh database
holds every balance, ledger entry and server, and the root passwords reveal with the same keys."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
from served import VPSSHOP, serve, shop_env, worker

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def _fresh_database(source_url: str, tmp_path: Path) -> str:
    """An empty database of the same kind: a new SQLite file, or PostgreSQL database ``<name>_restore``."""
    if source_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'restored' / 'vpsshop.db'}"
    url = sa.make_url(source_url)
    target = url.set(database=f"{url.database}_restore")
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{target.database}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{target.database}"'))
    finally:
        admin.dispose()
    return target.render_as_string(hide_password=False)


def _ledger(url: str) -> list[tuple]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [
                tuple(row)
                for row in conn.execute(
                    sa.text(
                        "SELECT id, account_id, amount_micros, balance_after_micros, reason, memo FROM ledger_entries "
                        "ORDER BY id"
                    )
                )
            ]
    finally:
        engine.dispose()


def _vpsshop(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([VPSSHOP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_restore_into_a_fresh_database_keeps_everything(vpsshop_database_url, tmp_path: Path):
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0.5",
    )
    with serve(tmp_path, env, "--no-worker") as api, worker(tmp_path, env):
        created = httpx.post(f"{api.base}/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        assert (
            _vpsshop(
                env, tmp_path, "admin", "credit", str(created["user_id"]), "40", "--reason", "backup test"
            ).returncode
            == 0
        )
        sid = httpx.post(f"{api.base}/servers", headers=headers, json=ORDER).json()["server"]["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()["status"] != "active":
            assert time.monotonic() < deadline
            time.sleep(0.3)
        account = httpx.get(f"{api.base}/account", headers=headers).json()
        servers = httpx.get(f"{api.base}/servers", headers=headers).json()
        password = httpx.get(f"{api.base}/servers/{sid}/credentials", headers=headers).json()["password"]
        # Backed up while the shop runs.
        made = _vpsshop(env, tmp_path, "backup", "--output", str(tmp_path / "shop.dump"))
        assert made.returncode == 0, made.stderr
        assert "written to" in made.stdout and "holds no keys" in made.stderr
    ledger = _ledger(vpsshop_database_url)
    assert [row[4] for row in ledger] == ["admin_credit", "order"]

    fresh = _fresh_database(vpsshop_database_url, tmp_path)
    restored_env = shop_env(fresh)
    done = _vpsshop(restored_env, tmp_path, "restore", str(tmp_path / "shop.dump"))
    assert done.returncode == 0, done.stderr
    assert _ledger(fresh) == ledger
    # A second restore into the now non-empty database needs --yes.
    again = _vpsshop(restored_env, tmp_path, "restore", str(tmp_path / "shop.dump"))
    assert again.returncode == 1 and "--yes" in again.stderr
    assert _vpsshop(restored_env, tmp_path, "restore", "--yes", str(tmp_path / "shop.dump")).returncode == 0
    assert _ledger(fresh) == ledger

    with serve(tmp_path, restored_env, "--no-worker", name="restored") as restored:
        assert httpx.get(f"{restored.base}/account", headers=headers).json() == account
        assert httpx.get(f"{restored.base}/servers", headers=headers).json() == servers
        revealed = httpx.get(f"{restored.base}/servers/{sid}/credentials", headers=headers)
        assert revealed.status_code == 200 and revealed.json()["password"] == password


def test_restore_refuses_the_wrong_kind_of_backup(tmp_path: Path):
    junk = tmp_path / "junk.dump"
    junk.write_bytes(b"not a backup at all")
    env = shop_env(f"sqlite:///{tmp_path / 'x.db'}")
    done = _vpsshop(env, tmp_path, "restore", str(junk))
    assert done.returncode == 1 and "not a vpsshop backup" in done.stderr
    pg_like = tmp_path / "pg.dump"
    pg_like.write_bytes(b"PGDMP" + b"\0" * 20)
    done = _vpsshop(env, tmp_path, "restore", str(pg_like))
    assert done.returncode == 1 and "postgresql backup" in done.stderr
