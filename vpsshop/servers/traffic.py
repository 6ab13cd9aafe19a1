"""Each server's network traffic per traffic period, against its plan's allowance.

The ``servers-traffic`` background task (``vpsshop worker``, and ``vpsshop serve`` with its worker)
reads every active server's interface counters from the hypervisor every ``traffic.sample_seconds``
(:meth:`vpsshop.HypervisorBackend.interface_counters`, capability ``"traffic"``) and adds what they
grew by to the server's current period (:class:`~vpsshop.servers.models.ServerTraffic`). Counters
that went down started again (the domain was powered off and on, migrated, or its host rebooted):
all of their new value is new traffic.

A period starts at the order and again at each renewal (:func:`start_period`, called by
:func:`vpsshop.servers.lifecycle.renew` in the renewal's transaction): each paid cycle buys a new
allowance, the plan's ``bandwidth_tb`` (10^12 bytes a TB; in and out count together) or
``traffic.plan_allowance_bytes``. Once a period's traffic passes it, ``traffic.policy`` applies,
once per period, with a ``server.traffic_exceeded`` event:

* ``throttle``: the server's rate is capped at ``traffic.throttle_kib_per_second`` through the
  hypervisor (:meth:`~vpsshop.HypervisorBackend.limit_bandwidth`; set again at each pass, so a
  reinstall or a migration does not shed it); the pass after a renewal lifts it and sends
  ``server.traffic_restored``;
* ``suspend``: the server is suspended (``suspended_by = "traffic"``), as for non-payment; a
  renewal resumes it;
* ``none``: only the event.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from anyio import to_thread
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.errors import PluginError
from vpsshop.hypervisor import CAPABILITY_TRAFFIC, InterfaceCounters, ServerHandle
from vpsshop.models import Server
from vpsshop.servers.models import ServerTraffic
from vpsshop.servers.resource import current_traffic, server_event

log = logging.getLogger("vpsshop.servers.traffic")

TB = 10**12


def allowance_bytes(ctx: AppContext, plan_id: str) -> int | None:
    """What plan ``plan_id`` includes per period, in and out together; None: unlimited."""
    override = ctx.settings.traffic.plan_allowance_bytes
    if plan_id in override:
        return override[plan_id] or None
    plan = next((p for p in ctx.catalog_data.plans if p.id == plan_id), None)
    if plan is None or not plan.bandwidth_tb:
        return None
    return plan.bandwidth_tb * TB


def grown(last: int | None, now: int) -> int:
    """What a counter read ``now`` adds after a sample of ``last``: all of it when it started again."""
    if last is None or now < last:
        return now
    return now - last


@dataclass
class Sample:
    """What one server's sample leaves the hypervisor to do."""

    throttle: bool = False
    lift: list[int] = field(default_factory=list)
    """Ids of earlier periods whose throttle is still on the hypervisor."""


def _handle(server: Server) -> ServerHandle:
    return ServerHandle(host=server.host or "", domain=server.domain or "", ip=server.ip, location=server.location)


