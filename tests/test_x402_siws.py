"""Signing in with a Solana wallet: the x402 ``sign-in-with-x`` extension's Sign-In With Solana messages
(CAIP-122, ed25519), made by the official PyPI x402 client's sign-in-with-x extension with a real solders
keypair as the signer.

The shop runs under uvicorn with the real USDCSOL plugin (its chain: LiteSVM behind
``tests/solana_rpc_double.py``, the fixtures of tests/test_x402_svm.py), its ``public_url`` on the served
port (sign-in messages are bound to it). A Solana wallet orders a server without an account (pay as
sign-up, docs/x402.md's USDCSOL client), loses its key and signs in with the same client; forged,
tampered and replayed messages are refused; an account links and removes a Solana wallet; EVM wallets
still sign in on the same shop.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from eth_account import Account as EthAccount
from solders.keypair import Keypair
from test_x402_orders import order_body, price_of
from test_x402_svm import (  # noqa: F401 - fixtures
    CAIP2,
    UNIT,
    Ledger,
    documented_client,
    fee_payer,
    ledger,
    usdcsol_section,
)
from test_x402_topups import Served
from x402.extensions.sign_in_with_x import (
    SOLANA_MAINNET,
    build_siwx_schema,
    create_siwx_payload,
    decode_base58,
    encode_base58,
    encode_siwx_header,
)
from x402.mechanisms.svm.signers import KeypairSigner
from x402_peers import free_port

WALLET_LOGIN = "/account/wallet-login"


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def shop_keypair(ledger: Ledger) -> Keypair:
    shop = Keypair()
    ledger.fund(str(shop.pubkey()), 0)
    return shop


@pytest.fixture
def vpsshop_overrides(port: int, ledger: Ledger, fee_payer: Keypair, shop_keypair: Keypair) -> dict[str, Any]:
    return {
        "public_url": f"http://127.0.0.1:{port}/v1",
        "coins": {"USDCSOL": usdcsol_section(ledger, str(shop_keypair.pubkey()))},
        "signin": {"failures_per_client": 100},  # the refusals below are failed sign-ins from one address
    }


@pytest.fixture
def served(vpsshop_app: Any, port: int) -> Iterator[Served]:
    server = Served(vpsshop_app, port)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.base, timeout=60) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def challenge_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 402, response.text
    required = json.loads(base64.b64decode(response.headers["PAYMENT-REQUIRED"]))
    assert required["accepts"] == [] and required["x402Version"] == 2
    return required


def signed(signer: Any, required: dict[str, Any], namespace: str, **changes: Any) -> str:
    """``SIGN-IN-WITH-X`` made by the x402 package's client functions for the challenge's chain of
    ``namespace`` (``solana`` or ``eip155``), as its client extension does."""
    extension = required["extensions"]["sign-in-with-x"]
    chain = next(c for c in extension["supportedChains"] if c["chainId"].startswith(namespace + ":"))
    info = {**extension["info"], **chain, **changes}
    return encode_siwx_header(asyncio.run(create_siwx_payload(info, signer, info["uri"])))


def edited(header: str, **changes: Any) -> str:
    payload = json.loads(base64.b64decode(header))
    payload.update(changes)
    return base64.b64encode(json.dumps(payload).encode()).decode()


def refusal(http: httpx.Client, header: str, path: str = WALLET_LOGIN, **kwargs: Any) -> str:
    answer = http.post(path, headers={"SIGN-IN-WITH-X": header, **kwargs.pop("headers", {})}, **kwargs)
    assert answer.status_code == 401, answer.text
    return str(answer.json()["error"])


def test_a_solana_wallet_that_paid_as_sign_up_signs_in_with_the_official_client(
    ledger: Ledger, served: Served, http: httpx.Client, shop_keypair: Keypair
) -> None:
    # the challenge lists the shop's Solana chain (ed25519) after the EVM one (the sandbox's USDCBASE: Base Sepolia)
    required = challenge_of(http.post(WALLET_LOGIN))
    extension = required["extensions"]["sign-in-with-x"]
    assert CAIP2 == SOLANA_MAINNET
    assert extension["supportedChains"] == [
        {"chainId": "eip155:84532", "type": "eip191"},
        {"chainId": SOLANA_MAINNET, "type": "ed25519"},
    ]
    assert extension["schema"] == build_siwx_schema()
    assert extension["info"]["uri"] == f"{served.base}{WALLET_LOGIN}"

    # a Solana wallet orders a server without an account: docs/x402.md's USDCSOL client pays
    body = order_body(http)
    price = int(price_of(http, body) * UNIT)
    payer = Keypair()
    payer_ata = ledger.fund(str(payer.pubkey()), 100 * UNIT)
    documented = documented_client()
    client = documented["solana_client"](payer, ledger.rpc.url, ledger.mint, str(price))
    answer = asyncio.run(documented["order_without_an_account"](served.base, body, client))
    account = answer["account"]
    assert account["created"] is True and account["address"] == str(payer.pubkey())
    assert ledger.token_balance(payer_ata) == 100 * UNIT - price
    key = bearer(account["api_key"])
    assert [w["address"] for w in http.get("/account/wallets", headers=key).json()["wallets"]] == [str(payer.pubkey())]

    # its key is lost: revoked; the same client signs in with the same keypair and gets a fresh key
    assert http.delete(f"/keys/{account['key_id']}", headers=key).status_code == 200
    assert http.get("/servers", headers=key).status_code == 401
    fresh = asyncio.run(documented["sign_in_with_the_wallet"](served.base, client))
    assert fresh.startswith("vpsk_") and fresh != account["api_key"]
    assert http.get("/account", headers=bearer(fresh)).json()["user_id"] == account["user_id"]
    listed = http.get("/servers", headers=bearer(fresh)).json()["servers"]
    assert [s["id"] for s in listed] == [answer["server"]["id"]]
    names = [k["name"] for k in http.get("/keys", headers=bearer(fresh)).json()["keys"]]
    assert names == ["wallet"], names
    assert ledger.token_balance(payer_ata) == 100 * UNIT - price  # signing in paid nothing

    # the package's functions, as the extension calls them: one header signs in once
    header = signed(KeypairSigner(payer), challenge_of(http.post(WALLET_LOGIN)), "solana")
    first = http.post(WALLET_LOGIN, headers={"SIGN-IN-WITH-X": header})
    assert first.status_code == 201 and first.json()["address"] == str(payer.pubkey()), first.text
    assert first.json()["user_id"] == account["user_id"]
    assert refusal(http, header) == "invalid_siwx_nonce"  # a replay


def test_forged_and_tampered_solana_messages_are_refused(
    ledger: Ledger, served: Served, http: httpx.Client, fee_payer: Keypair
) -> None:
    owner, stranger = KeypairSigner(Keypair()), KeypairSigner(Keypair())
    key = bearer(http.post("/account").json()["api_key"])
    linking = challenge_of(http.post("/account/wallets", headers=key))
    linked = http.post("/account/wallets", headers={**key, "SIGN-IN-WITH-X": signed(owner, linking, "solana")})
    assert linked.status_code == 201 and linked.json()["address"] == owner.address, linked.text

    fresh = challenge_of(http.post(WALLET_LOGIN))
    good = signed(owner, fresh, "solana")
    payload = json.loads(base64.b64decode(good))
    signature = bytearray(decode_base58(payload["signature"]))
    signature[10] ^= 0x01
    assert refusal(http, edited(good, signature=encode_base58(bytes(signature)))) == "invalid_siwx_signature"
    # the signed text changed after signing: another statement, another resource, another request id
    assert refusal(http, edited(good, statement="Send all my USDC.")) == "invalid_siwx_signature"
    assert refusal(http, edited(good, resources=["https://evil.example/"])) == "invalid_siwx_signature"
    assert refusal(http, edited(good, requestId="1")) == "invalid_siwx_signature"
    # another key's signature claiming the owner's address, and the owner's signature claimed by another
    forged = signed(stranger, fresh, "solana")
    assert refusal(http, edited(forged, address=owner.address)) == "invalid_siwx_signature"
    assert refusal(http, edited(good, address=stranger.address)) == "invalid_siwx_signature"
    # malformed: not base58, the wrong length, an EVM signature on the Solana chain: refused, never a 500
    for bad in ("0OIl", "", "1" * 88, "2" * 300, "0x" + "ab" * 65):
        assert refusal(http, edited(good, signature=bad)) == "invalid_siwx_signature", bad
    for bad in ("0x" + "ab" * 20, "1" * 44, "1" + owner.address, "3" * 200):
        assert refusal(http, edited(good, address=bad)) == "invalid_siwx_signature", bad
    # a chain the shop does not take, or the Solana chain with the EVM signature type
    assert refusal(http, signed(owner, fresh, "solana", chainId="solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1")) == (
        "invalid_siwx_unsupported_chain"
    )
    assert refusal(http, edited(good, type="eip191")) == "invalid_siwx_unsupported_chain"
    phished = signed(owner, fresh, "solana", domain="evil.example", uri=f"https://evil.example/v1{WALLET_LOGIN}")
    assert refusal(http, phished) == "invalid_siwx_domain_mismatch"
    assert refusal(http, signed(owner, linking, "solana")) == "invalid_siwx_uri_mismatch"
    # none of these used the nonce up: the untouched message still signs in, once
    signed_in = http.post(WALLET_LOGIN, headers={"SIGN-IN-WITH-X": good})
    assert signed_in.status_code == 201 and signed_in.json()["address"] == owner.address, signed_in.text
    assert refusal(http, good) == "invalid_siwx_nonce"


def test_an_account_links_a_solana_wallet_and_evm_wallets_still_sign_in(
    ledger: Ledger, served: Served, http: httpx.Client, fee_payer: Keypair
) -> None:
    solana_wallet, evm_wallet = KeypairSigner(Keypair()), EthAccount.create()
    key = bearer(http.post("/account").json()["api_key"])
    user_id = http.get("/account", headers=key).json()["user_id"]

    def link(headers: dict[str, str], wallet: Any, namespace: str) -> httpx.Response:
        required = challenge_of(http.post("/account/wallets", headers=headers))
        return http.post("/account/wallets", headers={**headers, "SIGN-IN-WITH-X": signed(wallet, required, namespace)})

    def login(wallet: Any, namespace: str) -> httpx.Response:
        header = signed(wallet, challenge_of(http.post(WALLET_LOGIN)), namespace)
        return http.post(WALLET_LOGIN, headers={"SIGN-IN-WITH-X": header})

    assert login(solana_wallet, "solana").json()["error"] == "unknown_wallet"
    linked = link(key, solana_wallet, "solana")
    assert linked.status_code == 201 and linked.json()["address"] == solana_wallet.address, linked.text
    evm = link(key, evm_wallet, "eip155")
    assert evm.status_code == 201 and evm.json()["address"] == evm_wallet.address.lower(), evm.text
    listed = http.get("/account/wallets", headers=key).json()["wallets"]
    assert [w["address"] for w in listed] == [solana_wallet.address, evm_wallet.address.lower()]
    assert link(key, solana_wallet, "solana").json()["id"] == linked.json()["id"]  # linked again: unchanged

    for wallet, namespace in ((solana_wallet, "solana"), (evm_wallet, "eip155")):
        signed_in = login(wallet, namespace)
        assert signed_in.status_code == 201, signed_in.text
        assert http.get("/account", headers=bearer(signed_in.json()["api_key"])).json()["user_id"] == user_id

    # a Solana wallet owns one account; removed, it no longer signs in
    other = bearer(http.post("/account").json()["api_key"])
    taken = link(other, solana_wallet, "solana")
    assert taken.status_code == 409 and taken.json()["error"] == "wallet_taken", taken.text
    assert http.delete(f"/account/wallets/{linked.json()['id']}", headers=other).status_code == 404
    assert http.delete(f"/account/wallets/{linked.json()['id']}", headers=key).status_code == 200
    gone = login(solana_wallet, "solana")
    assert gone.status_code == 401 and gone.json()["error"] == "unknown_wallet", gone.text
    assert login(evm_wallet, "eip155").status_code == 201
    # now another account can link it
    assert link(other, solana_wallet, "solana").status_code == 201
    assert Decimal(str(http.get("/account", headers=other).json()["balance_usd"])) == 0
