"""The engine side of x402 top-ups, with a test-only x402 coin.

``SignedUsdcStandIn`` is NOT the USDCBASE plugin (another module, tested against anvil): it is a
small :class:`vpsshop.X402Coin` that checks real EIP-3009 ``TransferWithAuthorization`` signatures
(EIP-712, signed by throw-away keys with ``eth_account``) and "settles" against
:class:`UsdcBook`, a Python object that enforces single-use (payer, nonce) like the USDC contract.
It lets these tests drive the engine's paths: 402, settle and credit once, rejection, replay,
and an unknown outcome resolved later through ``settlement_status``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from starlette.testclient import TestClient

from vpsshop import PluginError, X402Coin, X402Payment, X402Rejected, X402Settlement, hookimpl
from vpsshop.testing import create_test_account

PAY_TO = "0x" + "5" * 40
ASSET = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
DOMAIN = {"name": "USDC", "version": "2", "chainId": 84532, "verifyingContract": ASSET}
TYPES = {
    "TransferWithAuthorization": [
        {"name": "from", "type": "address"},
        {"name": "to", "type": "address"},
        {"name": "value", "type": "uint256"},
        {"name": "validAfter", "type": "uint256"},
        {"name": "validBefore", "type": "uint256"},
        {"name": "nonce", "type": "bytes32"},
    ]
}


class UsdcBook:
    """Balances moved by authorizations; each (payer, nonce) can be used once, as on chain."""

    def __init__(self) -> None:
        self.used: dict[tuple[str, str], str] = {}
        self.received = 0
        self.fail_after_transfer = False
        self.settle_seconds = 0.0
        """How long a settlement takes (a chain's block time and receipt)."""

    def transfer_with_authorization(self, payer: str, nonce: str, value: int) -> str:
        if (payer, nonce) in self.used:
            raise X402Rejected("nonce_used", "authorization already used")
        tx = "0x" + secrets.token_hex(32)
        self.used[(payer, nonce)] = tx
        self.received += value
        if self.fail_after_transfer:  # the chain took it, the answer was lost
            raise PluginError("RPC time-out after broadcasting")
        return tx


BOOK = UsdcBook()


class SignedUsdcStandIn(X402Coin):
    code = "USDCTEST"
    name = "USDC stand-in (tests only)"
    decimals = 6
    rate_symbol = "USDC"

    @property
    def network(self) -> str:
        return "base-sepolia"

    def payment_requirements(self, amount_atomic: int, resource: str, description: str) -> dict[str, Any]:
        return {
            "scheme": "exact",
            "network": "base-sepolia",
            "maxAmountRequired": str(amount_atomic),
            "resource": resource,
            "description": description,
            "mimeType": "application/json",
            "payTo": PAY_TO,
            "maxTimeoutSeconds": 60,
            "asset": ASSET,
            "extra": {"name": "USDC", "version": "2"},
        }

    def decode_payment(self, header_value: str, version: int = 1) -> X402Payment:
        try:
            raw = json.loads(base64.b64decode(header_value))
            auth = raw["payload"]["authorization"]
            return X402Payment(auth["from"].lower(), auth["nonce"].lower(), int(auth["value"]), raw["x402Version"], raw)
        except (ValueError, KeyError, TypeError):
            raise X402Rejected("invalid_payment", "X-PAYMENT is not base64 JSON of an x402 payload", 400) from None

    async def settle(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        auth = payment.raw["payload"]["authorization"]
        message = {
            **auth,
            "value": int(auth["value"]),
            "validAfter": int(auth["validAfter"]),
            "validBefore": int(auth["validBefore"]),
            "nonce": bytes.fromhex(auth["nonce"][2:]),
        }
        signable = encode_typed_data(DOMAIN, TYPES, message)
        signer = Account.recover_message(signable, signature=payment.raw["payload"]["signature"])
        if signer.lower() != payment.payer:
            raise X402Rejected("invalid_signature", "the signature is not the payer's")
        if auth["to"].lower() != requirements["payTo"].lower():
            raise X402Rejected("wrong_recipient", "authorization pays someone else")
        if str(payment.value_atomic) != requirements["maxAmountRequired"]:
            raise X402Rejected("wrong_amount", "value differs from maxAmountRequired")
        if BOOK.settle_seconds:
            await asyncio.sleep(BOOK.settle_seconds)
        tx = BOOK.transfer_with_authorization(payment.payer, payment.nonce, payment.value_atomic)
        return X402Settlement(payment.payer, payment.nonce, tx, "base-sepolia", payment.value_atomic)

    async def settlement_status(self, payment: X402Payment) -> X402Settlement | None:
        tx = BOOK.used.get((payment.payer, payment.nonce))
        return (
            None
            if tx is None
            else X402Settlement(payment.payer, payment.nonce, tx, "base-sepolia", payment.value_atomic)
        )


class StandInPlugin:
    @hookimpl
    def vpsshop_register_coins(self) -> Iterable[type[X402Coin]]:
        return [SignedUsdcStandIn]


@pytest.fixture
def vpsshop_app(vpsshop_settings: Any, vpsshop_clock: Any) -> Any:
    from vpsshop.app import create_app
    from vpsshop.plugins import build_plugin_manager

    BOOK.fail_after_transfer, BOOK.settle_seconds = False, 0.0
    pm = build_plugin_manager(extra=[StandInPlugin()])
    return create_app(vpsshop_settings, pm=pm, clock=vpsshop_clock, background=False)


def sign(requirements: dict[str, Any], value: int | None = None, key: Any = None) -> str:
    key = key or Account.create()
    auth = {
        "from": key.address,
        "to": requirements["payTo"],
        "value": str(value or requirements["maxAmountRequired"]),
        "validAfter": str(int(time.time()) - 5),
        "validBefore": str(int(time.time()) + 60),
        "nonce": "0x" + secrets.token_hex(32),
    }
    message = {
        **auth,
        "value": int(auth["value"]),
        "validAfter": int(auth["validAfter"]),
        "validBefore": int(auth["validBefore"]),
        "nonce": bytes.fromhex(auth["nonce"][2:]),
    }
    signature = Account.sign_typed_data(key.key, DOMAIN, TYPES, message).signature.hex()
    payload = {
        "x402Version": 1,
        "scheme": "exact",
        "network": "base-sepolia",
        "payload": {"signature": "0x" + signature.removeprefix("0x"), "authorization": auth},
    }
    return base64.b64encode(json.dumps(payload).encode()).decode()


def balance(client: TestClient, headers: dict[str, str]) -> Decimal:
    return Decimal(str(client.get("/v1/account", headers=headers).json()["balance_usd"]))


def test_402_then_settle_and_credit_once(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    first = vpsshop_client.post("/v1/topups", json={"amount": 40, "coin": "USDCTEST"}, headers=account.headers)
    assert first.status_code == 402
    body = first.json()
    assert body["x402Version"] == 1 and body["error"]
    [req] = body["accepts"]
    assert req["maxAmountRequired"] == "40000000" and req["payTo"] == PAY_TO
    assert req["resource"].endswith("/topups")
    header = sign(req)
    paid = vpsshop_client.post(
        "/v1/topups", json={"amount": 40, "coin": "USDCTEST"}, headers={**account.headers, "X-PAYMENT": header}
    )
    assert paid.status_code == 201, paid.text
    topup = paid.json()
    assert (topup["status"], topup["coin"], topup["credited_usd"]) == ("completed", "USDCTEST", 40)
    result = json.loads(base64.b64decode(paid.headers["X-PAYMENT-RESPONSE"]))
    assert result["success"] is True and result["transaction"].startswith("0x") and result["network"]
    read = vpsshop_client.get(f"/v1/topups/{topup['ref']}", headers=account.headers).json()
    assert (read["status"], read["payment_status"], read["credited_usd"]) == ("completed", "confirmed", 40)
    assert (read["deposit_amount"], read["deposit_address"], read["qr_data_uri"]) == ("40.000000", PAY_TO, None)
    # Replaying the same header returns the same top-up and credits nothing more.
    again = vpsshop_client.post(
        "/v1/topups", json={"amount": 40, "coin": "USDCTEST"}, headers={**account.headers, "X-PAYMENT": header}
    )
    assert again.status_code == 201 and again.json()["ref"] == topup["ref"]
    assert balance(vpsshop_client, account.headers) == 40
    # Another account cannot claim the same authorization.
    thief = create_test_account(vpsshop_client)
    stolen = vpsshop_client.post(
        "/v1/topups", json={"amount": 40, "coin": "USDCTEST"}, headers={**thief.headers, "X-PAYMENT": header}
    )
    assert stolen.status_code == 409 and stolen.json()["error"] == "nonce_used"
    assert balance(vpsshop_client, thief.headers) == 0


def test_payment_mode_header_selects_x402(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    response = vpsshop_client.post(
        "/v1/topups", json={"amount": 25}, headers={**account.headers, "X-Payment-Mode": "x402"}
    )
    assert response.status_code == 402 and response.json()["accepts"][0]["maxAmountRequired"] == "25000000"


def test_rejections_credit_nothing(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    req = vpsshop_client.post("/v1/topups", json={"amount": 30, "coin": "USDCTEST"}, headers=account.headers).json()[
        "accepts"
    ][0]
    wrong = vpsshop_client.post(
        "/v1/topups",
        json={"amount": 30, "coin": "USDCTEST"},
        headers={**account.headers, "X-PAYMENT": sign(req, value=29_000_000)},
    )
    assert wrong.status_code == 402 and wrong.json()["error"] == "wrong_amount"
    garbage = vpsshop_client.post(
        "/v1/topups",
        json={"amount": 30, "coin": "USDCTEST"},
        headers={**account.headers, "X-PAYMENT": "not base64 json"},
    )
    assert garbage.status_code == 400 and garbage.json()["error"] == "invalid_payment"
    assert balance(vpsshop_client, account.headers) == 0


def test_unknown_outcome_is_resolved_once_later(vpsshop_client: TestClient) -> None:
    from vpsshop.x402.hooks import settlement_task

    account = create_test_account(vpsshop_client)
    req = vpsshop_client.post("/v1/topups", json={"amount": 50, "coin": "USDCTEST"}, headers=account.headers).json()[
        "accepts"
    ][0]
    header = sign(req)
    BOOK.fail_after_transfer = True
    unknown = vpsshop_client.post(
        "/v1/topups", json={"amount": 50, "coin": "USDCTEST"}, headers={**account.headers, "X-PAYMENT": header}
    )
    assert unknown.status_code == 503 and unknown.json()["error"] == "settlement_pending"
    assert balance(vpsshop_client, account.headers) == 0
    BOOK.fail_after_transfer = False
    task = settlement_task(vpsshop_client.app.state.ctx)  # type: ignore[attr-defined]
    assert task is not None and task.name == "x402-settlements"  # its own background task, not the watcher's
    assert vpsshop_client.portal.call(task.run)["credited"] == 1  # type: ignore[union-attr]
    assert balance(vpsshop_client, account.headers) == 50
    retry = vpsshop_client.post(
        "/v1/topups", json={"amount": 50, "coin": "USDCTEST"}, headers={**account.headers, "X-PAYMENT": header}
    )
    assert retry.status_code == 201 and retry.json()["status"] == "completed"
    assert balance(vpsshop_client, account.headers) == 50


# ---- re-sends while the first settlement runs (issue 22, item 9) -----------------------------------


def _resend_together(client: TestClient, account: Any, header: str, count: int = 3) -> list[Any]:
    def send(_: int) -> Any:
        return client.post(
            "/v1/topups", json={"amount": 40, "coin": "USDCTEST"}, headers={**account.headers, "X-PAYMENT": header}
        )

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(send, range(count)))


def _ask(client: TestClient, account: Any) -> dict[str, Any]:
    return client.post("/v1/topups", json={"amount": 40, "coin": "USDCTEST"}, headers=account.headers).json()[
        "accepts"
    ][0]


def test_concurrent_resends_wait_for_the_first_settlement_and_replay_it(vpsshop_client: TestClient) -> None:
    """Three re-sends of one payment at once: one settles, the others wait for it (they used to get
    503 settlement_pending, which no official client retries) and answer the same completed top-up."""
    account = create_test_account(vpsshop_client)
    header = sign(_ask(vpsshop_client, account))
    received = BOOK.received
    BOOK.settle_seconds = 1.0
    answers = _resend_together(vpsshop_client, account, header)
    assert [a.status_code for a in answers] == [201, 201, 201], [a.text for a in answers]
    assert len({a.json()["ref"] for a in answers}) == 1 and answers[0].json()["status"] == "completed"
    transactions = {json.loads(base64.b64decode(a.headers["X-PAYMENT-RESPONSE"]))["transaction"] for a in answers}
    assert len(transactions) == 1
    assert balance(vpsshop_client, account.headers) == 40 and BOOK.received - received == 40_000_000


def test_a_resend_waiting_on_an_unknown_outcome_asks_the_chain(vpsshop_client: TestClient) -> None:
    """The first request's outcome is unknown (503): the waiting re-sends stop waiting at once and ask
    the chain, which shows the transfer: they are credited (once) while the first said pending."""
    account = create_test_account(vpsshop_client)
    header = sign(_ask(vpsshop_client, account))
    BOOK.settle_seconds, BOOK.fail_after_transfer = 1.0, True
    started = time.monotonic()
    answers = _resend_together(vpsshop_client, account, header)
    assert time.monotonic() - started < 5
    codes = sorted(a.status_code for a in answers)
    assert codes == [201, 201, 503], [a.text for a in answers]
    assert [a.json()["error"] for a in answers if a.status_code == 503] == ["settlement_pending"]
    assert balance(vpsshop_client, account.headers) == 40


def test_the_wait_for_a_first_settlement_is_bounded(vpsshop_client: TestClient, monkeypatch: Any) -> None:
    from datetime import timedelta

    monkeypatch.setattr("vpsshop.x402.settlement.RESEND_WAIT", timedelta(seconds=1))
    account = create_test_account(vpsshop_client)
    header = sign(_ask(vpsshop_client, account))
    BOOK.settle_seconds = 4.0
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(
            vpsshop_client.post,
            "/v1/topups",
            json={"amount": 40, "coin": "USDCTEST"},
            headers={**account.headers, "X-PAYMENT": header},
        )
        time.sleep(0.5)  # the first is settling
        started = time.monotonic()
        waited = vpsshop_client.post(
            "/v1/topups", json={"amount": 40, "coin": "USDCTEST"}, headers={**account.headers, "X-PAYMENT": header}
        )
        took = time.monotonic() - started
        assert waited.status_code == 503 and waited.json()["error"] == "settlement_pending", waited.text
        assert 0.8 < took < 2.5, took  # waited RESEND_WAIT (a second here), not the first settlement's four
        assert first.result().status_code == 201
    assert balance(vpsshop_client, account.headers) == 40
