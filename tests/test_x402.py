"""USDCBASE (plugins/vpsshop_x402) on a real chain: anvil, a USDC-like EIP-3009 token, the official
x402 clients (PyPI ``x402`` v1 client, npm ``x402``), and a facilitator built from the ``x402`` package.

Every failure case asserts that nothing moved on chain: the payer's and payTo's USDC balances are
unchanged and the authorization is still unused (or used only by what the test itself did).
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from x402_peers import (
    USDC_UNIT,
    Chain,
    Facilitator,
    StallingRpcFront,
    npm_bin,
    rpc,
    sign_v1_header,
    start_chain,
    wait_until,
)

from vpsshop import PluginError, X402Rejected
from vpsshop_x402 import USDCBASE, decrypt_relayer_key, encrypt_relayer_key

pytestmark = pytest.mark.slow

ENCRYPTION_KEY = "3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
ETH = 10**18
RESOURCE = "http://127.0.0.1:8000/v1/topups"


@pytest.fixture(scope="session")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    started = start_chain(tmp_path_factory.mktemp("x402-chain"))
    try:
        yield started
    finally:
        started.anvil.stop()


@pytest.fixture
def shop(chain: Chain) -> Any:
    """A fresh payTo address (no key needed) so balances start at zero."""
    return chain.new_account()


@pytest.fixture
def relayer(chain: Chain) -> Any:
    return chain.new_account(eth_wei=10 * ETH)


def make_coin(chain: Chain, shop: Any, relayer: Any, monkeypatch: pytest.MonkeyPatch, **over: Any) -> USDCBASE:
    monkeypatch.setenv("TEST_X402_RELAYER_KEY", relayer.key.hex())
    section = {
        "network": "base",
        "mode": "direct",
        "pay_to": shop.address,
        "asset": chain.asset,
        "rpc_url": chain.url,
        "relayer_key_env": "TEST_X402_RELAYER_KEY",
        "max_timeout_seconds": 120,
        **over,
    }
    coin = USDCBASE.from_settings(section, sandbox=False, where="coins.USDCBASE")
    assert isinstance(coin, USDCBASE)
    return coin


@pytest.fixture
def coin(chain: Chain, shop: Any, relayer: Any, monkeypatch: pytest.MonkeyPatch) -> USDCBASE:
    return make_coin(chain, shop, relayer, monkeypatch)


def settle(coin: USDCBASE, header: str, requirements: dict[str, Any], version: int = 1) -> Any:
    payment = coin.decode_payment(header, version)
    return asyncio.run(coin.settle(payment, requirements))


def assert_nothing_moved(chain: Chain, payer: Any, shop: Any, payer_before: int) -> None:
    assert chain.usdc(payer.address) == payer_before
    assert chain.usdc(shop.address) == 0


# ---- the happy path with the official Python client -------------------------------------------


def test_python_client_payment_settles_on_chain(chain: Chain, coin: USDCBASE, shop: Any, relayer: Any) -> None:
    payer = chain.new_account(usdc=100 * USDC_UNIT)
    requirements = coin.payment_requirements(25 * USDC_UNIT, RESOURCE, "Top-up of $25.00")
    header = sign_v1_header(payer, requirements)

    payment = coin.decode_payment(header)
    assert payment.payer == payer.address and payment.value_atomic == 25 * USDC_UNIT
    settlement = asyncio.run(coin.settle(payment, requirements))

    assert settlement.payer == payer.address and settlement.nonce == payment.nonce
    assert settlement.amount_atomic == 25 * USDC_UNIT and settlement.network == "base"
    receipt = chain.w3.eth.get_transaction_receipt(settlement.transaction)
    assert receipt["status"] == 1 and receipt["from"] == relayer.address
    assert chain.usdc(payer.address) == 75 * USDC_UNIT
    assert chain.usdc(shop.address) == 25 * USDC_UNIT
    assert chain.used(payer.address, payment.nonce)
    # the shop paid the gas, not the payer
    assert chain.w3.eth.get_balance(payer.address) == 0
    assert chain.w3.eth.get_balance(relayer.address) < 10 * ETH


def test_requirements_match_the_seed_and_work_offline(coin: USDCBASE, chain: Chain, shop: Any) -> None:
    req = coin.payment_requirements(1_500_000, RESOURCE, "Top-up of $1.50")
    assert req == {
        "scheme": "exact",
        "network": "base",
        "maxAmountRequired": "1500000",
        "resource": RESOURCE,
        "description": "Top-up of $1.50",
        "mimeType": "application/json",
        "payTo": shop.address,
        "maxTimeoutSeconds": 120,
        "asset": chain.asset,
        "extra": {"name": "USD Coin", "version": "2"},
    }
    sandbox = USDCBASE.from_settings(None, sandbox=True, where="coins.USDCBASE")
    offline = sandbox.payment_requirements(1_000_000, RESOURCE, "x")
    assert offline["network"] == "base-sepolia"
    assert offline["asset"] == "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
    assert offline["extra"] == {"name": "USDC", "version": "2"}
    mainnet = USDCBASE.from_settings(
        {"mode": "facilitator", "facilitator_url": "http://127.0.0.1:1", "pay_to": shop.address},
        sandbox=False,
        where="coins.USDCBASE",
    )
    assert mainnet.payment_requirements(1, RESOURCE, "x")["asset"] == "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
    assert mainnet.payment_requirements(1, RESOURCE, "x")["extra"] == {"name": "USD Coin", "version": "2"}
