"""What happens when a paid period ends, on the service's clock (``ctx.clock``).

A server is bought for one billing cycle: ``expires_at`` = the order time plus one calendar month
(``monthly``, the default) or twelve (``annual``). Then, each pass of the ``servers-lifecycle``
background task (every minute) does, in this order:

1. **renew**: an ``active`` server with ``auto_renew`` whose ``expires_at`` is within the renewal
   lead window is charged one more cycle from the balance (ledger reason ``renewal``) and its
   ``expires_at`` moves one cycle on. The lead window is ``servers.renew_lead_hours`` (default 72),
   capped at half the billing cycle so a short cycle is never charged twice in one period. The
   charge's ledger ``dedupe_key`` is ``renewal:<server id>:<expires_at being renewed>``: one period
   is charged at most once, whichever worker or request gets there first.
2. **suspend**: an ``active`` server whose ``expires_at`` has passed (the balance could not
   renew it) becomes ``suspended`` and a ``suspend`` job stops its VM. Its disk is kept.
3. **terminate**: a ``suspended`` server whose ``expires_at`` is more than ``servers.grace_days``
   (default 7) in the past becomes ``terminated`` and a ``destroy`` job removes its VM, disk and
   seed image and frees its address.

A customer brings a server suspended for non-payment back with ``POST /servers/{id}/renew`` after
topping up: one cycle is charged, the new period starts at the renewal (the suspended days are not
billed), the server is ``active`` again and a ``resume`` job starts its VM. Renewing an active server
extends it from its current ``expires_at``. A server the shop suspended (``vpsshop admin suspend``,
``suspended_by = "admin"``) cannot be renewed: only ``vpsshop admin unsuspend`` lifts that.

Every step is a conditional ``UPDATE ... WHERE status = <expected> AND expires_at = <read>`` in the
transaction that also writes the ledger entry, the history row and the job: only one worker can
win a step, and a step that has happened cannot happen again.
"""

from __future__ import annotations

import calendar
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from anyio import to_thread
from sqlalchemy import event as sa_event
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

import vpsshop.events as events
import vpsshop.ledger as ledger
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.errors import Conflict
from vpsshop.models import Server
from vpsshop.servers.models import ServerEvent, ServerJob, ServerTraffic
from vpsshop.servers.resource import current_traffic, server_event
from vpsshop.settings import ServersSettings
from vpsshop.tasks import Nudge

log = logging.getLogger("vpsshop.servers")

CYCLE_MONTHS = {"monthly": 1, "annual": 12}
DEFAULT_CYCLE: Final = "monthly"


ServersPolicy = ServersSettings
"""The ``[servers]`` settings section (validated with the settings, see :class:`vpsshop.settings.ServersSettings`)."""


def policy(ctx: AppContext) -> ServersPolicy:
    return ctx.settings.servers


def add_months(when: datetime, months: int) -> datetime:
    """``when`` plus calendar months, the day clamped to the month's end (Jan 31 + 1 = Feb 28/29)."""
    month0 = when.month - 1 + months
    year, month = when.year + month0 // 12, month0 % 12 + 1
    day = min(when.day, calendar.monthrange(year, month)[1])
    return when.replace(year=year, month=month, day=day)


def period_end(start: datetime, cycle: str) -> datetime:
    return add_months(start, CYCLE_MONTHS[cycle])


def renew_lead(pol: ServersPolicy, server: Server) -> timedelta:
    """The renewal lead window, at most half of the server's current billing cycle."""
    cycle_length = period_end(server.expires_at, server.cycle) - server.expires_at
    return min(timedelta(hours=pol.renew_lead_hours), cycle_length / 2)


def record(
    session: Session, server_id: int, kind: str, now: datetime, detail: str | None = None, once_key: str | None = None
) -> bool:
    """Append a history row; with ``once_key``, only if no row with that key exists (False then)."""
    if once_key is not None:
        found = session.exec(select(ServerEvent.id).where(ServerEvent.once_key == once_key)).first()
        if found is not None:
            return False
        savepoint = session.begin_nested()
        try:
            session.add(ServerEvent(server_id=server_id, kind=kind, detail=detail, once_key=once_key, created_at=now))
            session.flush()
            savepoint.commit()
        except IntegrityError:  # another worker recorded it a moment ago
            savepoint.rollback()
            return False
        return True
    session.add(ServerEvent(server_id=server_id, kind=kind, detail=detail, once_key=once_key, created_at=now))
    session.flush()
    return True


JOBS_QUEUED = Nudge()
"""Called once a transaction that queued a job commits: the ``servers-jobs`` task of this process
(``vpsshop serve`` with its worker) claims the job at once instead of at its next interval."""


def enqueue(session: Session, server_id: int, kind: str, now: datetime) -> ServerJob:
    job = ServerJob(server_id=server_id, kind=kind, status="queued", run_after=now, created_at=now)
    session.add(job)
    session.flush()
    nudge_after_commit(session)
    return job


