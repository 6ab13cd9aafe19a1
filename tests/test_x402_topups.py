"""x402 top-ups end to end: core's ``POST /v1/topups`` with the real USDCBASE plugin on anvil.

Nothing here is a double: vpsshop runs under uvicorn on a loopback port with ``[coins.USDCBASE]``
in direct mode (settings, relayer key from an environment variable), the chain is anvil with the
EIP-3009 test USDC (tests/x402_peers.py), and the payments are signed by the PyPI ``x402`` clients
from the 402 the API answered. Every test runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from x402_peers import USDC_UNIT, Chain, StallingRpcFront, free_port, sign_v1_header, start_chain, wait_until

pytestmark = pytest.mark.slow

ETH = 10**18
RELAYER_ENV = "TEST_X402_TOPUPS_RELAYER_KEY"


@pytest.fixture(scope="session")
def topup_chain() -> Iterator[Chain]:
    work = Path(tempfile.mkdtemp(prefix="vpsshop-x402-topups-"))  # private: /tmp/pytest-of-* is shared
    started = start_chain(work)
    try:
        yield started
    finally:
        started.anvil.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def shop(topup_chain: Chain) -> Any:
    return topup_chain.new_account()


@pytest.fixture
def relayer(topup_chain: Chain, monkeypatch: pytest.MonkeyPatch) -> Any:
    account = topup_chain.new_account(eth_wei=10 * ETH)
    monkeypatch.setenv(RELAYER_ENV, account.key.hex())
    return account


@pytest.fixture
def rpc_front(topup_chain: Chain) -> Iterator[StallingRpcFront]:
    """The RPC endpoint the shop uses in the unknown-outcome tests (forwards to anvil until told to stall)."""
    front = StallingRpcFront(topup_chain.url, stall_seconds=4)
    try:
        yield front
    finally:
        front.stop()


def usdcbase_section(topup_chain: Chain, shop: Any) -> dict[str, Any]:
    """``[coins.USDCBASE]`` in direct mode on anvil, its relayer key from :data:`RELAYER_ENV`."""
    return {
        "network": "base",
        "mode": "direct",
        "pay_to": shop.address,
        "asset": topup_chain.asset,
        "rpc_url": topup_chain.url,
        "relayer_key_env": RELAYER_ENV,
        "max_timeout_seconds": 120,
        "facilitator_url": None,
    }


@pytest.fixture
def vpsshop_overrides(request: pytest.FixtureRequest, topup_chain: Chain, shop: Any, relayer: Any) -> dict[str, Any]:
    section = usdcbase_section(topup_chain, shop)
    if "rpc_front" in request.fixturenames:  # the unknown-outcome tests
        section.update(rpc_url=request.getfixturevalue("rpc_front").url, rpc_timeout_seconds=1)
    return {"coins": {"USDCBASE": section}}


class Served:
    """vpsshop under uvicorn on a loopback port."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        import uvicorn

        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(vpsshop_app: Any) -> Iterator[Served]:
    server = Served(vpsshop_app)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.base, timeout=60) as client:
        yield client


@pytest.fixture
def auth(http: httpx.Client) -> dict[str, str]:
    created = http.post("/account")
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['api_key']}"}


def balance(http: httpx.Client, auth: dict[str, str]) -> Decimal:
    return Decimal(str(http.get("/account", headers=auth).json()["balance_usd"]))


def decode_header(value: str) -> dict[str, Any]:
    return json.loads(base64.b64decode(value))


def ask_402(http: httpx.Client, auth: dict[str, str], amount: int = 25) -> dict[str, Any]:
    first = http.post("/topups", json={"amount": amount, "coin": "USDCBASE"}, headers=auth)
    assert first.status_code == 402, first.text
    return first.json()


