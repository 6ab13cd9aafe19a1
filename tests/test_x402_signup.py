"""Issue 29: a wallet with no account orders a server by paying (pay as sign-up), and signs in with the
x402 ``sign-in-with-x`` extension after its key is revoked.

The shop runs under uvicorn with the real USDCBASE plugin in direct mode on anvil (the fixtures of
tests/test_x402_topups.py), its ``public_url`` on the served port (sign-in messages are bound to it);
the payments and signatures are made by the official clients: the PyPI ``x402HttpxClient`` (v2) with the
package's sign-in-with-x client extension, the PyPI v1 scheme, and npm ``x402-fetch``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account as EthAccount
from test_x402_orders import order_body, price_of
from test_x402_topups import (  # noqa: F401 - fixtures
    Served,
    decode_header,
    relayer,
    shop,
    topup_chain,
    usdcbase_section,
)
from x402_peers import USDC_UNIT, Chain, fetch_with_npm_client, free_port, run_node, sign_v1_header

pytestmark = pytest.mark.slow


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def vpsshop_overrides(port: int, topup_chain: Chain, shop: Any, relayer: Any) -> dict[str, Any]:
    return {"public_url": f"http://127.0.0.1:{port}/v1", "coins": {"USDCBASE": usdcbase_section(topup_chain, shop)}}


@pytest.fixture
def served(vpsshop_app: Any, port: int) -> Any:
    server = Served(vpsshop_app, port)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http(served: Served) -> Any:
    with httpx.Client(base_url=served.base, timeout=60) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


DOC = (Path(__file__).resolve().parent.parent / "docs" / "x402.md").read_text()


def documented_client(asset: str) -> dict[str, Any]:
    """docs/x402.md's PyPI client code, run as written; its SPEND allows the test USDC (another asset
    than Circle's, which the client would refuse: see "The official clients' spending limits")."""
    match = re.search(r"<!-- wallet-signup[^>]*-->\n```python\n(.*?)```", DOC, re.S)
    assert match, "docs/x402.md lost its wallet-signup block"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/x402.md", "exec"), namespace)
    namespace["SPEND"] = {"allowed_assets": [{"network": "eip155:8453", "asset": asset}]}
    return namespace


def test_a_wallet_signs_up_by_paying_and_signs_in_after_its_key_is_revoked(
    topup_chain: Chain, served: Served, http: httpx.Client, shop: Any
) -> None:
    body = order_body(http)
    price = price_of(http, body)
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)

    # no API key: the 402 asks for the whole price (x402 v1 body, v2 header), nothing is created
    asked = http.post("/servers", json=body)
    assert asked.status_code == 402, asked.text
    assert asked.json()["error"] == "payment_required" and asked.json()["accepts"][0]["maxAmountRequired"] == str(
        int(price * USDC_UNIT)
    )
    from x402.http.utils import decode_payment_required_header

    assert decode_payment_required_header(asked.headers["PAYMENT-REQUIRED"]).accepts[0].amount == str(
        int(price * USDC_UNIT)
    )

    documented = documented_client(topup_chain.asset)
    answer = asyncio.run(documented["order_without_an_account"](served.base, payer, body))
    account = answer["account"]
    assert account["created"] is True and account["address"] == payer.address.lower()
    assert account["api_key"].startswith("vpsk_") and account["login_token"]
    server_id = answer["server"]["id"]
    assert topup_chain.usdc(shop.address) == int(price * USDC_UNIT)

    key = bearer(account["api_key"])
    assert [s["id"] for s in http.get("/servers", headers=key).json()["servers"]] == [server_id]
    assert http.get("/account", headers=key).json()["user_id"] == account["user_id"]
    wallets = http.get("/account/wallets", headers=key).json()["wallets"]
    assert [w["address"] for w in wallets] == [payer.address.lower()]
    # the dashboard's login token works too
    login = http.post("/login", json={"login_token": account["login_token"]})
    assert login.status_code == 201, login.text

    # the key is lost: revoke every key, then sign in with the wallet (one call and one retry)
    other = bearer(login.json()["api_key"])
    assert http.delete(f"/keys/{account['key_id']}", headers=other).status_code == 200
    assert http.delete(f"/keys/{login.json()['id']}", headers=other).status_code == 200
    assert http.get("/servers", headers=key).status_code == 401
    assert http.get("/servers", headers=other).status_code == 401
    challenge = http.post("/account/wallet-login")
    assert challenge.status_code == 402 and challenge.json()["error"] == "wallet_signature_required"
    fresh = asyncio.run(documented["sign_in_with_the_wallet"](served.base, payer))
    assert fresh.startswith("vpsk_")
    assert http.get("/account", headers=bearer(fresh)).json()["user_id"] == account["user_id"]
    assert [s["id"] for s in http.get("/servers", headers=bearer(fresh)).json()["servers"]] == [server_id]
    assert topup_chain.usdc(shop.address) == int(price * USDC_UNIT)  # signing in paid nothing


