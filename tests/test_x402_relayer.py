"""USDCBASE's relayer key (from the environment, encrypted at rest and opened with the shop's secrets
that core hands to the coin's construction, never shown)
and the coin's readiness and settings checks, on anvil (fixtures: tests/x402_coin.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from x402_coin import (  # noqa: F401 - chain, coin, relayer and shop are fixtures
    ENCRYPTION_KEY,
    RESOURCE,
    _b64,
    chain,
    coin,
    make_coin,
    relayer,
    settle,
    shop,
)
from x402_peers import USDC_UNIT, Chain, sign_v1_header

from vpsshop import ConfigError, ShopSecrets, X402Rejected
from vpsshop_x402 import USDCBASE, decrypt_relayer_key, encrypt_relayer_key

pytestmark = pytest.mark.slow

# ---- the relayer key and readiness ----------------------------------------------------------


def test_encrypted_relayer_key_settles_and_never_shows(
    chain: Chain, shop: Any, relayer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    secret_hex = bytes(relayer.key).hex()
    token = encrypt_relayer_key(secret_hex, ENCRYPTION_KEY)
    assert secret_hex not in token
    section = {
        "mode": "direct",
        "network": "base",
        "rpc_url": chain.url,
        "pay_to": shop.address,
        "asset": chain.asset,
        "relayer_key_encrypted": token,
    }
    # built by hand without the shop's secrets: not ready, and a payment is refused with nothing sent
    locked = USDCBASE.from_settings(section, sandbox=False, where="coins.USDCBASE")
    assert isinstance(locked, USDCBASE)
    not_ready = asyncio.run(locked.check_ready())
    assert not not_ready.ok and "needs the shop's secrets" in not_ready.detail
    with pytest.raises(X402Rejected) as refused:
        settle(
            locked,
            sign_v1_header(chain.new_account(usdc=1), locked.payment_requirements(1, RESOURCE, "t")),
            locked.payment_requirements(1, RESOURCE, "t"),
        )
    assert refused.value.status == 503 and refused.value.code == "settlement_unavailable"
    # another shop's key: start-up stops, naming the setting (never the key)
    with pytest.raises(ConfigError, match=r"coins\.USDCBASE\.relayer_key_encrypted") as wrong:
        USDCBASE.from_settings(section, sandbox=False, where="coins.USDCBASE", secrets=ShopSecrets("x" * 43 + "="))
    assert token not in str(wrong.value)
    coin = USDCBASE.from_settings(section, sandbox=False, where="coins.USDCBASE", secrets=ShopSecrets(ENCRYPTION_KEY))
    assert isinstance(coin, USDCBASE)
    ready = asyncio.run(coin.check_ready())
    assert ready.ok and relayer.address in ready.detail

    caplog.set_level("DEBUG")
    payer = chain.new_account(usdc=5 * USDC_UNIT)
    requirements = coin.payment_requirements(5 * USDC_UNIT, RESOURCE, "t")
    settlement = settle(coin, sign_v1_header(payer, requirements), requirements)
    assert chain.w3.eth.get_transaction(settlement.transaction)["from"] == relayer.address
    shown = caplog.text + repr(coin.config) + repr(coin.chain.relayer) + str(coin.__dict__)
    assert secret_hex not in shown.lower() and token not in shown
    assert decrypt_relayer_key(token, ENCRYPTION_KEY).address == relayer.address


def test_direct_mode_settings_are_checked(chain: Chain, shop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="rpc_url"):
        USDCBASE.from_settings(
            {"mode": "direct", "pay_to": shop.address, "relayer_key_env": "X"}, sandbox=False, where="coins.USDCBASE"
        )
    with pytest.raises(ConfigError, match="exactly one"):
        USDCBASE.from_settings(
            {"mode": "direct", "pay_to": shop.address, "rpc_url": chain.url}, sandbox=False, where="coins.USDCBASE"
        )
    # without a node nothing could find a settlement whose /settle outcome was unknown
    with pytest.raises(ConfigError, match="needs rpc_url"):
        USDCBASE.from_settings(
            {"mode": "facilitator", "facilitator_url": "http://x", "pay_to": shop.address},
            sandbox=False,
            where="coins.USDCBASE",
        )
    with pytest.raises(ConfigError, match=r"coins\.USDCBASE\.pay_to"):
        USDCBASE.from_settings(
            {"mode": "facilitator", "facilitator_url": "http://x", "pay_to": "0x12"},
            sandbox=False,
            where="coins.USDCBASE",
        )
    monkeypatch.delenv("EMPTY_RELAYER_KEY", raising=False)
    coin = USDCBASE.from_settings(
        {"mode": "direct", "pay_to": shop.address, "rpc_url": chain.url, "relayer_key_env": "EMPTY_RELAYER_KEY"},
        sandbox=False,
        where="coins.USDCBASE",
    )
    ready = asyncio.run(coin.check_ready())
    assert not ready.ok and "EMPTY_RELAYER_KEY" in ready.detail


def test_relayer_without_gas_is_not_ready(chain: Chain, shop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    coin = make_coin(chain, shop, chain.new_account(), monkeypatch)
    ready = asyncio.run(coin.check_ready())
    assert not ready.ok and "no ETH for gas" in ready.detail
    assert ready.figures == {"relayer_gas_wei": 0.0}  # /metrics shows the empty relayer too


def test_direct_mode_on_the_wrong_chain_is_not_ready(
    chain: Chain, shop: Any, relayer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    coin = make_coin(chain, shop, relayer, monkeypatch, network="base-sepolia")
    ready = asyncio.run(coin.check_ready())
    assert not ready.ok and "not base-sepolia" in ready.detail


def test_sandbox_loads_without_secrets_and_reports_honestly(vpsshop_client: Any) -> None:
    catalog = vpsshop_client.get("/v1/catalog").json()
    options = {o["coin"]: o for o in catalog["payment_options"]}
    assert options["USDCBASE"]["network"] == "base-sepolia" and options["USDCBASE"]["method"] == "x402"
    coin = vpsshop_client.app.state.ctx.coins["USDCBASE"]
    ready = asyncio.run(coin.check_ready())
    assert not ready.ok and "placeholder" in ready.detail


def test_encrypt_relayer_key_command(tmp_path: Path, relayer: Any) -> None:
    import os
    import sys

    secret_hex = bytes(relayer.key).hex()
    env = {**os.environ, "VPSSHOP_ENCRYPTION_KEY": ENCRYPTION_KEY, "VPSSHOP_DATABASE_URL": f"sqlite:///{tmp_path}/s.db"}
    done = subprocess.run(
        [sys.executable, "-m", "vpsshop_x402", "encrypt-relayer-key"],
        input=f"0x{secret_hex}\n".encode(),
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    token = done.stdout.decode().strip()
    assert secret_hex not in done.stdout.decode() + done.stderr.decode()
    assert relayer.address in done.stderr.decode()
    assert decrypt_relayer_key(token, ENCRYPTION_KEY).address == relayer.address
    bad = subprocess.run(
        [sys.executable, "-m", "vpsshop_x402", "encrypt-relayer-key"],
        input=b"not a key\n",
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert bad.returncode == 2 and b"not a valid" in bad.stderr


def test_payment_identity_is_normalized(chain: Chain, coin: USDCBASE) -> None:
    """The engine keys the credit on (payer, nonce): the same authorization written with other
    letter cases must give the same key."""
    payer = chain.new_account(usdc=1)
    requirements = coin.payment_requirements(1, RESOURCE, "t")
    header = sign_v1_header(payer, requirements)
    data = json.loads(base64.b64decode(header))
    auth = data["payload"]["authorization"]
    auth["from"] = auth["from"].lower()
    auth["nonce"] = "0x" + auth["nonce"][2:].upper()
    original, respelled = coin.decode_payment(header), coin.decode_payment(_b64(data))
    assert (
        (original.payer, original.nonce)
        == (respelled.payer, respelled.nonce)
        == (payer.address, original.nonce.lower())
    )
    assert original.valid_before == int(auth["validBefore"]) > time.time()


def test_the_shop_builds_the_coin_with_its_relayer_key_unlocked(
    tmp_path: Path, chain: Chain, shop: Any, relayer: Any
) -> None:
    """Core hands the shop's secrets to the coin's construction: relayer_key_encrypted is open before any
    start-up hook runs, and the plugin has none."""
    from starlette.testclient import TestClient

    import vpsshop_x402
    from vpsshop.app import create_app
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

    section = {
        "mode": "direct",
        "network": "base",
        "rpc_url": chain.url,
        "pay_to": shop.address,
        "asset": chain.asset,
        "relayer_key_encrypted": encrypt_relayer_key(bytes(relayer.key).hex(), TEST_ENCRYPTION_KEY),
    }
    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path / 'shop.db'}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "server": {"background": False},
            "coins": {"USDCBASE": section},
        },
    )
    assert not hasattr(vpsshop_x402, "vpsshop_startup")
    app = create_app(settings, background=False)
    coin = app.state.ctx.coins["USDCBASE"]
    assert coin.chain.relayer is not None and coin.chain.relayer.address == relayer.address
    with TestClient(app) as client:
        health = client.get("/v1/health").json()
    usdc = next(c for c in health["components"] if c["id"] == "USDCBASE")
    assert usdc["ready"] is True and relayer.address in usdc["detail"]
