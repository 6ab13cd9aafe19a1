"""x402 pays an order or a renewal in one call-and-retry: ``POST /v1/servers`` and ``POST /v1/servers/{id}/renew``.

The shop runs under uvicorn with the real USDCBASE plugin in direct mode on anvil (the fixtures of
tests/test_x402_topups.py); payments are made by the three official clients: the PyPI ``x402`` v1
scheme, the PyPI ``x402HttpxClient`` (v2), and npm ``x402-fetch``. Every test runs on SQLite and
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import base64
import json
from decimal import Decimal
from typing import Any

import httpx
import pytest
from test_x402_topups import (  # noqa: F401 - fixtures
    Served,
    auth,
    balance,
    decode_header,
    http,
    relayer,
    served,
    shop,
    topup_chain,
    vpsshop_overrides,
)
from x402_peers import USDC_UNIT, Chain, sign_v1_header, sign_v2_header

pytestmark = pytest.mark.slow


def order_body(http: httpx.Client) -> dict[str, str]:
    catalog = http.get("/catalog").json()
    return {
        "plan": catalog["plans"][0]["id"],
        "location": catalog["locations"][0]["id"],
        "os": catalog["operating_systems"][0]["id"],
    }


def price_of(http: httpx.Client, body: dict[str, str]) -> Decimal:
    """The monthly price of ``body`` from the catalog's pricing table."""
    for row in http.get("/catalog").json()["pricing"]:
        if row["plan"] == body["plan"] and row["location"] == body["location"]:
            return Decimal(str(row["monthly_usd"]))
    raise AssertionError("no price")


def servers(http: httpx.Client, auth: dict[str, str]) -> list[dict[str, Any]]:
    return http.get("/servers", headers=auth).json()["servers"]


def credit(app: Any, auth: dict[str, str], http: httpx.Client, usd: str) -> None:
    from vpsshop import ledger
    from vpsshop.money import usd_to_micros

    account_id = http.get("/account", headers=auth).json()["user_id"]
    with app.state.ctx.db.session() as session:
        ledger.post(session, account_id, usd_to_micros(Decimal(usd)), "admin_credit", memo="test")


def active_server_paid_from_the_balance(http: httpx.Client, auth: dict[str, str], app: Any) -> tuple[int, Decimal]:
    """An order paid from a balance credited with exactly its price, made active as the provisioning job
    leaves it (no worker runs here): (its id, its price); the balance is 0 afterwards."""
    from vpsshop.models import Server

    body = order_body(http)
    price = price_of(http, body)
    credit(app, auth, http, str(price))
    ordered = http.post("/servers", json=body, headers=auth)
    assert ordered.status_code == 201, ordered.text
    server_id = ordered.json()["server"]["id"]
    with app.state.ctx.db.session() as session:
        server = session.get(Server, server_id)
        server.status, server.ip = "active", "192.0.2.10"
        session.add(server)
    return server_id, price


def test_short_balance_402_is_the_seed_body_plus_x402_requirements(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
) -> None:
    body = order_body(http)
    price = price_of(http, body)
    credit(vpsshop_app, auth, http, "1.25")
    short = http.post("/servers", json=body, headers=auth)
    assert short.status_code == 402, short.text
    answer = short.json()
    assert answer["error"] == "insufficient_balance" and "top up" in answer["message"]
    assert Decimal(str(answer["price"])) == price and Decimal(str(answer["balance"])) == Decimal("1.25")
    deficit = price - Decimal("1.25")
    assert Decimal(str(answer["deficit"])) == deficit
    assert answer["x402Version"] == 1
    [req] = answer["accepts"]
    assert req["maxAmountRequired"] == str(int(deficit * USDC_UNIT)) and req["payTo"] == shop.address
    assert req["resource"].endswith("/v1/servers") and req["network"] == "base"

    from x402.extensions.bazaar import validate_discovery_extension
    from x402.http.utils import decode_payment_required_header

    required = decode_payment_required_header(short.headers["PAYMENT-REQUIRED"])
    assert required.x402_version == 2 and required.accepts[0].amount == req["maxAmountRequired"]
    assert required.resource is not None and required.resource.url == req["resource"]
    extensions = decode_header(short.headers["PAYMENT-REQUIRED"])["extensions"]
    assert extensions["payment-identifier"]["info"] == {"required": False}
    bazaar = extensions["bazaar"]
    assert validate_discovery_extension(bazaar).valid, validate_discovery_extension(bazaar).errors
    assert bazaar["info"]["input"]["method"] == "POST" and set(bazaar["info"]["input"]["body"]) >= {"plan", "os"}
    assert "plan" in json.dumps(bazaar["schema"]["properties"]["input"]["properties"]["body"])
    assert balance(http, auth) == Decimal("1.25") and servers(http, auth) == []


