"""PostgreSQL: the authentication cache and its invalidation (``vpsshop/authcache.py``).

Measured here: the window in which another process still accepts a key revoked elsewhere (two
real ``vpsshop serve`` processes), and that the revoking process refuses it on its very next
request. Shown here: every writer invalidates (``vpsshop admin credit`` from another process, a
plain SQL ``UPDATE``), the cache is really used (a change made with triggers disabled stays
invisible while the listener is up), and it switches itself off when its listener goes.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from served import VPSSHOP, revocation_windows, serve, shop_env

from vpsshop.authcache import APPLICATION_NAME, LIVE_SECONDS
from vpsshop.testing import postgres_test_url, reset_postgres

WINDOW_LIMIT_SECONDS = 0.5


@pytest.fixture
def vpsshop_database_url() -> str:
    url = postgres_test_url()
    reset_postgres(url)
    return url


def _sql(url: str, statement: str, *params: Any, replica: bool = False) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        if replica:  # as a restore would: triggers do not fire, so nothing is notified
            conn.execute("SET session_replication_role = replica")
        conn.execute(statement, params)


def _until(check: Any, timeout: float = 5.0) -> float:
    """Seconds until ``check()`` is true (raises after ``timeout``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "condition not reached"
        time.sleep(0.001)
    return time.monotonic() - started


def _cache_live(client: Any) -> None:
    caches = client.app.state.ctx.db.auth_caches()
    _until(lambda: bool(caches) and caches[0].live_until > time.monotonic())


@pytest.fixture
def app_client(vpsshop_client: Any) -> Iterator[Any]:
    yield vpsshop_client


def test_cache_answers_and_every_writer_invalidates(app_client, vpsshop_account, vpsshop_database_url, tmp_path):
    client, headers = app_client, vpsshop_account.headers
    assert client.get("/v1/account", headers=headers).status_code == 200  # starts the listener
    _cache_live(client)
    cache = client.app.state.ctx.db.auth_caches()[0]
    client.get("/v1/account", headers=headers)
    hits = cache.hits
    assert client.get("/v1/account", headers=headers).json()["balance_usd"] == 0
    assert cache.hits == hits + 1  # answered from memory

    # A change that notifies nobody (triggers off, as during a restore) stays invisible: the cache is real.
    _sql(
        vpsshop_database_url,
        "UPDATE accounts SET totp_enabled = true WHERE id = %s",
        vpsshop_account.user_id,
        replica=True,
    )
    assert client.get("/v1/account", headers=headers).json()["totp_enabled"] is False

    # Another process credits through the ledger: the trigger's NOTIFY drops the entry.
    subprocess.run(
        [VPSSHOP, "admin", "credit", str(vpsshop_account.user_id), "7", "--reason", "test"],
        cwd=tmp_path,
        env=shop_env(vpsshop_database_url),
        check=True,
        capture_output=True,
    )
    _until(lambda: client.get("/v1/account", headers=headers).json()["balance_usd"] == 7)
    assert client.get("/v1/account", headers=headers).json()["totp_enabled"] is True  # re-read whole

    # A plain UPDATE in psql revokes the key: refused within the window.
    _sql(vpsshop_database_url, "UPDATE api_keys SET revoked_at = now() WHERE id = %s", vpsshop_account.key_id)
    window = _until(lambda: client.get("/v1/account", headers=headers).status_code == 401)
    assert window < WINDOW_LIMIT_SECONDS


def test_the_revoking_process_refuses_the_key_on_its_next_request(app_client, vpsshop_account):
    client = app_client
    second = client.post("/v1/keys", headers=vpsshop_account.headers).json()
    other = {"Authorization": f"Bearer {second['api_key']}"}
    assert client.get("/v1/account", headers=other).status_code == 200
    _cache_live(client)
    for _ in range(3):
        assert client.get("/v1/account", headers=other).status_code == 200
    assert client.delete(f"/v1/keys/{second['id']}", headers=vpsshop_account.headers).status_code == 200
    assert client.get("/v1/account", headers=other).status_code == 401  # no window at all here


def test_an_order_is_seen_at_once_by_its_own_process(app_client, vpsshop_account):
    client, headers = app_client, vpsshop_account.headers
    vpsshop_account.credit("10")
    client.get("/v1/account", headers=headers)
    _cache_live(client)
    assert client.get("/v1/account", headers=headers).json()["balance_usd"] == 10
    order = client.post("/v1/servers", headers=headers, json={"plan": "pup", "location": "nl", "os": "debian-12"})
    assert order.status_code == 201
    me = client.get("/v1/account", headers=headers).json()
    assert me["balance_usd"] == 6.01 and me["servers"] == 1


def test_no_listener_no_cache(app_client, vpsshop_account, vpsshop_database_url):
    client, headers = app_client, vpsshop_account.headers
    client.get("/v1/account", headers=headers)
    _cache_live(client)
    cache = client.app.state.ctx.db.auth_caches()[0]
    _sql(
        vpsshop_database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s "
        "AND datname = current_database()",
        APPLICATION_NAME,
    )
    # The listener sees its connection close (or misses its heartbeat): from then on, no cache.
    _until(lambda: cache.live_until < time.monotonic(), timeout=LIVE_SECONDS + 1)
    _sql(
        vpsshop_database_url,
        "UPDATE api_keys SET revoked_at = now() WHERE id = %s",
        vpsshop_account.key_id,
        replica=True,
    )  # notifies nobody: only reading the database can see it
    if cache.live_until < time.monotonic():
        assert client.get("/v1/account", headers=headers).status_code == 401
    else:  # it reconnected in between: reconnecting starts from an empty cache
        assert cache.entries == {} or client.get("/v1/account", headers=headers).status_code == 401


def test_window_between_two_serve_processes(vpsshop_database_url, tmp_path: Path):
    """Revoke through one `vpsshop serve`, poll the other until it refuses: the invalidation window."""
    env = shop_env(vpsshop_database_url)
    with serve(tmp_path, env, "--no-worker", name="a") as a, serve(tmp_path, env, "--no-worker", name="b") as b:
        windows = revocation_windows(a, b, settle=0.05)
    print(
        f"\ninvalidation window between two vpsshop serve processes, 20 revocations: median "
        f"{statistics.median(windows) * 1000:.1f} ms, max {max(windows) * 1000:.1f} ms "
        "(each includes one HTTP round trip to b)"
    )
    assert max(windows) < WINDOW_LIMIT_SECONDS
