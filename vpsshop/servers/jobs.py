"""The provisioning job queue: hypervisor work done outside requests, once, surviving restarts.

An order, a suspension, a renewal of a suspended server, a termination and a power action each
insert a :class:`~vpsshop.servers.models.ServerJob` in the transaction that decided it. The
``servers-jobs`` background task (every ``servers.jobs_interval_seconds``) claims jobs and runs
them against ``ctx.hypervisor``.

Claiming is one statement: ``UPDATE server_jobs SET status = 'running', locked_until = now +
lease ... WHERE id = (SELECT id ... LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING ...``. On PostgreSQL
two workers skip each other's row; on SQLite ``BEGIN IMMEDIATE`` serialises writers. A job is
never run by two workers at once: the finishing update checks ``locked_by``.

Leases are short (``servers.job_lease_seconds``, 15 s) and renewed by the worker every third of
that while the job runs (:func:`run_job`), so a long hypervisor call keeps its job and a dead
worker's job is free again within one lease. A worker also frees at once the jobs of a worker it
can prove dead: one on the same host, in the same PID namespace, whose process no longer exists
(:func:`reclaim_dead`, each pass). The next worker runs such a job again; the hypervisor verbs are
idempotent, so that is safe. Jobs of one server run one at a time in id order.

Each power verb's job leaves ``servers.power`` as the verb made it (``running`` after start, reboot,
resume, provisioning and reinstall; ``stopped`` after stop and suspend; null once destroyed), so
``GET /servers/{id}`` shows a stopped server without asking the hypervisor.

A provisioning attempt that fails is retried after ``retry_seconds`` x 2^(attempt-1). After
``provision_attempts`` failures the server is ``terminated`` with the reason in
``status_reason``, the order's charge is refunded through the ledger (reason ``refund``, dedupe key
``refund:server:<id>``) and a ``destroy`` job cleans up whatever was half created.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from anyio import to_thread
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import aliased
from sqlmodel import Session, col, select

import vpsshop.events as events
import vpsshop.ledger as ledger
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.encryption import decrypt_text
from vpsshop.errors import PluginError
from vpsshop.hypervisor import (
    CAPABILITY_GUEST_REPORT,
    CAPABILITY_IPV6,
    DomainState,
    GuestReport,
    ServerHandle,
    ServerSpec,
)
from vpsshop.metrics import server_ready
from vpsshop.models import Server, saved_id
from vpsshop.servers.credentials import decrypt_password
from vpsshop.servers.lifecycle import ServersPolicy, enqueue, policy, record
from vpsshop.servers.models import DrainedHost, IpLease, Ipv6Lease, ServerEvent, ServerJob
from vpsshop.servers.resource import server_event

log = logging.getLogger("vpsshop.servers")


ON_ACTIVATED: list[Callable[[AppContext, int], Awaitable[None]]] = []
"""Called with each server a provisioning job has just made ``active``, after its transaction: what
settles an order's held x402 payment (:func:`vpsshop.servers.held.settle_when_ready`, registered by
:mod:`vpsshop.servers.held`, which the context's assembly imports: that module depends on this one)."""
ON_ABANDONED: list[Callable[[AppContext, Session, Server], object]] = []
"""Called in the transaction of :func:`abandon_provisioning`: what drops an order's held x402 payment
(:func:`vpsshop.servers.held.release_for_server`)."""


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "-"


WORKER_ID = f"{socket.gethostname()[:32]}:{_pid_namespace()}:{os.getpid()}:{secrets.token_hex(3)}"
"""This process's name on the jobs it leases: host, PID namespace, process id and a random tag."""
MAX_JOBS_PER_PASS = 50


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    server_id: int
    kind: str
    attempts: int
    worker: str


BOOT_RECHECK_SECONDS = 0.5
"""How soon a provisioning job looks again at a domain that reports ``starting``, or whose guest has
not reported its boot within :data:`REPORT_WAIT_SECONDS`."""
REPORT_WAIT_SECONDS = 30.0
"""How long one run of a provisioning or reinstall job waits for the guest's report (the backend
returns it the moment it arrives) before it goes back to the queue; the job's lease is renewed meanwhile."""
MAX_HOST_KEYS = 10
MIGRATING = (
    "Moving to another host of its location (maintenance): powered off while its disk is copied, "
    "then started there with the same address."
)
"""``status_reason`` of a server while a ``migrate`` job moves it."""

BOOTING = "Booting: waiting for the guest to finish its first boot and for its SSH daemon to answer."
"""``status_reason`` of a provisioning server whose domain runs, until its guest reports."""
SSH_OFF = "Ready, but its SSH daemon does not answer: the server's own first-boot data (user data) turned it off."
"""``status_reason`` of a server whose guest booted cleanly with SSH turned off by the customer's user data."""
BOOT_ERRORS = (
    "The first boot finished with errors, so the server may not be set up as ordered (it runs): {errors}. "
    "Check the user data and reinstall, or ask the shop."
)
"""``status_reason`` of a server whose guest reported errors of its first boot (cloud-init's)."""


