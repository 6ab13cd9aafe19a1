"""Top-up endpoints: create (deposit address or x402), read (checks the chain), cancel.

The deposit top-up services (:func:`create_deposit_topup`, :func:`read_topup`,
:func:`cancel_topup_of`) give the API's :class:`TopupOut`; the endpoints and the dashboard call them.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, Field, WithJsonSchema, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vpsshop.coins import DepositCoin, X402Coin
from vpsshop.context import MAX_TOPUP_CENTS, MIN_TOPUP_CENTS, AppContext
from vpsshop.errors import BadRequest
from vpsshop.money import UsdAmount, micros_to_usd, usd_to_micros
from vpsshop.payments import engine_for
from vpsshop.payments.engine import TopupView, make_view, qr_data_uri
from vpsshop.routing import ApiModel, ApiRoute, Call, Header, Reply, idempotency_header, idempotency_key, json_response
from vpsshop.x402 import discovery, headers, settlement

TAG = ("topups",)
MIN_USD = Decimal(MIN_TOPUP_CENTS) / 100  # the limits the catalog's topup_limits also shows
MAX_USD = Decimal(MAX_TOPUP_CENTS) / 100


class TopupBody(ApiModel):
    """Body of ``POST /topups``."""

    amount: Annotated[
        Decimal,
        WithJsonSchema(
            {
                "type": "number",
                "minimum": 25,
                "maximum": 2000,
                "multipleOf": 0.01,
                "description": "USD to add to the balance: 25 to 2000, at most two decimals (a JSON number).",
            }
        ),
    ] = Field(ge=MIN_USD, le=MAX_USD, decimal_places=2, allow_inf_nan=False)
    coin: str | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="Coin code (BTC, XMR, ETH, LTC, TRX, USDT, USDTTRC, SOL, USDCBASE). "
        "Default: BTC (the shop's `topups.default_coin` setting may change it).",
        json_schema_extra={"x-catalog": "coins"},
    )

    @field_validator("amount", mode="before")
    @classmethod
    def _json_number(cls, value: Any) -> Any:
        if isinstance(value, (bool, str)):
            raise ValueError("amount must be a JSON number of USD (25 to 2000)")
        return value

    @classmethod
    def error_code(cls, field_name: str, error_type: str) -> str:
        if field_name == "amount" and error_type == "greater_than_equal":
            return "amount_too_low"
        if field_name == "amount" and error_type == "less_than_equal":
            return "amount_too_high"
        if field_name == "coin":
            return "invalid_coin"
        return super().error_code(field_name, error_type)


class TopupOut(BaseModel):
    """The seed's Top-up, plus the progress of its payment."""

    ref: str = Field(description="Top-up reference, used in the path. Unguessable.")
    status: str = Field(description="pending, completed, expired or cancelled.")
    amount_usd: UsdAmount = Field(description="USD amount requested.")
    coin: str = Field(description="Coin code requested.")
    deposit_address: str = Field(description="Where to pay. Unique to this top-up; never reused.")
    deposit_amount: str = Field(
        description="Amount to pay, in the deposit coin's units, at the rate locked until expires_at."
    )
    deposit_coin: str
    deposit_network: str | None = Field(description="Chain and network of the deposit (bitcoin, litecoin-testnet...).")
    qr_data_uri: str | None = Field(
        description="PNG QR code (data URI) of the payment URI: BIP-21 for BTC and LTC, "
        "monero: for XMR. Null for x402 top-ups."
    )
    expires_at: datetime | None = Field(
        description="End of the locked rate. Payments after it are still credited, "
        "valued at the rate of the moment they are credited."
    )
    payment_status: str = Field(
        description="awaiting_payment (nothing seen), seen (a payment is on chain or in the "
        "mempool, waiting for confirmations), confirmed (every payment seen is credited)."
    )
    amount_received: str = Field(description="Sum of the payments seen or credited, in the deposit coin's units.")
    credited_usd: UsdAmount = Field(description="USD credited to the balance by this top-up so far.")
    confirmations: int | None = Field(description="Confirmations of the least confirmed payment still waiting.")
    confirmations_required: int | None = Field(description="Confirmations a payment needs before it is credited.")
    created_at: datetime


def render(ctx: AppContext, view: TopupView) -> TopupOut:
    topup = view.topup
    coin = ctx.coins.get(topup.coin)
    decimals = coin.decimals if coin is not None else 0
    from vpsshop.coins import format_atomic

    qr = None
    required = None
    if isinstance(coin, DepositCoin) and topup.deposit_address:
        qr = qr_data_uri(coin.payment_uri(topup.deposit_address, int(topup.deposit_amount_atomic), topup.ref))
        required = coin.confirmations
    return TopupOut(
        ref=topup.ref,
        status=topup.status,
        amount_usd=micros_to_usd(topup.amount_micros),
        coin=topup.coin,
        deposit_address=topup.deposit_address or "",
        deposit_amount=format_atomic(int(topup.deposit_amount_atomic), decimals),
        deposit_coin=topup.coin,
        deposit_network=topup.deposit_network,
        qr_data_uri=qr,
        expires_at=topup.expires_at,
        payment_status=view.payment_status,
        amount_received=format_atomic(view.amount_received_atomic, decimals),
        credited_usd=micros_to_usd(view.credited_micros),
        confirmations=view.confirmations,
        confirmations_required=required,
        created_at=topup.created_at,
    )


