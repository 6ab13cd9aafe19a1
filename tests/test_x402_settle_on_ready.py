"""``[x402] settle = "on_ready"``: an order's x402 payment is verified and held, and settled only once the
server is ready (docs/x402.md, "Settle on readiness").

The shop runs under uvicorn with the real USDCBASE plugin in direct mode on anvil (the fixtures of
tests/test_x402_topups.py) and the simulator hypervisor; the official PyPI ``x402`` client pays. The
provisioning job runs as the worker runs it (:func:`vpsshop.servers.jobs.run_jobs`); balances are read
on chain. Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import base64
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
from test_x402_orders import credit, order_body, price_of, servers
from test_x402_topups import (  # noqa: F401 - fixtures
    Served,
    auth,
    balance,
    decode_header,
    http,
    relayer,
    rpc_front,
    run_watcher,
    served,
    shop,
    topup_chain,
    usdcbase_section,
)
from x402_peers import USDC_UNIT, Chain, StallingRpcFront, wait_until

from vpsshop.payments.models import Topup, X402Record
from vpsshop.servers.held import settle_ready_holds
from vpsshop.servers.jobs import run_jobs

pytestmark = pytest.mark.slow

FUNDS = 100 * USDC_UNIT


@pytest.fixture
def vpsshop_overrides(request: pytest.FixtureRequest, topup_chain: Chain, shop: Any, relayer: Any) -> dict[str, Any]:
    section = usdcbase_section(topup_chain, shop)
    if "rpc_front" in request.fixturenames:  # the unknown-outcome tests: the shop's RPC endpoint may stall
        section.update(rpc_url=request.getfixturevalue("rpc_front").url, rpc_timeout_seconds=1)
    return {
        "coins": {"USDCBASE": section},
        "x402": {"settle": "on_ready"},
        "hypervisor": {"simulator": {"boot_seconds": 0}},
        "servers": {"boot_timeout_seconds": 600},
    }


def order_with_official_client(served: Served, topup_chain: Chain, payer: Any, body: Any, auth: Any) -> httpx.Response:
    """``POST /servers`` by the PyPI ``x402HttpxClient`` (v2), unmodified apart from its spend limits."""
    from x402 import x402Client
    from x402.http.clients import x402HttpxClient
    from x402.mechanisms.evm.exact import ExactEvmClientScheme

    client = x402Client()
    client.set_spend_controls({"allowed_assets": [{"network": "eip155:8453", "asset": topup_chain.asset}]})
    client.register("eip155:8453", ExactEvmClientScheme(payer))

    async def order() -> httpx.Response:
        async with x402HttpxClient(client, timeout=60, headers=auth) as paying:
            return await paying.post(f"{served.base}/servers", json=body)

    return asyncio.run(order())


def paid_order(
    served: Served, topup_chain: Chain, http: httpx.Client, auth: Any, body: Any = None, eth_wei: int = 0
) -> tuple[Any, Any, httpx.Response]:
    """An order paid by a new payer holding :data:`FUNDS` through the official client: (body, payer, the
    201, whose payment is held)."""
    body = body or order_body(http)
    payer = topup_chain.new_account(usdc=FUNDS, eth_wei=eth_wei)
    response = order_with_official_client(served, topup_chain, payer, body, auth)
    assert response.status_code == 201, response.text
    return body, payer, response


def record_of(ctx: Any, payer: str) -> tuple[X402Record, Topup]:
    from sqlmodel import select

    with ctx.db.session() as session:
        record = session.exec(select(X402Record).where(X402Record.payer == payer.lower())).one()
        topup = session.get(Topup, record.topup_id)
        assert topup is not None
        return record, topup


def ledger_reasons(ctx: Any, account_id: int) -> list[str]:
    from sqlmodel import select

    from vpsshop.models import LedgerEntry

    with ctx.db.session() as session:
        return list(session.exec(select(LedgerEntry.reason).where(LedgerEntry.account_id == account_id)).all())


def event_types(http: httpx.Client, auth: dict[str, str]) -> list[str]:
    return [e["type"] for e in http.get("/events", headers=auth).json()["events"]]


def test_payment_settles_once_when_the_server_is_ready(
    topup_chain: Chain, served: Served, http: httpx.Client, auth: dict[str, str], shop: Any, vpsshop_app: Any
) -> None:
    from x402.http.utils import decode_payment_response_header

    ctx = vpsshop_app.state.ctx
    body = order_body(http)
    price = price_of(http, body)
    paid_atomic = int(price * USDC_UNIT)
    asked = decode_header(http.post("/servers", json=body, headers=auth).headers["PAYMENT-REQUIRED"])
    # the authorization outlives the boot: boot_timeout_seconds (600) + 600
    assert asked["accepts"][0]["maxTimeoutSeconds"] == 1200

    _body, payer, response = paid_order(served, topup_chain, http, auth, body)
    assert response.json()["server"]["status"] == "provisioning"
    held = decode_payment_response_header(response.headers["PAYMENT-RESPONSE"])
    assert held.success and held.payer == payer.address and held.transaction == ""
    assert held.extensions == {"settlement": {"status": "held", "settlesWhen": "server_ready"}}
    # verified, held: nothing moved on chain, the order was charged from the held credit
    assert topup_chain.usdc(payer.address) == FUNDS and topup_chain.usdc(shop.address) == 0
    record, topup = record_of(ctx, payer.address)
    assert record.status == "held" and topup.status == "pending" and not topup_chain.used(payer.address, record.nonce)
    assert balance(http, auth) == 0
    # the same paid request re-sent while the payment is held: the same order, the same held answer
    replay = http.post("/servers", json=body, headers={**auth, "PAYMENT-SIGNATURE": record.header})
    assert replay.status_code == 201 and replay.json()["server"]["id"] == response.json()["server"]["id"]
    assert decode_header(replay.headers["PAYMENT-RESPONSE"]) == decode_header(response.headers["PAYMENT-RESPONSE"])

    assert asyncio.run(run_jobs(ctx))["done"] == 1  # the worker's provisioning job: ready, then settled
    [server] = servers(http, auth)
    assert server["status"] == "active" and server["ready_at"]
    assert topup_chain.usdc(payer.address) == FUNDS - paid_atomic
    assert topup_chain.usdc(shop.address) == paid_atomic
    record, topup = record_of(ctx, payer.address)
    assert record.status == "settled" and record.transaction and topup.status == "completed"
    receipt = topup_chain.w3.eth.get_transaction_receipt(record.transaction)
    assert receipt["status"] == 1
    assert balance(http, auth) == 0

    # once: another pass, another worker's sweep, the same paid request re-sent
    asyncio.run(run_jobs(ctx))
    asyncio.run(settle_ready_holds(ctx))
    from vpsshop.x402.settlement import settle_held

    assert record.id is not None and asyncio.run(settle_held(ctx, record.id)) is None
    again = http.post("/servers", json=body, headers={**auth, "PAYMENT-SIGNATURE": record.header})
    assert again.status_code == 201 and again.json()["server"]["id"] == server["id"], again.text
    settled = decode_payment_response_header(again.headers["PAYMENT-RESPONSE"])  # now the settled transaction
    assert settled.success and settled.transaction == record.transaction and not settled.extensions
    assert topup_chain.usdc(payer.address) == FUNDS - paid_atomic and topup_chain.usdc(shop.address) == paid_atomic
    assert balance(http, auth) == 0 and len(servers(http, auth)) == 1
    assert "server.active" in event_types(http, auth) and "server.payment_failed" not in event_types(http, auth)


def test_a_boot_that_never_completes_settles_nothing(
    topup_chain: Chain,
    served: Served,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = vpsshop_app.state.ctx

    async def never_reports(handle: Any, wait_seconds: float) -> None:
        return None  # the guest never says its boot finished

    monkeypatch.setattr(ctx.hypervisor, "guest_report", never_reports)
    _body, payer, response = paid_order(served, topup_chain, http, auth)
    server_id = response.json()["server"]["id"]
    assert asyncio.run(run_jobs(ctx))["retry"] == 1
    for _ in range(ctx.settings.servers.provision_attempts):
        ctx.clock.advance(hours=2)  # past boot_timeout_seconds and every retry's back-off
        asyncio.run(run_jobs(ctx))
    [server] = servers(http, auth)
    assert server["id"] == server_id and server["status"] == "terminated", server
    assert "has not reported a finished boot" in server["status_reason"]
    # the payer's USDC never moved; the shop holds none; the authorization was never used on chain
    assert topup_chain.usdc(payer.address) == FUNDS and topup_chain.usdc(shop.address) == 0
    record, topup = record_of(ctx, payer.address)
    assert record.status == "rejected" and record.error == "server_not_ready" and topup.status == "cancelled"
    assert not topup_chain.used(payer.address, record.nonce)
    # not billed: the order's charge refunded, the held credit taken back
    assert balance(http, auth) == 0
    assert sorted(ledger_reasons(ctx, topup.account_id)) == ["order", "refund", "reversal", "topup"]
    asyncio.run(settle_ready_holds(ctx))
    assert topup_chain.usdc(payer.address) == FUNDS


def test_a_settlement_refused_at_readiness_terminates_the_server(
    topup_chain: Chain, served: Served, http: httpx.Client, auth: dict[str, str], shop: Any, vpsshop_app: Any
) -> None:
    from eth_account import Account

    ctx = vpsshop_app.state.ctx
    _body, payer, _response = paid_order(served, topup_chain, http, auth, eth_wei=10**18)
    assert topup_chain.usdc(payer.address) == FUNDS

    # before the server is ready, the payer moves its USDC away
    elsewhere = Account.create().address
    tx = topup_chain.token.functions.transfer(elsewhere, FUNDS).build_transaction(
        {
            "from": payer.address,
            "nonce": topup_chain.w3.eth.get_transaction_count(payer.address),
            "gas": 100_000,
            "gasPrice": topup_chain.w3.eth.gas_price,
            "chainId": topup_chain.w3.eth.chain_id,
        }
    )
    sent = topup_chain.w3.eth.send_raw_transaction(payer.sign_transaction(tx).raw_transaction)
    assert topup_chain.w3.eth.wait_for_transaction_receipt(sent, timeout=30)["status"] == 1

    asyncio.run(run_jobs(ctx))  # ready: the settlement is refused
    [server] = servers(http, auth)
    assert server["status"] == "terminated" and "insufficient_funds" in server["status_reason"], server
    assert "server.payment_failed" in event_types(http, auth)
    record, topup = record_of(ctx, payer.address)
    assert record.status == "rejected" and record.error == "insufficient_funds" and topup.status == "cancelled"
    assert topup_chain.usdc(shop.address) == 0 and topup_chain.usdc(elsewhere) == FUNDS
    assert balance(http, auth) == Decimal(0)
    assert sorted(ledger_reasons(ctx, topup.account_id)) == ["order", "refund", "reversal", "topup"]
    asyncio.run(run_jobs(ctx))  # the clean-up; nothing is settled or charged again
    asyncio.run(settle_ready_holds(ctx))
    assert topup_chain.usdc(shop.address) == 0 and balance(http, auth) == 0
    assert event_types(http, auth).count("server.payment_failed") == 1


def test_a_first_boot_with_errors_settles_nothing_and_a_short_authorization_is_refused(
    topup_chain: Chain,
    served: Served,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    from test_server_readiness import GuestSays, _report
    from x402_peers import sign_v1_header

    ctx = vpsshop_app.state.ctx
    body = order_body(http)
    payer = topup_chain.new_account(usdc=FUNDS)
    req = http.post("/servers", json=body, headers=auth).json()["accepts"][0]
    # valid for 300 s only: it could expire before the boot is done, so nothing is held
    short = sign_v1_header(payer, req, validBefore=str(int(time.time()) + 300))
    refused = http.post("/servers", json=body, headers={**auth, "X-PAYMENT": short})
    assert refused.status_code == 402 and refused.json()["error"] == "authorization_expired", refused.text
    assert servers(http, auth) == [] and balance(http, auth) == 0

    monkeypatch.setattr(ctx.hypervisor, "guest_report", GuestSays(_report(errors=["cloud-init failed"])))
    ordered = http.post("/servers", json=body, headers={**auth, "X-PAYMENT": sign_v1_header(payer, req)})
    assert ordered.status_code == 201, ordered.text
    held = decode_header(ordered.headers["X-PAYMENT-RESPONSE"])
    assert (
        held["success"] is True and held["transaction"] == "" and held["extensions"]["settlement"]["status"] == "held"
    )
    asyncio.run(run_jobs(ctx))
    [server] = servers(http, auth)
    assert server["status"] == "terminated", server
    assert topup_chain.usdc(payer.address) == FUNDS and topup_chain.usdc(shop.address) == 0
    record, topup = record_of(ctx, payer.address)
    assert record.status == "rejected" and record.error == "server_not_ready" and topup.status == "cancelled"
    assert balance(http, auth) == 0
    assert sorted(ledger_reasons(ctx, topup.account_id)) == ["order", "refund", "reversal", "topup"]


# ---- the settlement's outcome at readiness is unknown: the chain decides -------------------------


def settle_at_readiness_with_unknown_outcome(ctx: Any, rpc_front: StallingRpcFront, reaches_chain: bool) -> None:
    """The provisioning job makes the server ready and sends its settlement, whose answer never comes:
    the node times out (after forwarding the transaction to the chain, or swallowing it)."""
    rpc_front.stall, rpc_front.forward_when_stalling = {"eth_sendRawTransaction"}, reaches_chain
    try:
        assert asyncio.run(run_jobs(ctx))["done"] == 1
    finally:
        rpc_front.stall = set()


def valid_before(header: str) -> datetime:
    seconds = json.loads(base64.b64decode(header))["payload"]["authorization"]["validBefore"]
    return datetime.fromtimestamp(int(seconds), UTC)


def test_an_unknown_outcome_at_readiness_never_settled_ends_like_a_refused_settlement(
    topup_chain: Chain,
    served: Served,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
    vpsshop_clock: Any,
    rpc_front: StallingRpcFront,
) -> None:
    from vpsshop.x402.settlement import SETTLE_GRACE

    ctx = vpsshop_app.state.ctx
    body = order_body(http)
    credit(vpsshop_app, auth, http, str(price_of(http, body) / 2))  # x402 pays the other half
    before = balance(http, auth)
    _body, payer, response = paid_order(served, topup_chain, http, auth, body)
    server_id = response.json()["server"]["id"]
    assert balance(http, auth) == 0

    settle_at_readiness_with_unknown_outcome(ctx, rpc_front, reaches_chain=False)
    record, topup = record_of(ctx, payer.address)
    assert record.status == "settling" and record.error == "outcome_unknown" and topup.status == "pending"
    assert not topup_chain.used(payer.address, record.nonce)
    [server] = servers(http, auth)
    assert server["status"] == "active"
    # while the authorization may still be mined, nothing is decided; a replay reports it held
    assert run_watcher(vpsshop_app) == 0
    assert record_of(ctx, payer.address)[0].status == "settling" and servers(http, auth)[0]["status"] == "active"
    replay = http.post("/servers", json=body, headers={**auth, "PAYMENT-SIGNATURE": record.header})
    assert replay.status_code == 201 and replay.json()["server"]["id"] == server_id, replay.text
    assert decode_header(replay.headers["PAYMENT-RESPONSE"]) == decode_header(response.headers["PAYMENT-RESPONSE"])

    # validBefore passes with the nonce unused: two workers' passes at once end it once
    vpsshop_clock.set(valid_before(record.header) + SETTLE_GRACE * 2)
    with ThreadPoolExecutor(2) as workers:
        assert list(workers.map(run_watcher, [vpsshop_app, vpsshop_app])) == [0, 0]
    [server] = servers(http, auth)
    assert server["id"] == server_id and server["status"] == "terminated", server
    assert "not_settled" in server["status_reason"]
    record, topup = record_of(ctx, payer.address)
    assert record.status == "rejected" and record.error == "not_settled" and topup.status == "cancelled"
    assert balance(http, auth) == before
    assert sorted(ledger_reasons(ctx, topup.account_id)) == ["admin_credit", "order", "refund", "reversal", "topup"]
    assert event_types(http, auth).count("server.payment_failed") == 1
    assert topup_chain.usdc(payer.address) == FUNDS and topup_chain.usdc(shop.address) == 0
    assert not topup_chain.used(payer.address, record.nonce)

    # later passes, the lifecycle's sweep and a replay change nothing; the replay reports no payment
    assert run_watcher(vpsshop_app) == 0
    asyncio.run(run_jobs(ctx))
    asyncio.run(settle_ready_holds(ctx))
    replay = http.post("/servers", json=body, headers={**auth, "PAYMENT-SIGNATURE": record.header})
    assert replay.status_code == 201 and replay.json()["server"]["status"] == "terminated", replay.text
    assert "PAYMENT-RESPONSE" not in replay.headers
    assert balance(http, auth) == before and event_types(http, auth).count("server.payment_failed") == 1
    assert sorted(ledger_reasons(ctx, topup.account_id)) == ["admin_credit", "order", "refund", "reversal", "topup"]


def test_an_unknown_outcome_at_readiness_settled_late_is_a_settled_order(
    topup_chain: Chain,
    served: Served,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
    vpsshop_clock: Any,
    rpc_front: StallingRpcFront,
) -> None:
    from x402.http.utils import decode_payment_response_header

    from vpsshop.x402.settlement import SETTLE_GRACE

    ctx = vpsshop_app.state.ctx
    body, payer, response = paid_order(served, topup_chain, http, auth)
    paid_atomic = int(price_of(http, body) * USDC_UNIT)
    settle_at_readiness_with_unknown_outcome(ctx, rpc_front, reaches_chain=True)
    record, _topup = record_of(ctx, payer.address)
    assert record.status == "settling" and record.error == "outcome_unknown"
    wait_until(lambda: topup_chain.used(payer.address, record.nonce), what="the settlement to be mined")

    assert run_watcher(vpsshop_app) == 1
    record, topup = record_of(ctx, payer.address)
    assert record.status == "settled" and record.transaction and topup.status == "completed"
    assert topup_chain.usdc(shop.address) == paid_atomic and topup_chain.usdc(payer.address) == FUNDS - paid_atomic
    # the credit held for the order is kept (never credited twice), the server runs on a paid order
    assert balance(http, auth) == 0
    assert sorted(ledger_reasons(ctx, topup.account_id)) == ["order", "topup"]
    vpsshop_clock.set(valid_before(record.header) + SETTLE_GRACE * 2)
    assert run_watcher(vpsshop_app) == 0
    asyncio.run(run_jobs(ctx))
    asyncio.run(settle_ready_holds(ctx))
    [server] = servers(http, auth)
    assert server["status"] == "active" and server["id"] == response.json()["server"]["id"]
    assert record_of(ctx, payer.address)[0].status == "settled" and balance(http, auth) == 0
    assert "server.payment_failed" not in event_types(http, auth)
    again = http.post("/servers", json=body, headers={**auth, "PAYMENT-SIGNATURE": record.header})
    assert again.status_code == 201 and again.json()["server"]["id"] == server["id"], again.text
    settled = decode_payment_response_header(again.headers["PAYMENT-RESPONSE"])
    assert settled.success and settled.transaction == record.transaction and not settled.extensions
