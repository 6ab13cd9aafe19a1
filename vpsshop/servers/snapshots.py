"""Server snapshots: restore points a customer takes before a risky change (docs/servers.md,
"Snapshots").

``POST /servers/{id}/snapshots`` adds a ``creating`` snapshot and queues a ``snapshot`` job in one
transaction; the job has the hypervisor take it (``create_snapshot``), makes it ``ready`` and emits
``server.snapshot_created``. ``POST .../snapshots/{sid}/restore`` queues a ``restore`` job, which
puts the server back to the snapshot (``restore_snapshot``: its disk, and its memory where the
backend keeps it) and emits ``server.snapshot_restored``; the server's ``status_reason`` says it is
restoring meanwhile, as a reinstall's does. ``DELETE .../snapshots/{sid}`` makes it ``deleting`` and
queues the job that removes it (``server.snapshot_deleted``).

A server holds at most ``servers.snapshots_max`` snapshots (3 by default). Each costs the catalog's
``snapshot_price_cents`` a month: what the server's snapshots cost per billing cycle is kept in
``servers.snapshot_fee_micros`` (a snapshot adds its fee when it is requested and takes it away when
its deletion is requested, or its creation failed), and each renewal charges it on top of the plan's
price. Taking a snapshot charges nothing at once; a snapshot deleted before the renewal costs
nothing; nothing of it is refunded at a termination.

A termination, or a reinstall (a new disk), removes every snapshot of the server. A snapshot taken
before a resize is not restored (``snapshot_predates_resize``): it holds the old plan's disk and
memory.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import sqlalchemy as sa
from anyio import to_thread
from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.catalog import snapshot_fee_micros
from vpsshop.context import AppContext
from vpsshop.errors import Conflict, NotFound
from vpsshop.hypervisor import CAPABILITY_SNAPSHOTS
from vpsshop.inputs import Input
from vpsshop.models import Server
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.servers.lifecycle import enqueue, policy, record
from vpsshop.servers.models import ServerSnapshot
from vpsshop.servers.resource import ServerOut, owned, server_event

__all__ = [
    "RESTORING",
    "SnapshotIn",
    "SnapshotList",
    "SnapshotOut",
    "SnapshotRestoreOut",
    "create_snapshot",
    "delete_snapshot",
    "drop_snapshots",
    "list_snapshots",
    "restore_snapshot",
    "snapshot_name",
]

LIVE = ("creating", "ready", "deleting")
"""The states of a snapshot that counts against the limit (it is, or is about to be, on the host)."""
RESTORING = (
    "Restoring snapshot {snapshot}: the server's disk (and, where the host keeps it, its memory) goes back to "
    "the snapshot; this clears once it runs again."
)
"""``status_reason`` of an active server from its restore request until its job is done."""
RESTORE_FAILED = (
    "The restore of snapshot {snapshot} did not complete: the server may not run. Restore it again "
    "(POST /servers/{{id}}/snapshots/{snapshot}/restore) or ask the shop."
)
"""``status_reason`` of an active server whose restore job failed its last attempt."""


class SnapshotIn(Input):
    """Body of ``POST /servers/{id}/snapshots`` (may be empty)."""

    name: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[\x20-\x7e]*$",
        description="A label for the snapshot (printable ASCII, up to 64 characters); absent: none.",
    )


class SnapshotOut(BaseModel):
    """One snapshot of a server."""

    id: int
    server_id: int
    name: str | None = Field(description="The customer's label, if given.")
    status: Literal["creating", "ready", "deleting", "deleted", "failed"] = Field(
        description="creating until the hypervisor has taken it (server.snapshot_created), then ready; deleting "
        "from DELETE until it is gone, then deleted; failed when the hypervisor could not take it."
    )
    plan: str = Field(description="The server's plan when it was taken: only a snapshot of its current plan restores.")
    monthly_usd: UsdAmount = Field(description="What it adds to each renewal (per billing cycle).")
    created_at: datetime
    ready_at: datetime | None
    deleted_at: datetime | None
    job_id: int | None = Field(None, description="After a POST or DELETE: the queued job.")


class SnapshotList(BaseModel):
    server_id: int
    snapshots: list[SnapshotOut] = Field(description="The server's snapshots that are not deleted, oldest first.")
    max_snapshots: int = Field(description="How many a server may hold (servers.snapshots_max).")
    monthly_price_usd: UsdAmount = Field(description="The catalog's price of one snapshot, per month.")


class SnapshotRestoreOut(BaseModel):
    server: ServerOut
    snapshot: SnapshotOut
    job_id: int = Field(description="The queued restore job (server.snapshot_restored once done).")
    status: Literal["queued"] = "queued"


def require_snapshots(ctx: AppContext) -> None:
    """:raises Conflict: ``not_supported``: the shop's hypervisor backend has no snapshots."""
    backend = ctx.hypervisor
    if backend is None or CAPABILITY_SNAPSHOTS not in backend.capabilities:
        kind = backend.kind if backend is not None else "none"
        raise Conflict("not_supported", f"This shop's hypervisor backend ({kind}) cannot take or restore snapshots.")


