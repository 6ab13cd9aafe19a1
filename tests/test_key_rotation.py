"""Encryption key rotation (vpsshop/encryption.py, ``vpsshop admin rotate-keys``) while the shop runs:
every root password stays revealable before, during and after, and afterwards the new key alone
decrypts every stored secret."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken
from served import TEST_ENCRYPTION_KEY, VPSSHOP, serve, shop_env, worker

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
NEW_KEY = Fernet.generate_key().decode()


def _stored(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [
                row[0]
                for row in conn.execute(
                    sa.text(
                        "SELECT root_password_enc FROM servers WHERE root_password_enc IS NOT NULL UNION ALL "
                        "SELECT secret_enc FROM webhook_endpoints"
                    )
                )
            ]
    finally:
        engine.dispose()


def test_rotate_keys_while_the_service_runs(vpsshop_database_url, tmp_path: Path):
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0.5",
    )
    with serve(tmp_path, env, "--no-worker") as api, worker(tmp_path, env):
        created = httpx.post(f"{api.base}/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        assert (
            subprocess.run(
                [VPSSHOP, "admin", "credit", str(created["user_id"]), "40", "--reason", "rotation"],
                cwd=tmp_path,
                env=env,
                timeout=60,
            ).returncode
            == 0
        )
        sids = [httpx.post(f"{api.base}/servers", headers=headers, json=ORDER).json()["server"]["id"] for _ in range(2)]
        hook = httpx.post(f"{api.base}/webhooks", headers=headers, json={"url": "https://example.com/hook"})
        assert hook.status_code == 201, hook.text
        deadline = time.monotonic() + 60
        while any(httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()["status"] != "active" for sid in sids):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        passwords = {
            sid: httpx.get(f"{api.base}/servers/{sid}/credentials", headers=headers).json()["password"] for sid in sids
        }

    # Step 1: the new key first, the old one still listed; restart the processes with both.
    rotated_env = {**env, "VPSSHOP_ENCRYPTION_KEY": NEW_KEY, "VPSSHOP_OLD_ENCRYPTION_KEYS": TEST_ENCRYPTION_KEY}
    with serve(tmp_path, rotated_env, "--no-worker", name="rotating") as api:
        for sid, password in passwords.items():  # old secrets decrypt with the old key
            assert httpx.get(f"{api.base}/servers/{sid}/credentials", headers=headers).json()["password"] == password
        # Step 2: re-encrypt while this shop answers requests.
        rotation = subprocess.Popen(
            [VPSSHOP, "admin", "rotate-keys"],
            cwd=tmp_path,
            env=rotated_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while rotation.poll() is None:
            for sid, password in passwords.items():
                got = httpx.get(f"{api.base}/servers/{sid}/credentials", headers=headers)
                assert got.status_code == 200 and got.json()["password"] == password
        out, err = rotation.communicate()
        assert rotation.returncode == 0, err
        assert "servers: 2 secrets re-encrypted" in out and "webhook_endpoints: 1 secrets re-encrypted" in out
    # Every stored secret now decrypts with the new key alone, and not with the old one.
    for token in _stored(vpsshop_database_url):
        Fernet(NEW_KEY.encode()).decrypt(token.encode())
        try:
            Fernet(TEST_ENCRYPTION_KEY.encode()).decrypt(token.encode())
            raise AssertionError("a secret still decrypts with the old key")
        except InvalidToken:
            pass

    # Step 3: the old key removed; the shop still reveals every password.
    final_env = {**env, "VPSSHOP_ENCRYPTION_KEY": NEW_KEY}
    with serve(tmp_path, final_env, "--no-worker", name="rotated") as api:
        for sid, password in passwords.items():
            assert httpx.get(f"{api.base}/servers/{sid}/credentials", headers=headers).json()["password"] == password
    # A secret that no configured key decrypts stops the rotation with a remedy and changes nothing.
    wrong = {**env, "VPSSHOP_ENCRYPTION_KEY": Fernet.generate_key().decode()}
    failed = subprocess.run(
        [VPSSHOP, "admin", "rotate-keys"], cwd=tmp_path, env=wrong, capture_output=True, text=True, timeout=60
    )
    assert failed.returncode == 1 and "none of the configured keys" in failed.stderr


def test_encrypted_settings_open_with_an_old_key_during_rotation():
    """Settings a plugin keeps encrypted (coins.SOL.seed_encrypted) still open while the old key is listed."""
    from vpsshop.component import ShopSecrets
    from vpsshop.errors import ConfigError

    token = ShopSecrets(TEST_ENCRYPTION_KEY).encrypt("deposit mnemonic")
    assert ShopSecrets(NEW_KEY, (TEST_ENCRYPTION_KEY,)).decrypt(token, setting="coins.SOL.seed_encrypted") == (
        "deposit mnemonic"
    )
    try:
        ShopSecrets(NEW_KEY).decrypt(token, setting="coins.SOL.seed_encrypted")
        raise AssertionError("an old token opened without the old key")
    except ConfigError as exc:
        assert "coins.SOL.seed_encrypted" in str(exc)
