"""Top-ups as the customer does them: start one (a deposit address, or x402), read it, cancel it.

Every front end calls these: ``POST /v1/topups`` and ``GET /v1/topups/{ref}``, the dashboard's top-up
pages, the MCP tools. The engine underneath (:mod:`vpsshop.payments.engine`) watches the chains and
credits; :mod:`vpsshop.x402.settlement` settles x402 authorizations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal

from anyio import to_thread
from pydantic import Field, WithJsonSchema, field_validator
from sqlmodel import col, select

from vpsshop import limits, wallets
from vpsshop.accounts import MissingCredential, customer_of
from vpsshop.actors import Customer
from vpsshop.coins import DepositCoin, PaymentCoin, X402Coin
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, NotFound
from vpsshop.inputs import Input
from vpsshop.money import MAX_TOPUP_CENTS, MIN_TOPUP_CENTS, usd_to_micros
from vpsshop.payments import engine_for
from vpsshop.payments.models import Topup
from vpsshop.payments.resource import TopupOut, make_view, read_view, topup_out, x402_view
from vpsshop.wallets import SignupCredentials
from vpsshop.x402 import purchases, settlement
from vpsshop.x402.offers import PaymentRequired, SettledPayment, SignedPayment, offer_in

__all__ = [
    "REF_PATTERN",
    "TopupInput",
    "TopupStarted",
    "cancel_topup",
    "coin_of",
    "get_topup",
    "recent_topups",
    "start_topup",
    "watches_chain",
]

MIN_USD = Decimal(MIN_TOPUP_CENTS) / 100  # the limits the catalog's topup_limits also shows
MAX_USD = Decimal(MAX_TOPUP_CENTS) / 100
REF_PATTERN = r"^[A-Za-z0-9_-]{1,40}$"
"""A top-up reference as a request names it (``tp_`` and 22 url-safe characters are made)."""


class TopupInput(Input):
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


@dataclass(frozen=True)
class TopupStarted:
    """A started top-up, and the x402 settlement that paid it when one did."""

    topup: TopupOut
    settled: SettledPayment | None = None


def _counted(ctx: AppContext, account_id: int) -> None:
    limits.count_write(ctx, account_id)
    limits.topup_quota(ctx, account_id)


async def start_topup(
    ctx: AppContext,
    customer: Customer,
    data: TopupInput,
    *,
    idempotency_key: str | None = None,
    pay_by: Literal["x402", "deposit"] | None = None,
    payment: SignedPayment | None = None,
) -> TopupStarted:
    """Start a top-up of ``data.amount`` USD.

    A deposit coin gives a pending top-up with an address of its own and the amount to send at a
    locked rate (``idempotency_key``: a retry returns the first top-up). An x402 coin (or ``pay_by``
    ``"x402"``, or a ``payment``) asks for the payment first: without ``payment`` it raises
    :class:`~vpsshop.x402.offers.PaymentRequired` with the requirements; with it, the payment is
    settled and credited and the top-up is completed.

    :raises BadRequest: invalid_coin, invalid_payment_mode, invalid_payment.
    :raises RateLimited: the account's write limit or open top-up quota.
    :raises Conflict: idempotency_key_reused.
    :raises ApiError: 503 rate_unavailable; the x402 refusals and 503s of :func:`vpsshop.x402.settlement.pay`.
    """
    engine = engine_for(ctx)
    await to_thread.run_sync(_counted, ctx, customer.account_id)
    if payment is not None:  # a client that sends a payment means to pay by x402
        if pay_by == "deposit":
            raise BadRequest(
                "invalid_payment_mode",
                "An x402 payment (X-PAYMENT, PAYMENT-SIGNATURE) belongs to the x402 flow, not to a deposit top-up.",
            )
        pay_by = "x402"
    requested = engine.coin(data.coin)
    any_x402 = pay_by == "x402" and not isinstance(requested, X402Coin)  # X-Payment-Mode: any x402 coin
    coin = engine.x402_coin() if any_x402 else requested
    amount_micros = usd_to_micros(data.amount)
    if isinstance(coin, X402Coin):
        if payment is None:
            coins = purchases.offered_coins(ctx) if any_x402 else [coin]
            raise PaymentRequired(offer_in(ctx, coins, amount_micros, "/topups"))
        if any_x402:
            coin, _decoded = purchases.decode(ctx, payment)
        topup, settled = await settlement.pay(
            ctx, coin, customer.account_id, amount_micros, payment.value, payment.version
        )
        out = topup_out(ctx, x402_view(topup, "settled" if topup.status == "completed" else None))
        return TopupStarted(out, SettledPayment(coin, settled, payment.version))
    if not isinstance(coin, DepositCoin):
        raise BadRequest("invalid_coin", f"Coin {coin.code} cannot be paid to a deposit address.")
    topup = await engine.create_topup(customer.account_id, amount_micros, coin, idempotency_key)
    view = make_view(topup, [])
    return TopupStarted(await to_thread.run_sync(topup_out, ctx, view))  # the QR code takes ~15 ms


class TopupSignupOut(TopupOut):
    """The answer of a top-up paid by x402 without an API key: the top-up and the paying wallet's account."""

    account: SignupCredentials = Field(
        description="The paying wallet's account, with its first API key and login token the first time (shown once)."
    )


