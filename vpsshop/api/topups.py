"""The top-up endpoints: ``POST /v1/topups`` (a deposit address, or x402), ``GET /v1/topups/{ref}``
(checks the chain), ``POST /v1/topups/{ref}/cancel``, over :mod:`vpsshop.topups`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from vpsshop import limits, topups
from vpsshop.api import x402
from vpsshop.payments.resource import TopupOut
from vpsshop.routing import (
    ApiRoute,
    Call,
    Header,
    Reply,
    body_named,
    client_address,
    idempotency_header,
    idempotency_key,
)
from vpsshop.topups import TopupInput

# The bodies under the names of the OpenAPI description (clients generated from it use them).
TopupBody = body_named("TopupBody", TopupInput)

TAG = ("topups",)


async def create_topup(call: Call) -> Reply:
    key = idempotency_key(call.request)  # a malformed key is a 400 whichever way the top-up is paid
    mode = x402.payment_mode(call.request)
    if call.customer is None:  # no API key: pay as sign-up
        signup = await topups.start_signup_topup(
            call.ctx,
            call.body,
            pay_by="x402" if mode == "x402" else "deposit" if mode == "deposit" else None,
            payment=x402.signed_payment(call.request),
            client=client_address(call.request),
        )
        return Reply(signup.topup, 201, {"Cache-Control": "no-store", **x402.settlement_headers(signup.settled)})
    started = await topups.start_topup(
        call.ctx,
        call.actor,
        call.body,
        idempotency_key=key,
        pay_by="x402" if mode == "x402" else "deposit" if mode == "deposit" else None,
        payment=x402.signed_payment(call.request),
    )
    return Reply(started.topup, 201, x402.settlement_headers(started.settled))


async def get_topup(call: Call) -> TopupOut:
    return await topups.get_topup(call.ctx, call.actor, str(call.path["ref"]))


async def cancel_topup(call: Call) -> TopupOut:
    return await topups.cancel_topup(call.ctx, call.actor, str(call.path["ref"]))


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
            "docs/x402.md.\n\nPay as sign-up: without an Authorization header an x402 top-up (USDCBASE, or "
            "X-Payment-Mode: x402) is answered the same 402, and its payment is credited to the account the paying "
            "wallet owns, created by its first payment (the sign-up limit of POST /account applies); the 201 adds "
            "`account` (`user_id`, `address`, `created`, and the account's first `api_key` and `login_token` the "
            "first time, shown once; Cache-Control: no-store). A deposit coin without a key is a 401. See "
            "POST /servers and docs/x402.md.",
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
            limits=limits.TOPUP_QUOTA + ", or (no API key) too many accounts created from this client address "
            "([ratelimit] signups_per_client)",
            tags=TAG,
            count_writes=False,
            operation_id="createTopup",
            auth_optional=True,
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
            count_writes=False,
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
            count_writes=False,
            operation_id="cancelTopup",
        ),
    ]