def snapshot_name(snapshot_id: int) -> str:
    """The snapshot's name on the hypervisor."""
    return f"snap-{snapshot_id}"


def snapshot_out(snapshot: ServerSnapshot, job_id: int | None = None) -> SnapshotOut:
    assert snapshot.id is not None
    return SnapshotOut(
        id=snapshot.id,
        server_id=snapshot.server_id,
        name=snapshot.label,
        status=snapshot.status,  # type: ignore[arg-type]  # one of SNAPSHOT_STATES
        plan=snapshot.plan,
        monthly_usd=micros_to_usd(snapshot.fee_micros),
        created_at=snapshot.created_at,
        ready_at=snapshot.ready_at,
        deleted_at=snapshot.deleted_at,
        job_id=job_id,
    )


def _owned_snapshot(session: Session, server_id: int, snapshot_id: int) -> ServerSnapshot:
    snapshot = session.exec(
        select(ServerSnapshot)
        .where(ServerSnapshot.id == snapshot_id, ServerSnapshot.server_id == server_id)
        .with_for_update()
    ).first()
    if snapshot is None or snapshot.status == "deleted":
        raise NotFound("snapshot")
    return snapshot


def _active(server: Server, what: str) -> None:
    if server.status != "active":
        raise Conflict("server_not_active", f"Snapshots are {what} on an active server; this one is {server.status}.")


def _enqueue(session: Session, server_id: int, kind: str, snapshot_id: int, now: datetime) -> int:
    job = enqueue(session, server_id, kind, now)
    job.target = str(snapshot_id)
    session.add(job)
    session.flush()
    assert job.id is not None
    return job.id


async def list_snapshots(ctx: AppContext, customer: Customer, server_id: int) -> SnapshotList:
    """The server's snapshots that are not deleted. :raises NotFound: not the account's server."""

    def read() -> SnapshotList:
        with ctx.db.session() as session:
            owned(session, customer.account_id, server_id)
            rows = session.exec(
                select(ServerSnapshot)
                .where(ServerSnapshot.server_id == server_id, col(ServerSnapshot.status) != "deleted")
                .order_by(col(ServerSnapshot.id))
            ).all()
            return SnapshotList(
                server_id=server_id,
                snapshots=[snapshot_out(s) for s in rows],
                max_snapshots=policy(ctx).snapshots_max,
                monthly_price_usd=micros_to_usd(snapshot_fee_micros(ctx.catalog_data, "monthly")),
            )

    return await to_thread.run_sync(read)