def test_v1_client_orders_in_one_retry_and_the_payment_never_buys_twice(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
) -> None:
    body = order_body(http)
    price = price_of(http, body)
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    req = http.post("/servers", json=body, headers=auth).json()["accepts"][0]
    header = sign_v1_header(payer, req)
    paid = http.post("/servers", json=body, headers={**auth, "X-PAYMENT": header})
    assert paid.status_code == 201, paid.text
    server = paid.json()["server"]
    assert server["status"] == "provisioning" and paid.json()["root_password"]
    settled = decode_header(paid.headers["X-PAYMENT-RESPONSE"])
    assert settled["success"] is True and settled["payer"] == payer.address
    assert topup_chain.w3.eth.get_transaction_receipt(settled["transaction"])["status"] == 1
    assert balance(http, auth) == 0
    paid_atomic = int(price * USDC_UNIT)
    assert topup_chain.usdc(shop.address) == paid_atomic
    assert topup_chain.usdc(payer.address) == 100 * USDC_UNIT - paid_atomic

    # the same paid request again (a client retrying): the same order, nothing settled or charged
    again = http.post("/servers", json=body, headers={**auth, "X-PAYMENT": header})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert again.json()["server"]["id"] == server["id"]
    # like a replayed top-up, the replay reports the settlement (payer checksummed as the first time)
    assert decode_header(again.headers["X-PAYMENT-RESPONSE"]) == settled
    assert "X-PAYMENT-RESPONSE" in again.headers["Access-Control-Expose-Headers"]
    assert [s["id"] for s in servers(http, auth)] == [server["id"]]
    assert balance(http, auth) == 0 and topup_chain.usdc(shop.address) == paid_atomic
    # the same header sent to top up instead: the authorization is spoken for
    stolen = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
    assert stolen.status_code in (402, 409) and stolen.json()["error"] in ("nonce_used", "wrong_amount"), stolen.text
    assert balance(http, auth) == 0


def test_x402_httpx_client_orders_in_v2(
    topup_chain: Chain,
    served: Served,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
) -> None:
    """The PyPI ``x402HttpxClient`` pays the deficit from PAYMENT-REQUIRED and the order is placed."""
    from x402 import x402Client
    from x402.http.clients import x402HttpxClient
    from x402.http.utils import decode_payment_response_header
    from x402.mechanisms.evm.exact import ExactEvmClientScheme

    body = order_body(http)
    price = price_of(http, body)
    credit(vpsshop_app, auth, http, "2")
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    client = x402Client()
    client.set_spend_controls({"allowed_assets": [{"network": "eip155:8453", "asset": topup_chain.asset}]})
    client.register("eip155:8453", ExactEvmClientScheme(payer))

    async def order() -> httpx.Response:
        async with x402HttpxClient(client, timeout=60, headers=auth) as paying:
            return await paying.post(f"{served.base}/servers", json=body)

    response = asyncio.run(order())
    assert response.status_code == 201, response.text
    settled = decode_payment_response_header(response.headers["PAYMENT-RESPONSE"])
    assert settled.success and settled.payer == payer.address
    assert balance(http, auth) == 0
    assert topup_chain.usdc(shop.address) == int((price - 2) * USDC_UNIT)
    assert len(servers(http, auth)) == 1


