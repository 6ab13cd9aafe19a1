"""Webhook delivery: fan-out from the outbox, claiming, sending, retrying, disabling.

One pass of the ``webhooks`` background task (:func:`run_pass`):

1. **fan-out**: newly committed events are published (:func:`vpsshop.events.outbox.publish`); those
   after the ``webhooks`` cursor (see :mod:`vpsshop.events.outbox`) become one
   ``webhook_deliveries`` row per enabled endpoint of the event's account that subscribes to its
   type and was registered before it happened. The cursor row is locked for the transaction (PostgreSQL
   ``FOR UPDATE SKIP LOCKED``; SQLite serialises writers), so the rows and the cursor move together
   and an event is fanned out once.
2. **claim**: due deliveries move to ``delivering`` under a lease in one statement (``UPDATE ...
   WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)`` on PostgreSQL), so two workers never send one
   attempt twice. A worker that dies leaves its deliveries ``delivering``; their lease runs out and
   another worker sends them again: delivery is at least once, and ``webhook-id`` (the event id)
   lets the receiver drop repeats.
3. **send** (:mod:`vpsshop.events.sender`), signed with the endpoint's secret
   (:mod:`vpsshop.events.signing`); ``webhook-timestamp`` is the wall-clock time of the attempt.
4. **record** the attempt in the delivery log. A 2xx ends the delivery. Anything else schedules the
   next attempt after ``retry_base_seconds`` x 2^(attempt-1) (at most ``retry_max_delay_seconds``,
   +-10 % jitter, at least a ``Retry-After``) until ``retry_window_hours`` after the delivery
   began; then it is ``failed``. An endpoint whose failures have not been broken by a success for
   ``disable_after_hours``, or that answers ``410 Gone``, is disabled, and the account gets a
   ``webhook.disabled`` event (its other endpoints, ``GET /v1/events`` and plugins see it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from anyio import to_thread
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.events import outbox, sender, signing
from vpsshop.events.models import EventCursor, StoredEvent, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from vpsshop.events.settings import EventSettings, event_settings
from vpsshop.events.types import matches
from vpsshop.events.webhooks import webhook_out

log = logging.getLogger("vpsshop.webhooks")

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"[:64]
FANOUT_CURSOR = "webhooks"


@dataclass(frozen=True)
class Claimed:
    id: int
    endpoint_id: int
    event_id: int
    attempts: int
    created_at: datetime
    worker: str


# ---- fan-out -------------------------------------------------------------------------------------


def fan_out(ctx: AppContext, limit: int | None = None) -> tuple[int, int]:
    """Turn new events into deliveries. Returns (events read, deliveries created)."""
    settings = event_settings(ctx)
    now = ctx.clock.now()
    dialect = ctx.db.dialect
    with ctx.db.session() as session:
        outbox.ensure_cursor(session, FANOUT_CURSOR, 0, now)
        query = select(EventCursor).where(EventCursor.name == FANOUT_CURSOR)
        if dialect == "postgresql":
            query = query.with_for_update(skip_locked=True)
        cursor = session.exec(query).first()
        if cursor is None:
            return 0, 0  # another worker is fanning out right now
        rows = session.exec(
            outbox.visible(
                select(StoredEvent)
                .where(col(StoredEvent.seq) > cursor.last_id)
                .order_by(col(StoredEvent.seq))
                .limit(limit or settings.batch_size)
            )
        ).all()
        if not rows:
            return 0, 0
        accounts = {row.account_id for row in rows}
        endpoints = session.exec(
            select(WebhookEndpoint).where(
                col(WebhookEndpoint.account_id).in_(accounts),
                col(WebhookEndpoint.status) == "enabled",
                col(WebhookEndpoint.deleted_at).is_(None),
            )
        ).all()
        by_account: dict[int, list[tuple[WebhookEndpoint, list[str]]]] = {}
        for endpoint in endpoints:
            by_account.setdefault(endpoint.account_id, []).append((endpoint, json.loads(endpoint.event_types)))
        created = []
        for row in rows:
            for endpoint, patterns in by_account.get(row.account_id, ()):
                if row.seq > endpoint.since_event_id and matches(patterns, row.type):
                    created.append(
                        dict(
                            endpoint_id=endpoint.id,
                            event_id=row.id,
                            account_id=row.account_id,
                            fanout_key=f"{endpoint.id}:{row.id}",
                            redelivery=False,
                            status="pending",
                            attempts=0,
                            next_attempt_at=now,
                            created_at=now,
                        )
                    )
        if created:
            session.execute(sa.insert(WebhookDelivery), created)
        cursor.last_id = rows[-1].seq
        cursor.updated_at = now
        session.add(cursor)
    return len(rows), len(created)


# ---- claiming ------------------------------------------------------------------------------------


def claim(ctx: AppContext, worker: str = WORKER_ID, limit: int = 8) -> list[Claimed]:
    """Move up to ``limit`` due deliveries to ``delivering`` under this worker's lease."""
    settings = event_settings(ctx)
    now = ctx.clock.now()
    due = (
        select(col(WebhookDelivery.id))
        .join(WebhookEndpoint, col(WebhookEndpoint.id) == col(WebhookDelivery.endpoint_id))
        .where(
            col(WebhookEndpoint.status) == "enabled",
            col(WebhookEndpoint.deleted_at).is_(None),
            sa.or_(
                sa.and_(col(WebhookDelivery.status) == "pending", col(WebhookDelivery.next_attempt_at) <= now),
                sa.and_(col(WebhookDelivery.status) == "delivering", col(WebhookDelivery.locked_until) < now),
            ),
        )
        .order_by(col(WebhookDelivery.next_attempt_at), col(WebhookDelivery.id))
        .limit(limit)
    )
    if ctx.db.dialect == "postgresql":
        due = due.with_for_update(skip_locked=True, of=WebhookDelivery)
    with ctx.db.session() as session:
        rows = session.execute(
            sa.update(WebhookDelivery)
            .where(col(WebhookDelivery.id).in_(due.scalar_subquery()))
            .values(
                status="delivering",
                attempts=col(WebhookDelivery.attempts) + 1,
                locked_by=worker,
                locked_until=now + timedelta(seconds=settings.lease_seconds),
            )
            .returning(
                col(WebhookDelivery.id),
                col(WebhookDelivery.endpoint_id),
                col(WebhookDelivery.event_id),
                col(WebhookDelivery.attempts),
                col(WebhookDelivery.created_at),
            )
        ).all()
    return [
        Claimed(r[0], r[1], r[2], r[3], r[4] if r[4].tzinfo else r[4].replace(tzinfo=now.tzinfo), worker) for r in rows
    ]