class RetryLater(Exception):
    """The job cannot run yet (no hypervisor loaded, the domain still booting): not a failure.

    The job goes back to the queue without counting an attempt, to run again after ``after``
    seconds (default: ``servers.jobs_interval_seconds``).
    """

    def __init__(self, message: str, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after


def claim(ctx: AppContext, worker: str = WORKER_ID) -> ClaimedJob | None:
    """Move the oldest runnable job to ``running`` under a lease, or return None."""
    now = ctx.clock.now()
    lease = now + timedelta(seconds=policy(ctx).job_lease_seconds)
    earlier = aliased(ServerJob)
    runnable = (
        select(col(ServerJob.id))
        .where(
            sa.or_(
                sa.and_(col(ServerJob.status) == "queued", col(ServerJob.run_after) <= now),
                sa.and_(col(ServerJob.status) == "running", col(ServerJob.locked_until) < now),
            ),
            ~sa.exists().where(
                col(earlier.server_id) == col(ServerJob.server_id),
                col(earlier.id) < col(ServerJob.id),
                col(earlier.status).in_(("queued", "running")),
            ),
        )
        .order_by(col(ServerJob.run_after), col(ServerJob.id))
        .limit(1)
    )
    if ctx.db.dialect == "postgresql":
        runnable = runnable.with_for_update(skip_locked=True, of=ServerJob)
    with ctx.db.session() as session:
        row = session.execute(
            sa.update(ServerJob)
            .where(col(ServerJob.id) == runnable.scalar_subquery())
            .values(status="running", attempts=col(ServerJob.attempts) + 1, locked_until=lease, locked_by=worker)
            .returning(col(ServerJob.id), col(ServerJob.server_id), col(ServerJob.kind), col(ServerJob.attempts))
        ).first()
    if row is None:
        return None
    return ClaimedJob(row[0], row[1], row[2], row[3], worker)


def _provably_dead(worker: str) -> bool:
    """Whether ``worker`` (a :data:`WORKER_ID`) is a process of this host and PID namespace that
    no longer exists. Anything else (another host, an older id format, a live process) is not proof."""
    host, namespace, pid, _tag = [*worker.split(":"), "", "", "", ""][:4]
    mine_host, mine_namespace, mine_pid, _ = WORKER_ID.split(":")
    if host != mine_host or namespace != mine_namespace or namespace == "-" or not pid.isdigit() or pid == mine_pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists (owned by someone else)
    return False


def reclaim_dead(ctx: AppContext) -> int:
    """Free the ``running`` jobs of workers :func:`_provably_dead` so they can be claimed now
    rather than when their lease runs out. Returns how many were freed."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        holders = (
            session.execute(
                sa.select(col(ServerJob.locked_by))
                .where(col(ServerJob.status) == "running", col(ServerJob.locked_until) >= now)
                .distinct()
            )
            .scalars()
            .all()
        )
        dead = [w for w in holders if w and _provably_dead(w)]
        if not dead:
            return 0
        freed = rowcount(
            session.execute(
                sa.update(ServerJob)
                .where(col(ServerJob.status) == "running", col(ServerJob.locked_by).in_(dead))
                .values(locked_until=now - timedelta(seconds=1))
            )
        )
    log.warning("freed %d job(s) leased by worker(s) no longer running: %s", freed, ", ".join(dead))
    return freed


def renew_lease(ctx: AppContext, job: ClaimedJob) -> bool:
    """Extend ``job``'s lease by ``servers.job_lease_seconds`` from now; False when it is no longer ours."""
    until = ctx.clock.now() + timedelta(seconds=policy(ctx).job_lease_seconds)
    with ctx.db.session() as session:
        return rowcount(session.execute(sa.update(ServerJob).where(_ours(job)).values(locked_until=until))) == 1


async def _keep_lease(ctx: AppContext, job: ClaimedJob) -> None:
    every = policy(ctx).job_lease_seconds / 3
    while True:
        await asyncio.sleep(every)
        try:
            kept = await to_thread.run_sync(renew_lease, ctx, job)
        except Exception as exc:  # noqa: BLE001 - a database hiccup: try again at the next beat
            log.warning("job %s: renewing the lease failed: %s", job.id, exc)
            continue
        if not kept:
            log.warning("job %s (%s of server %s): lease lost to another worker", job.id, job.kind, job.server_id)
            return


def _ours(job: ClaimedJob) -> sa.ColumnElement[bool]:
    """``job``'s row while its worker still holds it: running under that worker's lease."""
    return sa.and_(
        col(ServerJob.id) == job.id, col(ServerJob.locked_by) == job.worker, col(ServerJob.status) == "running"
    )


def _finish(session: Session, job: ClaimedJob, now: datetime, **values: object) -> bool:
    return rowcount(session.execute(sa.update(ServerJob).where(_ours(job)).values(**values))) == 1


def _handle(server: Server) -> ServerHandle:
    return ServerHandle(host=server.host or "", domain=server.domain or "", ip=server.ip, location=server.location)


# ---- provisioning --------------------------------------------------------------------------------


def _prepare(ctx: AppContext, server_id: int, status: str = "provisioning") -> tuple[Server, ServerSpec] | None:
    """Name the domain and lease its address (both kept across retries and reinstalls); build the
    spec from the server as it is now (a reinstall has changed its OS, keys and password)."""
    backend = ctx.hypervisor
    assert backend is not None
    with ctx.db.session() as session:
        server = session.get(Server, server_id)
        if server is None or server.status != status:
            return None
        if server.domain is None:
            server.domain = f"vps-{server.id}-{secrets.token_hex(4)}"
            session.add(server)
        plan = next((p for p in ctx.catalog_data.plans if p.id == server.plan), None)
        os_ = next((o for o in ctx.catalog_data.operating_systems if o.id == server.os), None)
        if plan is None or os_ is None:
            raise RuntimeError(f"plan {server.plan!r} or operating system {server.os!r} is no longer in the catalog")
        pool = backend.address_pool(server.location)
        address = None
        if pool is not None:
            address = _lease_address(session, IpLease, pool.pool, pool.addresses, server_id, ctx.clock.now())
        v6 = backend.ipv6_pool(server.location) if CAPABILITY_IPV6 in backend.capabilities else None
        ipv6, ipv6_length = None, 64
        if v6 is not None:
            lease = _lease_address(session, Ipv6Lease, v6.pool, v6.leases(), server_id, ctx.clock.now())
            ipv6, ipv6_length = v6.guest_address(lease)
        assert server.root_password_enc is not None
        spec = ServerSpec(
            name=server.domain,
            hostname=server.hostname,
            location=server.location,
            vcpu=plan.vcpu,
            memory_mib=plan.memory_mib,
            disk_gib=plan.disk_gib,
            os_id=os_.id,
            os_image=os_.image,
            root_password=decrypt_password(ctx, server.root_password_enc),
            ip=address,
            prefix_length=pool.prefix_length if pool else 24,
            gateway=pool.gateway if pool else None,
            nameservers=pool.nameservers if pool else (),
            ssh_keys=tuple(json.loads(server.ssh_keys)) if server.ssh_keys else (),
            user_data=decrypt_text(ctx, server.user_data_enc, "user data") if server.user_data_enc else None,
            ipv6=ipv6,
            ipv6_prefix_length=ipv6_length,
            ipv6_gateway=v6.gateway if v6 is not None else None,
            avoid_hosts=tuple(session.exec(select(DrainedHost.host)).all()),
        )
        return server, spec


def _lease_address(
    session: Session,
    table: type[IpLease] | type[Ipv6Lease],
    pool: str,
    addresses: Iterable[str],
    server_id: int,
    now: datetime,
) -> str:
    held = session.exec(select(table.address).where(table.server_id == server_id)).first()
    if held is not None:
        return held
    taken = set(session.exec(select(table.address).where(table.pool == pool)).all())
    for address in addresses:
        if address in taken:
            continue
        savepoint = session.begin_nested()
        try:
            session.add(table(pool=pool, address=address, server_id=server_id, created_at=now))
            session.flush()
            savepoint.commit()
            return address
        except IntegrityError:  # another worker leased it a moment ago: try the next one
            savepoint.rollback()
    raise PluginError(f"address pool {pool!r} has no free address")


def _ipv6_values(session: Session, server_id: int, spec: ServerSpec) -> dict[str, str | None]:
    """``servers.ipv6`` and ``ipv6_prefix`` as an active server shows them: its guest's address, and
    the /64 its lease is when the pool routes one per server."""
    lease = session.exec(select(Ipv6Lease.address).where(Ipv6Lease.server_id == server_id)).first()
    return {"ipv6": spec.ipv6, "ipv6_prefix": lease if lease is not None and "/" in lease else None}


def _release_address(ctx: AppContext, server_id: int) -> None:
    with ctx.db.session() as session:
        session.execute(sa.delete(IpLease).where(col(IpLease.server_id) == server_id))
        session.execute(sa.delete(Ipv6Lease).where(col(Ipv6Lease.server_id) == server_id))


async def _provision(ctx: AppContext, job: ClaimedJob) -> None:
    prepared = await to_thread.run_sync(_prepare, ctx, job.server_id)
    if prepared is None:
        return
    server, spec = prepared
    assert ctx.hypervisor is not None
    handle = await ctx.hypervisor.create(spec)
    state = await ctx.hypervisor.state(handle)
    if state == DomainState.STARTING:
        waited = (ctx.clock.now() - server.created_at).total_seconds()
        limit = policy(ctx).boot_timeout_seconds
        if waited < limit:
            await to_thread.run_sync(_set_reason, ctx, saved_id(server), BOOTING)
            raise RetryLater(f"domain {handle.domain} is booting", after=BOOT_RECHECK_SECONDS)
        raise PluginError(
            f"domain {handle.domain} is still starting {waited:.0f} s after the order "
            f"(servers.boot_timeout_seconds = {limit:g})"
        )
    if state != DomainState.RUNNING:
        raise PluginError(f"domain {handle.domain} is {state.value} after creation, not running")
    ip = handle.ip or spec.ip
    server_id = saved_id(server)
    report = await _guest_report(ctx, server_id, handle, server.created_at, BOOTING)

    def activate() -> None:
        now = ctx.clock.now()
        ready = _ready_values(report, now)
        with ctx.db.session() as session:
            v6 = _ipv6_values(session, server_id, spec)
            moved = rowcount(
                session.execute(
                    sa.update(Server)
                    .where(col(Server.id) == server_id, col(Server.status) == "provisioning")
                    .values(
                        status="active", ip=ip, host=handle.host, domain=handle.domain, power="running", **ready, **v6
                    )
                )
            )
            if moved:
                record(session, server_id, "provisioned", now, f"{handle.host} {handle.domain} {ip}")
                _record_report(session, server_id, report, now)
                kind = "server.active" if ready["ready_at"] is not None else "server.boot_failed"
                events.emit(session, kind, server.account_id, server_event(session, server_id), now=now)
        if moved and ready["ready_at"] is not None:
            server_ready("order", (now - server.created_at).total_seconds())

    await to_thread.run_sync(activate)
    for hook in ON_ACTIVATED:  # an order paid by an x402 authorization held until now: settle it
        await hook(ctx, server_id)


async def _guest_report(
    ctx: AppContext, server_id: int, handle: ServerHandle, since: datetime, waiting: str | None
) -> GuestReport | None:
    """The guest's report of its boot, waiting for it (None when the backend makes no reports).

    Sets ``status_reason`` to ``waiting`` while it waits (None: leave it). A guest that has not
    reported ``servers.boot_timeout_seconds`` after ``since`` (the order, the reinstall request)
    fails the attempt; one that has not reported yet sends the job back to the queue.
    """
    backend = ctx.hypervisor
    assert backend is not None
    if CAPABILITY_GUEST_REPORT not in backend.capabilities:
        return None
    limit = policy(ctx).boot_timeout_seconds
    waited = (ctx.clock.now() - since).total_seconds()
    if waited >= limit:
        raise PluginError(
            f"the guest of domain {handle.domain} has not reported a finished boot {waited:.0f} s after it was "
            f"started (servers.boot_timeout_seconds = {limit:g}); see its console"
        )
    if waiting is not None:
        await to_thread.run_sync(_set_reason, ctx, server_id, waiting)
    report = await backend.guest_report(handle, min(REPORT_WAIT_SECONDS, limit - waited))
    if report is None:
        raise RetryLater(
            f"the guest of domain {handle.domain} has not reported its boot yet", after=BOOT_RECHECK_SECONDS
        )
    if not isinstance(report, GuestReport):
        raise PluginError(f"guest_report returned {type(report).__name__}, not a vpsshop.GuestReport")
    return report


def _set_reason(ctx: AppContext, server_id: int, reason: str) -> None:
    """``status_reason`` of a server still provisioning (one terminated meanwhile keeps its own)."""
    with ctx.db.session() as session:
        session.execute(
            sa.update(Server)
            .where(
                col(Server.id) == server_id,
                col(Server.status) == "provisioning",
                sa.or_(col(Server.status_reason).is_(None), col(Server.status_reason) != reason),
            )
            .values(status_reason=reason)
        )


def _ready_values(report: GuestReport | None, now: datetime) -> dict[str, object]:
    """The columns a guest's report sets: ``ready_at`` (None when its boot had errors),
    ``host_keys`` and ``status_reason``. No report (a backend without reports): ready now."""
    if report is None:
        return {"ready_at": now, "host_keys": None, "status_reason": None}
    keys = json.dumps([f"{k.type} {k.key}" for k in report.host_keys[:MAX_HOST_KEYS]]) if report.host_keys else None
    if report.errors:
        errors = "; ".join(e.strip()[:200] for e in report.errors[:3])
        return {"ready_at": None, "host_keys": keys, "status_reason": BOOT_ERRORS.format(errors=errors)[:500]}
    return {"ready_at": now, "host_keys": keys, "status_reason": None if report.ssh else SSH_OFF}


def _record_report(session: Session, server_id: int, report: GuestReport | None, now: datetime) -> None:
    if report is None:
        return
    if report.errors:
        record(session, server_id, "boot_errors", now, "; ".join(report.errors)[:500])
    else:
        record(session, server_id, "ready", now, "ssh" if report.ssh else "ssh off")


def _give_up_provisioning(ctx: AppContext, server_id: int, attempts: int, error: str) -> None:
    """After the last attempt: terminate, refund the order, clean up. Once: guarded by status."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        server = session.get(Server, server_id)
        if server is None:
            return
        reason = f"Provisioning failed after {attempts} attempts: {error}"
        abandon_provisioning(ctx, session, server, now, reason, "provision_failed")


def cancel_queued_provisioning(session: Session, server_id: int, now: datetime, reason: str) -> None:
    """Cancel ``server_id``'s provisioning job if it still waits: the server will not be made."""
    session.execute(
        sa.update(ServerJob)
        .where(
            col(ServerJob.server_id) == server_id, col(ServerJob.kind) == "provision", col(ServerJob.status) == "queued"
        )
        .values(status="cancelled", finished_at=now, locked_until=None, last_error=f"cancelled: {reason}"[:500])
    )


def abandon_provisioning(
    ctx: AppContext, session: Session, server: Server, now: datetime, reason: str, history: str
) -> int | None:
    """Terminate ``server`` while it is still ``provisioning``, refund its order and queue the clean-up,
    in the caller's transaction.

    The one path of a provisioning given up after its last attempt and of an operator cancelling it
    (``vpsshop admin cancel-job``, ``vpsshop admin refund``): the server becomes ``terminated`` (only
    from ``provisioning``: a conditional update), the order's price is credited back (ledger
    ``refund``, dedupe key ``refund:server:<id>``: once, whichever path gets there), its queued
    provisioning job is cancelled, an x402 authorization held for the order until the server is ready is
    dropped (nothing was sent), and a ``destroy`` job removes whatever an attempt half created (a
    provisioning job still running finds the server terminated and stops; the destroy job runs
    after it, as jobs of one server run in id order).

    :returns: the micros refunded, or None when the server was no longer provisioning (nothing done).
    """
    assert server.id is not None
    server_id = server.id
    refunded_note = " The order was refunded."
    moved = rowcount(
        session.execute(
            sa.update(Server)
            .where(col(Server.id) == server_id, col(Server.status) == "provisioning")
            .values(
                status="terminated",
                terminated_at=now,
                status_reason=reason[: 500 - len(refunded_note)] + refunded_note,
            )
        )
    )
    if moved != 1:
        return None
    posting = ledger.post(
        session,
        server.account_id,
        server.price_micros,
        "refund",
        ref=f"server:{server_id}",
        dedupe_key=f"refund:server:{server_id}",
        memo=reason[:500],
        now=now,
    )
    refunded = posting.entry.amount_micros if posting.created else 0
    for release in ON_ABANDONED:  # an order's x402 authorization held until ready: dropped
        release(ctx, session, server)
    cancel_queued_provisioning(session, server_id, now, reason)
    record(session, server_id, history, now, reason[:500])
    record(session, server_id, "refunded", now, str(refunded))
    events.emit(session, "server.terminated", server.account_id, server_event(session, server_id), now=now)
    enqueue(session, server_id, "destroy", now)
    return refunded


# ---- reinstall -----------------------------------------------------------------------------------


REINSTALLING = (
    "Reinstalling {os}: the disk is being made anew; this clears once the new system is installed and started."
)
"""``status_reason`` of an active server from its reinstall request until its job is done."""
REINSTALL_FAILED = (
    "The reinstall of {os} did not complete, and the server may not boot: reinstall it again "
    "(POST /servers/{id}/reinstall) or ask the shop."
)
"""``status_reason`` of an active server whose reinstall job failed its last attempt."""


async def _reinstall(ctx: AppContext, job: ClaimedJob) -> None:
    """Recreate an active server's disk from its (new) OS with its new first-boot data; then the
    server's ``status_reason`` clears, ``power`` is running and ``server.reinstalled`` is emitted,
    in one transaction."""
    prepared = await to_thread.run_sync(_prepare, ctx, job.server_id, "active")
    if prepared is None:
        return  # suspended or terminated since the request: nothing to reinstall
    server, spec = prepared
    assert ctx.hypervisor is not None
    requested, made = await to_thread.run_sync(_reinstall_progress, ctx, job)
    handle = _handle(server)
    if not made:  # a job waiting for the new guest's report runs again: the disk is made once
        handle = await ctx.hypervisor.reinstall(handle, spec)

        def disk_made() -> None:
            with ctx.db.session() as session:
                record(
                    session,
                    job.server_id,
                    "reinstalled",
                    ctx.clock.now(),
                    f"{handle.host} {handle.domain} {spec.os_id}",
                    once_key=f"reinstalled:job:{job.id}",
                )
                session.execute(
                    sa.update(Server).where(col(Server.id) == job.server_id).values(ready_at=None, host_keys=None)
                )

        await to_thread.run_sync(disk_made)
    report = await _guest_report(ctx, job.server_id, handle, requested, None)

    def reinstalled() -> None:
        now = ctx.clock.now()
        ready = _ready_values(report, now)
        with ctx.db.session() as session:
            moved = rowcount(
                session.execute(
                    sa.update(Server)
                    .where(col(Server.id) == job.server_id, col(Server.status) == "active")
                    .values(power="running", **ready)
                )
            )
            if moved:
                _record_report(session, job.server_id, report, now)
                kind = "server.reinstalled" if ready["ready_at"] is not None else "server.boot_failed"
                events.emit(session, kind, server.account_id, server_event(session, job.server_id), now=now)
        if moved and ready["ready_at"] is not None:
            server_ready("reinstall", (now - requested).total_seconds())

    await to_thread.run_sync(reinstalled)


def _reinstall_progress(ctx: AppContext, job: ClaimedJob) -> tuple[datetime, bool]:
    """When the reinstall was requested (its job was queued), and whether an earlier run of the job
    made the new disk already."""
    with ctx.db.session() as session:
        requested = session.execute(
            sa.select(col(ServerJob.created_at)).where(col(ServerJob.id) == job.id)
        ).scalar_one()
        made = session.exec(select(ServerEvent.id).where(ServerEvent.once_key == f"reinstalled:job:{job.id}")).first()
        return requested, made is not None


def _reinstall_failed(ctx: AppContext, server_id: int) -> None:
    with ctx.db.session() as session:
        server = session.get(Server, server_id)
        if server is None or server.status != "active":
            return
        server.status_reason = REINSTALL_FAILED.format(os=server.os, id=server_id)
        session.add(server)


# ---- resize --------------------------------------------------------------------------------------

RESIZING = (
    "Resizing to plan {plan}: the server is powered off, given the plan's memory, vCPUs and disk, and started "
    "again; its file system grows at that boot. This clears once it runs."
)
"""``status_reason`` of an active server from its resize request until its job is done."""
RESIZE_FAILED = (
    "The resize to plan {plan} did not complete: the server may still have its old memory, vCPUs or disk. "
    "Ask the shop's support (the resize was charged)."
)
"""``status_reason`` of an active server whose resize job failed its last attempt."""


async def _resize(ctx: AppContext, job: ClaimedJob) -> None:
    """Give an active server its (new) plan's memory, vCPUs and disk; then its ``status_reason``
    clears, ``power`` is running and ``server.resized`` is emitted, in one transaction."""
    prepared = await to_thread.run_sync(_prepare, ctx, job.server_id, "active")
    if prepared is None:
        return  # suspended or terminated since the request: the VM is off or gone
    server, spec = prepared
    assert ctx.hypervisor is not None
    handle = _handle(server)
    await ctx.hypervisor.resize(handle, spec)

    def resized() -> None:
        now = ctx.clock.now()
        with ctx.db.session() as session:
            moved = rowcount(
                session.execute(
                    sa.update(Server)
                    .where(col(Server.id) == job.server_id, col(Server.status) == "active")
                    .values(power="running", status_reason=None)
                )
            )
            if moved:
                detail = f"{spec.vcpu} vCPU, {spec.memory_mib} MiB, {spec.disk_gib} GiB"
                record(session, job.server_id, "resized", now, detail)
                events.emit(session, "server.resized", server.account_id, server_event(session, job.server_id), now=now)

    await to_thread.run_sync(resized)


def _resize_failed(ctx: AppContext, server_id: int) -> None:
    with ctx.db.session() as session:
        server = session.get(Server, server_id)
        if server is None or server.status != "active":
            return
        server.status_reason = RESIZE_FAILED.format(plan=server.plan)
        session.add(server)


# ---- reverse DNS ---------------------------------------------------------------------------------


async def _rdns(ctx: AppContext, job: ClaimedJob) -> None:
    """Make the provider's PTR record of the server's address what the row says now."""

    def load() -> Server | None:
        with ctx.db.session() as session:
            return session.get(Server, job.server_id)

    server = await to_thread.run_sync(load)
    if ctx.dns is None or server is None or not server.ip or server.status == "terminated":
        return  # termination clears the record in its destroy job
    for address in _named_addresses(ctx, server):
        if server.reverse_dns:
            await ctx.dns.set_ptr(address, server.reverse_dns)
        else:
            await ctx.dns.clear_ptr(address)


def _named_addresses(ctx: AppContext, server: Server) -> list[str]:
    """The addresses a server's reverse DNS name is given to: its IPv4 address, and its IPv6 one
    when a zone of the provider holds it."""
    assert ctx.dns is not None
    return [a for a in (server.ip, server.ipv6) if a and (a == server.ip or ctx.dns.holds(a))]


# ---- firewall ------------------------------------------------------------------------------------


async def _firewall(ctx: AppContext, job: ClaimedJob) -> None:
    """Hand the server's stored rules to the backend (the latest ones: an older job applies them too)."""
    from vpsshop.servers.firewall import firewall_applied, rules_of

    def load() -> Server | None:
        with ctx.db.session() as session:
            return session.get(Server, job.server_id)

    server = await to_thread.run_sync(load)
    if server is None or server.domain is None or server.status == "terminated":
        return  # nothing on the hypervisor to filter (destroy removes the filter)
    assert ctx.hypervisor is not None
    await ctx.hypervisor.set_firewall(_handle(server), rules_of(server))
    await to_thread.run_sync(firewall_applied, ctx, job.server_id, server.account_id, server.firewall)


# ---- snapshots -----------------------------------------------------------------------------------


async def _snapshot(ctx: AppContext, job: ClaimedJob) -> None:
    """Take, restore or delete the job's snapshot (vpsshop/servers/snapshots.py), then record it."""
    from vpsshop.servers.snapshots import job_snapshot, snapshot_done, snapshot_name

    found = await to_thread.run_sync(job_snapshot, ctx, job.id)
    if found is None:
        return
    server, snapshot = found
    assert snapshot.id is not None and ctx.hypervisor is not None
    if server.domain is None or server.status == "terminated":
        return  # the destroy job removes the domain and every snapshot with it
    handle, name = _handle(server), snapshot_name(snapshot.id)
    if job.kind == "snapshot":
        if snapshot.status != "creating":
            return  # deleted (a reinstall) before it was taken
        await ctx.hypervisor.create_snapshot(handle, name)
    elif job.kind == "restore":
        if snapshot.status != "ready" or server.status != "active":
            return
        await ctx.hypervisor.restore_snapshot(handle, name)
    else:
        await ctx.hypervisor.delete_snapshot(handle, name)
    await to_thread.run_sync(snapshot_done, ctx, job.kind, job.server_id, snapshot.id, server.account_id)


# ---- other verbs ---------------------------------------------------------------------------------

_POWER_AFTER = {"start": "running", "reboot": "running", "resume": "running", "stop": "stopped", "suspend": "stopped"}
"""What ``servers.power`` says once each power verb has run."""
_POWER_EVENTS = {"start": "server.started", "stop": "server.stopped", "reboot": "server.rebooted"}
"""The event of each customer power action, emitted once its job has run."""


async def _verb(ctx: AppContext, job: ClaimedJob) -> None:
    def load() -> Server | None:
        with ctx.db.session() as session:
            return session.get(Server, job.server_id)

    server = await to_thread.run_sync(load)
    if server is None or server.domain is None:
        return  # never got as far as a domain: nothing on the hypervisor to act on
    assert ctx.hypervisor is not None
    handle = _handle(server)
    if job.kind in ("start", "stop", "reboot") and server.status != "active":
        return  # a power action queued before a suspension or termination: dropped
    await getattr(ctx.hypervisor, job.kind)(handle)
    if job.kind in _POWER_AFTER:

        def powered() -> None:
            with ctx.db.session() as session:
                moved = rowcount(
                    session.execute(
                        sa.update(Server)
                        .where(col(Server.id) == job.server_id, col(Server.status) != "terminated")
                        .values(power=_POWER_AFTER[job.kind])
                    )
                )
                event = _POWER_EVENTS.get(job.kind)
                if moved and event is not None:
                    events.emit(
                        session, event, server.account_id, server_event(session, job.server_id), now=ctx.clock.now()
                    )

        await to_thread.run_sync(powered)
    if job.kind == "destroy":
        if ctx.dns is not None and server.ip and server.reverse_dns:
            for address in _named_addresses(ctx, server):  # the addresses go back to the pool: names must not stay
                await ctx.dns.clear_ptr(address)

            def forget() -> None:
                with ctx.db.session() as session:
                    session.execute(sa.update(Server).where(col(Server.id) == job.server_id).values(reverse_dns=None))

            await to_thread.run_sync(forget)
        await to_thread.run_sync(_release_address, ctx, job.server_id)

        def destroyed() -> None:
            from vpsshop.servers.snapshots import drop_snapshots

            with ctx.db.session() as session:
                session.execute(
                    sa.update(Server)
                    .where(col(Server.id) == job.server_id)
                    .values(power=None, ip=None, ipv6=None, ipv6_prefix=None)
                )
                row = session.get(Server, job.server_id)
                if row is not None:  # the domain's disk held them
                    drop_snapshots(session, row, ctx.clock.now())
                record(
                    session,
                    job.server_id,
                    "destroyed",
                    ctx.clock.now(),
                    f"{handle.host} {handle.domain}",
                    once_key=f"destroyed:{job.server_id}",
                )

        await to_thread.run_sync(destroyed)


# ---- migrate -------------------------------------------------------------------------------------


async def _migrate(ctx: AppContext, job: ClaimedJob) -> None:
    """Move the server to the job's target host: ``status_reason`` and ``server.migrating`` first,
    then the backend's :meth:`~vpsshop.HypervisorBackend.migrate` (idempotent: a retried job
    finishes the move), then ``servers.host``, the history row and ``server.migrated`` in one
    transaction, with ``status_reason`` cleared."""

    def begin() -> tuple[Server, str] | None:
        with ctx.db.session() as session:
            server = session.get(Server, job.server_id)
            target = session.execute(sa.select(col(ServerJob.target)).where(col(ServerJob.id) == job.id)).scalar_one()
            if server is None or server.domain is None or server.status == "terminated" or not target:
                return None
            if server.host == target:
                return server, target  # a retried job whose move was recorded: the backend only tidies up
            if record(
                session,
                job.server_id,
                "migrating",
                ctx.clock.now(),
                f"{server.host} -> {target}",
                once_key=f"migrating:job:{job.id}",
            ):
                server.status_reason = MIGRATING
                session.add(server)
                session.flush()
                events.emit(
                    session,
                    "server.migrating",
                    server.account_id,
                    server_event(session, job.server_id),
                    now=ctx.clock.now(),
                )
            return server, target

    begun = await to_thread.run_sync(begin)
    if begun is None:
        return
    server, target = begun
    assert ctx.hypervisor is not None
    running = server.power != "stopped" and server.status == "active"
    handle = await ctx.hypervisor.migrate(_handle(server), target, start=running)
    if handle.host != target:
        raise PluginError(f"migrate returned host {handle.host!r}, not {target!r}")

    def moved() -> None:
        with ctx.db.session() as session:
            row = session.get(Server, job.server_id)
            if row is None:
                return
            source = row.host
            row.host = target
            if row.status_reason == MIGRATING:
                row.status_reason = None
            session.add(row)
            session.flush()
            if record(
                session,
                job.server_id,
                "migrated",
                ctx.clock.now(),
                f"{source} -> {target}",
                once_key=f"migrated:job:{job.id}",
            ):
                events.emit(
                    session,
                    "server.migrated",
                    row.account_id,
                    server_event(session, job.server_id),
                    now=ctx.clock.now(),
                )

    await to_thread.run_sync(moved)


def _migrate_failed(ctx: AppContext, server_id: int, error: str) -> None:
    with ctx.db.session() as session:
        server = session.get(Server, server_id)
        if server is not None and server.status_reason == MIGRATING:
            server.status_reason = None  # the backend left it on its old host, as it was
            session.add(server)
        record(session, server_id, "migrate_failed", ctx.clock.now(), error[:200])


# ---- the pass ------------------------------------------------------------------------------------


async def run_job(ctx: AppContext, job: ClaimedJob) -> str:
    """Run one claimed job, renewing its lease while it runs, and record its outcome: ``done``,
    ``retry`` or ``failed``."""
    heartbeat = asyncio.create_task(_keep_lease(ctx, job), name=f"server-job-{job.id}-lease")
    try:
        return await _run_job(ctx, job)
    finally:
        heartbeat.cancel()


async def _run_job(ctx: AppContext, job: ClaimedJob) -> str:
    pol: ServersPolicy = policy(ctx)
    try:
        if ctx.hypervisor is None and job.kind != "rdns":
            raise RetryLater("no hypervisor backend is loaded")
        if job.kind == "provision":
            await _provision(ctx, job)
        elif job.kind == "reinstall":
            await _reinstall(ctx, job)
        elif job.kind == "resize":
            await _resize(ctx, job)
        elif job.kind == "rdns":
            await _rdns(ctx, job)
        elif job.kind == "migrate":
            await _migrate(ctx, job)
        elif job.kind == "firewall":
            await _firewall(ctx, job)
        elif job.kind in ("snapshot", "restore", "delete_snapshot"):
            await _snapshot(ctx, job)
        else:
            await _verb(ctx, job)
    except RetryLater as exc:
        await to_thread.run_sync(_requeue, ctx, job, str(exc), False, pol, exc.after)
        return "retry"
    except Exception as exc:  # noqa: BLE001 - any failure of a verb is recorded, never lost
        error = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
        log.warning(
            "job %s (%s of server %s) attempt %s failed: %s", job.id, job.kind, job.server_id, job.attempts, error
        )
        if job.attempts < pol.provision_attempts:
            await to_thread.run_sync(_requeue, ctx, job, error, True, pol)
            return "retry"
        await to_thread.run_sync(_fail, ctx, job, error)
        return "failed"
    await to_thread.run_sync(_done, ctx, job)
    return "done"


def _requeue(
    ctx: AppContext, job: ClaimedJob, error: str, counts: bool, pol: ServersPolicy, after: float | None = None
) -> None:
    now = ctx.clock.now()
    if counts:
        delay = pol.retry_seconds * 2 ** (job.attempts - 1)
    else:
        delay = pol.jobs_interval_seconds if after is None else after
    with ctx.db.session() as session:
        _finish(
            session,
            job,
            now,
            status="queued",
            run_after=now + timedelta(seconds=delay),
            locked_until=None,
            locked_by=None,
            last_error=error[:500],
            attempts=ServerJob.attempts if counts else ServerJob.attempts - 1,
        )


def _fail(ctx: AppContext, job: ClaimedJob, error: str) -> None:
    now = ctx.clock.now()
    with ctx.db.session() as session:
        _finish(session, job, now, status="failed", finished_at=now, locked_until=None, last_error=error[:500])
    if job.kind == "provision":
        _give_up_provisioning(ctx, job.server_id, job.attempts, error)
    elif job.kind == "reinstall":
        _reinstall_failed(ctx, job.server_id)
    elif job.kind == "resize":
        _resize_failed(ctx, job.server_id)
    elif job.kind == "migrate":
        _migrate_failed(ctx, job.server_id, error)
    elif job.kind in ("snapshot", "restore", "delete_snapshot"):
        from vpsshop.servers.snapshots import snapshot_failed

        snapshot_failed(ctx, job.kind, job.id)
    elif job.kind in _POWER_EVENTS:
        with ctx.db.session() as session:
            server = session.get(Server, job.server_id)
            if server is not None and server.status == "active":
                events.emit(
                    session,
                    "server.power_failed",
                    server.account_id,
                    server_event(session, job.server_id),
                    now=ctx.clock.now(),
                )


def _done(ctx: AppContext, job: ClaimedJob) -> None:
    now = ctx.clock.now()
    with ctx.db.session() as session:
        _finish(session, job, now, status="done", finished_at=now, locked_until=None, last_error=None)


async def run_jobs(ctx: AppContext, limit: int = MAX_JOBS_PER_PASS, worker: str = WORKER_ID) -> dict[str, int]:
    """One pass of the ``servers-jobs`` task: claim and run jobs until none is due or ``limit``.

    Up to ``servers.job_concurrency`` jobs run at once (a suspension waits for the guest's ACPI
    shutdown; other servers' jobs need not wait behind it). When nothing is claimable but jobs are
    still running, the pass waits for one to finish and looks again, so a job queued by a finishing
    job (the clean-up after a failed provisioning) runs in the same pass. Tests call it directly.
    Returns how many jobs ended ``done``, ``retry`` and ``failed``.
    """
    counts = {"done": 0, "retry": 0, "failed": 0}
    concurrency = policy(ctx).job_concurrency
    running: set[asyncio.Task[str]] = set()
    claimed = 0
    await to_thread.run_sync(reclaim_dead, ctx)

    def collect(finished: set[asyncio.Task[str]]) -> None:
        for task in finished:
            counts[task.result()] += 1
        running.difference_update(finished)

    while claimed < limit:
        if len(running) >= concurrency:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            collect(done)
            continue
        job = await to_thread.run_sync(claim, ctx, worker)
        if job is None:
            if not running:
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            collect(done)
            continue
        claimed += 1
        running.add(asyncio.create_task(run_job(ctx, job), name=f"server-job-{job.id}"))
    if running:
        done, _ = await asyncio.wait(running)
        collect(done)
    return counts
