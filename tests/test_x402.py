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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vpsshop_x402 import USDCBASE, decrypt_relayer_key, encrypt_relayer_key
from x402_peers import (
    USDC_UNIT,
    Chain,
    Facilitator,
    StallingRpcFront,
    X402ResourceDouble,
    fetch_with_npm_client,
    rpc,
    sign_npm_header,
    sign_v1_header,
    sign_v2_header,
    start_chain,
    wait_until,
)

from vpsshop import PluginError, X402Rejected

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
    from x402.http.utils import decode_payment_response_header

    x_payment_response = base64.b64encode(json.dumps(coin.settlement_response(settlement)).encode()).decode()
    decoded = decode_payment_response_header(x_payment_response)
    assert decoded.success and decoded.transaction == settlement.transaction and decoded.network == "base"
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


# ---- malformed headers: 400, nothing touched -------------------------------------------------


def _b64(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "header",
    [
        "",
        "not base64 at all!",
        _b64(b"\xff\xfe not json"),
        _b64(b"{truncated"),
        _b64([1, 2, 3]),
        _b64({"x402Version": 2, "scheme": "exact", "network": "base", "payload": {}}),
        _b64({"x402Version": 1, "scheme": "exact", "network": "base"}),
        _b64({"x402Version": 1, "scheme": "exact", "network": "base", "payload": {"signature": "0x00"}}),
        _b64(
            {
                "x402Version": 1,
                "scheme": "exact",
                "network": "base",
                "payload": {
                    "signature": "0x" + "11" * 65,
                    "authorization": {
                        "from": "0x12",
                        "to": "0x" + "22" * 20,
                        "value": "1",
                        "validAfter": "0",
                        "validBefore": "9",
                        "nonce": "0x" + "33" * 32,
                    },
                },
            }
        ),
    ],
    ids=["empty", "not-base64", "not-utf8", "not-json", "not-object", "wrong-version", "no-payload",
         "no-authorization", "bad-address"],
)
def test_malformed_header_is_400_invalid_payment(coin: USDCBASE, header: str) -> None:
    with pytest.raises(X402Rejected) as err:
        coin.decode_payment(header)
    assert err.value.code == "invalid_payment" and err.value.status == 400


# ---- refused authorizations: 402, nothing moved -------------------------------------------------


def _refused(chain: Chain, coin: USDCBASE, shop: Any, header: str, requirements: dict[str, Any], payer: Any) -> str:
    before = chain.usdc(payer.address)
    payment = coin.decode_payment(header)
    with pytest.raises(X402Rejected) as err:
        asyncio.run(coin.settle(payment, requirements))
    assert err.value.status == 402
    assert_nothing_moved(chain, payer, shop, before)
    assert not chain.used(payer.address, payment.nonce)
    return err.value.code


def test_wrong_signature_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    thief = chain.new_account()
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    # the thief signs an authorization that claims to come from the payer
    header = sign_v1_header(thief, requirements, **{"from": payer.address})
    assert _refused(chain, coin, shop, header, requirements, payer) == "invalid_signature"