# ---- sending and recording -----------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    claimed: Claimed
    url: str
    secret: str
    event: events.Event


def _prepare(ctx: AppContext, batch: list[Claimed]) -> list[Prepared]:
    out = []
    with ctx.db.session() as session:
        for item in batch:
            endpoint = session.get(WebhookEndpoint, item.endpoint_id)
            row = session.get(StoredEvent, item.event_id)
            if endpoint is None or row is None:  # pragma: no cover - rows are never deleted under a delivery
                continue
            out.append(
                Prepared(
                    item, endpoint.url, signing.decrypt_secret(ctx, endpoint.secret_enc), events.Event.from_row(row)
                )
            )
    return out


def next_delay(
    settings: EventSettings, attempts: int, retry_after: float | None = None, rng: random.Random | None = None
) -> float:
    """Seconds before attempt ``attempts + 1``: exponential, capped, jittered, honouring Retry-After."""
    base = min(settings.retry_base_seconds * 2 ** min(attempts - 1, 40), settings.retry_max_delay_seconds)
    delay: float = base * (rng or random).uniform(0.9, 1.1)
    if retry_after is not None:
        delay = max(delay, min(retry_after, settings.retry_max_delay_seconds))
    return delay


def _record(ctx: AppContext, item: Claimed, result: sender.SendResult, started: datetime) -> str:
    """Log the attempt and move the delivery on. Returns ``succeeded``, ``retry``, ``failed`` or ``lost``."""
    settings = event_settings(ctx)
    now = ctx.clock.now()
    owned = sa.and_(
        col(WebhookDelivery.id) == item.id,
        col(WebhookDelivery.locked_by) == item.worker,
        col(WebhookDelivery.status) == "delivering",
    )
    with ctx.db.session() as session:
        session.add(
            WebhookAttempt(
                delivery_id=item.id,
                endpoint_id=item.endpoint_id,
                number=item.attempts,
                outcome=result.outcome,
                status_code=result.status_code,
                error=(result.error or None) and result.error[:500],
                response_excerpt=result.excerpt,
                duration_ms=result.duration_ms,
                worker=item.worker[:64],
                started_at=started,
            )
        )
        common = dict(
            last_status_code=result.status_code,
            last_error=(result.error or "")[:500] or None,
            locked_by=None,
            locked_until=None,
        )
        if result.outcome == "accepted":
            if (
                rowcount(
                    session.execute(
                        sa.update(WebhookDelivery).where(owned).values(status="succeeded", finished_at=now, **common)
                    )
                )
                != 1
            ):
                return "lost"
            session.execute(
                sa.update(WebhookEndpoint).where(col(WebhookEndpoint.id) == item.endpoint_id).values(failing_since=None)
            )
            return "succeeded"
        delay = next_delay(settings, item.attempts, result.retry_after)
        gave_up = now + timedelta(seconds=delay) > item.created_at + timedelta(hours=settings.retry_window_hours)
        values = (
            dict(status="failed", finished_at=now)
            if gave_up
            else dict(status="pending", next_attempt_at=now + timedelta(seconds=delay))
        )
        if rowcount(session.execute(sa.update(WebhookDelivery).where(owned).values(**values, **common))) != 1:
            return "lost"
        session.execute(
            sa.update(WebhookEndpoint)
            .where(col(WebhookEndpoint.id) == item.endpoint_id, col(WebhookEndpoint.failing_since).is_(None))
            .values(failing_since=now)
        )
        endpoint = session.get(WebhookEndpoint, item.endpoint_id, populate_existing=True)
        assert endpoint is not None and endpoint.failing_since is not None
        if result.status_code == 410:
            disable(session, endpoint, now, "The endpoint answered 410 Gone.")
        elif endpoint.failing_since <= now - timedelta(hours=settings.disable_after_hours):
            since = endpoint.failing_since.isoformat(timespec="seconds")
            disable(session, endpoint, now, f"Every attempt since {since} failed (last: {result.error}).")
        return "failed" if gave_up else "retry"


