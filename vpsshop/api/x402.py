"""x402 over HTTP: the payment headers a request carries and the x402 headers of an answer.

* ``X-PAYMENT`` (v1) and ``PAYMENT-SIGNATURE`` (v2) carry the client's signed payment
  (:func:`signed_payment`);
* a 402 asking for a payment keeps its x402 v1 fields in the body and adds ``PAYMENT-REQUIRED`` (the
  v2 form, base64 JSON, with the ``bazaar`` and ``payment-identifier`` extensions);
* an answer paid by x402 (or the replay of one, or a failure after the payment settled) carries
  ``X-PAYMENT-RESPONSE`` (v1) or ``PAYMENT-RESPONSE`` (v2).

The operations know nothing of these headers: they take a :class:`~vpsshop.x402.offers.SignedPayment`
and report a :class:`~vpsshop.x402.offers.SettledPayment` or raise an error carrying a
:class:`~vpsshop.x402.offers.PaymentOffer` (:func:`error_headers`).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from starlette.requests import Request

from vpsshop.api.discovery import extensions
from vpsshop.context import AppContext
from vpsshop.errors import ApiError, BadRequest
from vpsshop.wallets import SIGN_IN_WITH_X, SignatureRequired
from vpsshop.x402.offers import PaidButFailed, PaymentOffer, SettledPayment, SignedPayment

__all__ = [
    "error_headers",
    "payment_mode",
    "settlement_headers",
    "signed_message",
    "signed_payment",
]


def signed_payment(request: Request) -> SignedPayment | None:
    """The request's x402 payment: ``X-PAYMENT`` (v1) or ``PAYMENT-SIGNATURE`` (v2), or None.

    :raises BadRequest: invalid_payment when a header is empty or both are sent.
    """
    v1, v2 = request.headers.get("x-payment"), request.headers.get("payment-signature")
    for name, value in (("X-PAYMENT", v1), ("PAYMENT-SIGNATURE", v2)):
        if value is not None and not value.strip():
            raise BadRequest("invalid_payment", f"The {name} header is empty; send the base64 payment payload.")
    if v1 is not None and v2 is not None:
        raise BadRequest("invalid_payment", "Send either X-PAYMENT (x402 v1) or PAYMENT-SIGNATURE (v2), not both.")
    if v1 is not None:
        return SignedPayment(v1, 1)
    if v2 is not None:
        return SignedPayment(v2, 2)
    return None


def signed_message(request: Request) -> str | None:
    """The request's ``SIGN-IN-WITH-X`` header (the x402 sign-in-with-x extension's signed message), or None.

    :raises BadRequest: invalid_siwx_payload when it is empty.
    """
    value = request.headers.get(SIGN_IN_WITH_X)
    if value is not None and not value.strip():
        raise BadRequest("invalid_siwx_payload", "The SIGN-IN-WITH-X header is empty; send the signed payload.")
    return value


def payment_mode(request: Request) -> str | None:
    """``X-Payment-Mode``: ``x402`` or ``deposit`` (None when absent). :raises BadRequest: any other value."""
    mode = (request.headers.get("x-payment-mode") or "").strip().lower()
    if mode and mode not in ("x402", "deposit"):
        raise BadRequest("invalid_payment_mode", "X-Payment-Mode must be x402 (or deposit, the default).")
    return mode or None


def _b64_json(body: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def settlement_headers(settled: SettledPayment | None) -> dict[str, str]:
    """``X-PAYMENT-RESPONSE`` (v1) or ``PAYMENT-RESPONSE`` (v2) reporting ``settled``, exposed to browsers."""
    if settled is None:
        return {}
    name = "X-PAYMENT-RESPONSE" if settled.version == 1 else "PAYMENT-RESPONSE"
    return {name: _b64_json(settled.response()), "Access-Control-Expose-Headers": name}


def payment_required_header(ctx: AppContext, payment: PaymentOffer) -> dict[str, str]:
    """``PAYMENT-REQUIRED`` of a 402 asking for ``payment`` (empty when the coin offers no x402 v2)."""
    required = payment.payment_required(extensions(ctx, payment.operation_path))
    if required is None:
        return {}
    return {"PAYMENT-REQUIRED": _b64_json(required), "Access-Control-Expose-Headers": "PAYMENT-REQUIRED"}


def error_headers(ctx: AppContext, exc: ApiError) -> dict[str, str]:
    """The x402 headers of an error answer: ``PAYMENT-REQUIRED`` when it asks for a payment (an x402
    top-up's 402, an order's or renewal's short balance when the shop takes x402), the payment
    response when it failed after its payment settled."""
    if isinstance(exc, PaidButFailed):
        return settlement_headers(exc.settled)
    if isinstance(exc, SignatureRequired):
        return {
            "PAYMENT-REQUIRED": _b64_json(exc.payment_required()),
            "Access-Control-Expose-Headers": "PAYMENT-REQUIRED",
        }
    offer = getattr(exc, "offer", None)
    if isinstance(offer, PaymentOffer):
        return payment_required_header(ctx, offer)
    return {}