def test_tampered_value_breaks_the_signature(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    small = coin.payment_requirements(1 * USDC_UNIT, RESOURCE, "t")
    big = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    data = json.loads(base64.b64decode(sign_v1_header(payer, small)))
    data["payload"]["authorization"]["value"] = str(10 * USDC_UNIT)
    assert _refused(chain, coin, shop, _b64(data), big, payer) == "invalid_signature"


def test_wrong_amount_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    for value in (10 * USDC_UNIT - 1, 10 * USDC_UNIT + 1):
        header = sign_v1_header(payer, requirements, value=str(value))
        assert _refused(chain, coin, shop, header, requirements, payer) == "wrong_amount"


def test_wrong_recipient_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    other = chain.new_account()
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    header = sign_v1_header(payer, requirements, to=other.address)
    assert _refused(chain, coin, shop, header, requirements, payer) == "wrong_recipient"
    assert chain.usdc(other.address) == 0


def test_expired_authorization_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    now = int(time.time())
    for valid_before in (now - 60, now + 3):  # gone, and inside the 6-second margin
        header = sign_v1_header(payer, requirements, validBefore=str(valid_before))
        assert _refused(chain, coin, shop, header, requirements, payer) == "authorization_expired"


def test_not_yet_valid_authorization_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    header = sign_v1_header(payer, requirements, validAfter=str(int(time.time()) + 120))
    assert _refused(chain, coin, shop, header, requirements, payer) == "authorization_not_yet_valid"


def test_wrong_network_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    data = json.loads(base64.b64decode(sign_v1_header(payer, requirements)))
    data["network"] = "base-sepolia"
    assert _refused(chain, coin, shop, _b64(data), requirements, payer) == "wrong_network"


def test_other_token_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    """An authorization signed for another token's EIP-712 domain does not verify for ours."""
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    other_token = chain.deploy_token("USD Coin", "2")
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    header = sign_v1_header(payer, {**requirements, "asset": other_token.address})
    assert _refused(chain, coin, shop, header, requirements, payer) == "invalid_signature"


def test_insufficient_funds_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=5 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    header = sign_v1_header(payer, requirements)
    assert _refused(chain, coin, shop, header, requirements, payer) == "insufficient_funds"


def test_reused_nonce_is_refused_and_moves_nothing_more(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    header = sign_v1_header(payer, requirements)
    first = settle(coin, header, requirements)
    assert chain.usdc(shop.address) == 10 * USDC_UNIT

    with pytest.raises(X402Rejected) as again:
        settle(coin, header, requirements)
    assert again.value.code == "nonce_used"
    # a new signature over the same nonce is refused too
    nonce = coin.decode_payment(header).nonce
    with pytest.raises(X402Rejected) as same_nonce:
        settle(coin, sign_v1_header(payer, requirements, nonce=nonce), requirements)
    assert same_nonce.value.code == "nonce_used"
    assert chain.usdc(payer.address) == 40 * USDC_UNIT and chain.usdc(shop.address) == 10 * USDC_UNIT
    status = asyncio.run(coin.settlement_status(coin.decode_payment(header)))
    assert status == first


def test_same_header_settled_twice_at_once_moves_once(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))

    async def both() -> list[Any]:
        return await asyncio.gather(
            coin.settle(payment, requirements), coin.settle(payment, requirements), return_exceptions=True
        )

    results = asyncio.run(both())
    settled = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, X402Rejected)]
    assert len(settled) == 1 and len(refused) == 1 and refused[0].code == "nonce_used"
    assert chain.usdc(payer.address) == 40 * USDC_UNIT and chain.usdc(shop.address) == 10 * USDC_UNIT


# ---- a settlement that reverts -----------------------------------------------------------------


