"""USDCBASE (plugins/vpsshop_x402) on a real chain: anvil, a USDC-like EIP-3009 token and the official
PyPI ``x402`` v1 client. The happy path, malformed headers, refused authorizations, settlements that
revert, and an RPC endpoint that times out.

Every failure case asserts that nothing moved on chain: the payer's and payTo's USDC balances are
unchanged and the authorization is still unused (or used only by what the test itself did). The chain,
the coin and their fixtures are in tests/x402_coin.py; the npm client, x402 v2, HTTP clients and
facilitator mode in tests/test_x402_clients.py; the relayer key and readiness in
tests/test_x402_relayer.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from x402_coin import (  # noqa: F401 - chain, coin, relayer and shop are fixtures
    ETH,
    RESOURCE,
    _b64,
    _refused,
    _settle_while_payer_cancels,
    chain,
    coin,
    make_coin,
    relayer,
    settle,
    shop,
)
from x402_peers import USDC_UNIT, Chain, StallingRpcFront, sign_v1_header, wait_until

from vpsshop import PluginError, X402Rejected
from vpsshop_x402 import USDCBASE

pytestmark = pytest.mark.slow

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
        {"mode": "facilitator", "facilitator_url": "http://127.0.0.1:1", "rpc_url": chain.url, "pay_to": shop.address},
        sandbox=False,
        where="coins.USDCBASE",
    )
    assert mainnet.payment_requirements(1, RESOURCE, "x")["asset"] == "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
    assert mainnet.payment_requirements(1, RESOURCE, "x")["extra"] == {"name": "USD Coin", "version": "2"}


# ---- malformed headers: 400, nothing touched -------------------------------------------------


def _v1_header(**authorization: str) -> str:
    """An X-PAYMENT whose fields are well formed but for the ``authorization`` fields given."""
    well_formed = {
        "from": "0x" + "12" * 20,
        "to": "0x" + "22" * 20,
        "value": "1",
        "validAfter": "0",
        "validBefore": "9",
        "nonce": "0x" + "33" * 32,
    }
    payload = {"signature": "0x" + "11" * 65, "authorization": {**well_formed, **authorization}}
    return _b64({"x402Version": 1, "scheme": "exact", "network": "base", "payload": payload})


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
        _v1_header(**{"from": "0x12"}),
        _v1_header(**{"from": "0x" + "12" * 20 + "\n"}),  # Python's re `$` matched before a final newline
        _v1_header(nonce="0x" + "33" * 31),
        _v1_header(validBefore="9.5"),
    ],
    ids=[
        "empty",
        "not-base64",
        "not-utf8",
        "not-json",
        "not-object",
        "wrong-version",
        "no-payload",
        "no-authorization",
        "bad-address",
        "address-with-newline",
        "short-nonce",
        "not-a-uint",
    ],
)
def test_malformed_header_is_400_invalid_payment(coin: USDCBASE, header: str) -> None:
    with pytest.raises(X402Rejected) as err:
        coin.decode_payment(header)
    assert err.value.code == "invalid_payment" and err.value.status == 400


def test_a_malformed_header_names_the_field_at_fault(coin: USDCBASE) -> None:
    with pytest.raises(X402Rejected) as err:
        coin.decode_payment(_v1_header(nonce="0x12"))
    assert err.value.message == "payload.authorization.nonce is missing or malformed."


# ---- refused authorizations: 402, nothing moved -------------------------------------------------


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


def test_settlement_that_reverts_is_refused_and_moves_nothing(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    outcome = _settle_while_payer_cancels(chain, coin, payer, payment, requirements)
    assert isinstance(outcome, X402Rejected) and outcome.code == "settlement_reverted", outcome
    assert chain.usdc(payer.address) == 50 * USDC_UNIT and chain.usdc(shop.address) == 0
    assert asyncio.run(coin.settlement_status(payment)) is None  # canceled, not paid


def test_verify_checks_without_moving_anything(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    """verify() (settle on readiness holds a verified authorization) accepts a good authorization and
    refuses one the payer cannot fund; neither moves anything nor uses the nonce."""
    payer = chain.new_account(usdc=50 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    asyncio.run(coin.verify(payment, requirements))
    assert chain.usdc(payer.address) == 50 * USDC_UNIT and chain.usdc(shop.address) == 0
    assert not chain.used(payer.address, payment.nonce)

    poor = chain.new_account(usdc=5 * USDC_UNIT)
    unfunded = coin.decode_payment(sign_v1_header(poor, requirements))
    with pytest.raises(X402Rejected) as err:
        asyncio.run(coin.verify(unfunded, requirements))
    assert err.value.code == "insufficient_funds" and err.value.status == 402
    assert chain.usdc(poor.address) == 5 * USDC_UNIT and not chain.used(poor.address, unfunded.nonce)


def test_funds_moved_away_after_verify_fail_the_settlement(chain: Chain, coin: USDCBASE, shop: Any) -> None:
    """A verified authorization is no payment: the payer may move the USDC before it is settled."""
    payer = chain.new_account(usdc=50 * USDC_UNIT, eth_wei=ETH)
    elsewhere = chain.new_account()
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = coin.decode_payment(sign_v1_header(payer, requirements))
    asyncio.run(coin.verify(payment, requirements))
    tx = chain.token.functions.transfer(elsewhere.address, 45 * USDC_UNIT).build_transaction(
        {"from": payer.address, "nonce": chain.w3.eth.get_transaction_count(payer.address)}
    )
    sent = chain.w3.eth.send_raw_transaction(payer.sign_transaction(tx).raw_transaction)
    assert chain.w3.eth.wait_for_transaction_receipt(sent, timeout=30)["status"] == 1
    with pytest.raises(X402Rejected) as err:
        asyncio.run(coin.settle(payment, requirements))
    assert err.value.code == "insufficient_funds"
    assert chain.usdc(payer.address) == 5 * USDC_UNIT and chain.usdc(shop.address) == 0
    assert not chain.used(payer.address, payment.nonce)


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
    for coin in (first, second, first, second):  # noqa: F402 - each of the two coins, not the fixture
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

    with pytest.raises(X402Rejected) as refused:  # nothing sent: a 503 the same payment may be re-sent after
        asyncio.run(coin.settle(payment, requirements))
    assert refused.value.status == 503 and refused.value.code == "settlement_unavailable"
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
