"""The ledger: the one way a balance changes.

Every change is an appended :class:`~vpsshop.models.LedgerEntry` with a reason, written in the same
transaction as the conditional update of the account's balance. The update only succeeds while the
new balance stays at or above zero, which the database checks row by row under concurrency on both
SQLite and PostgreSQL; a ``CHECK`` constraint backs it up. An entry may carry a ``dedupe_key`` (the
chain's identity of a payment, an order's idempotency key): the unique index makes a second posting
with the same key a no-op that returns the first entry, even when two workers race.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from anyio import to_thread
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.db import touch_account
from vpsshop.errors import ApiError
from vpsshop.models import Account, LedgerEntry, utcnow
from vpsshop.money import UsdAmount, micros_to_usd

REASONS = frozenset(
    {
        "topup",  # a crypto payment was credited
        "admin_credit",  # support credit from `vpsshop admin credit`
        "admin_debit",
        "order",  # a server was bought
        "renewal",  # a server's period was extended
        "resize",  # a server moved to a dearer plan: the difference for the rest of its paid time
        "refund",  # a charge was returned (provisioning failed)
        "reversal",  # the credit of an x402 payment held for an order taken back: it never settled
    }
)


class LedgerEntryOut(BaseModel):
    """One change of the balance: in the dashboard's list and in ``ledger.credit``/``ledger.debit`` events."""

    id: int
    amount_usd: UsdAmount = Field(description="Positive for a credit, negative for a debit.")
    balance_after_usd: UsdAmount
    reason: str = Field(description="topup, order, renewal, resize, refund, reversal, admin_credit or admin_debit.")
    ref: str | None = Field(description="What it is for: a top-up ref, server:<id>.")
    memo: str | None = Field(description="A note: the payment credited, the reason of a support credit.")
    created_at: datetime


def entry_out(entry: LedgerEntry) -> LedgerEntryOut:
    assert entry.id is not None
    return LedgerEntryOut(
        id=entry.id,
        amount_usd=micros_to_usd(entry.amount_micros),
        balance_after_usd=micros_to_usd(entry.balance_after_micros),
        reason=entry.reason,
        ref=entry.ref,
        memo=entry.memo,
        created_at=entry.created_at,
    )


async def recent_entries(ctx: AppContext, customer: Customer, limit: int = 20) -> list[LedgerEntryOut]:
    """The account's newest balance changes, newest first."""

    def read() -> list[LedgerEntryOut]:
        with ctx.db.session() as session:
            rows = session.exec(
                select(LedgerEntry)
                .where(LedgerEntry.account_id == customer.account_id)
                .order_by(col(LedgerEntry.id).desc())
                .limit(limit)
            ).all()
            return [entry_out(e) for e in rows]

    return await to_thread.run_sync(read)


class InsufficientBalance(ApiError):
    """A debit larger than the balance. Rendered as the seed's 402 ``insufficient_balance``; an operation
    that can be paid by x402 raises it with the x402 requirements for the deficit
    (:class:`vpsshop.x402.offers.ShortBalance`)."""

    def __init__(self, price_micros: int, balance_micros: int) -> None:
        self.price_micros = price_micros
        self.balance_micros = balance_micros
        deficit = price_micros - balance_micros
        super().__init__(
            402,
            "insufficient_balance",
            f"The balance of {micros_to_usd(balance_micros)} USD does not cover {micros_to_usd(price_micros)} USD; "
            f"top up at least {micros_to_usd(deficit)} USD.",
            price=micros_to_usd(price_micros),
            balance=micros_to_usd(balance_micros),
            deficit=micros_to_usd(deficit),
        )


@dataclass(frozen=True)
class Posting:
    entry: LedgerEntry
    created: bool
    """False when an entry with the same ``dedupe_key`` existed: nothing was posted this time."""


def post(
    session: Session,
    account_id: int,
    amount_micros: int,
    reason: str,
    *,
    ref: str | None = None,
    dedupe_key: str | None = None,
    memo: str | None = None,
    now: datetime | None = None,
) -> Posting:
    """Change ``account_id``'s balance by ``amount_micros`` inside the caller's transaction.

    :raises InsufficientBalance: a debit that would take the balance below zero.
    :raises LookupError: no such account.
    :raises ValueError: an unknown reason or a zero amount.
    """
    if reason not in REASONS:
        raise ValueError(f"unknown ledger reason {reason!r}")
    if amount_micros == 0 or not isinstance(amount_micros, int):
        raise ValueError("a ledger entry moves a non-zero whole number of micros")
    if dedupe_key is not None:
        existing = _by_dedupe_key(session, dedupe_key)
        if existing is not None:
            return Posting(existing, created=False)
    # A savepoint only where a concurrent duplicate can be caught and answered (a dedupe key): it
    # costs two round trips on PostgreSQL, and an order (no dedupe key) has nothing to catch.
    savepoint = session.begin_nested() if dedupe_key is not None else None
    try:
        result = session.execute(
            sa.update(Account)
            .where(col(Account.id) == account_id, col(Account.balance_micros) + amount_micros >= 0)
            .values(balance_micros=col(Account.balance_micros) + amount_micros)
            .returning(col(Account.balance_micros))
        ).first()
        if result is None:
            if savepoint is not None:
                savepoint.rollback()
            balance = session.execute(select(Account.balance_micros).where(Account.id == account_id)).scalar()
            if balance is None:
                raise LookupError(f"no account {account_id}")
            raise InsufficientBalance(-amount_micros, balance)
        touch_account(session, account_id)
        entry = LedgerEntry(
            account_id=account_id,
            amount_micros=amount_micros,
            balance_after_micros=result[0],
            reason=reason,
            ref=ref,
            dedupe_key=dedupe_key,
            memo=memo,
            created_at=now or utcnow(),
        )
        session.add(entry)
        session.flush()
        events.emit(
            session,
            "ledger.credit" if amount_micros > 0 else "ledger.debit",
            account_id,
            entry_out(entry),
            now=entry.created_at,
        )
        if savepoint is not None:
            savepoint.commit()
    except IntegrityError:
        if savepoint is None:
            raise
        savepoint.rollback()
        existing = _by_dedupe_key(session, dedupe_key) if dedupe_key else None
        if existing is None:
            raise
        return Posting(existing, created=False)
    return Posting(entry, created=True)


def by_dedupe_key(session: Session, dedupe_key: str) -> LedgerEntry | None:
    """The entry posted under ``dedupe_key``, if one was."""
    return _by_dedupe_key(session, dedupe_key)


def _by_dedupe_key(session: Session, dedupe_key: str) -> LedgerEntry | None:
    return session.exec(select(LedgerEntry).where(LedgerEntry.dedupe_key == dedupe_key)).first()


def balance_from_entries(session: Session, account_id: int) -> int:
    """The balance recomputed from the entries: equals ``Account.balance_micros`` at all times."""
    total = session.execute(
        select(sa.func.coalesce(sa.func.sum(LedgerEntry.amount_micros), 0)).where(LedgerEntry.account_id == account_id)
    ).scalar()
    return int(total or 0)