def _sign_cancel(chain: Chain, payer: Any, nonce: str) -> tuple[int, bytes, bytes]:
    signed = payer.sign_typed_data(
        domain_data={"name": "USD Coin", "version": "2", "chainId": 8453, "verifyingContract": chain.asset},
        message_types={"CancelAuthorization": [{"name": "authorizer", "type": "address"}, {"name": "nonce", "type": "bytes32"}]},
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
                auth["from"], auth["to"], int(auth["value"]), int(auth["validAfter"]), int(auth["validBefore"]),
                bytes.fromhex(auth["nonce"][2:]), sig[64], sig[:32], sig[32:64],
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


def test_settlement_that_reverts_is_refused_and_moves_nothing(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    outcome = _settle_while_payer_cancels(chain, coin, payer, payment, requirements)
    assert isinstance(outcome, X402Rejected) and outcome.code == "settlement_reverted", outcome
    assert chain.usdc(payer.address) == 50 * USDC_UNIT and chain.usdc(shop.address) == 0
    assert asyncio.run(coin.settlement_status(payment)) is None  # canceled, not paid


def test_front_run_settlement_still_counts_once(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    """Someone submits the customer's authorization before the shop's transaction: ours reverts,
    but the USDC arrived, so settle() returns the transaction that paid us (and only once)."""
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    outcome = _settle_while_payer_cancels(chain, coin, payer, payment, requirements, front_run=True)
    assert not isinstance(outcome, BaseException), outcome
    receipt = chain.w3.eth.get_transaction_receipt(outcome.transaction)
    assert receipt["status"] == 1 and receipt["from"] == chain.deployer  # the front-runner's transaction
    assert outcome.amount_atomic == 10 * USDC_UNIT
    assert chain.usdc(payer.address) == 40 * USDC_UNIT and chain.usdc(shop.address) == 10 * USDC_UNIT
    with pytest.raises(X402Rejected) as again:
        asyncio.run(coin.settle(payment, requirements))
    assert again.value.code == "nonce_used"


def test_two_processes_sharing_a_relayer_do_not_clash(
    chain: Chain, shop: Any, relayer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two coin instances (two server processes) send from one relayer: a stale nonce is re-signed."""
    first = make_coin(chain, shop, relayer, monkeypatch)
    second = make_coin(chain, shop, relayer, monkeypatch)
    requirements = first.payment_requirements(1 * USDC_UNIT, RESOURCE, "t")
    for coin in (first, second, first, second):
        payer = chain.new_account(usdc=1 * USDC_UNIT)
        settle(coin, sign_v1_header(payer, requirements), requirements)
    assert chain.usdc(shop.address) == 4 * USDC_UNIT


# ---- an RPC endpoint that times out ------------------------------------------------------------


@pytest.fixture
def stalling_rpc(chain: Chain) -> Iterator[StallingRpcFront]:
    front = StallingRpcFront(chain.url, stall_seconds=4)
    try:
        yield front
    finally:
        front.stop()


def test_rpc_timeout_after_sending_then_status_resolves_it(
    chain: Chain, shop: Any, relayer: Any, stalling_rpc: StallingRpcFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    coin = make_coin(chain, shop, relayer, monkeypatch, rpc_url=stalling_rpc.url, rpc_timeout_seconds=1)
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    stalling_rpc.stall = {"eth_sendRawTransaction"}  # the transaction reaches the chain, the answer does not

    with pytest.raises(PluginError, match="outcome unknown"):
        asyncio.run(coin.settle(payment, requirements))

    stalling_rpc.stall = set()
    wait_until(lambda: chain.used(payer.address, payment.nonce), what="the settlement to be mined")
    found = asyncio.run(coin.settlement_status(payment))
    assert found is not None and found.payer == payer.address and found.amount_atomic == 10 * USDC_UNIT
    assert chain.w3.eth.get_transaction_receipt(found.transaction)["status"] == 1
    # a retry of the same payment does not settle a second time
    with pytest.raises(X402Rejected) as retry:
        asyncio.run(coin.settle(payment, requirements))
    assert retry.value.code == "nonce_used"
    assert chain.usdc(payer.address) == 40 * USDC_UNIT and chain.usdc(shop.address) == 10 * USDC_UNIT


def test_rpc_timeout_before_anything_is_sent(
    chain: Chain, shop: Any, relayer: Any, stalling_rpc: StallingRpcFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    coin = make_coin(chain, shop, relayer, monkeypatch, rpc_url=stalling_rpc.url, rpc_timeout_seconds=1)
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    stalling_rpc.stall = {"eth_call"}
    stalling_rpc.forward_when_stalling = False

    with pytest.raises(PluginError):
        asyncio.run(coin.settle(payment, requirements))
    stalling_rpc.stall = set()
    assert asyncio.run(coin.settlement_status(payment)) is None
    assert chain.usdc(payer.address) == 50 * USDC_UNIT and chain.usdc(shop.address) == 0
    # the payment is still good: settling it once the endpoint answers works
    assert asyncio.run(coin.settle(payment, requirements)).amount_atomic == 10 * USDC_UNIT


def test_receipt_wait_timeout_is_unknown_outcome(
    chain: Chain, shop: Any, relayer: Any, stalling_rpc: StallingRpcFront, monkeypatch: pytest.MonkeyPatch
) -> None:
    coin = make_coin(
        chain, shop, relayer, monkeypatch, rpc_url=stalling_rpc.url, rpc_timeout_seconds=1, receipt_timeout_seconds=1
    )
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    stalling_rpc.stall = {"eth_getTransactionReceipt"}
    with pytest.raises(PluginError, match="outcome unknown"):
        asyncio.run(coin.settle(payment, requirements))
    stalling_rpc.stall = set()
    wait_until(lambda: chain.used(payer.address, payment.nonce), what="the settlement to be mined")
    assert asyncio.run(coin.settlement_status(payment)) is not None


# ---- the npm client and x402 v2 ---------------------------------------------------------------


def test_npm_client_payment_settles_on_chain(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=30 * USDC_UNIT)
    requirements = coin.payment_requirements(30 * USDC_UNIT, RESOURCE, "Top-up of $30.00")
    header = sign_npm_header(payer, requirements, chain.url)
    settlement = settle(coin, header, requirements)
    assert settlement.payer == payer.address and settlement.amount_atomic == 30 * USDC_UNIT
    assert chain.usdc(payer.address) == 0 and chain.usdc(shop.address) == 30 * USDC_UNIT


def test_npm_client_wrong_amount_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=30 * USDC_UNIT)
    asked = coin.payment_requirements(30 * USDC_UNIT, RESOURCE, "t")
    header = sign_npm_header(payer, {**asked, "maxAmountRequired": str(29 * USDC_UNIT)}, chain.url)
    assert _refused(chain, coin, shop, header, asked, payer) == "wrong_amount"


def test_v2_payment_signature_settles(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=20 * USDC_UNIT)
    requirements = coin.payment_requirements(20 * USDC_UNIT, RESOURCE, "t")
    v2 = coin.payment_requirements_v2(requirements)
    assert v2["network"] == "eip155:8453" and v2["amount"] == str(20 * USDC_UNIT)
    header = sign_v2_header(payer, v2, RESOURCE)
    with pytest.raises(X402Rejected):
        coin.decode_payment(header, version=1)  # a v2 header is not a v1 one
    payment = coin.decode_payment(header, version=2)
    assert payment.version == 2 and payment.payer == payer.address
    settlement = asyncio.run(coin.settle(payment, requirements))
    assert settlement.amount_atomic == 20 * USDC_UNIT
    assert chain.usdc(shop.address) == 20 * USDC_UNIT
    # what core puts in PAYMENT-RESPONSE reads back with the x402 package's own decoder
    from x402.http.utils import decode_payment_response_header

    header_value = base64.b64encode(json.dumps(coin.settlement_response(settlement, 2)).encode()).decode()
    decoded = decode_payment_response_header(header_value)
    assert decoded.success and decoded.transaction == settlement.transaction
    assert decoded.network == "eip155:8453" and decoded.payer == payer.address


def test_v2_payment_for_other_requirements_is_refused(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=20 * USDC_UNIT)
    requirements = coin.payment_requirements(20 * USDC_UNIT, RESOURCE, "t")
    v2 = coin.payment_requirements_v2(coin.payment_requirements(19 * USDC_UNIT, RESOURCE, "t"))
    header = sign_v2_header(payer, v2, RESOURCE)
    before = chain.usdc(payer.address)
    with pytest.raises(X402Rejected) as err:
        asyncio.run(coin.settle(coin.decode_payment(header, version=2), requirements))
    assert err.value.code == "wrong_amount"
    assert_nothing_moved(chain, payer, shop, before)


# ---- real x402 HTTP clients against the exchange core performs ---------------------------------


@pytest.fixture
def paid_resource(coin: USDCBASE) -> Iterator[X402ResourceDouble]:
    served = X402ResourceDouble(coin, 25 * USDC_UNIT)
    try:
        yield served
    finally:
        served.stop()


def _python_http_client(payer: Any, requirements_network: str, asset: str, v2: bool = False) -> Any:
    from x402 import x402Client
    from x402.mechanisms.evm.exact import ExactEvmClientScheme
    from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1

    client = x402Client()
    client.set_spend_controls({"allowed_assets": [{"network": requirements_network, "asset": asset}]})
    if v2:
        client.register("eip155:8453", ExactEvmClientScheme(payer))
    else:
        client.register_v1(requirements_network, ExactEvmSchemeV1(payer))
    return client


def test_python_http_client_pays_the_402_over_http(
    chain: Chain, paid_resource: X402ResourceDouble, shop: Any
) -> None:
    from x402.http.clients import x402HttpxClient
    from x402.http.utils import decode_payment_response_header

    payer = chain.new_account(usdc=100 * USDC_UNIT)
    client = _python_http_client(payer, "base", chain.asset)

    async def pay() -> Any:
        async with x402HttpxClient(client, timeout=60) as http:
            return await http.post(paid_resource.url, json={"amount": 25, "coin": "USDCBASE"})

    response = asyncio.run(pay())
    assert paid_resource.answers == [402, 200]
    assert response.status_code == 200 and response.json()["status"] == "completed"
    settle_result = decode_payment_response_header(response.headers["X-PAYMENT-RESPONSE"])
    assert settle_result.success and settle_result.payer == payer.address
    assert settle_result.transaction == response.json()["transaction"]
    assert chain.usdc(payer.address) == 75 * USDC_UNIT and chain.usdc(shop.address) == 25 * USDC_UNIT
    assert len(paid_resource.settled) == 1


def test_python_http_client_speaks_v2_when_offered(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    from x402.http.clients import x402HttpxClient
    from x402.http.utils import decode_payment_response_header

    served = X402ResourceDouble(coin, 25 * USDC_UNIT, offer_v2=True)
    try:
        payer = chain.new_account(usdc=100 * USDC_UNIT)
        client = _python_http_client(payer, "eip155:8453", chain.asset, v2=True)

        async def pay() -> Any:
            async with x402HttpxClient(client, timeout=60) as http:
                return await http.post(served.url, json={"amount": 25, "coin": "USDCBASE"})

        response = asyncio.run(pay())
    finally:
        served.stop()
    assert served.answers == [402, 200] and response.status_code == 200
    settle_result = decode_payment_response_header(response.headers["PAYMENT-RESPONSE"])
    assert settle_result.success and settle_result.network == "eip155:8453"
    assert chain.usdc(shop.address) == 25 * USDC_UNIT


def test_npm_x402_fetch_pays_the_402_over_http(chain: Chain, paid_resource: X402ResourceDouble, shop: Any) -> None:
    payer = chain.new_account(usdc=100 * USDC_UNIT)
    result = fetch_with_npm_client(payer, paid_resource.url, chain.url)
    assert paid_resource.answers == [402, 200]
    assert result["status"] == 200 and result["body"]["status"] == "completed"
    settle_result = json.loads(base64.b64decode(result["paymentResponse"]))
    assert settle_result == {
        "success": True,
        "transaction": result["body"]["transaction"],
        "network": "base",
        "payer": payer.address,
    }
    assert chain.usdc(payer.address) == 75 * USDC_UNIT and chain.usdc(shop.address) == 25 * USDC_UNIT


def test_http_refusal_has_the_error_body(chain: Chain, paid_resource: X402ResourceDouble, shop: Any) -> None:
    """A client holding too little USDC gets the seed's error body from the coin's refusal."""
    from x402.http.clients import x402HttpxClient

    payer = chain.new_account(usdc=1 * USDC_UNIT)

    async def pay() -> Any:
        async with x402HttpxClient(_python_http_client(payer, "base", chain.asset), timeout=60) as http:
            return await http.post(paid_resource.url, json={"amount": 25, "coin": "USDCBASE"})

    response = asyncio.run(pay())
    assert paid_resource.answers == [402, 402]
    assert response.status_code == 402
    assert response.json()["error"] == "insufficient_funds" and response.json()["message"]
    assert chain.usdc(payer.address) == 1 * USDC_UNIT and chain.usdc(shop.address) == 0


# ---- facilitator mode -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def facilitator(chain: Chain) -> Iterator[Facilitator]:
    wallet = chain.new_account(eth_wei=10 * ETH)
    served = Facilitator(chain.url, "0x" + bytes(wallet.key).hex())
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture
def facilitated(chain: Chain, shop: Any, facilitator: Facilitator) -> USDCBASE:
    coin = USDCBASE.from_settings(
        {
            "network": "base",
            "mode": "facilitator",
            "facilitator_url": facilitator.url,
            "rpc_url": chain.url,
            "pay_to": shop.address,
            "asset": chain.asset,
            "max_timeout_seconds": 120,
        },
        sandbox=False,
        where="coins.USDCBASE",
    )
    assert isinstance(coin, USDCBASE)
    return coin


def test_facilitator_settles_python_client_payment(
    chain: Chain, facilitated: USDCBASE, facilitator: Facilitator, shop: Any
) -> None:
    payer = chain.new_account(usdc=40 * USDC_UNIT)
    requirements = facilitated.payment_requirements(40 * USDC_UNIT, RESOURCE, "t")
    facilitator.requests.clear()
    settlement = settle(facilitated, sign_v1_header(payer, requirements), requirements)
    assert facilitator.requests == ["POST /verify", "POST /settle"]
    assert chain.w3.eth.get_transaction_receipt(settlement.transaction)["status"] == 1
    assert chain.usdc(payer.address) == 0 and chain.usdc(shop.address) == 40 * USDC_UNIT
    assert asyncio.run(facilitated.settlement_status(facilitated.decode_payment(sign_v1_header(payer, requirements)))) is None
    assert asyncio.run(facilitated.check_ready()).ok


def test_facilitator_settles_npm_and_v2_payments(chain: Chain, facilitated: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=40 * USDC_UNIT)
    requirements = facilitated.payment_requirements(15 * USDC_UNIT, RESOURCE, "t")
    settle(facilitated, sign_npm_header(payer, requirements, chain.url), requirements)
    v2 = sign_v2_header(payer, facilitated.payment_requirements_v2(requirements), RESOURCE)
    settle(facilitated, v2, requirements, version=2)
    assert chain.usdc(payer.address) == 10 * USDC_UNIT and chain.usdc(shop.address) == 30 * USDC_UNIT


def test_facilitator_refusals_move_nothing(
    chain: Chain, facilitated: USDCBASE, facilitator: Facilitator, shop: Any
) -> None:
    payer = chain.new_account(usdc=40 * USDC_UNIT)
    thief = chain.new_account()
    requirements = facilitated.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    facilitator.requests.clear()
    forged = sign_v1_header(thief, requirements, **{"from": payer.address})
    assert _refused(chain, facilitated, shop, forged, requirements, payer) == "invalid_signature"
    assert facilitator.requests == ["POST /verify"]
    broke = chain.new_account(usdc=1)
    assert _refused(chain, facilitated, shop, sign_v1_header(broke, requirements), requirements, broke) == (
        "insufficient_funds"
    )
    header = sign_v1_header(payer, requirements)
    settle(facilitated, header, requirements)
    with pytest.raises(X402Rejected) as again:
        settle(facilitated, header, requirements)
    assert again.value.code == "nonce_used"
    assert chain.usdc(payer.address) == 30 * USDC_UNIT and chain.usdc(shop.address) == 10 * USDC_UNIT


def test_facilitator_settlement_that_reverts(chain: Chain, facilitated: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = facilitated.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = facilitated.decode_payment(sign_v1_header(payer, requirements))
    outcome = _settle_while_payer_cancels(chain, facilitated, payer, payment, requirements)
    assert isinstance(outcome, X402Rejected) and outcome.code == "settlement_reverted", outcome
    assert chain.usdc(payer.address) == 50 * USDC_UNIT and chain.usdc(shop.address) == 0


def test_facilitator_front_run_settlement_counts(chain: Chain, facilitated: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = facilitated.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = facilitated.decode_payment(sign_v1_header(payer, requirements))
    outcome = _settle_while_payer_cancels(chain, facilitated, payer, payment, requirements, front_run=True)
    assert not isinstance(outcome, BaseException), outcome
    assert chain.w3.eth.get_transaction_receipt(outcome.transaction)["from"] == chain.deployer
    assert chain.usdc(payer.address) == 40 * USDC_UNIT and chain.usdc(shop.address) == 10 * USDC_UNIT


def test_facilitator_that_does_not_answer_is_unknown_outcome(chain: Chain, shop: Any) -> None:
    from x402_peers import free_port

    coin = USDCBASE.from_settings(
        {"mode": "facilitator", "facilitator_url": f"http://127.0.0.1:{free_port()}", "pay_to": shop.address,
         "asset": chain.asset, "network": "base"},
        sandbox=False,
        where="coins.USDCBASE",
    )
    payer = chain.new_account(usdc=10 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    with pytest.raises(PluginError):
        settle(coin, sign_v1_header(payer, requirements), requirements)
    with pytest.raises(PluginError, match="rpc_url"):
        asyncio.run(coin.settlement_status(coin.decode_payment(sign_v1_header(payer, requirements))))
    ready = asyncio.run(coin.check_ready())
    assert not ready.ok and "does not answer" in ready.detail


# ---- the relayer key and readiness ----------------------------------------------------------


def test_encrypted_relayer_key_settles_and_never_shows(
    chain: Chain, shop: Any, relayer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    secret_hex = bytes(relayer.key).hex()
    token = encrypt_relayer_key(secret_hex, ENCRYPTION_KEY)
    assert secret_hex not in token
    coin = USDCBASE.from_settings(
        {"mode": "direct", "network": "base", "rpc_url": chain.url, "pay_to": shop.address, "asset": chain.asset,
         "relayer_key_encrypted": token},
        sandbox=False,
        where="coins.USDCBASE",
    )
    assert isinstance(coin, USDCBASE)
    locked = asyncio.run(coin.check_ready())
    assert not locked.ok and "locked" in locked.detail
    with pytest.raises(PluginError, match="not configured"):
        settle(coin, sign_v1_header(chain.new_account(usdc=1), coin.payment_requirements(1, RESOURCE, "t")),
               coin.payment_requirements(1, RESOURCE, "t"))
    with pytest.raises(PluginError, match="cannot be decrypted"):
        coin.use_encryption_key("x" * 43 + "=")
    coin.use_encryption_key(ENCRYPTION_KEY)
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
    from vpsshop import ConfigError

    with pytest.raises(ConfigError, match="rpc_url"):
        USDCBASE.from_settings({"mode": "direct", "pay_to": shop.address, "relayer_key_env": "X"},
                               sandbox=False, where="coins.USDCBASE")
    with pytest.raises(ConfigError, match="exactly one"):
        USDCBASE.from_settings({"mode": "direct", "pay_to": shop.address, "rpc_url": chain.url},
                               sandbox=False, where="coins.USDCBASE")
    with pytest.raises(ConfigError, match="coins.USDCBASE.pay_to"):
        USDCBASE.from_settings({"mode": "facilitator", "facilitator_url": "http://x", "pay_to": "0x12"},
                               sandbox=False, where="coins.USDCBASE")
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


def test_direct_mode_on_the_wrong_chain_is_not_ready(chain: Chain, shop: Any, relayer: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
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
    done = subprocess.run(  # noqa: PLW1510 - the return codes are asserted
        [sys.executable, "-m", "vpsshop_x402", "encrypt-relayer-key"],
        input=f"0x{secret_hex}\n".encode(), capture_output=True, env=env, cwd=tmp_path, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    token = done.stdout.decode().strip()
    assert secret_hex not in done.stdout.decode() + done.stderr.decode()
    assert relayer.address in done.stderr.decode()
    assert decrypt_relayer_key(token, ENCRYPTION_KEY).address == relayer.address
    bad = subprocess.run(  # noqa: PLW1510
        [sys.executable, "-m", "vpsshop_x402", "encrypt-relayer-key"],
        input=b"not a key\n", capture_output=True, env=env, cwd=tmp_path, timeout=60,
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
    assert (original.payer, original.nonce) == (respelled.payer, respelled.nonce) == (payer.address, original.nonce.lower())
    assert original.valid_before == int(auth["validBefore"]) > time.time()


def test_startup_unlocks_the_encrypted_relayer_key(tmp_path: Path, chain: Chain, shop: Any, relayer: Any) -> None:
    """The plugin's vpsshop_startup hook decrypts relayer_key_encrypted with the shop's encryption_key."""
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

    section = {"mode": "direct", "network": "base", "rpc_url": chain.url, "pay_to": shop.address,
               "asset": chain.asset, "relayer_key_encrypted": encrypt_relayer_key(bytes(relayer.key).hex(), TEST_ENCRYPTION_KEY)}
    settings = load_settings(None, environ={}, overrides={
        "mode": "sandbox", "database_url": f"sqlite:///{tmp_path / 'shop.db'}", "secret_key": TEST_SECRET_KEY,
        "encryption_key": TEST_ENCRYPTION_KEY, "server": {"background": False}, "coins": {"USDCBASE": section},
    })
    app = create_app(settings, background=False)
    coin = app.state.ctx.coins["USDCBASE"]
    assert coin.chain.relayer is None
    with TestClient(app) as client:
        assert coin.chain.relayer is not None and coin.chain.relayer.address == relayer.address
        health = client.get("/v1/health").json()
    usdc = next(c for c in health["components"] if c["id"] == "USDCBASE")
    assert usdc["ready"] is True and relayer.address in usdc["detail"]