def test_a_replayed_payment_creates_one_account_and_shows_the_key_once(
    topup_chain: Chain, http: httpx.Client, shop: Any
) -> None:
    body = order_body(http)
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    requirements = http.post("/servers", json=body).json()["accepts"][0]
    header = sign_v1_header(payer, requirements)
    first = http.post("/servers", json=body, headers={"X-PAYMENT": header})
    assert first.status_code == 201, first.text
    assert first.headers["Cache-Control"] == "no-store"
    account = first.json()["account"]
    assert account["created"] and account["api_key"]
    settled = decode_header(first.headers["X-PAYMENT-RESPONSE"])
    assert settled["payer"] == payer.address

    again = http.post("/servers", json=body, headers={"X-PAYMENT": header})
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert again.json()["server"]["id"] == first.json()["server"]["id"]
    replayed = again.json()["account"]
    assert replayed["user_id"] == account["user_id"] and replayed["api_key"] is None
    assert replayed["login_token"] is None

    # the same wallet pays for a second order without a key: its account, and no new key
    second = http.post("/servers", json=body, headers={"X-PAYMENT": sign_v1_header(payer, requirements)})
    assert second.status_code == 201, second.text
    assert second.json()["account"] == {**replayed, "created": False}
    servers = http.get("/servers", headers=bearer(account["api_key"])).json()["servers"]
    assert len(servers) == 2


def test_a_topup_without_a_key_signs_up_once(topup_chain: Chain, http: httpx.Client, shop: Any) -> None:
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    asked = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"})
    assert asked.status_code == 402 and asked.json()["x402Version"] == 1, asked.text
    header = sign_v1_header(payer, asked.json()["accepts"][0])
    paid = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={"X-PAYMENT": header})
    assert paid.status_code == 201 and paid.headers["Cache-Control"] == "no-store", paid.text
    assert paid.json()["status"] == "completed"
    account = paid.json()["account"]
    assert account["created"] and account["address"] == payer.address.lower()
    key = bearer(account["api_key"])
    assert http.get("/account", headers=key).json()["balance_usd"] == 25
    assert http.get(f"/topups/{paid.json()['ref']}", headers=key).json()["status"] == "completed"
    # the same payment again: the same top-up, credited once, no key shown again
    again = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={"X-PAYMENT": header})
    assert again.status_code == 201 and again.json()["ref"] == paid.json()["ref"], again.text
    assert again.json()["account"]["api_key"] is None and again.json()["account"]["user_id"] == account["user_id"]
    assert http.get("/account", headers=key).json()["balance_usd"] == 25
    assert topup_chain.usdc(shop.address) == 25 * USDC_UNIT
    # a deposit top-up needs an account first
    assert (
        http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={"X-Payment-Mode": "deposit"}).status_code
        == 401
    )


