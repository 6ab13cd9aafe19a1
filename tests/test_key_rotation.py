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

from vpsshop.component import ShopSecrets
from vpsshop.encryption import ENCRYPTED_COLUMNS
from vpsshop.errors import ConfigError

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
USER_DATA = "#cloud-config\npackages: [htop]\n"
NEW_KEY = Fernet.generate_key().decode()


def _stored(url: str) -> list[str]:
    """Every stored secret: each column of ENCRYPTED_COLUMNS."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [
                token
                for table, _pk, column in ENCRYPTED_COLUMNS
                for (token,) in conn.execute(
                    sa.select(sa.column(column)).select_from(sa.table(table)).where(sa.column(column).is_not(None))
                )
            ]
    finally:
        engine.dispose()


def _audit(url: str) -> list[tuple[str, str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text("SELECT action, detail FROM admin_audit ORDER BY id"))]
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
        sids = [
            httpx.post(f"{api.base}/servers", headers=headers, json={**ORDER, "user_data": USER_DATA}).json()["server"][
                "id"
            ]
            for _ in range(2)
        ]
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
        assert "servers.root_password_enc: 2 secrets re-encrypted" in out
        assert "servers.user_data_enc: 2 secrets re-encrypted" in out
        assert "webhook_endpoints.secret_enc: 1 secrets re-encrypted" in out
    # The rotation left its audit entry, with what it rewrote.
    action, detail = _audit(vpsshop_database_url)[-1]
    assert action == "rotate_keys" and '"servers.user_data_enc": 2' in detail
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


def test_x402_relayer_key_opens_with_an_old_key_during_rotation():
    """``coins.USDCBASE.relayer_key_encrypted`` (a setting, not a column) still opens while the old key is
    listed in old_encryption_keys, as docs/operations.md promises for every encrypted setting: the coin
    opens it with the shop's secrets, old keys included."""
    from vpsshop_x402 import decrypt_relayer_key, encrypt_relayer_key

    private_key = "11" * 32
    token = encrypt_relayer_key(private_key, TEST_ENCRYPTION_KEY)
    expected = decrypt_relayer_key(token, TEST_ENCRYPTION_KEY).address
    assert decrypt_relayer_key(token, ShopSecrets(NEW_KEY, (TEST_ENCRYPTION_KEY,))).address == expected
    try:
        decrypt_relayer_key(token, ShopSecrets(NEW_KEY))
        raise AssertionError("an old token opened without the old key")
    except ConfigError as exc:
        assert "coins.USDCBASE.relayer_key_encrypted" in str(exc) and private_key not in str(exc)
