"""x402's messages, apart from any transport: payment requirements, reading a signed payment, the
settlement response.

No database and no HTTP here: the REST API carries these in headers (``X-PAYMENT``,
``PAYMENT-REQUIRED``, ``X-PAYMENT-RESPONSE`` ..., :mod:`vpsshop.api.x402`), the MCP tools in
arguments and results. USDC is valued at par: ``maxAmountRequired`` is the USD amount in the
stablecoin's base units.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from vpsshop.coins import X402Coin, X402Payment, X402Rejected, X402Settlement
from vpsshop.context import AppContext
from vpsshop.errors import ApiError, BadRequest
from vpsshop.money import MICROS_PER_USD

X402_VERSION = 1
"""The version of the 402 body (v2 travels in the ``PAYMENT-REQUIRED`` header)."""


def amount_atomic(coin: X402Coin, amount_micros: int) -> int:
    """The top-up's USD amount in the stablecoin's base units, at par."""
    atomic: int = amount_micros * 10**coin.decimals // MICROS_PER_USD  # int ** int is Any to typeshed
    return atomic


HOLD_MARGIN_SECONDS = 600
"""With ``[x402] settle = "on_ready"``: how long an order's authorization stays valid beyond
``servers.boot_timeout_seconds``: the last provisioning attempt's activation, the worker's settlement
and its receipt must fit in it (docs/x402.md, "Settle on readiness")."""


def settles_on_ready(ctx: AppContext) -> bool:
    """Whether an order's x402 payment is held until the server is ready (``[x402] settle = "on_ready"``)."""
    return ctx.settings.x402.settle == "on_ready"


def holds_orders(ctx: AppContext, coin: X402Coin) -> bool:
    """Whether an order paid in ``coin`` is verified and held until the server is ready: with
    ``[x402] settle = "on_ready"``, for a coin that verifies apart from settling (:meth:`X402Coin.verify`;
    one that does not, such as USDCSOL, settles at the order as before)."""
    return settles_on_ready(ctx) and type(coin).verify is not X402Coin.verify


def hold_seconds(ctx: AppContext) -> int:
    """How long an order's authorization must stay valid when it is settled on readiness."""
    return int(ctx.settings.servers.boot_timeout_seconds) + HOLD_MARGIN_SECONDS


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
    reqs = coin.payment_requirements(amount_atomic(coin, amount_micros), f"{public}{path}", description)
    if path == "/servers" and holds_orders(ctx, coin):  # the authorization must outlive the boot
        reqs["maxTimeoutSeconds"] = max(int(reqs.get("maxTimeoutSeconds", 0)), hold_seconds(ctx))
    return reqs


PAYMENT_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")


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


def payment_network(header: str) -> str | None:
    """The network a base64 JSON payment payload names (v1 ``network``, v2 ``accepted.network``), or None
    when it names none or cannot be read (the coin's own reading then says why)."""
    try:
        decoded = json.loads(base64.b64decode(header.strip() + "=" * (-len(header.strip()) % 4)))
    except (ValueError, TypeError):
        return None
    if not isinstance(decoded, dict):
        return None
    accepted = decoded.get("accepted")
    network = accepted.get("network") if isinstance(accepted, dict) else decoded.get("network")
    return network if isinstance(network, str) else None


def decode_recorded(coin: X402Coin, header: str) -> X402Payment:
    """Decode a header kept in a record: ``X-PAYMENT`` (v1) or ``PAYMENT-SIGNATURE`` (v2)."""
    try:
        version = int(json.loads(base64.b64decode(header + "=" * (-len(header) % 4))).get("x402Version", 1))
    except (ValueError, TypeError, AttributeError):
        version = X402_VERSION
    return coin.decode_payment(header, version)


def _b64_json(body: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def response_header(coin: X402Coin, settlement: X402Settlement, version: int = X402_VERSION) -> str:
    """``X-PAYMENT-RESPONSE`` (v1) or ``PAYMENT-RESPONSE`` (v2): base64 JSON of the settle result."""
    return _b64_json(coin.settlement_response(settlement, version))


def decode(coin: X402Coin, header: str, version: int) -> X402Payment:
    """The coin's reading of a payment header. :raises ApiError: the coin's refusal (400 invalid_payment)."""
    try:
        return coin.decode_payment(header, version)
    except X402Rejected as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
