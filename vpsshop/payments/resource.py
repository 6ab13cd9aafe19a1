"""The Top-up resource: what ``GET /v1/topups/{ref}`` answers and what every ``topup.*`` event carries.

One model (:class:`TopupOut`) for both. Its progress fields (``payment_status``,
``amount_received``, ``credited_usd``, ``confirmations``) come from the top-up's payments
(:class:`TopupView`); ``payment`` is the payment a ``topup.payment_*`` event is about (null
elsewhere), and ``qr_data_uri`` is drawn for the API's answers only (null in events: a webhook need
not carry a picture).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from pydantic import BaseModel, Field
from sqlmodel import Session, select

import vpsshop.events as events
from vpsshop.coins import DepositCoin, format_atomic
from vpsshop.context import AppContext
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.payments.models import Topup, TopupPayment, X402Record
from vpsshop.qrcodes import png_data_uri

__all__ = [
    "DepositAddressOut",
    "PaymentOut",
    "TopupOut",
    "TopupView",
    "emit_payment_credited",
    "make_view",
    "topup_event",
    "topup_out",
    "x402_view",
]


class PaymentOut(BaseModel):
    """One payment to a top-up (in ``topup.payment_*`` events)."""

    coin: str
    txid: str
    amount: str = Field(description="Amount of this payment in the coin's units.")
    confirmations: int | None
    late: bool = Field(
        description="Arrived after the top-up expired or was cancelled: valued at the rate of "
        "the moment it was credited."
    )
    credited_usd: UsdAmount | None = Field(description="USD credited for it; null until credited.")


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
        "monero: for XMR. Null for x402 top-ups, and in events (GET /topups/{ref} draws it)."
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
    completed_at: datetime | None = Field(None, description="When its first payment was credited.")
    payment: PaymentOut | None = Field(
        None, description="The payment a topup.payment_* event (or topup.late_payment ...) is about; null elsewhere."
    )


class DepositAddressOut(BaseModel):
    """A standing deposit address of the account (and what every ``deposit_address.*`` event carries)."""

    coin: str
    address: str = Field(description="Send any amount of `coin` here, any number of times; it never expires.")
    network: str | None = Field(description="Chain and network (bitcoin, litecoin-regtest ...).")
    minimum_usd: UsdAmount = Field(
        description="A receipt worth less (at the rate when confirmed) is held until the receipts held add up to it."
    )
    held_amount: str = Field(description="Confirmed receipts held below the minimum, in the coin's units.")
    confirmations_required: int
    qr_data_uri: str | None = Field(description="PNG QR code (data URI) of the address; null in lists.")
    created_at: datetime
    payment: PaymentOut | None = Field(
        None,
        description="The receipt a deposit_address.payment_* event is about (its top-up is made when it is "
        "credited); null elsewhere.",
    )


@dataclass(frozen=True)
class TopupView:
    """A top-up with what its payments add up to."""

    topup: Topup
    payment_status: str
    amount_received_atomic: int
    credited_micros: int
    confirmations: int | None


def make_view(topup: Topup, payments: list[TopupPayment]) -> TopupView:
    live = [p for p in payments if p.status in ("seen", "credited")]
    seen = [p for p in live if p.status == "seen"]
    if seen:
        status = "seen"
    elif live:
        status = "confirmed"
    else:
        status = "awaiting_payment"
    return TopupView(
        topup=topup,
        payment_status=status,
        amount_received_atomic=sum(int(p.amount_atomic) for p in live if p.coin == topup.coin),
        credited_micros=sum(p.credited_micros or 0 for p in live),
        confirmations=min(p.confirmations for p in seen) if seen else None,
    )


def x402_view(topup: Topup, status: str | None) -> TopupView:
    """An x402 top-up by its record's status: settled is credited in full (USDC at par), settling
    is seen (outcome unknown), rejected or no record is nothing received."""
    if status == "settled":
        return TopupView(topup, "confirmed", int(topup.deposit_amount_atomic), topup.amount_micros, None)
    if status == "settling":
        return TopupView(topup, "seen", int(topup.deposit_amount_atomic), 0, None)
    return TopupView(topup, "awaiting_payment", 0, 0, None)


def read_view(session: Session, topup: Topup) -> TopupView:
    """The view of ``topup`` from its payments (or its x402 record), read in ``session``."""
    if topup.watch_key is None and topup.deposit_address_id is None:  # an x402 top-up: its record says how far it got
        record = session.exec(select(X402Record).where(X402Record.topup_id == topup.id)).first()
        return x402_view(topup, record.status if record is not None else None)
    payments = session.exec(select(TopupPayment).where(TopupPayment.topup_id == topup.id)).all()
    return make_view(topup, list(payments))


@lru_cache(maxsize=4096)
def qr_data_uri(text: str) -> str:
    """A PNG QR code of ``text`` as a ``data:`` URI (made with ``qrcode``; cached per text)."""
    return png_data_uri(text)


def _decimals(ctx: AppContext, code: str) -> int:
    coin = ctx.coins.get(code)
    return coin.decimals if coin is not None else 0


def topup_out(ctx: AppContext, view: TopupView, *, qr: bool = True, payment: PaymentOut | None = None) -> TopupOut:
    """The resource. ``qr``: draw the QR code of a deposit top-up (about 15 ms the first time: off the
    event loop)."""
    topup = view.topup
    coin = ctx.coins.get(topup.coin)
    decimals = coin.decimals if coin is not None else 0
    qr_uri = None
    required = None
    if isinstance(coin, DepositCoin) and topup.deposit_address:
        if qr:
            qr_uri = qr_data_uri(coin.payment_uri(topup.deposit_address, int(topup.deposit_amount_atomic), topup.ref))
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
        qr_data_uri=qr_uri,
        expires_at=topup.expires_at,
        payment_status=view.payment_status,
        amount_received=format_atomic(view.amount_received_atomic, decimals),
        credited_usd=micros_to_usd(view.credited_micros),
        confirmations=view.confirmations,
        confirmations_required=required,
        created_at=topup.created_at,
        completed_at=topup.completed_at,
        payment=payment,
    )


def payment_out(ctx: AppContext, payment: TopupPayment) -> PaymentOut:
    return PaymentOut(
        coin=payment.coin,
        txid=payment.txid,
        amount=format_atomic(int(payment.amount_atomic), _decimals(ctx, payment.coin)),
        confirmations=payment.confirmations,
        late=payment.late,
        credited_usd=micros_to_usd(payment.credited_micros) if payment.credited_micros is not None else None,
    )


def topup_event(ctx: AppContext, session: Session, topup: Topup, payment: TopupPayment | None = None) -> TopupOut:
    """The top-up as an event carries it, read in the transaction that changed it (``session``)."""
    session.flush()
    return topup_out(
        ctx, read_view(session, topup), qr=False, payment=payment_out(ctx, payment) if payment is not None else None
    )


def x402_payment_event(
    ctx: AppContext, topup: Topup, transaction: str, amount_atomic: int, credited_micros: int
) -> TopupOut:
    """A settled x402 authorization as a payment event's data (USDC at par; no confirmations)."""
    payment = PaymentOut(
        coin=topup.coin,
        txid=transaction,
        amount=format_atomic(int(amount_atomic), _decimals(ctx, topup.coin)),
        confirmations=None,
        late=False,
        credited_usd=micros_to_usd(credited_micros),
    )
    return topup_out(ctx, x402_view(topup, "settled"), qr=False, payment=payment)


