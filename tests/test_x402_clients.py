"""USDCBASE paid by the other official x402 clients and settled through a facilitator: the npm ``x402``
client, x402 v2 (PyPI ``ExactEvmScheme``), the PyPI and npm HTTP clients against the exchange core
performs (``X402ResourceDouble``), and a facilitator built from the ``x402`` package's facilitator
classes. Every failure case asserts that nothing moved on chain (fixtures: tests/x402_coin.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from x402_coin import (  # noqa: F401 - chain, coin, relayer and shop are fixtures
    ETH,
    RESOURCE,
    _refused,
    _settle_while_payer_cancels,
    assert_nothing_moved,
    chain,
    coin,
    relayer,
    settle,
    shop,
)
from x402_peers import (
    USDC_UNIT,
    Chain,
    Facilitator,
    X402ResourceDouble,
    fetch_with_npm_client,
    sign_npm_header,
    sign_v1_header,
    sign_v2_header,
    wait_until,
)

from vpsshop import PluginError, X402Rejected
from vpsshop_x402 import USDCBASE

pytestmark = pytest.mark.slow

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


def test_python_http_client_pays_the_402_over_http(chain: Chain, paid_resource: X402ResourceDouble, shop: Any) -> None:
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
    assert (
        asyncio.run(facilitated.settlement_status(facilitated.decode_payment(sign_v1_header(payer, requirements))))
        is None
    )
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


def test_facilitator_verify_asks_only_verify(
    chain: Chain, facilitated: USDCBASE, facilitator: Facilitator, shop: Any
) -> None:
    """verify() in facilitator mode: the facilitator's /verify and nothing else; nothing moves."""
    payer = chain.new_account(usdc=40 * USDC_UNIT)
    requirements = facilitated.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    payment = facilitated.decode_payment(sign_v1_header(payer, requirements))
    facilitator.requests.clear()
    asyncio.run(facilitated.verify(payment, requirements))
    assert facilitator.requests == ["POST /verify"]
    broke = chain.new_account(usdc=1)
    with pytest.raises(X402Rejected) as err:
        asyncio.run(facilitated.verify(facilitated.decode_payment(sign_v1_header(broke, requirements)), requirements))
    assert err.value.code == "insufficient_funds"
    assert chain.usdc(payer.address) == 40 * USDC_UNIT and chain.usdc(shop.address) == 0
    assert not chain.used(payer.address, payment.nonce)


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


def test_facilitator_that_does_not_answer_moves_nothing(chain: Chain, shop: Any) -> None:
    """/verify cannot be asked: nothing was sent, a 503 the same payment may be re-sent after."""
    from x402_peers import free_port

    coin = USDCBASE.from_settings(
        {
            "mode": "facilitator",
            "facilitator_url": f"http://127.0.0.1:{free_port()}",
            "rpc_url": chain.url,
            "pay_to": shop.address,
            "asset": chain.asset,
            "network": "base",
        },
        sandbox=False,
        where="coins.USDCBASE",
    )
    payer = chain.new_account(usdc=10 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    header = sign_v1_header(payer, requirements)
    with pytest.raises(X402Rejected) as refused:
        settle(coin, header, requirements)
    assert refused.value.status == 503 and refused.value.code == "settlement_unavailable"
    assert asyncio.run(coin.settlement_status(coin.decode_payment(header))) is None
    assert chain.usdc(payer.address) == 10 * USDC_UNIT and chain.usdc(shop.address) == 0
    ready = asyncio.run(coin.check_ready())
    assert not ready.ok and "does not answer" in ready.detail


def test_facilitator_settle_time_out_is_unknown_and_found_on_chain(
    chain: Chain, shop: Any, facilitator: Facilitator
) -> None:
    """/settle answers too late: the outcome is unknown (money may have moved), and the chain tells."""
    coin = USDCBASE.from_settings(
        {
            "mode": "facilitator",
            "facilitator_url": facilitator.url,
            "facilitator_timeout_seconds": 1,
            "rpc_url": chain.url,
            "pay_to": shop.address,
            "asset": chain.asset,
            "network": "base",
            "max_timeout_seconds": 120,
        },
        sandbox=False,
        where="coins.USDCBASE",
    )
    payer = chain.new_account(usdc=10 * USDC_UNIT)
    requirements = coin.payment_requirements(10 * USDC_UNIT, RESOURCE, "t")
    header = sign_v1_header(payer, requirements)
    facilitator.stall_settle = 4
    try:
        with pytest.raises(PluginError, match="outcome unknown"):
            settle(coin, header, requirements)
    finally:
        facilitator.stall_settle = 0
    payment = coin.decode_payment(header)
    wait_until(lambda: chain.used(payer.address, payment.nonce), what="the settlement to be mined")
    found = asyncio.run(coin.settlement_status(payment))
    assert found is not None and found.amount_atomic == 10 * USDC_UNIT
    assert chain.usdc(shop.address) == 10 * USDC_UNIT