async def start_signup_topup(
    ctx: AppContext,
    data: TopupInput,
    *,
    pay_by: Literal["x402", "deposit"] | None = None,
    payment: SignedPayment | None = None,
    client: str,
) -> TopupStarted:
    """A top-up sent without an API key (pay as sign-up): an x402 top-up credited to the account the paying
    wallet owns, created by its first payment (:func:`vpsshop.wallets.owner_account`); the answer is a
    :class:`TopupSignupOut`. Without a payment, the 402 of :func:`start_topup`.

    :raises MissingCredential: 401 for a deposit coin (a deposit address needs an account first).
    :raises RateLimited: a new account over the sign-up limit of ``client``.
    """
    engine = engine_for(ctx)
    requested = engine.coin(data.coin)
    x402 = isinstance(requested, X402Coin) or pay_by == "x402" or payment is not None
    if pay_by == "deposit" or not x402 or purchases.offered_coin(ctx) is None:
        raise MissingCredential()
    coins = [requested] if isinstance(requested, X402Coin) else purchases.offered_coins(ctx)
    if payment is None:
        raise PaymentRequired(offer_in(ctx, coins, usd_to_micros(data.amount), "/topups"))
    _coin, decoded = purchases.decode(ctx, payment)
    owner = await to_thread.run_sync(wallets.owner_account, ctx, decoded.payer, client)
    customer = await customer_of(ctx, owner.account_id)
    started = await start_topup(ctx, customer, data, pay_by="x402", payment=payment)
    shown = await to_thread.run_sync(wallets.deliver_credentials, ctx, decoded.payer, owner)
    return TopupStarted(TopupSignupOut(**started.topup.model_dump(), account=shown), started.settled)


_REF = re.compile(REF_PATTERN)


def _check_ref(ref: str) -> str:
    if not _REF.fullmatch(ref):
        raise NotFound("top-up")
    return ref


async def get_topup(ctx: AppContext, customer: Customer, ref: str) -> TopupOut:
    """The account's top-up ``ref``, after checking its chain (rate-limited): polling it credits the
    balance once a payment has its confirmations. :raises NotFound: no such top-up on this account."""
    view = await engine_for(ctx).get_topup(customer.account_id, _check_ref(ref))
    return await to_thread.run_sync(topup_out, ctx, view)  # a QR code not cached yet is drawn off the loop


async def cancel_topup(ctx: AppContext, customer: Customer, ref: str) -> TopupOut:
    """Cancel a pending top-up. :raises ApiError: 404, 409 payment_in_progress or topup_completed."""
    _check_ref(ref)
    await to_thread.run_sync(limits.count_write, ctx, customer.account_id)
    view = await engine_for(ctx).cancel_topup(customer.account_id, ref)
    return await to_thread.run_sync(topup_out, ctx, view)


async def recent_topups(ctx: AppContext, customer: Customer, limit: int = 10) -> list[TopupOut]:
    """The account's newest top-ups, newest first (as stored: :func:`get_topup` checks a chain)."""

    def read() -> list[TopupOut]:
        with ctx.db.session() as session:
            rows = session.exec(
                select(Topup).where(Topup.account_id == customer.account_id).order_by(col(Topup.id).desc()).limit(limit)
            ).all()
            return [topup_out(ctx, read_view(session, t), qr=False) for t in rows]

    return await to_thread.run_sync(read)


def coin_of(ctx: AppContext, code: str | None) -> PaymentCoin[Any]:
    """The enabled coin ``code`` (the shop's default coin when None). :raises BadRequest: invalid_coin."""
    return engine_for(ctx).coin(code)


def watches_chain(ctx: AppContext, coin_code: str) -> bool:
    """Whether the shop watches ``coin_code``'s chain for payments (a sandbox coin without a node does not)."""
    coin = ctx.coins.get(coin_code)
    return isinstance(coin, DepositCoin) and coin.can_scan