def emit_payment_credited(
    session: Session, ctx: AppContext, topup: Topup, payment: TopupPayment, completed: bool, now: datetime
) -> None:
    """The events of one credited deposit payment: confirmed; late, under- or overpaid; completed.

    Under and over are judged on what the top-up's address received in its own coin against the
    amount asked for; a payment in another coin of the chain, on the USD credited.
    """
    data = topup_event(ctx, session, topup, payment)
    account = topup.account_id
    events.emit(session, "topup.payment_confirmed", account, data, now=now)
    if payment.late:
        events.emit(session, "topup.late_payment", account, data, now=now)
    credited_rows = [
        p
        for p in session.exec(select(TopupPayment).where(TopupPayment.topup_id == topup.id)).all()
        if p.status == "credited"
    ]
    received = sum(int(p.amount_atomic) for p in credited_rows if p.coin == topup.coin)
    credited = sum(p.credited_micros or 0 for p in credited_rows)
    shortfall = int(topup.deposit_amount_atomic) - received if received else topup.amount_micros - credited
    if shortfall > 0:
        events.emit(session, "topup.underpaid", account, data, now=now)
    elif shortfall < 0:
        events.emit(session, "topup.overpaid", account, data, now=now)
    if completed:
        events.emit(session, "topup.completed", account, data, now=now)