async def create_snapshot(ctx: AppContext, customer: Customer, server_id: int, data: SnapshotIn) -> SnapshotOut:
    """A new snapshot, taken by a job within seconds; its fee joins the server's renewals.

    :raises Conflict: not_supported, server_not_active, snapshot_limit_reached.
    :raises NotFound: not the account's server.
    """
    require_snapshots(ctx)
    most = policy(ctx).snapshots_max

    def run() -> SnapshotOut:
        limits.count_write(ctx, customer.account_id)
        now = ctx.clock.now()
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id, lock=True)
            _active(server, "taken")
            held = session.execute(
                sa.select(sa.func.count())
                .select_from(ServerSnapshot)
                .where(col(ServerSnapshot.server_id) == server_id, col(ServerSnapshot.status).in_(LIVE))
            ).scalar_one()
            if held >= most:
                raise Conflict(
                    "snapshot_limit_reached",
                    f"A server holds at most {most} snapshots and this one has {held}: delete one first.",
                )
            fee = snapshot_fee_micros(ctx.catalog_data, server.cycle)
            snapshot = ServerSnapshot(
                server_id=server_id, label=data.name or None, plan=server.plan, fee_micros=fee, created_at=now
            )
            session.add(snapshot)
            session.flush()
            assert snapshot.id is not None
            server.snapshot_fee_micros += fee
            session.add(server)
            job_id = _enqueue(session, server_id, "snapshot", snapshot.id, now)
            record(session, server_id, "snapshot", now, snapshot_name(snapshot.id))
            return snapshot_out(snapshot, job_id)

    return await to_thread.run_sync(run)


async def restore_snapshot(ctx: AppContext, customer: Customer, server_id: int, snapshot_id: int) -> SnapshotRestoreOut:
    """Queue the job that puts the server back to the snapshot; ``status_reason`` says so meanwhile.

    :raises Conflict: not_supported, server_not_active, snapshot_not_ready, snapshot_predates_resize.
    :raises NotFound: not the account's server, or no such snapshot of it.
    """
    require_snapshots(ctx)

    def run() -> SnapshotRestoreOut:
        limits.count_write(ctx, customer.account_id)
        now = ctx.clock.now()
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id, lock=True)
            snapshot = _owned_snapshot(session, server_id, snapshot_id)
            _active(server, "restored")
            if snapshot.status != "ready":
                raise Conflict(
                    "snapshot_not_ready", f"Snapshot {snapshot_id} is {snapshot.status}: only a ready one restores."
                )
            if snapshot.plan != server.plan:
                raise Conflict(
                    "snapshot_predates_resize",
                    f"Snapshot {snapshot_id} was taken on plan {snapshot.plan}; the server is now {server.plan}, and "
                    "restoring it would bring back the old plan's disk and memory.",
                )
            server.status_reason = RESTORING.format(snapshot=snapshot_id)
            session.add(server)
            job_id = _enqueue(session, server_id, "restore", snapshot_id, now)
            record(session, server_id, "restore", now, snapshot_name(snapshot_id))
            return SnapshotRestoreOut(
                server=server_event(session, server_id), snapshot=snapshot_out(snapshot), job_id=job_id
            )

    return await to_thread.run_sync(run)


async def delete_snapshot(ctx: AppContext, customer: Customer, server_id: int, snapshot_id: int) -> SnapshotOut:
    """Queue the job that removes the snapshot; it stops counting against the limit and costing at once.

    :raises Conflict: snapshot_not_ready (still being taken, or being deleted).
    :raises NotFound: not the account's server, or no such snapshot of it.
    """

    def run() -> SnapshotOut:
        limits.count_write(ctx, customer.account_id)
        now = ctx.clock.now()
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id, lock=True)
            snapshot = _owned_snapshot(session, server_id, snapshot_id)
            if snapshot.status not in ("ready", "failed"):
                raise Conflict(
                    "snapshot_not_ready", f"Snapshot {snapshot_id} is {snapshot.status}: wait until it is ready."
                )
            if snapshot.status == "ready":
                server.snapshot_fee_micros = max(0, server.snapshot_fee_micros - snapshot.fee_micros)
                session.add(server)
            snapshot.status = "deleting"
            session.add(snapshot)
            job_id = _enqueue(session, server_id, "delete_snapshot", snapshot_id, now)
            record(session, server_id, "snapshot_delete", now, snapshot_name(snapshot_id))
            return snapshot_out(snapshot, job_id)

    return await to_thread.run_sync(run)


