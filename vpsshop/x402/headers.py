"""The HTTP side of x402: reading the payment headers, writing the 402 and the payment responses.

No database here. ``X-PAYMENT`` (v1) and ``PAYMENT-SIGNATURE`` (v2) are read by
:func:`payment_header`; the 402's v1 body by :func:`payment_required_body`, its v2
``PAYMENT-REQUIRED`` header by :func:`payment_required_header`; ``X-PAYMENT-RESPONSE`` /
``PAYMENT-RESPONSE`` by :func:`response_header`. USDC is valued at par: ``maxAmountRequired`` is the
USD amount in the stablecoin's base units.
"""

from __future__ import annotations

import base64
import json
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from vpsshop.coins import X402Coin, X402Payment, X402Rejected, X402Settlement
from vpsshop.errors import ApiError, BadRequest
from vpsshop.money import MICROS_PER_USD

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext

X402_VERSION = 1
"""The version of the 402 body (v2 travels in the ``PAYMENT-REQUIRED`` header)."""


def amount_atomic(coin: X402Coin, amount_micros: int) -> int:
    """The top-up's USD amount in the stablecoin's base units, at par."""
    return amount_micros * 10**coin.decimals // MICROS_PER_USD


def requirements(
    ctx: AppContext,
    coin: X402Coin,
    amount_micros: int,
    path: str = "/topups",
    description: str | None = None,
) -> dict[str, Any]:
    """One v1 ``accepts`` entry for ``amount_micros`` USD, for the resource ``path`` (under ``public_url``)."""
    public = ctx.settings.public_url.rstrip("/")
    if description is None:
        description = f"Top-up of {amount_micros / MICROS_PER_USD:.2f} USD"
    return coin.payment_requirements(amount_atomic(coin, amount_micros), f"{public}{path}", description)


PAYMENT_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")


def sends_payment(request: Request) -> bool:
    """Whether the request carries an x402 payment header (valid or not): it means to pay by x402."""
    return "x-payment" in request.headers or "payment-signature" in request.headers


def payment_header(request: Request) -> tuple[str, int] | None:
    """The request's x402 payment: (``X-PAYMENT`` value, 1) or (``PAYMENT-SIGNATURE`` value, 2), or None.

    :raises BadRequest: invalid_payment when a header is empty or both are sent.
    """
    v1, v2 = request.headers.get("x-payment"), request.headers.get("payment-signature")
    for name, value in (("X-PAYMENT", v1), ("PAYMENT-SIGNATURE", v2)):
        if value is not None and not value.strip():
            raise BadRequest("invalid_payment", f"The {name} header is empty; send the base64 payment payload.")
    if v1 is not None and v2 is not None:
        raise BadRequest("invalid_payment", "Send either X-PAYMENT (x402 v1) or PAYMENT-SIGNATURE (v2), not both.")
    if v1 is not None:
        return v1, 1
    if v2 is not None:
        return v2, 2
    return None


def payment_identifier(payment: X402Payment) -> str | None:
    """The id of the x402 v2 ``payment-identifier`` extension in the payload, if the client sent one.

    :raises BadRequest: invalid_payment when the extension is there but its id is not 16 to 128
        letters, digits, ``_`` or ``-``.
    """
    extensions = payment.raw.get("extensions")
    ext = extensions.get("payment-identifier") if isinstance(extensions, dict) else None
    info = ext.get("info") if isinstance(ext, dict) else None
    value = info.get("id") if isinstance(info, dict) else None
    if value is None:
        return None
    if not isinstance(value, str) or not PAYMENT_ID.fullmatch(value):
        raise BadRequest(
            "invalid_payment", "extensions.payment-identifier.info.id must be 16 to 128 letters, digits, '_' or '-'."
        )
    return value


def decode_recorded(coin: X402Coin, header: str) -> X402Payment:
    """Decode a header kept in a record: ``X-PAYMENT`` (v1) or ``PAYMENT-SIGNATURE`` (v2)."""
    try:
        version = int(json.loads(base64.b64decode(header + "=" * (-len(header) % 4))).get("x402Version", 1))
    except (ValueError, TypeError, AttributeError):
        version = X402_VERSION
    return coin.decode_payment(header, version)


def payment_required_body(ctx: AppContext, coin: X402Coin, amount_micros: int, error: str) -> dict[str, Any]:
    """The x402 v1 body of a top-up's 402. ``error`` is x402's text; ``message`` says what to do, as
    every error body of the API does."""
    return {
        "x402Version": X402_VERSION,
        "error": error,
        "message": f"Pay {amount_micros / MICROS_PER_USD:.2f} USD in {coin.code}: sign the payment requirements "
        "in accepts (x402) and re-send this request with X-PAYMENT (v1) or PAYMENT-SIGNATURE (v2).",
        "accepts": [requirements(ctx, coin, amount_micros)],
    }


def _b64_json(body: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def payment_required_header(
    ctx: AppContext,
    coin: X402Coin,
    amount_micros: int,
    path: str = "/topups",
    description: str | None = None,
    extensions: dict[str, Any] | None = None,
) -> str | None:
    """``PAYMENT-REQUIRED`` (x402 v2) sent with the 402 next to the v1 body; None when the coin does
    not offer v2 (:meth:`X402Coin.payment_requirements_v2` raises ``NotImplementedError``)."""
    reqs = requirements(ctx, coin, amount_micros, path, description)
    try:
        accepted = coin.payment_requirements_v2(reqs)
    except NotImplementedError:
        return None
    required: dict[str, Any] = {
        "x402Version": 2,
        "error": "PAYMENT-SIGNATURE header is required",
        "resource": {
            "url": reqs["resource"],
            "description": reqs.get("description", ""),
            "mimeType": reqs.get("mimeType", "application/json"),
        },
        "accepts": [accepted],
    }
    if extensions:
        required["extensions"] = extensions
    return _b64_json(required)


def response_header(coin: X402Coin, settlement: X402Settlement, version: int = X402_VERSION) -> str:
    """``X-PAYMENT-RESPONSE`` (v1) or ``PAYMENT-RESPONSE`` (v2): base64 JSON of the settle result."""
    return _b64_json(coin.settlement_response(settlement, version))


def decode(coin: X402Coin, header: str, version: int) -> X402Payment:
    """The coin's reading of a payment header. :raises ApiError: the coin's refusal (400 invalid_payment)."""
    try:
        return coin.decode_payment(header, version)
    except X402Rejected as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