def _header(call: Call, name: str) -> str | None:
    return call.request.headers.get(name)


async def create_topup(call: Call) -> Reply | Response:
    body: TopupBody = call.body
    key = idempotency_key(call.request)  # a malformed key is a 400 whichever way the top-up is paid
    engine = engine_for(call.ctx)
    amount_micros = usd_to_micros(body.amount)
    mode = (_header(call, "x-payment-mode") or "").strip().lower()
    if mode and mode not in ("x402", "deposit"):
        raise BadRequest("invalid_payment_mode", "X-Payment-Mode must be x402 (or deposit, the default).")
    if headers.sends_payment(call.request):
        # a client that sends a payment means to pay by x402
        if mode == "deposit":
            raise BadRequest(
                "invalid_payment_mode",
                "X-PAYMENT and PAYMENT-SIGNATURE belong to the x402 flow, not X-Payment-Mode: deposit.",
            )
        mode = "x402"
    coin = (
        engine.x402_coin()
        if mode == "x402" and not isinstance(engine.coin(body.coin), X402Coin)
        else engine.coin(body.coin)
    )
    if isinstance(coin, X402Coin):
        return await _x402_topup(call, coin, amount_micros)
    if not isinstance(coin, DepositCoin):
        raise BadRequest("invalid_coin", f"Coin {coin.code} cannot be paid to a deposit address.")
    return Reply(await create_deposit_topup(call.ctx, call.account_id, coin, amount_micros, key), 201)


async def create_deposit_topup(
    ctx: AppContext, account_id: int, coin: DepositCoin, amount_micros: int, key: str | None
) -> TopupOut:
    """A pending top-up with its own deposit address (or the earlier one of ``key``).

    :raises ApiError: 409 idempotency_key_reused, 503 rate_unavailable.
    """
    topup = await engine_for(ctx).create_topup(account_id, amount_micros, coin, key)
    return await run_in_threadpool(render, ctx, make_view(topup, []))  # the QR code takes ~15 ms


async def _x402_topup(call: Call, coin: X402Coin, amount_micros: int) -> Reply | Response:
    sent = headers.payment_header(call.request)
    if sent is None:
        body = headers.payment_required_body(call.ctx, coin, amount_micros, "X-PAYMENT header is required")
        response = json_response(body, 402)
        required = headers.payment_required_header(
            call.ctx, coin, amount_micros, extensions=discovery.extensions(call.ctx, "/topups")
        )
        if required is not None:
            response.headers["PAYMENT-REQUIRED"] = required
            response.headers["Access-Control-Expose-Headers"] = "PAYMENT-REQUIRED"
        return response
    header, version = sent
    topup, settled = await settlement.pay(call.ctx, coin, call.account_id, amount_micros, header, version)
    from vpsshop.payments.engine import x402_view

    out = render(call.ctx, x402_view(topup, "settled" if topup.status == "completed" else None))
    name = "X-PAYMENT-RESPONSE" if version == 1 else "PAYMENT-RESPONSE"
    return Reply(
        out, 201, {name: headers.response_header(coin, settled, version), "Access-Control-Expose-Headers": name}
    )


async def read_topup(ctx: AppContext, account_id: int, ref: str) -> TopupOut:
    """The account's top-up ``ref``, after checking its chain (rate-limited). :raises NotFound:"""
    view = await engine_for(ctx).get_topup(account_id, ref)
    return await run_in_threadpool(render, ctx, view)  # a QR code not cached yet is drawn off the loop


async def cancel_topup_of(ctx: AppContext, account_id: int, ref: str) -> TopupOut:
    """Cancel a pending top-up. :raises ApiError: 404, 409 payment_in_progress or topup_completed."""
    view = await engine_for(ctx).cancel_topup(account_id, ref)
    return await run_in_threadpool(render, ctx, view)


async def get_topup(call: Call) -> TopupOut:
    return await read_topup(call.ctx, call.account_id, _ref(call))


async def cancel_topup(call: Call) -> TopupOut:
    return await cancel_topup_of(call.ctx, call.account_id, _ref(call))


def _ref(call: Call) -> str:
    ref: Any = call.path["ref"]
    if not isinstance(ref, str) or not (1 <= len(ref) <= 40):
        from vpsshop.errors import NotFound

        raise NotFound("top-up")
    return ref