def test_npm_x402_fetch_signs_up_in_one_call(topup_chain: Chain, served: Served, http: httpx.Client, shop: Any) -> None:
    body = order_body(http)
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    answer = fetch_with_npm_client(payer, f"{served.base}/servers", topup_chain.url, body=body)
    assert answer["status"] == 201, answer
    account = answer["body"]["account"]
    assert account["created"] and account["address"] == payer.address.lower()
    assert http.get("/servers", headers=bearer(account["api_key"])).json()["servers"][0]["status"] == "provisioning"


def test_npm_x402_fetch_v2_signs_up_in_one_call(
    topup_chain: Chain, served: Served, http: httpx.Client, shop: Any
) -> None:
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    request = {
        "privateKey": "0x" + bytes(payer.key).hex(),
        "url": f"{served.base}/servers",
        "body": order_body(http),
        "asset": topup_chain.asset,
    }
    answer = json.loads(run_node("x402_v2_fetch.cjs", request, timeout=120))
    assert answer["status"] == 201, answer
    account = answer["body"]["account"]
    assert account["created"] and account["address"] == payer.address.lower()
    assert len(http.get("/servers", headers=bearer(account["api_key"])).json()["servers"]) == 1


def test_sign_up_limits_apply_before_anything_moves(
    topup_chain: Chain, http: httpx.Client, shop: Any, vpsshop_app: Any
) -> None:
    vpsshop_app.state.ctx.settings.ratelimit.signups_per_client = 1
    body = order_body(http)
    requirements = http.post("/servers", json=body).json()["accepts"][0]
    assert http.post("/account").status_code == 201  # this address's one account of the window
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    refused = http.post("/servers", json=body, headers={"X-PAYMENT": sign_v1_header(payer, requirements)})
    assert refused.status_code == 429 and refused.json()["error"] == "rate_limited", refused.text
    assert topup_chain.usdc(payer.address) == 100 * USDC_UNIT and topup_chain.usdc(shop.address) == 0


# ---- signing in: the challenge and its refusals ---------------------------------------------------


def challenge_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 402, response.text
    required = json.loads(base64.b64decode(response.headers["PAYMENT-REQUIRED"]))
    assert required["accepts"] == [] and required["x402Version"] == 2
    assert response.json()["extensions"] == required["extensions"]
    return required


def signed(wallet: Any, required: dict[str, Any], **changes: Any) -> str:
    """``SIGN-IN-WITH-X`` made by the x402 package's own client functions from a 402's challenge."""
    from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header

    extension = required["extensions"]["sign-in-with-x"]
    info = {**extension["info"], **extension["supportedChains"][0], **changes}
    payload = asyncio.run(create_siwx_payload(info, wallet, info["uri"]))
    return encode_siwx_header(payload)