def test_npm_x402_fetch_orders_in_v1(
    topup_chain: Chain,
    served: Served,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
) -> None:
    from x402_peers import fetch_with_npm_client

    body = order_body(http)
    price = price_of(http, body)
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    answer = fetch_with_npm_client(payer, f"{served.base}/servers", topup_chain.url, headers=auth, body=body)
    assert answer["status"] == 201, answer
    assert answer["body"]["server"]["status"] == "provisioning"
    assert decode_header(answer["paymentResponse"])["payer"] == payer.address
    assert balance(http, auth) == 0 and topup_chain.usdc(shop.address) == int(price * USDC_UNIT)
    assert len(servers(http, auth)) == 1


def test_payment_identifier_and_idempotency_key_map_onto_one_order(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
) -> None:
    body = order_body(http)
    price_atomic = int(price_of(http, body) * USDC_UNIT)
    first = http.post("/servers", json=body, headers=auth)
    required = decode_header(first.headers["PAYMENT-REQUIRED"])
    accepted, resource = required["accepts"][0], required["resource"]["url"]

    def with_identifier(header: str, identifier: str) -> str:
        payload = json.loads(base64.b64decode(header))
        payload["extensions"] = {"payment-identifier": {"info": {"required": False, "id": identifier}}}
        return base64.b64encode(json.dumps(payload).encode()).decode()

    payer, again_payer = (topup_chain.new_account(usdc=100 * USDC_UNIT) for _ in range(2))
    identifier = "pay_0123456789abcdef0123"
    paid = http.post(
        "/servers",
        json=body,
        headers={**auth, "PAYMENT-SIGNATURE": with_identifier(sign_v2_header(payer, accepted, resource), identifier)},
    )
    assert paid.status_code == 201, paid.text
    # the client signs a new authorization for its retry, with the same payment id: the same order
    retry = http.post(
        "/servers",
        json=body,
        headers={
            **auth,
            "PAYMENT-SIGNATURE": with_identifier(sign_v2_header(again_payer, accepted, resource), identifier),
        },
    )
    assert retry.status_code == 201 and retry.headers["Idempotent-Replayed"] == "true", retry.text
    assert retry.json()["server"]["id"] == paid.json()["server"]["id"]
    # the retry's own authorization moved nothing: the header reports the one that paid the order
    assert decode_header(retry.headers["PAYMENT-RESPONSE"]) == decode_header(paid.headers["PAYMENT-RESPONSE"])
    assert decode_header(retry.headers["PAYMENT-RESPONSE"])["payer"] == payer.address
    assert topup_chain.usdc(again_payer.address) == 100 * USDC_UNIT  # the second authorization was not settled
    bad = http.post(
        "/servers",
        json=body,
        headers={
            **auth,
            "PAYMENT-SIGNATURE": with_identifier(sign_v2_header(again_payer, accepted, resource), "short"),
        },
    )
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_payment"

    # Idempotency-Key: a paid order, then a retry with a fresh authorization and the same key
    keyed = {**auth, "Idempotency-Key": "agent-order-1"}
    req = http.post("/servers", json=body, headers=keyed).json()["accepts"][0]
    one = http.post("/servers", json=body, headers={**keyed, "X-PAYMENT": sign_v1_header(payer, req)})
    assert one.status_code == 201, one.text
    two = http.post("/servers", json=body, headers={**keyed, "X-PAYMENT": sign_v1_header(again_payer, req)})
    assert two.status_code == 201 and two.json()["server"]["id"] == one.json()["server"]["id"]
    assert decode_header(two.headers["X-PAYMENT-RESPONSE"]) == decode_header(one.headers["X-PAYMENT-RESPONSE"])
    assert topup_chain.usdc(again_payer.address) == 100 * USDC_UNIT
    assert len(servers(http, auth)) == 2 and balance(http, auth) == 0
    assert topup_chain.usdc(shop.address) == 2 * price_atomic