class X402RequirementsOut(BaseModel):
    """The 402 body of an x402 top-up (x402 v1)."""

    x402Version: int
    error: str
    message: str = Field(description="What to do: sign the requirements in accepts and re-send the request.")
    accepts: list[dict[str, Any]]


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST",
            "/topups",
            create_topup,
            "Start a top-up",
            TopupOut,
            status=201,
            body=TopupBody,
            description="Creates a pending top-up of `amount` USD paid in `coin` (default BTC). A classic coin "
            "answers 201 with a deposit address unique to this top-up, the amount to pay at a rate locked until "
            "`expires_at`, and a QR code of the payment URI. USDCBASE, or the header `X-Payment-Mode: x402`, "
            "answers 402 with the x402 payment requirements; re-send the same request with `X-PAYMENT` (a signed "
            "EIP-3009 authorization) and the answer is 201 with the completed top-up and `X-PAYMENT-RESPONSE` "
            "(base64 JSON `{success, transaction, network, payer}`). x402 v2 clients: the 402 also carries "
            "`PAYMENT-REQUIRED` (base64 JSON `{x402Version: 2, error, resource: {url, description, mimeType}, "
            "accepts}` with CAIP-2 networks and `amount`); re-send with `PAYMENT-SIGNATURE` instead of `X-PAYMENT` "
            "and the 201 carries `PAYMENT-RESPONSE` (base64 JSON, network in CAIP-2, plus `amount`). The body of "
            "the 402 stays x402 v1. Re-sending the same payment header returns the same top-up and credits "
            "nothing more; 503 settlement_pending means the outcome is not known yet: re-send the same header; 503 "
            "settlement_unavailable means the payment could not be checked now (nothing was sent or kept): re-send "
            "it later. "
            "Send `Idempotency-Key` to make a retried request return the first top-up instead of a second one. "
            "Errors: 400 amount_too_low (< 25), amount_too_high (> 2000), invalid_amount, invalid_coin, "
            "unknown_field, invalid_payment_mode, invalid_payment (malformed X-PAYMENT or PAYMENT-SIGNATURE, or "
            "both sent); 402 with an error code when an x402 authorization is refused (wrong_amount, nonce_used, "
            "authorization_expired ...); 409 idempotency_key_reused, nonce_used (authorization used by another "
            "account); 503 rate_unavailable, settlement_pending, settlement_unavailable. See docs/payments.md and "
            "docs/x402.md.",
            errors={
                400: "amount_too_low (< 25), amount_too_high (> 2000), invalid_amount, invalid_coin, unknown_field, "
                "invalid_payment_mode, or a malformed X-PAYMENT.",
                402: "x402 payment required (body: x402 v1 requirements; header PAYMENT-REQUIRED: the v2 form) or "
                "the authorization was refused (wrong_amount, nonce_used, authorization_expired ...).",
                409: "idempotency_key_reused (same key, different request), nonce_used.",
                503: "rate_unavailable (no fresh exchange rate), settlement_pending (x402 outcome unknown; retry), "
                "settlement_unavailable (the x402 payment could not be checked; nothing sent or kept).",
            },
            responses={402: ("x402 payment requirements", X402RequirementsOut)},
            headers=(
                idempotency_header("A client-chosen key: a retry returns the first top-up."),
                Header(
                    "X-Payment-Mode",
                    "`x402` asks for the x402 flow whatever the coin.",
                    schema={"type": "string", "enum": ["x402", "deposit"]},
                ),
                Header(
                    "X-PAYMENT",
                    "base64 JSON x402 v1 payment payload (re-sent request); the 201 then carries "
                    "X-PAYMENT-RESPONSE. Its presence selects the x402 flow (with X-Payment-Mode: deposit it is "
                    "a 400 invalid_payment_mode).",
                    schema={"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9+/=_-]+$"},
                ),
                Header(
                    "PAYMENT-SIGNATURE",
                    "base64 JSON x402 v2 payment payload (re-sent request, instead of "
                    "X-PAYMENT); the 201 then carries PAYMENT-RESPONSE. Selects the x402 flow like X-PAYMENT.",
                    schema={"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9+/=_-]+$"},
                ),
            ),
            response_headers={},
            tags=TAG,
            operation_id="createTopup",
        ),
        ApiRoute(
            "GET",
            "/topups/{ref}",
            get_topup,
            "Read a top-up",
            TopupOut,
            description="The top-up and the progress of its payment. Polling checks the chain (at most every few "
            "seconds per coin; a background watcher also does) and credits the balance once a payment has its "
            "confirmations: status becomes completed. A pending top-up past expires_at with nothing seen becomes "
            "expired. A top-up of another account is a 404.",
            errors={404: "No top-up with this ref on this account."},
            tags=TAG,
            operation_id="getTopup",
        ),
        ApiRoute(
            "POST",
            "/topups/{ref}/cancel",
            cancel_topup,
            "Cancel a pending top-up",
            TopupOut,
            description="Stops a pending top-up: status becomes cancelled. Its address stays watched, so a "
            "payment that still arrives is credited (valued at the rate of that moment) and the top-up then "
            "becomes completed. Cancelling a cancelled or expired top-up returns it unchanged.",
            errors={
                404: "No top-up with this ref on this account.",
                409: "payment_in_progress (a payment waits for confirmations) or topup_completed.",
            },
            tags=TAG,
            operation_id="cancelTopup",
        ),
    ]