def test_usdcbase_topup_settles_on_chain_and_credits_once(
    topup_chain: Chain, http: httpx.Client, auth: dict[str, str], shop: Any, served: Served
) -> None:
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    body = ask_402(http, auth)
    assert body["x402Version"] == 1 and body["error"]
    [req] = body["accepts"]
    assert req["scheme"] == "exact" and req["network"] == "base" and req["maxAmountRequired"] == str(25 * USDC_UNIT)
    assert req["payTo"] == shop.address and req["asset"] == topup_chain.asset
    assert req["resource"].endswith("/v1/topups") and req["extra"] == {"name": "USD Coin", "version": "2"}

    header = sign_v1_header(payer, req)  # the PyPI x402 v1 client signs what the API asked for
    paid = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert paid.status_code == 201, paid.text
    topup = paid.json()
    assert topup["status"] == "completed" and topup["coin"] == "USDCBASE" and topup["payment_status"] == "confirmed"
    assert Decimal(str(topup["credited_usd"])) == 25 and topup["deposit_address"] == shop.address
    response = decode_header(paid.headers["X-PAYMENT-RESPONSE"])
    assert response["success"] is True and response["network"] == "base" and response["payer"] == payer.address
    receipt = topup_chain.w3.eth.get_transaction_receipt(response["transaction"])
    assert receipt["status"] == 1
    from x402.http.utils import decode_payment_response_header

    assert decode_payment_response_header(paid.headers["X-PAYMENT-RESPONSE"]).transaction == response["transaction"]

    assert balance(http, auth) == 25
    assert topup_chain.usdc(payer.address) == 75 * USDC_UNIT and topup_chain.usdc(shop.address) == 25 * USDC_UNIT
    got = http.get(f"/topups/{topup['ref']}", headers=auth)
    assert got.status_code == 200 and got.json()["status"] == "completed"

    again = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert again.status_code == 201, again.text
    assert again.json()["ref"] == topup["ref"] and again.json()["status"] == "completed"
    replayed = decode_header(again.headers["X-PAYMENT-RESPONSE"])
    assert replayed["transaction"] == response["transaction"]
    assert replayed["payer"] == payer.address == response["payer"]  # checksummed, as in the first answer
    assert balance(http, auth) == 25
    assert topup_chain.usdc(payer.address) == 75 * USDC_UNIT and topup_chain.usdc(shop.address) == 25 * USDC_UNIT

    # another account replaying the header gets nothing
    other = {"Authorization": f"Bearer {http.post('/account').json()['api_key']}"}
    stolen = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**other, "X-PAYMENT": header})
    assert stolen.status_code == 409 and stolen.json()["error"] == "nonce_used"
    assert balance(http, other) == 0 and balance(http, auth) == 25