def drop_snapshots(session: Session, server: Server, now: datetime) -> int:
    """Every snapshot of ``server`` is ``deleted`` and costs nothing more, in the caller's transaction:
    its disk is being destroyed or made anew (a termination, a reinstall). Returns how many."""
    gone = session.execute(
        sa.update(ServerSnapshot)
        .where(col(ServerSnapshot.server_id) == server.id, col(ServerSnapshot.status) != "deleted")
        .values(status="deleted", deleted_at=now)
    )
    server.snapshot_fee_micros = 0
    session.add(server)
    return int(getattr(gone, "rowcount", 0) or 0)


# ---- the jobs (run by vpsshop.servers.jobs) --------------------------------------------------------


def job_snapshot(ctx: AppContext, job_id: int) -> tuple[Server, ServerSnapshot] | None:
    """The server and the snapshot a snapshot job is about (None: either is gone)."""
    from vpsshop.servers.models import ServerJob

    with ctx.db.session() as session:
        target = session.execute(sa.select(col(ServerJob.target)).where(col(ServerJob.id) == job_id)).scalar_one()
        snapshot = session.get(ServerSnapshot, int(target)) if target and target.isdigit() else None
        server = session.get(Server, snapshot.server_id) if snapshot is not None else None
        if snapshot is None or server is None:
            return None
        return server, snapshot


def snapshot_done(ctx: AppContext, kind: str, server_id: int, snapshot_id: int, account_id: int) -> None:
    """After the backend's verb: the snapshot's (and for a restore, the server's) new state, the
    history row and the event, in one transaction."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        snapshot = session.get(ServerSnapshot, snapshot_id)
        server = session.get(Server, server_id)
        if snapshot is None or server is None:
            return
        if kind == "snapshot":
            if snapshot.status != "creating":
                return
            snapshot.status, snapshot.ready_at = "ready", now
            event = "server.snapshot_created"
        elif kind == "delete_snapshot":
            if snapshot.status == "deleted":
                return
            snapshot.status, snapshot.deleted_at = "deleted", now
            event = "server.snapshot_deleted"
        else:
            if server.status != "active":
                return
            server.power = "running"
            if server.status_reason == RESTORING.format(snapshot=snapshot_id):
                server.status_reason = None
            session.add(server)
            record(session, server_id, "restored", now, snapshot_name(snapshot_id))
            event = "server.snapshot_restored"
        session.add(snapshot)
        session.flush()
        events.emit(session, event, account_id, snapshot_out(snapshot), now=now)


def snapshot_failed(ctx: AppContext, kind: str, job_id: int) -> None:
    """After a snapshot job's last failed attempt: a snapshot not taken is ``failed`` and costs
    nothing; a restore says so in ``status_reason``; a deletion leaves the snapshot ``failed`` (the
    customer may delete it again)."""
    found = job_snapshot(ctx, job_id)
    if found is None:
        return
    _, snapshot = found
    with ctx.db.session() as session:
        server = session.get(Server, snapshot.server_id)
        row = session.get(ServerSnapshot, snapshot.id)
        if server is None or row is None or row.status == "deleted":
            return
        if kind == "restore":
            if server.status == "active":
                server.status_reason = RESTORE_FAILED.format(snapshot=snapshot.id)
                session.add(server)
            return
        if kind == "snapshot" and row.status == "creating":
            server.snapshot_fee_micros = max(0, server.snapshot_fee_micros - row.fee_micros)
            session.add(server)
        row.status = "failed"
        session.add(row)
