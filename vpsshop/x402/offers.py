"""What the operations say about x402, apart from any transport: a payment they ask for, a signed
payment they are given, a settlement they report.

* :class:`PaymentOffer`: the requirements of a payment an operation asks for (a top-up's amount, an
  order's or a renewal's deficit), as x402 v1 (``accepts``) and v2 (``accepted``) state them;
* :class:`SignedPayment`: the payment a client signed, as it sent it (base64 JSON);
* :class:`SettledPayment`: the settlement that paid for an operation, which the answer reports;
* :class:`PaymentRequired`: the 402 of an x402 top-up sent without a payment;
* :class:`ShortBalance`: an order's or a renewal's short balance, with the requirements for the deficit;
* :class:`PaidButFailed`: an operation that failed after its payment settled (the money stays on the
  balance).

The REST API renders them as the x402 headers (:mod:`vpsshop.api.x402`); the MCP tools as fields.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from vpsshop.coins import X402Coin, X402Settlement
from vpsshop.context import AppContext
from vpsshop.errors import ApiError
from vpsshop.ledger import InsufficientBalance
from vpsshop.money import MICROS_PER_USD
from vpsshop.x402.messages import X402_VERSION, requirements

__all__ = [
    "PaidButFailed",
    "PaymentOffer",
    "PaymentRequired",
    "SettledPayment",
    "ShortBalance",
    "SignedPayment",
    "offer",
    "offer_in",
]


@dataclass(frozen=True)
class PaymentOffer:
    """The x402 payment an operation asks for: ``amount_micros`` USD paying for ``path``."""

    coin: X402Coin
    amount_micros: int
    path: str
    """The paid resource's path under ``/v1`` (``/servers/7/renew``): the requirements' ``resource``."""
    operation_path: str
    """Its path as the API describes it (``/servers/{id}/renew``), for the v2 discovery extensions."""
    accepts: dict[str, Any]
    """The x402 v1 ``accepts`` entry."""
    accepted_v2: dict[str, Any] | None
    """The x402 v2 ``accepts`` entry, or None when the coin offers no v2."""
    description: str
    alternatives: tuple[PaymentOffer, ...] = ()
    """The same payment in the shop's other x402 coins (USDC on Solana beside USDC on Base): their
    entries follow this one in ``accepts``, and the client pays whichever it can."""

    @property
    def offers(self) -> tuple[PaymentOffer, ...]:
        """This offer and its alternatives, in ``accepts`` order."""
        return (self, *self.alternatives)

    def coin_codes(self) -> str:
        """``USDCBASE`` or ``USDCBASE or USDCSOL``: the coins a message names."""
        return " or ".join(each.coin.code for each in self.offers)

    def all_accepts(self) -> list[dict[str, Any]]:
        """The x402 v1 ``accepts`` list: one entry per coin."""
        return [each.accepts for each in self.offers]

    def v1_fields(self) -> dict[str, Any]:
        """``x402Version`` and ``accepts``: what an x402 v1 client reads in a 402 body."""
        return {"x402Version": X402_VERSION, "accepts": self.all_accepts()}

    def payment_required(self, extensions: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The x402 v2 ``PaymentRequired`` object (None without v2)."""
        accepted = [each.accepted_v2 for each in self.offers if each.accepted_v2 is not None]
        if not accepted:
            return None
        required: dict[str, Any] = {
            "x402Version": 2,
            "error": "PAYMENT-SIGNATURE header is required",
            "resource": {
                "url": self.accepts["resource"],
                "description": self.accepts.get("description", ""),
                "mimeType": self.accepts.get("mimeType", "application/json"),
            },
            "accepts": accepted,
        }
        if extensions:
            required["extensions"] = extensions
        return required


def offer(
    ctx: AppContext,
    coin: X402Coin,
    amount_micros: int,
    path: str,
    description: str | None = None,
    operation_path: str | None = None,
) -> PaymentOffer:
    """The requirements of paying ``amount_micros`` USD in ``coin`` for ``path``."""
    if description is None:
        description = f"Top-up of {amount_micros / MICROS_PER_USD:.2f} USD"
    accepts = requirements(ctx, coin, amount_micros, path, description)
    try:
        accepted_v2: dict[str, Any] | None = coin.payment_requirements_v2(accepts)
    except NotImplementedError:
        accepted_v2 = None
    return PaymentOffer(coin, amount_micros, path, operation_path or path, accepts, accepted_v2, description)