def nudge_after_commit(session: Session) -> None:
    """Call :data:`JOBS_QUEUED` once ``session`` commits: it queued a job (a rollback calls nothing)."""
    if not session.info.get("nudges_jobs"):
        session.info["nudges_jobs"] = True
        sa_event.listen(session, "after_commit", _queued, once=True)


def _queued(session: Session) -> None:
    session.info.pop("nudges_jobs", None)
    JOBS_QUEUED()


@dataclass(frozen=True)
class Renewal:
    server: Server
    charged: bool
    """False when this period had been renewed already (by another worker or request)."""
    charged_micros: int = 0


def renewal_terms(server: Server, now: datetime, periods: int = 1) -> tuple[int, datetime]:
    """What renewing ``server`` for ``periods`` cycles costs and where ``expires_at`` moves.

    The one pricing rule of renewals: :func:`renew` charges this, and the renewal quote shows it.
    A suspended server's new period starts now (the suspended days are not billed); an active one
    extends from its current ``expires_at``.
    """
    start = max(server.expires_at, now) if server.status == "suspended" else server.expires_at
    per_cycle = server.price_micros + server.snapshot_fee_micros  # the plan, and the snapshots it holds
    return per_cycle * periods, add_months(start, CYCLE_MONTHS[server.cycle] * periods)


def max_periods(pol: ServersPolicy, server: Server, now: datetime) -> int:
    """The most periods a renewal may buy now without passing the prepay horizon (0: none)."""
    horizon = now + timedelta(days=pol.max_prepay_days)
    periods = 0
    while periods < 1000 and renewal_terms(server, now, periods + 1)[1] <= horizon:
        periods += 1
    return periods


def check_not_admin_suspended(server: Server) -> None:
    """:raises Conflict: ``server_admin_suspended``: the shop suspended ``server``; a renewal must not lift that."""
    if server.status == "suspended" and server.suspended_by == "admin":
        raise Conflict(
            "server_admin_suspended",
            f"Server {server.id} was suspended by the shop ({server.status_reason or 'no reason given'}). "
            "Renewing does not lift a suspension by the shop: contact the shop's support.",
        )


def renew(session: Session, server: Server, now: datetime, *, by: str, periods: int = 1) -> Renewal:
    """Charge ``periods`` cycles and move ``expires_at`` on, in the caller's transaction.

    :raises ledger.InsufficientBalance: the balance does not cover the charge (nothing changes).
    :raises Conflict: ``server_admin_suspended`` (nothing changes).
    """
    assert server.id is not None
    check_not_admin_suspended(server)
    old_expiry = server.expires_at
    price, new_expiry = renewal_terms(server, now, periods)
    memo = f"{server.cycle} renewal of server {server.id} ({by})"
    posting = ledger.post(
        session,
        server.account_id,
        -price,
        "renewal",
        ref=f"server:{server.id}",
        dedupe_key=f"renewal:{server.id}:{old_expiry.isoformat()}",
        memo=memo if periods == 1 else f"{memo}, {periods} periods",
        now=now,
    )
    if not posting.created:
        session.refresh(server)
        return Renewal(server, charged=False)
    values: dict[str, Any] = {"expires_at": new_expiry}
    resumed = server.status == "suspended"
    if resumed:
        values.update(status="active", suspended_at=None, status_reason=None, suspended_by=None)
    moved = rowcount(
        session.execute(
            sa.update(Server)
            .where(
                col(Server.id) == server.id,
                col(Server.expires_at) == old_expiry,
                col(Server.status).in_(("active", "suspended")),
                sa.or_(col(Server.suspended_by).is_(None), col(Server.suspended_by) != "admin"),
            )
            .values(**values)
        )
    )
    if moved != 1:  # a concurrent step changed the server after we read it: undo the charge
        raise RenewalRaced()
    record(session, server.id, "renewed", now, f"{by}; expires {new_expiry.isoformat()}")
    start_period(session, server.id, now)  # each renewal buys a new traffic allowance
    events.emit(session, "server.renewed", server.account_id, server_event(session, server.id), now=now)
    if resumed:
        record(session, server.id, "resumed", now, by)
        enqueue(session, server.id, "resume", now)
        events.emit(session, "server.unsuspended", server.account_id, server_event(session, server.id), now=now)
    session.flush()
    session.refresh(server)
    return Renewal(server, charged=True, charged_micros=price)


class RenewalRaced(Exception):
    """A conditional update found the row changed; the transaction is rolled back and retried."""


def _due(session: Session, where: sa.ColumnElement[bool], limit: int = 200) -> list[Server]:
    return list(session.exec(select(Server).where(where).order_by(col(Server.id)).limit(limit)).all())


