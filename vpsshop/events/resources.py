"""What an event's ``data`` holds: the resource as the API shows it, per ``object``.

Built inside the transaction that makes the change (from rows already at hand), so the event says
what was true at that moment. ``data.object`` names the resource; the models here are also what
``/v1/openapi.json`` documents for each event type.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from vpsshop.coins import format_atomic
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.servers.resource import server_out

if TYPE_CHECKING:  # pragma: no cover
    from sqlmodel import Session

    from vpsshop.context import AppContext
    from vpsshop.models import ApiKey, LedgerEntry
    from vpsshop.payments.models import Topup, TopupPayment


class AccountData(BaseModel):
    object: Literal["account"] = "account"
    user_id: int
    created_at: datetime


class ApiKeyData(BaseModel):
    object: Literal["api_key"] = "api_key"
    id: int
    prefix: str = Field(description="First characters of the key (the key itself is never in an event).")
    name: str | None
    created_at: datetime
    revoked_at: datetime | None


class LedgerEntryData(BaseModel):
    object: Literal["ledger_entry"] = "ledger_entry"
    id: int
    amount_usd: UsdAmount = Field(description="Positive for a credit, negative for a debit.")
    balance_after_usd: UsdAmount
    reason: str = Field(description="topup, order, renewal, refund, admin_credit or admin_debit.")
    ref: str | None = Field(description="What it is for: a top-up ref, server:<id>.")
    created_at: datetime


class PaymentData(BaseModel):
    coin: str
    txid: str
    amount: str = Field(description="Amount of this payment in the coin's units.")
    confirmations: int | None
    late: bool = Field(
        description="Arrived after the top-up expired or was cancelled: valued at the rate of "
        "the moment it was credited."
    )
    credited_usd: UsdAmount | None = Field(description="USD credited for it; null until credited.")


class TopupData(BaseModel):
    object: Literal["topup"] = "topup"
    ref: str
    status: str = Field(description="pending, completed, expired or cancelled.")
    amount_usd: UsdAmount
    coin: str
    deposit_address: str
    deposit_amount: str
    deposit_network: str | None
    expires_at: datetime | None
    created_at: datetime
    completed_at: datetime | None
    amount_received: str | None = Field(
        None, description="Sum of the payments credited so far, in coin units (payment events only)."
    )
    credited_usd: UsdAmount | None = Field(None, description="USD credited by this top-up so far (payment events).")
    payment: PaymentData | None = Field(None, description="The payment the event is about (payment events).")


class WebhookData(BaseModel):
    object: Literal["webhook"] = "webhook"
    id: int
    url: str
    event_types: list[str]
    status: str
    disabled_reason: str | None


def account_data(account_id: int, created_at: datetime) -> AccountData:
    return AccountData(user_id=account_id, created_at=created_at)


def api_key_data(key: ApiKey) -> ApiKeyData:
    assert key.id is not None
    return ApiKeyData(id=key.id, prefix=key.prefix, name=key.name, created_at=key.created_at, revoked_at=key.revoked_at)


def ledger_entry_data(entry: LedgerEntry) -> LedgerEntryData:
    assert entry.id is not None
    return LedgerEntryData(
        id=entry.id,
        amount_usd=micros_to_usd(entry.amount_micros),
        balance_after_usd=micros_to_usd(entry.balance_after_micros),
        reason=entry.reason,
        ref=entry.ref,
        created_at=entry.created_at,
    )


def _decimals(ctx: AppContext, coin: str) -> int:
    found = ctx.coins.get(coin)
    return found.decimals if found is not None else 0


def topup_data(
    ctx: AppContext, topup: Topup, payment: TopupPayment | None = None, session: Session | None = None
) -> TopupData:
    """The top-up; with ``payment`` (and ``session`` to add up what was credited) a payment event's data."""
    decimals = _decimals(ctx, topup.coin)
    extra: dict[str, Any] = {}
    if payment is not None:
        pay_decimals = _decimals(ctx, payment.coin)
        extra["payment"] = PaymentData(
            coin=payment.coin,
            txid=payment.txid,
            amount=format_atomic(int(payment.amount_atomic), pay_decimals),
            confirmations=payment.confirmations,
            late=payment.late,
            credited_usd=micros_to_usd(payment.credited_micros) if payment.credited_micros is not None else None,
        )
        if session is not None:
            received, credited = credited_totals(session, topup)
            extra["amount_received"] = format_atomic(received, decimals)
            extra["credited_usd"] = micros_to_usd(credited)
    return TopupData(
        ref=topup.ref,
        status=topup.status,
        amount_usd=micros_to_usd(topup.amount_micros),
        coin=topup.coin,
        deposit_address=topup.deposit_address or "",
        deposit_amount=format_atomic(int(topup.deposit_amount_atomic), decimals),
        deposit_network=topup.deposit_network,
        expires_at=topup.expires_at,
        created_at=topup.created_at,
        completed_at=topup.completed_at,
        **extra,
    )


def credited_totals(session: Session, topup: Topup) -> tuple[int, int]:
    """(atomic units of the top-up's coin credited, micro-dollars credited) over its credited payments."""
    from sqlmodel import select

    from vpsshop.payments.models import TopupPayment

    rows = session.exec(
        select(TopupPayment).where(TopupPayment.topup_id == topup.id, TopupPayment.status == "credited")
    ).all()
    received = sum(int(p.amount_atomic) for p in rows if p.coin == topup.coin)
    return received, sum(p.credited_micros or 0 for p in rows)


def server_data(session: Session, server_id: int) -> Any:
    """The server as ``GET /servers/{id}`` shows it, read in ``session`` (after the change)."""
    from vpsshop.models import Server

    session.flush()
    server = session.get(Server, server_id, populate_existing=True)
    assert server is not None
    return server_out(server)


def x402_payment_data(
    ctx: AppContext, topup: Topup, transaction: str, amount_atomic: int, credited_micros: int
) -> TopupData:
    """A settled x402 authorization as a payment event's data (USDC at par; no confirmations)."""
    data = topup_data(ctx, topup)
    decimals = _decimals(ctx, topup.coin)
    data.payment = PaymentData(
        coin=topup.coin,
        txid=transaction,
        amount=format_atomic(int(amount_atomic), decimals),
        confirmations=None,
        late=False,
        credited_usd=micros_to_usd(credited_micros),
    )
    data.amount_received = format_atomic(int(amount_atomic), decimals)
    data.credited_usd = micros_to_usd(credited_micros)
    return data


def emit_payment_credited(
    session: Session, ctx: AppContext, topup: Topup, payment: TopupPayment, completed: bool, now: datetime
) -> None:
    """The events of one credited deposit payment: confirmed; late, under- or overpaid; completed.

    Under and over are judged on what the top-up's address received in its own coin against the
    amount asked for; a payment in another coin of the chain, on the USD credited.
    """
    from vpsshop import events

    session.flush()
    data = topup_data(ctx, topup, payment, session)
    account = topup.account_id
    events.emit(session, "topup.payment_confirmed", account, data, now=now)
    if payment.late:
        events.emit(session, "topup.late_payment", account, data, now=now)
    received, credited = credited_totals(session, topup)
    if received:
        shortfall = int(topup.deposit_amount_atomic) - received
    else:
        shortfall = topup.amount_micros - credited
    if shortfall > 0:
        events.emit(session, "topup.underpaid", account, data, now=now)
    elif shortfall < 0:
        events.emit(session, "topup.overpaid", account, data, now=now)
    if completed:
        events.emit(session, "topup.completed", account, data, now=now)