def test_wallet_login_refuses_replays_strangers_and_other_endpoints(
    http: httpx.Client, topup_chain: Chain, served: Served, vpsshop_app: Any
) -> None:
    from x402.extensions.sign_in_with_x import build_siwx_schema

    required = challenge_of(http.post("/account/wallet-login"))
    extension = required["extensions"]["sign-in-with-x"]
    assert extension["supportedChains"] == [{"chainId": "eip155:8453", "type": "eip191"}]
    assert extension["schema"] == build_siwx_schema()
    assert extension["info"]["domain"] == f"127.0.0.1:{served.port}"
    assert extension["info"]["uri"] == f"{served.base}/account/wallet-login"

    stranger = EthAccount.create()
    refused = http.post("/account/wallet-login", headers={"SIGN-IN-WITH-X": signed(stranger, required)})
    assert refused.status_code == 401 and refused.json()["error"] == "unknown_wallet", refused.text

    # a wallet that owns an account: created by paying
    payer = topup_chain.new_account(usdc=100 * USDC_UNIT)
    body = order_body(http)
    requirements = http.post("/servers", json=body).json()["accepts"][0]
    paid = http.post("/servers", json=body, headers={"X-PAYMENT": sign_v1_header(payer, requirements)})
    assert paid.status_code == 201, paid.text
    header = signed(payer, challenge_of(http.post("/account/wallet-login")))
    signed_in = http.post("/account/wallet-login", headers={"SIGN-IN-WITH-X": header})
    assert signed_in.status_code == 201 and signed_in.headers["Cache-Control"] == "no-store", signed_in.text
    used = http.post("/account/wallet-login", headers={"SIGN-IN-WITH-X": header})
    assert used.status_code == 401 and used.json()["error"] == "invalid_siwx_nonce", used.text

    def refusal(header: str) -> str:
        answer = http.post("/account/wallet-login", headers={"SIGN-IN-WITH-X": header})
        assert answer.status_code == 401, answer.text
        return str(answer.json()["error"])

    fresh = challenge_of(http.post("/account/wallet-login"))
    # another endpoint's challenge (linking a wallet) does not sign in
    key = bearer(paid.json()["account"]["api_key"])
    linking = challenge_of(http.post("/account/wallets", headers=key))
    assert refusal(signed(payer, linking)) == "invalid_siwx_uri_mismatch"
    phished = signed(payer, fresh, domain="evil.example", uri="https://evil.example/v1/account/wallet-login")
    assert refusal(phished) == "invalid_siwx_domain_mismatch"
    assert refusal(signed(payer, fresh, nonce="0" * 58)) == "invalid_siwx_nonce"
    assert refusal(signed(payer, fresh, chainId="eip155:1")) == "invalid_siwx_unsupported_chain"
    forged = json.loads(base64.b64decode(signed(stranger, fresh)))
    forged["address"] = payer.address
    assert refusal(base64.b64encode(json.dumps(forged).encode()).decode()) == "invalid_siwx_signature"
    assert refusal("not base64!") == "invalid_siwx_payload"
    clock = vpsshop_app.state.ctx.clock
    clock.advance(minutes=6)  # five minutes to sign and use a challenge, on the shop's clock
    assert refusal(signed(payer, fresh)) == "invalid_siwx_issued_at_too_old"
    # an old nonce in a message that claims to be new: the nonce itself has expired
    now = clock.now().isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert refusal(signed(payer, fresh, issuedAt=now, expirationTime=None)) == "invalid_siwx_nonce"


def test_an_account_links_more_wallets_and_removes_them(http: httpx.Client, topup_chain: Chain, served: Served) -> None:
    owner = EthAccount.create()
    key = bearer(http.post("/account").json()["api_key"])
    assert http.get("/account/wallets", headers=key).json() == {"wallets": []}
    linked = http.post(
        "/account/wallets",
        headers={**key, "SIGN-IN-WITH-X": signed(owner, challenge_of(http.post("/account/wallets", headers=key)))},
    )
    assert linked.status_code == 201, linked.text
    assert linked.json()["address"] == owner.address.lower()
    # the linked wallet signs in to this account
    login = http.post(
        "/account/wallet-login",
        headers={"SIGN-IN-WITH-X": signed(owner, challenge_of(http.post("/account/wallet-login")))},
    )
    assert login.status_code == 201 and login.json()["user_id"] == http.get("/account", headers=key).json()["user_id"]
    # another account cannot take it
    other = bearer(http.post("/account").json()["api_key"])
    taken = http.post(
        "/account/wallets",
        headers={**other, "SIGN-IN-WITH-X": signed(owner, challenge_of(http.post("/account/wallets", headers=other)))},
    )
    assert taken.status_code == 409 and taken.json()["error"] == "wallet_taken", taken.text
    # removed: it no longer signs in
    assert http.delete(f"/account/wallets/{linked.json()['id']}", headers=other).status_code == 404
    assert http.delete(f"/account/wallets/{linked.json()['id']}", headers=key).status_code == 200
    assert http.get("/account/wallets", headers=key).json() == {"wallets": []}
    gone = http.post(
        "/account/wallet-login",
        headers={"SIGN-IN-WITH-X": signed(owner, challenge_of(http.post("/account/wallet-login")))},
    )
    assert gone.status_code == 401 and gone.json()["error"] == "unknown_wallet"