def disable(session: Session, endpoint: WebhookEndpoint, now: datetime, reason: str) -> bool:
    """Disable ``endpoint`` once and tell the account (a ``webhook.disabled`` event)."""
    moved = rowcount(
        session.execute(
            sa.update(WebhookEndpoint)
            .where(col(WebhookEndpoint.id) == endpoint.id, col(WebhookEndpoint.status) == "enabled")
            .values(status="disabled", disabled_at=now, disabled_reason=reason[:500])
        )
    )
    if moved != 1:
        return False
    session.refresh(endpoint)
    log.warning("webhook endpoint %s of account %s disabled: %s", endpoint.id, endpoint.account_id, reason)

    events.emit(session, "webhook.disabled", endpoint.account_id, webhook_out(endpoint), now=now)
    return True


async def deliver(ctx: AppContext, prepared: Prepared, resolver: sender.Resolver | None = None) -> str:
    """Send one claimed delivery and record its outcome."""
    settings = event_settings(ctx)
    event = prepared.event
    timestamp = int(time.time())  # the attempt's wall-clock time, as receivers check it against theirs
    started = ctx.clock.now()
    headers = signing.headers(prepared.secret, event.id, timestamp, event.body)
    result = await sender.post(prepared.url, headers, event.body, settings, resolver)
    if result.outcome != "accepted":
        log.info(
            "webhook %s (%s) to endpoint %s, attempt %s: %s",
            event.id,
            event.type,
            prepared.claimed.endpoint_id,
            prepared.claimed.attempts,
            result.error,
        )
    return await to_thread.run_sync(_record, ctx, prepared.claimed, result, started)


async def run_pass(
    ctx: AppContext, worker: str = WORKER_ID, resolver: sender.Resolver | None = None, limit: int | None = None
) -> dict[str, int]:
    """One pass of the ``webhooks`` task: fan out, then deliver what is due (up to ``batch_size``)."""
    settings = event_settings(ctx)
    counts = {"fanned_out": 0, "succeeded": 0, "retry": 0, "failed": 0, "lost": 0}
    await to_thread.run_sync(outbox.publish_pending, ctx.db)
    while True:
        read, created = await to_thread.run_sync(fan_out, ctx)
        counts["fanned_out"] += created
        if not read:
            break
    budget = limit or settings.batch_size
    while budget > 0:
        batch = await to_thread.run_sync(claim, ctx, worker, min(settings.concurrency, budget))
        if not batch:
            break
        budget -= len(batch)
        prepared = await to_thread.run_sync(_prepare, ctx, batch)
        for outcome in await asyncio.gather(*(deliver(ctx, p, resolver) for p in prepared)):
            counts[outcome] += 1
    return counts