def test_payment_outside_deficit_and_price_moves_nothing(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
) -> None:
    body = order_body(http)
    req = http.post("/servers", json=body, headers=auth).json()["accepts"][0]
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    less = sign_v1_header(payer, {**req, "maxAmountRequired": str(int(req["maxAmountRequired"]) - 1)})
    refused = http.post("/servers", json=body, headers={**auth, "X-PAYMENT": less})
    assert refused.status_code == 402 and refused.json()["error"] == "wrong_amount", refused.text
    assert refused.json()["deficit"] and refused.json()["message"]
    bad_plan = http.post("/servers", json={**body, "plan": "nope"}, headers={**auth, "X-PAYMENT": less})
    assert bad_plan.status_code == 400 and bad_plan.json()["error"] == "invalid_plan"
    assert balance(http, auth) == 0 and servers(http, auth) == []
    assert topup_chain.usdc(payer.address) == 100 * USDC_UNIT and topup_chain.usdc(shop.address) == 0


def test_order_that_fails_after_settlement_leaves_the_money_on_the_balance(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the settlement and the order another request spends part of the balance (done here
    by an admin debit through the ledger just before the order's transaction runs): the order is
    refused with its own 402, the answer says the payment stays on the balance, and it does."""
    from vpsshop import ledger
    from vpsshop.servers import orders

    body = order_body(http)
    price = price_of(http, body)
    real = orders._place

    def spent_meanwhile(ctx: Any, customer: Any, order: Any, key: Any, **kwargs: Any) -> Any:
        with ctx.db.session() as session:
            ledger.post(session, customer.account_id, -10_000, "admin_debit", memo="a concurrent spend")
        return real(ctx, customer, order, key, **kwargs)

    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    req = http.post("/servers", json=body, headers=auth).json()["accepts"][0]
    monkeypatch.setattr(orders, "_place", spent_meanwhile)
    header = sign_v1_header(payer, req)
    failed = http.post("/servers", json=body, headers={**auth, "X-PAYMENT": header})
    assert failed.status_code == 402 and failed.json()["error"] == "insufficient_balance", failed.text
    assert "credited to your balance" in failed.json()["message"]
    payment = failed.json()["payment"]
    assert Decimal(str(payment["credited_usd"])) == price and payment["transaction"]
    assert decode_header(failed.headers["X-PAYMENT-RESPONSE"])["transaction"] == payment["transaction"]
    assert balance(http, auth) == price - Decimal("0.01") and servers(http, auth) == []
    got = http.get(f"/topups/{payment['topup']}", headers=auth).json()
    assert got["status"] == "completed" and Decimal(str(got["credited_usd"])) == price
    monkeypatch.setattr(orders, "_place", real)
    # the retry of the same payment credits nothing more; the balance still lacks a cent
    retry = http.post("/servers", json=body, headers={**auth, "X-PAYMENT": header})
    assert retry.status_code == 402 and retry.json()["error"] == "insufficient_balance", retry.text
    assert balance(http, auth) == price - Decimal("0.01") and topup_chain.usdc(shop.address) == int(price * USDC_UNIT)


def test_v1_client_pays_a_renewal_once(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
) -> None:
    server_id, price = active_server_paid_from_the_balance(http, auth, vpsshop_app)
    before = http.get(f"/servers/{server_id}", headers=auth).json()["expires_at"]

    short = http.post(f"/servers/{server_id}/renew", headers=auth)
    assert short.status_code == 402 and short.json()["error"] == "insufficient_balance", short.text
    [req] = short.json()["accepts"]
    assert req["resource"].endswith(f"/v1/servers/{server_id}/renew")
    assert decode_header(short.headers["PAYMENT-REQUIRED"])["extensions"]["bazaar"]["info"]["input"]["method"] == "POST"
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    header = sign_v1_header(payer, req)
    renewed = http.post(f"/servers/{server_id}/renew", headers={**auth, "X-PAYMENT": header})
    assert renewed.status_code == 200, renewed.text
    assert Decimal(str(renewed.json()["charged_usd"])) == price
    after = renewed.json()["server"]["expires_at"]
    assert after > before and "X-PAYMENT-RESPONSE" in renewed.headers
    again = http.post(f"/servers/{server_id}/renew", headers={**auth, "X-PAYMENT": header})
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert again.json()["server"]["expires_at"] == after
    assert decode_header(again.headers["X-PAYMENT-RESPONSE"]) == decode_header(renewed.headers["X-PAYMENT-RESPONSE"])
    assert balance(http, auth) == 0 and topup_chain.usdc(shop.address) == int(price * USDC_UNIT)
    # the same payment with another body is refused, as an order's is: it must not look like two periods paid
    changed = http.post(f"/servers/{server_id}/renew", json={"periods": 2}, headers={**auth, "X-PAYMENT": header})
    assert changed.status_code == 409 and changed.json()["error"] == "idempotency_key_reused", changed.text
    assert http.get(f"/servers/{server_id}", headers=auth).json()["expires_at"] == after
    assert balance(http, auth) == 0 and topup_chain.usdc(shop.address) == int(price * USDC_UNIT)


def test_v1_client_pays_a_resize_once(
    topup_chain: Chain,
    http: httpx.Client,
    auth: dict[str, str],
    shop: Any,
    vpsshop_app: Any,
) -> None:
    """A resize whose charge the balance lacks is paid by x402 like a renewal: the 402 carries the
    requirements for the deficit, the paid re-send resizes (charged exactly the quote), and the same
    payment re-sent answers that resize and moves nothing more."""
    server_id, _price = active_server_paid_from_the_balance(http, auth, vpsshop_app)
    bigger = http.get("/catalog").json()["plans"][1]["id"]
    quote = http.post(f"/servers/{server_id}/resize/quote", json={"plan": bigger}, headers=auth)
    assert quote.status_code == 200, quote.text
    charge = Decimal(str(quote.json()["price_usd"]))
    assert charge > 0 and not quote.json()["sufficient"], quote.json()

    short = http.post(f"/servers/{server_id}/resize", json={"plan": bigger}, headers=auth)
    assert short.status_code == 402 and short.json()["error"] == "insufficient_balance", short.text
    [req] = short.json()["accepts"]
    assert req["resource"].endswith(f"/v1/servers/{server_id}/resize")
    assert req["maxAmountRequired"] == str(int(charge * USDC_UNIT))
    assert "PAYMENT-REQUIRED" in short.headers
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    header = sign_v1_header(payer, req)
    resized = http.post(f"/servers/{server_id}/resize", json={"plan": bigger}, headers={**auth, "X-PAYMENT": header})
    assert resized.status_code == 202, resized.text
    assert Decimal(str(resized.json()["charged_usd"])) == charge
    assert resized.json()["server"]["plan"] == bigger and "X-PAYMENT-RESPONSE" in resized.headers
    again = http.post(f"/servers/{server_id}/resize", json={"plan": bigger}, headers={**auth, "X-PAYMENT": header})
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert again.json()["job_id"] == resized.json()["job_id"]
    assert Decimal(str(again.json()["charged_usd"])) == charge
    assert decode_header(again.headers["X-PAYMENT-RESPONSE"]) == decode_header(resized.headers["X-PAYMENT-RESPONSE"])
    assert balance(http, auth) == 0 and topup_chain.usdc(shop.address) == int(charge * USDC_UNIT)
    # the same authorization sent to pay for something else (a renewal) pays nothing more
    refused = http.post(f"/servers/{server_id}/renew", headers={**auth, "X-PAYMENT": header})
    assert (refused.status_code, refused.json()["error"]) == (409, "nonce_used"), refused.text
    assert http.get(f"/servers/{server_id}", headers=auth).json()["plan"] == bigger
    assert balance(http, auth) == 0 and topup_chain.usdc(shop.address) == int(charge * USDC_UNIT)