def _count(ctx: AppContext, server_id: int, counters: InterfaceCounters | None, now: datetime) -> Sample:
    """Add one sample to the server's current period and apply the policy once it is past its allowance."""
    from vpsshop.servers.lifecycle import enqueue, record

    cfg = ctx.settings.traffic
    with ctx.db.session() as session:
        server = session.get(Server, server_id, with_for_update=True)
        if server is None or server.status != "active":
            return Sample()
        row = current_traffic(session, server_id)
        if row is None:
            row = ServerTraffic(server_id=server_id, period_start=server.created_at)
            session.add(row)
        if counters is not None:
            row.in_bytes += grown(row.last_in, counters.in_bytes)
            row.out_bytes += grown(row.last_out, counters.out_bytes)
            row.last_in, row.last_out, row.sampled_at = counters.in_bytes, counters.out_bytes, now
        row.allowance_bytes = allowance_bytes(ctx, server.plan)
        session.flush()
        if row.allowance_bytes is not None and row.policy_applied is None:
            used = row.in_bytes + row.out_bytes
            if used > row.allowance_bytes:
                row.policy_applied, row.applied_at = cfg.policy, now
                detail = f"{used} of {row.allowance_bytes} bytes; policy {cfg.policy}"
                record(session, server_id, "traffic_exceeded", now, detail)
                if cfg.policy == "suspend" and _suspend(session, server, now, used, row.allowance_bytes):
                    record(session, server_id, "suspended", now, "traffic allowance used up")
                    enqueue(session, server_id, "suspend", now)
                event = server_event(session, server_id)
                events.emit(session, "server.traffic_exceeded", server.account_id, event, now=now)
                if cfg.policy == "suspend" and event.status == "suspended":
                    events.emit(session, "server.suspended", server.account_id, event, now=now)
        earlier = session.exec(
            select(ServerTraffic.id).where(
                ServerTraffic.server_id == server_id,
                ServerTraffic.policy_applied == "throttle",
                col(ServerTraffic.lifted_at).is_(None),
                ServerTraffic.id != row.id,
            )
        ).all()
        throttled = row.policy_applied == "throttle"
        return Sample(throttle=throttled, lift=[] if throttled else [i for i in earlier if i is not None])


def _suspend(session: Session, server: Server, now: datetime, used: int, allowance: int) -> bool:
    moved = rowcount(
        session.execute(
            sa.update(Server)
            .where(col(Server.id) == server.id, col(Server.status) == "active")
            .values(
                status="suspended",
                suspended_at=now,
                suspended_by="traffic",
                status_reason=f"The traffic allowance of this period is used up ({used} of {allowance} bytes); "
                "a renewal starts a new period and resumes the server.",
            )
        )
    )
    return moved == 1


def _lifted(ctx: AppContext, server_id: int, ids: list[int], now: datetime) -> None:
    from vpsshop.servers.lifecycle import record

    with ctx.db.session() as session:
        done = rowcount(
            session.execute(
                sa.update(ServerTraffic)
                .where(col(ServerTraffic.id).in_(ids), col(ServerTraffic.lifted_at).is_(None))
                .values(lifted_at=now)
            )
        )
        server = session.get(Server, server_id)
        if done and server is not None:
            record(session, server_id, "traffic_restored", now, "throttle lifted: a new traffic period")
            events.emit(
                session, "server.traffic_restored", server.account_id, server_event(session, server_id), now=now
            )


@dataclass(frozen=True)
class TrafficPass:
    sampled: int
    throttled: int
    lifted: int


async def run_traffic(ctx: AppContext) -> TrafficPass:
    """One pass of the ``servers-traffic`` task: every active server with a domain, one at a time."""
    backend = ctx.hypervisor
    if backend is None or CAPABILITY_TRAFFIC not in backend.capabilities:
        return TrafficPass(0, 0, 0)
    rate = ctx.settings.traffic.throttle_kib_per_second

    def due() -> list[Server]:
        with ctx.db.session() as session:
            query = select(Server).where(Server.status == "active", col(Server.domain).is_not(None))
            return list(session.exec(query.order_by(col(Server.id))).all())

    sampled = throttled = lifted = 0
    for server in await to_thread.run_sync(due):
        assert server.id is not None
        handle = _handle(server)
        try:
            counters = await backend.interface_counters(handle)
        except PluginError as exc:  # one host not answering does not stop the others' counting
            log.warning("traffic of server %s not sampled: %s", server.id, exc)
            continue
        sample = await to_thread.run_sync(_count, ctx, server.id, counters, ctx.clock.now())
        sampled += counters is not None
        try:
            if sample.throttle:
                await backend.limit_bandwidth(handle, rate)
                throttled += 1
            if sample.lift:
                await backend.limit_bandwidth(handle, None)
                await to_thread.run_sync(_lifted, ctx, server.id, sample.lift, ctx.clock.now())
                lifted += 1
        except PluginError as exc:  # tried again at the next pass
            log.warning("bandwidth cap of server %s not changed: %s", server.id, exc)
    return TrafficPass(sampled, throttled, lifted)
