"""Reading the outbox in order without skipping a late commit, and the cursors of its consumers.

Row ids come from a sequence, so on PostgreSQL two transactions can commit out of id order (id 101
after 102): a reader that moved past 102 would never see 101. So readers do not page by id. After
commit, :func:`publish` gives each new event its place, ``seq``, in one transaction that only one
publisher at a time runs (a transaction-scoped advisory lock on PostgreSQL; SQLite serialises
writers). Seqs are therefore committed in increasing order: once a reader has seen seq N, no event
can later appear below N. An event becomes visible to readers (webhooks, plugins, ``GET
/v1/events``) when it is published, which the worker does every ``events.interval_seconds`` and
``GET /v1/events`` does on demand.

This depends on nothing outside the shop's database (a horizon such as ``pg_snapshot_xmin`` would
wait for every transaction of every database of the PostgreSQL cluster).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from vpsshop.db import rowcount
from vpsshop.events.models import EventCursor, StoredEvent

_PG_PUBLISH_LOCK = 0x7670_7365  # "vpse"
PUBLISH_BATCH = 1000


def publish(session: Session, limit: int = PUBLISH_BATCH) -> int:
    """Give committed, unpublished events their ``seq`` in id order. Returns how many were published.

    On PostgreSQL, returns 0 at once when another publisher holds the lock (it publishes them).
    """
    if (
        session.get_bind().dialect.name == "postgresql"
        and not session.execute(sa.select(sa.func.pg_try_advisory_xact_lock(_PG_PUBLISH_LOCK))).scalar()
    ):
        return 0
    ids = (
        session.execute(
            sa.select(col(StoredEvent.id))
            .where(col(StoredEvent.seq).is_(None))
            .order_by(col(StoredEvent.id))
            .limit(limit)
        )
        .scalars()
        .all()
    )
    if not ids:
        return 0
    top = int(session.execute(sa.select(sa.func.coalesce(sa.func.max(StoredEvent.seq), 0))).scalar() or 0)
    session.execute(sa.update(StoredEvent), [{"id": i, "seq": top + n} for n, i in enumerate(ids, 1)])
    return len(ids)


def publish_pending(db: Any) -> int:
    """:func:`publish` in its own transaction, skipped without a write when nothing waits."""
    with db.session() as session:
        waiting = session.execute(sa.select(col(StoredEvent.id)).where(col(StoredEvent.seq).is_(None)).limit(1)).first()
    if waiting is None:
        return 0
    total = 0
    while True:
        with db.session() as session:
            done = publish(session)
        total += done
        if done < PUBLISH_BATCH:
            return total


def visible(stmt: Any) -> Any:
    """``stmt`` over ``events`` limited to published events."""
    return stmt.where(col(StoredEvent.seq).is_not(None))


def head(session: Session) -> int:
    """The ``seq`` of the newest published event (0 when there is none)."""
    value = session.execute(sa.select(sa.func.max(StoredEvent.seq))).scalar()
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
    taken = rowcount(
        session.execute(
            sa.update(EventCursor)
            .where(
                col(EventCursor.name) == name,
                sa.or_(
                    col(EventCursor.locked_until).is_(None),
                    col(EventCursor.locked_until) < now,
                    col(EventCursor.locked_by) == worker,
                ),
            )
            .values(locked_by=worker, locked_until=now + timedelta(seconds=seconds))
        )
    )
    if taken != 1:
        return None
    return session.get(EventCursor, name, populate_existing=True)


def store(session: Session, name: str, worker: str, now: datetime, **values: Any) -> bool:
    """Update the cursor while ``worker`` holds its lease; False if the lease was lost."""
    return (
        rowcount(
            session.execute(
                sa.update(EventCursor)
                .where(col(EventCursor.name) == name, col(EventCursor.locked_by) == worker)
                .values(updated_at=now, **values)
            )
        )
        == 1
    )