def offer_in(
    ctx: AppContext,
    coins: Sequence[X402Coin],
    amount_micros: int,
    path: str,
    description: str | None = None,
    operation_path: str | None = None,
) -> PaymentOffer:
    """The requirements of paying ``amount_micros`` USD for ``path`` in any of ``coins`` (at least one):
    one ``accepts`` entry per coin, the first coin's first."""
    first, *others = (offer(ctx, coin, amount_micros, path, description, operation_path) for coin in coins)
    return replace(first, alternatives=tuple(others))


@dataclass(frozen=True)
class SignedPayment:
    """An x402 payment as the client sent it: the base64 JSON payload and its x402 version
    (1: the REST header ``X-PAYMENT``; 2: ``PAYMENT-SIGNATURE``)."""

    value: str
    version: int

    @classmethod
    def from_payload(cls, value: str) -> SignedPayment:
        """A payment given without saying its version (an MCP tool's argument): read from the payload."""
        value = value.strip()
        return cls(value, payload_version(value))


def payload_version(value: str) -> int:
    """The ``x402Version`` a base64 JSON payment payload states (1 when it states none or is unreadable:
    decoding it then refuses it with the payload's own error)."""
    try:
        decoded = json.loads(base64.b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError):
        return X402_VERSION
    version = decoded.get("x402Version") if isinstance(decoded, dict) else None
    return version if version in (1, 2) else X402_VERSION


@dataclass(frozen=True)
class SettledPayment:
    """A settled authorization, as the answer of what it paid for reports it."""

    coin: X402Coin
    settlement: X402Settlement
    version: int
    held_until: str | None = None
    """Set when the payment was verified and is held, not settled yet (``[x402] settle = "on_ready"``):
    what settles it (``server_ready``). The settlement's ``transaction`` is then empty."""

    def response(self) -> dict[str, Any]:
        """The x402 settlement response (``{success, transaction, network, payer}``, v2 also ``amount``).

        A held payment answers ``success: true`` (it was accepted: the order is made) with an empty
        ``transaction`` (nothing is on chain yet) and ``extensions.settlement`` saying when it settles
        (docs/x402.md, "Settle on readiness")."""
        answer = self.coin.settlement_response(self.settlement, self.version)
        if self.held_until is not None:
            answer["transaction"] = ""
            answer["extensions"] = {"settlement": {"status": "held", "settlesWhen": self.held_until}}
        return answer


class PaymentRequired(ApiError):
    """The 402 of an x402 top-up sent without a payment: the x402 v1 body (``x402Version``, ``error``,
    ``message``, ``accepts``); ``offer`` for the v2 form."""

    def __init__(self, payment: PaymentOffer, error: str = "X-PAYMENT header is required") -> None:
        super().__init__(
            402,
            error,
            f"Pay {payment.amount_micros / MICROS_PER_USD:.2f} USD in {payment.coin_codes()}: sign the payment "
            "requirements in accepts (x402) and re-send this request with X-PAYMENT (v1) or PAYMENT-SIGNATURE (v2).",
        )
        self.offer = payment

    def body(self) -> dict[str, Any]:
        return {"x402Version": X402_VERSION, **super().body(), "accepts": self.offer.all_accepts()}


class ShortBalance(InsufficientBalance):
    """The seed's 402 ``insufficient_balance`` of an operation the shop lets x402 pay (an order, a renewal):
    ``offer`` holds the x402 requirements for the deficit, which the answer carries beside the seed's fields
    (``x402Version`` and ``accepts`` in the body; the v2 form in ``PAYMENT-REQUIRED`` over HTTP)."""

    def __init__(self, price_micros: int, balance_micros: int, payment: PaymentOffer) -> None:
        super().__init__(price_micros, balance_micros)
        self.offer = payment

    def body(self) -> dict[str, Any]:
        return {**super().body(), **self.offer.v1_fields()}


class PaidButFailed(ApiError):
    """An operation that failed after its x402 payment settled and was credited: the operation's own
    status and code, a message saying the money stays on the balance, and ``payment`` (top-up ref, USD
    credited, transaction). ``settled`` is reported as for a success."""

    def __init__(self, failure: ApiError, settled: SettledPayment, summary: dict[str, Any], what: str) -> None:
        super().__init__(
            failure.status,
            failure.error,
            f"{failure.message} The x402 payment of {summary['credited_usd']} USD settled and was credited to your "
            f"balance (top-up {summary['topup']}), where it stays; {what} was not made.",
            **failure.extra,
            payment=summary,
        )
        self.headers.update(failure.headers)
        self.settled = settled