def _renew_due(ctx: AppContext, pol: ServersPolicy, now: datetime) -> int:
    """Auto-renew servers inside their lead window. Each server in its own transaction."""
    horizon = now + timedelta(hours=pol.renew_lead_hours)
    with ctx.db.session() as session:
        candidates = _due(
            session,
            sa.and_(
                col(Server.status) == "active", col(Server.auto_renew).is_(True), col(Server.expires_at) <= horizon
            ),
        )
    done = 0
    for server in candidates:
        assert server.id is not None
        if server.expires_at - renew_lead(pol, server) > now:
            continue
        try:
            with ctx.db.session() as session:
                # Lock the row (PostgreSQL; SQLite's BEGIN IMMEDIATE already excludes other writers) so
                # that the check below and the renewal are one step for every worker.
                fresh = session.get(Server, server.id, with_for_update=True)
                if fresh is None or fresh.status != "active" or fresh.expires_at != server.expires_at:
                    continue
                if renew(session, fresh, now, by="auto-renewal").charged:
                    done += 1
        except ledger.InsufficientBalance as exc:
            with ctx.db.session() as session:
                if record(
                    session,
                    server.id,
                    "renewal_failed",
                    now,
                    exc.message,
                    once_key=f"renewal_failed:{server.id}:{server.expires_at.isoformat()}",
                ):
                    events.emit(
                        session, "server.renewal_failed", server.account_id, server_event(session, server.id), now=now
                    )
        except RenewalRaced:
            continue
    return done


def _step(
    session: Session,
    server: Server,
    now: datetime,
    before: str,
    values: dict[str, Any],
    *,
    why: str,
    event: str,
    job: str,
) -> int:
    """Move ``server`` on from status ``before`` to ``values`` unless something changed it since it was
    read (a renewal, an admin); then record the step, emit ``event`` and queue ``job``. 1 if it moved."""
    assert server.id is not None
    moved = rowcount(
        session.execute(
            sa.update(Server)
            .where(
                col(Server.id) == server.id,
                col(Server.status) == before,
                col(Server.expires_at) == server.expires_at,
            )
            .values(**values)
        )
    )
    if moved != 1:
        return 0
    record(session, server.id, values["status"], now, why)
    events.emit(session, event, server.account_id, server_event(session, server.id), now=now)
    enqueue(session, server.id, job, now)
    return 1


def _suspend_expired(ctx: AppContext, now: datetime) -> int:
    done = 0
    with ctx.db.session() as session:
        for server in _due(session, sa.and_(col(Server.status) == "active", col(Server.expires_at) <= now)):
            suspended = {
                "status": "suspended",
                "suspended_at": now,
                "suspended_by": "nonpayment",
                "status_reason": "The paid period ended and the balance did not cover a renewal.",
            }
            why = f"expired {server.expires_at.isoformat()}"
            done += _step(session, server, now, "active", suspended, why=why, event="server.suspended", job="suspend")
    return done


def _terminate_overdue(ctx: AppContext, pol: ServersPolicy, now: datetime) -> int:
    cutoff = now - timedelta(days=pol.grace_days)
    done = 0
    with ctx.db.session() as session:
        for server in _due(session, sa.and_(col(Server.status) == "suspended", col(Server.expires_at) <= cutoff)):
            terminated = {
                "status": "terminated",
                "terminated_at": now,
                "status_reason": f"Not renewed within {pol.grace_days:g} days of expiry; the server was deleted.",
            }
            done += _step(
                session,
                server,
                now,
                "suspended",
                terminated,
                why="grace period over",
                event="server.terminated",
                job="destroy",
            )
    return done


@dataclass(frozen=True)
class LifecyclePass:
    renewed: int
    suspended: int
    terminated: int


def run_lifecycle_sync(ctx: AppContext) -> LifecyclePass:
    pol = policy(ctx)
    now = ctx.clock.now()
    renewed = _renew_due(ctx, pol, now)
    suspended = _suspend_expired(ctx, now)
    terminated = _terminate_overdue(ctx, pol, now)
    if renewed or suspended or terminated:
        log.info("lifecycle: renewed %d, suspended %d, terminated %d", renewed, suspended, terminated)
    return LifecyclePass(renewed, suspended, terminated)


async def run_lifecycle(ctx: AppContext) -> LifecyclePass:
    """One pass of the ``servers-lifecycle`` task (tests call it directly on a FrozenClock)."""
    return await to_thread.run_sync(run_lifecycle_sync, ctx)


# ---- traffic periods ---------------------------------------------------------------------------

PERIOD_STARTED = Nudge()
"""Called once a renewal that started a new traffic period commits: the ``servers-traffic`` task of
this process lifts a throttle at once instead of at its next interval."""


def start_period(session: Session, server_id: int, now: datetime) -> None:
    """A renewal starts a new traffic period now, in the renewal's transaction. The counters' last
    sample carries over (traffic before it belongs to the period that ends)."""
    last = current_traffic(session, server_id)
    if last is not None and last.period_start >= now:
        return
    session.add(
        ServerTraffic(
            server_id=server_id,
            period_start=now,
            last_in=last.last_in if last else None,
            last_out=last.last_out if last else None,
            sampled_at=last.sampled_at if last else None,
            allowance_bytes=last.allowance_bytes if last else None,
        )
    )
    session.flush()
    if not session.info.get("nudges_traffic"):
        session.info["nudges_traffic"] = True
        sa_event.listen(session, "after_commit", _started, once=True)


def _started(session: Session) -> None:
    session.info.pop("nudges_traffic", None)
    PERIOD_STARTED()
