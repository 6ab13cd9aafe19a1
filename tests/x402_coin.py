"""The USDCBASE coin on anvil for the x402 tests: a session chain with the test USDC, a fresh ``shop``
(payTo) and ``relayer`` per test, :func:`make_coin` / the ``coin`` fixture (direct mode), and helpers.
Test modules import the fixtures they use from here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from x402_peers import Chain, rpc, start_chain, wait_until

from vpsshop import X402Rejected
from vpsshop_x402 import USDCBASE

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


def _b64(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.b64encode(raw).decode()


def _refused(chain: Chain, coin: USDCBASE, shop: Any, header: str, requirements: dict[str, Any], payer: Any) -> str:
    before = chain.usdc(payer.address)
    payment = coin.decode_payment(header)
    with pytest.raises(X402Rejected) as err:
        asyncio.run(coin.settle(payment, requirements))
    assert err.value.status == 402
    assert_nothing_moved(chain, payer, shop, before)
    assert not chain.used(payer.address, payment.nonce)
    return err.value.code


def _sign_cancel(chain: Chain, payer: Any, nonce: str) -> tuple[int, bytes, bytes]:
    signed = payer.sign_typed_data(
        domain_data={"name": "USD Coin", "version": "2", "chainId": 8453, "verifyingContract": chain.asset},
        message_types={
            "CancelAuthorization": [{"name": "authorizer", "type": "address"}, {"name": "nonce", "type": "bytes32"}]
        },
        message_data={"authorizer": payer.address, "nonce": bytes.fromhex(nonce[2:])},
    )
    return signed.v, signed.r.to_bytes(32, "big"), signed.s.to_bytes(32, "big")


def _settle_while_payer_cancels(
    chain: Chain, coin: USDCBASE, payer: Any, payment: Any, requirements: Any, front_run: bool = False
) -> Any:
    """Settle while the payer's cancelAuthorization (or, with ``front_run``, someone submitting the
    same authorization) waits in the same block with a higher fee: verification (at the latest
    block) passes, the mined settlement reverts. Returns the outcome."""
    outcome: list[Any] = []
    rpc(chain.url, "evm_setIntervalMining", [0])
    try:
        gas_price = int(chain.w3.eth.gas_price) * 10
        if front_run:
            auth = payment.raw["payload"]["authorization"]
            sig = bytes.fromhex(payment.raw["payload"]["signature"][2:])
            chain.token.functions.transferWithAuthorization(
                auth["from"],
                auth["to"],
                int(auth["value"]),
                int(auth["validAfter"]),
                int(auth["validBefore"]),
                bytes.fromhex(auth["nonce"][2:]),
                sig[64],
                sig[:32],
                sig[32:64],
            ).transact({"from": chain.deployer, "gasPrice": gas_price})
        else:
            v, r, s = _sign_cancel(chain, payer, payment.nonce)
            chain.token.functions.cancelAuthorization(
                payer.address, bytes.fromhex(payment.nonce[2:]), v, r, s
            ).transact({"from": chain.deployer, "gasPrice": gas_price})

        def run() -> None:
            try:
                outcome.append(asyncio.run(coin.settle(payment, requirements)))
            except BaseException as exc:  # noqa: BLE001 - examined by the caller
                outcome.append(exc)

        worker = threading.Thread(target=run)
        worker.start()
        wait_until(lambda: int(rpc(chain.url, "txpool_status")["pending"], 16) >= 2, what="both transactions pending")
        rpc(chain.url, "evm_mine")
        worker.join(60)
    finally:
        rpc(chain.url, "evm_setIntervalMining", [1])
    assert len(outcome) == 1, outcome
    return outcome[0]