def test_same_header_sent_twice_at_once_credits_once(
    topup_chain: Chain, http: httpx.Client, auth: dict[str, str], shop: Any, served: Served
) -> None:
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    header = sign_v1_header(payer, ask_402(http, auth, 30)["accepts"][0])

    def send(_: int) -> httpx.Response:
        with httpx.Client(base_url=served.base, timeout=60) as own:
            return own.post("/topups", json={"amount": 30, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(send, range(2)))
    # one settles; the other waits for that settlement (it used to answer 503 settlement_pending) and
    # answers the same completed top-up
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    assert len({a.json()["ref"] for a in answers}) == 1
    assert balance(http, auth) == 30
    assert topup_chain.usdc(payer.address) == 70 * USDC_UNIT and topup_chain.usdc(shop.address) == 30 * USDC_UNIT
    # a retry after both answered returns the completed top-up and still credits nothing more
    retry = http.post("/topups", json={"amount": 30, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert retry.status_code == 201 and retry.json()["status"] == "completed"
    assert balance(http, auth) == 30


def test_wrong_amount_is_refused_and_moves_nothing(
    topup_chain: Chain, http: httpx.Client, auth: dict[str, str], shop: Any
) -> None:
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    req = ask_402(http, auth, 25)["accepts"][0]
    # a valid signature over the 25 USDC requirements, sent for a 40 USD top-up
    header = sign_v1_header(payer, req)
    refused = http.post("/topups", json={"amount": 40, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert refused.status_code in (400, 402), refused.text
    assert refused.json()["error"] == "wrong_amount" and refused.json()["message"]
    # a signature whose value differs from what was asked for
    cheaper = sign_v1_header(payer, {**req, "maxAmountRequired": str(1 * USDC_UNIT)})
    refused = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": cheaper})
    assert refused.status_code in (400, 402) and refused.json()["error"] == "wrong_amount", refused.text
    assert balance(http, auth) == 0
    assert topup_chain.usdc(payer.address) == 100 * USDC_UNIT and topup_chain.usdc(shop.address) == 0
    garbage = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": "%%%"})
    assert garbage.status_code == 400 and garbage.json()["error"] == "invalid_payment"


# ---- unknown outcome: the record stays open until the authorization can no longer be used ------


def run_watcher(app: Any) -> int:
    """One pass over the open x402 records (what the ``x402-settlements`` background task runs)."""
    from vpsshop.x402.hooks import settlement_task

    task = settlement_task(app.state.ctx)
    assert task is not None
    return asyncio.run(task.run())["credited"]


def send_unknown_outcome(
    app: Any, http: httpx.Client, auth: dict[str, str], rpc_front: StallingRpcFront, header: str
) -> str:
    """Re-send with X-PAYMENT while the RPC endpoint swallows the transaction: 503, record open."""
    rpc_front.stall, rpc_front.forward_when_stalling = {"eth_sendRawTransaction"}, False
    try:
        lost = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    finally:
        rpc_front.stall = set()
    assert lost.status_code == 503 and lost.json()["error"] == "settlement_pending", lost.text
    # the 503 carries no ref (the client retries the same header); the test reads it from the database
    from sqlmodel import select

    from vpsshop.payments.models import Topup, X402Record

    with app.state.ctx.db.session() as session:
        [(ref, status)] = session.exec(
            select(Topup.ref, X402Record.status)
            .join(  # type: ignore[call-overload]
                X402Record, X402Record.topup_id == Topup.id
            )
            .where(Topup.status == "pending")
        ).all()
    assert status == "settling"
    return str(ref)


def test_open_record_outlives_abandon_after_while_the_authorization_is_valid(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    rpc_front: StallingRpcFront,
    vpsshop_app: Any,
    vpsshop_clock: Any,
) -> None:
    """An authorization valid for 3 hours whose transaction was lost stays open past 30 minutes; when
    someone else gets it mined later, the watcher credits it (once)."""
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    req = ask_402(http, auth)["accepts"][0]
    header = sign_v1_header(payer, req, validBefore=str(int(time.time()) + 3 * 3600))
    ref = send_unknown_outcome(vpsshop_app, http, auth, rpc_front, header)
    assert topup_chain.usdc(shop.address) == 0  # the shop's transaction never reached the chain

    vpsshop_clock.advance(minutes=45)
    assert run_watcher(vpsshop_app) == 0
    pending = http.get(f"/topups/{ref}", headers=auth).json()
    assert pending["status"] == "pending" and pending["payment_status"] == "seen"  # not expired
    cancel = http.post(f"/topups/{ref}/cancel", headers=auth)
    assert cancel.status_code == 409 and cancel.json()["error"] == "payment_in_progress", cancel.text

    # a third party submits the customer's signed authorization: the USDC reaches pay_to
    raw = json.loads(base64.b64decode(header))
    authorization, sig = raw["payload"]["authorization"], bytes.fromhex(raw["payload"]["signature"][2:])
    tx = topup_chain.token.functions.transferWithAuthorization(
        authorization["from"],
        authorization["to"],
        int(authorization["value"]),
        int(authorization["validAfter"]),
        int(authorization["validBefore"]),
        bytes.fromhex(authorization["nonce"][2:]),
        sig[64],
        sig[:32],
        sig[32:64],
    ).transact({"from": topup_chain.deployer})
    assert topup_chain.w3.eth.wait_for_transaction_receipt(tx, timeout=30)["status"] == 1
    wait_until(lambda: topup_chain.used(payer.address, authorization["nonce"]), what="the authorization to be used")

    assert run_watcher(vpsshop_app) == 1
    assert run_watcher(vpsshop_app) == 0
    done = http.get(f"/topups/{ref}", headers=auth).json()
    assert done["status"] == "completed" and Decimal(str(done["credited_usd"])) == 25
    assert balance(http, auth) == 25
    assert topup_chain.usdc(payer.address) == 75 * USDC_UNIT and topup_chain.usdc(shop.address) == 25 * USDC_UNIT
    again = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert again.status_code == 201 and again.json()["ref"] == ref and balance(http, auth) == 25


def test_open_record_is_closed_only_after_valid_before(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    rpc_front: StallingRpcFront,
    vpsshop_app: Any,
    vpsshop_clock: Any,
) -> None:
    from vpsshop.x402.settlement import SETTLE_GRACE

    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    header = sign_v1_header(payer, ask_402(http, auth)["accepts"][0])  # validBefore = now + 120 s
    valid_before = int(json.loads(base64.b64decode(header))["payload"]["authorization"]["validBefore"])
    ref = send_unknown_outcome(vpsshop_app, http, auth, rpc_front, header)

    assert run_watcher(vpsshop_app) == 0
    assert http.get(f"/topups/{ref}", headers=auth).json()["status"] == "pending"
    retry = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert retry.status_code == 503 and retry.json()["error"] == "settlement_pending"  # still usable: not closed

    from datetime import datetime

    vpsshop_clock.set(datetime.fromtimestamp(valid_before, UTC) + SETTLE_GRACE / 2)
    assert run_watcher(vpsshop_app) == 0
    assert http.get(f"/topups/{ref}", headers=auth).json()["status"] == "pending"  # blocks may still come

    vpsshop_clock.set(datetime.fromtimestamp(valid_before, UTC) + SETTLE_GRACE * 2)
    assert run_watcher(vpsshop_app) == 0
    closed = http.get(f"/topups/{ref}", headers=auth).json()
    assert closed["status"] == "cancelled" and closed["payment_status"] == "awaiting_payment"
    refused = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert refused.status_code == 402 and refused.json()["error"] == "nonce_used", refused.text
    assert balance(http, auth) == 0
    assert topup_chain.usdc(payer.address) == 100 * USDC_UNIT and topup_chain.usdc(shop.address) == 0


def test_retry_after_valid_before_closes_the_record(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    rpc_front: StallingRpcFront,
    vpsshop_app: Any,
    vpsshop_clock: Any,
) -> None:
    from vpsshop.x402.settlement import SETTLE_GRACE

    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    header = sign_v1_header(payer, ask_402(http, auth)["accepts"][0])
    valid_before = int(json.loads(base64.b64decode(header))["payload"]["authorization"]["validBefore"])
    ref = send_unknown_outcome(vpsshop_app, http, auth, rpc_front, header)
    from datetime import datetime

    vpsshop_clock.set(datetime.fromtimestamp(valid_before, UTC) + SETTLE_GRACE * 2)
    expired = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert expired.status_code == 402 and expired.json()["error"] == "authorization_expired", expired.text
    assert http.get(f"/topups/{ref}", headers=auth).json()["status"] == "cancelled"
    assert balance(http, auth) == 0 and topup_chain.usdc(shop.address) == 0


# ---- x402 v2: PAYMENT-REQUIRED, PAYMENT-SIGNATURE, PAYMENT-RESPONSE ---------------------------


def test_402_carries_the_v2_requirements_header(
    http: httpx.Client, auth: dict[str, str], shop: Any, topup_chain: Chain
) -> None:
    first = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers=auth)
    assert first.status_code == 402 and first.json()["x402Version"] == 1  # the body stays v1
    from x402.http.utils import decode_payment_required_header

    required = decode_header(first.headers["PAYMENT-REQUIRED"])
    assert required["x402Version"] == 2 and required["error"]
    v1 = first.json()["accepts"][0]
    assert required["resource"] == {
        "url": v1["resource"],
        "description": v1["description"],
        "mimeType": "application/json",
    }
    assert required["accepts"] == [
        {
            "scheme": "exact",
            "network": "eip155:8453",
            "amount": str(25 * USDC_UNIT),
            "asset": topup_chain.asset,
            "payTo": shop.address,
            "maxTimeoutSeconds": 120,
            "extra": {"name": "USD Coin", "version": "2"},
        }
    ]
    parsed = decode_payment_required_header(first.headers["PAYMENT-REQUIRED"])  # the x402 package reads it
    assert parsed.x402_version == 2 and parsed.accepts[0].amount == str(25 * USDC_UNIT)


def test_v2_payment_signature_settles_and_credits_once(
    topup_chain: Chain, http: httpx.Client, auth: dict[str, str], shop: Any
) -> None:
    from x402_peers import sign_v2_header

    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    first = http.post("/topups", json={"amount": 40, "coin": "USDCBASE"}, headers=auth)
    required = decode_header(first.headers["PAYMENT-REQUIRED"])
    signature = sign_v2_header(payer, required["accepts"][0], required["resource"]["url"])
    paid = http.post(
        "/topups", json={"amount": 40, "coin": "USDCBASE"}, headers={**auth, "PAYMENT-SIGNATURE": signature}
    )
    assert paid.status_code == 201, paid.text
    assert paid.json()["status"] == "completed" and "X-PAYMENT-RESPONSE" not in paid.headers
    response = decode_header(paid.headers["PAYMENT-RESPONSE"])
    assert response["success"] is True and response["network"] == "eip155:8453" and response["payer"] == payer.address
    assert response["amount"] == str(40 * USDC_UNIT)
    assert topup_chain.w3.eth.get_transaction_receipt(response["transaction"])["status"] == 1
    assert balance(http, auth) == 40
    assert topup_chain.usdc(payer.address) == 60 * USDC_UNIT and topup_chain.usdc(shop.address) == 40 * USDC_UNIT

    again = http.post(
        "/topups", json={"amount": 40, "coin": "USDCBASE"}, headers={**auth, "PAYMENT-SIGNATURE": signature}
    )
    assert again.status_code == 201 and again.json()["ref"] == paid.json()["ref"]
    assert decode_header(again.headers["PAYMENT-RESPONSE"])["transaction"] == response["transaction"]
    assert balance(http, auth) == 40 and topup_chain.usdc(shop.address) == 40 * USDC_UNIT

    # v2 signed for 40 USD, sent for a 25 USD top-up: refused, nothing moves
    other = topup_chain.new_account(usdc=100 * USDC_UNIT)
    wrong = sign_v2_header(other, required["accepts"][0], required["resource"]["url"])
    refused = http.post(
        "/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "PAYMENT-SIGNATURE": wrong}
    )
    assert refused.status_code in (400, 402) and refused.json()["error"] in ("wrong_amount", "wrong_asset"), (
        refused.text
    )
    both = http.post(
        "/topups",
        json={"amount": 40, "coin": "USDCBASE"},
        headers={**auth, "PAYMENT-SIGNATURE": wrong, "X-PAYMENT": wrong},
    )
    assert both.status_code == 400 and both.json()["error"] == "invalid_payment"
    assert balance(http, auth) == 40 and topup_chain.usdc(other.address) == 100 * USDC_UNIT


def test_x402_httpx_client_pays_the_topup_in_v2(
    topup_chain: Chain, served: Served, auth: dict[str, str], http: httpx.Client, shop: Any
) -> None:
    """The PyPI ``x402HttpxClient`` answers the API's 402 by itself, in v2 from PAYMENT-REQUIRED.

    (This client prefers the header whenever it is present: a client of this package that
    registered only the v1 scheme finds nothing to pay; real v1 clients read the body, see below.)
    """
    from x402 import x402Client
    from x402.http.clients import x402HttpxClient
    from x402.http.utils import decode_payment_response_header
    from x402.mechanisms.evm.exact import ExactEvmClientScheme
    from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1

    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    client = x402Client()
    client.set_spend_controls(
        {
            "allowed_assets": [
                {"network": "eip155:8453", "asset": topup_chain.asset},
                {"network": "base", "asset": topup_chain.asset},
            ]
        }
    )
    client.register("eip155:8453", ExactEvmClientScheme(payer))
    client.register_v1("base", ExactEvmSchemeV1(payer))

    async def pay() -> httpx.Response:
        async with x402HttpxClient(client, timeout=60, headers=auth) as paying:
            return await paying.post(f"{served.base}/topups", json={"amount": 25, "coin": "USDCBASE"})

    response = asyncio.run(pay())
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "completed" and "X-PAYMENT-RESPONSE" not in response.headers
    settled = decode_payment_response_header(response.headers["PAYMENT-RESPONSE"])
    assert settled.success and settled.payer == payer.address and settled.network == "eip155:8453"
    assert balance(http, auth) == 25
    assert topup_chain.usdc(payer.address) == 75 * USDC_UNIT and topup_chain.usdc(shop.address) == 25 * USDC_UNIT


def test_npm_x402_fetch_pays_the_topup_in_v1(
    topup_chain: Chain, served: Served, auth: dict[str, str], http: httpx.Client, shop: Any
) -> None:
    """npm ``x402-fetch`` (a v1 client) reads the 402 body and pays with X-PAYMENT, PAYMENT-REQUIRED or not."""
    from x402_peers import fetch_with_npm_client

    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    answer = fetch_with_npm_client(payer, f"{served.base}/topups", topup_chain.url, headers=auth)
    assert answer["status"] == 201, answer
    assert answer["body"]["status"] == "completed"
    settled = decode_header(answer["paymentResponse"])
    assert settled["success"] is True and settled["network"] == "base" and settled["payer"] == payer.address
    assert balance(http, auth) == 25
    assert topup_chain.usdc(payer.address) == 75 * USDC_UNIT and topup_chain.usdc(shop.address) == 25 * USDC_UNIT


def test_example_script_pays_through_the_api() -> None:
    """``examples/x402_anvil.py --api`` (docs/x402.md) runs end to end: it exits 1 if any step is off."""
    import subprocess
    import sys

    from x402_peers import ROOT, npm_bin

    npm_bin()  # anvil and solcjs on PATH for the script
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "x402_anvil.py"), "--api"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "POST /v1/topups: 402" in done.stdout and "re-send with X-PAYMENT: 201" in done.stdout
    assert "'balance_usd': 25.0" in done.stdout and "customer now holds 75.0 USDC, the shop 25.0 USDC" in done.stdout


def test_v2_payment_without_max_timeout_seconds_is_a_400_that_leaves_nothing(
    topup_chain: Chain, http: httpx.Client, auth: dict[str, str], shop: Any, vpsshop_app: Any
) -> None:
    """A PAYMENT-SIGNATURE whose ``accepted`` lacks ``maxTimeoutSeconds`` (or another required field)
    is malformed: 400 invalid_payment before anything is recorded, the same again, nothing moves."""
    from sqlmodel import select
    from x402_peers import sign_v2_header

    from vpsshop.payments.models import Topup, X402Record

    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    required = decode_header(
        http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers=auth).headers["PAYMENT-REQUIRED"]
    )
    signed = json.loads(base64.b64decode(sign_v2_header(payer, required["accepts"][0], required["resource"]["url"])))
    for field in ("maxTimeoutSeconds", "payTo"):
        broken = json.loads(json.dumps(signed))
        del broken["accepted"][field]
        header = base64.b64encode(json.dumps(broken).encode()).decode()
        for _ in range(2):
            answer = http.post(
                "/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "PAYMENT-SIGNATURE": header}
            )
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"] == "invalid_payment" and field in answer.json()["message"]
    with vpsshop_app.state.ctx.db.session() as session:
        assert session.exec(select(X402Record)).all() == [] and session.exec(select(Topup)).all() == []
    assert balance(http, auth) == 0 and topup_chain.usdc(payer.address) == 100 * USDC_UNIT


def test_x402_topup_402_has_a_message_and_a_bad_idempotency_key_is_a_400(
    http: httpx.Client, auth: dict[str, str], shop: Any
) -> None:
    first = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers=auth)
    assert first.status_code == 402 and "X-PAYMENT" in first.json()["message"], first.text
    bad = http.post(
        "/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "Idempotency-Key": "has spaces"}
    )
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_idempotency_key", bad.text
    bad = http.post(
        "/topups",
        json={"amount": 25, "coin": "USDCBASE"},
        headers={**auth, "Idempotency-Key": "has spaces", "X-PAYMENT": "e30="},
    )
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_idempotency_key", bad.text
