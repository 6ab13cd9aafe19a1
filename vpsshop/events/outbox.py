"""Reading the outbox in order without skipping a late commit, and the cursors of its consumers.

Event ids come from a sequence, so on PostgreSQL two transactions can commit out of id order (id
101 after 102). A reader that moved past 102 would never see 101. So on PostgreSQL each event row
carries the id of the transaction that inserted it, and a reader only takes events whose
transaction id is below the oldest transaction still running (``pg_snapshot_xmin``): every event
of an older transaction has committed (or rolled back) by then, so nothing can appear behind the
reader. On SQLite writers are serialised (``BEGIN IMMEDIATE``), so ids commit in order.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from vpsshop.events.models import EventCursor, StoredEvent


def visible(stmt: Any, dialect: str) -> Any:
    """``stmt`` over ``events`` limited to rows no earlier commit can still appear before."""
    if dialect == "postgresql":
        horizon = sa.cast(sa.cast(sa.func.pg_snapshot_xmin(sa.func.pg_current_snapshot()), sa.Text), sa.BigInteger)
        return stmt.where(StoredEvent.txid < horizon)  # type: ignore[operator]
    return stmt


def head(session: Session, dialect: str) -> int:
    """The id of the newest visible event (0 when there is none)."""
    value = session.execute(visible(sa.select(sa.func.max(StoredEvent.id)), dialect)).scalar()
    return int(value or 0)


def ensure_cursor(session: Session, name: str, start: int, now: datetime) -> None:
    """Create cursor ``name`` at ``start`` unless it exists (safe when two workers race)."""
    if session.get(EventCursor, name) is not None:
        return
    savepoint = session.begin_nested()
    try:
        session.add(EventCursor(name=name, last_id=start, updated_at=now))
        session.flush()
        savepoint.commit()
    except IntegrityError:
        savepoint.rollback()


def lease(session: Session, name: str, worker: str, now: datetime, seconds: float) -> EventCursor | None:
    """Take the lease of cursor ``name`` for ``worker`` (None while another worker holds it)."""
    taken = session.execute(
        sa.update(EventCursor)
        .where(EventCursor.name == name,
               sa.or_(EventCursor.locked_until.is_(None), EventCursor.locked_until < now,  # type: ignore[union-attr,operator]
                      EventCursor.locked_by == worker))
        .values(locked_by=worker, locked_until=now + timedelta(seconds=seconds))
    ).rowcount
    if taken != 1:
        return None
    return session.get(EventCursor, name, populate_existing=True)


def store(session: Session, name: str, worker: str, now: datetime, **values: Any) -> bool:
    """Update the cursor while ``worker`` holds its lease; False if the lease was lost."""
    return session.execute(
        sa.update(EventCursor).where(EventCursor.name == name, EventCursor.locked_by == worker)
        .values(updated_at=now, **values)
    ).rowcount == 1
