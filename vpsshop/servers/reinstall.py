"""Reinstalling a server: a fresh disk from a catalog OS, with new keys and password.

The request changes the server's row (OS, keys, user data, encrypted password) and queues a
``reinstall`` job in one transaction; the job (:func:`vpsshop.servers.jobs._reinstall`) asks the
hypervisor to recreate the disk from the base image and boot it with new first-boot data. The
server stays ``active`` throughout; its address, hostname, paid period and price do not change.
From the request until the job is done its ``status_reason`` says it is reinstalling
(``server.reinstalling``); the job clears it and emits ``server.reinstalled`` (or, after its last
failed attempt, says so there).
"""

from __future__ import annotations

from typing import Literal

from anyio import to_thread
from pydantic import BaseModel, Field
from sqlmodel import col, select

import vpsshop.events as events
from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.cloudinit import MAX_USER_DATA_BYTES
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict
from vpsshop.hypervisor import CAPABILITY_REINSTALL
from vpsshop.inputs import Input
from vpsshop.servers.credentials import encrypt_password, generate_root_password
from vpsshop.servers.jobs import REINSTALLING
from vpsshop.servers.lifecycle import enqueue, record
from vpsshop.servers.models import ServerJob
from vpsshop.servers.orders import PRINTABLE_PATTERN, user_data_enc
from vpsshop.servers.resource import ServerOut, owned, server_event
from vpsshop.servers.sshkeys import MAX_KEYS_PER_SERVER, SshKeyId, keys_for_server

__all__ = ["ReinstallInput", "ReinstallOut", "reinstall_server", "require_capability"]


class ReinstallInput(Input):
    """Body of ``POST /servers/{id}/reinstall``."""

    os: str = Field(
        min_length=1,
        max_length=32,
        description="An operating system id from GET /catalog; another one than the server's is allowed (invalid_os).",
        json_schema_extra={"x-catalog": "operating_systems"},
    )
    ssh_keys: list[SshKeyId] | None = Field(
        None,
        max_length=MAX_KEYS_PER_SERVER,
        description="Ids of the caller's stored keys for root's authorized_keys; omitted: none (invalid_ssh_keys).",
    )
    root_password: str | None = Field(
        None,
        min_length=10,
        max_length=128,
        pattern=PRINTABLE_PATTERN,
        description="10 to 128 printable ASCII characters; omitted: a new 20-character password is generated and "
        "returned once in this response (invalid_root_password).",
    )
    user_data: str | None = Field(
        None,
        max_length=MAX_USER_DATA_BYTES,
        description="cloud-init user data, as on POST /servers (invalid_user_data); omitted: none.",
    )


class ReinstallOut(BaseModel):
    server: ServerOut
    root_password: str | None = Field(
        description="The generated root password when the request gave none (null "
        "otherwise). Shown once; GET /servers/{id}/credentials reveals it later."
    )
    job_id: int = Field(description="The queued reinstall job.")
    status: Literal["queued"] = "queued"


def require_capability(ctx: AppContext, capability: str, what: str) -> None:
    """:raises Conflict: ``not_supported``: the shop's hypervisor backend cannot do ``what``."""
    backend = ctx.hypervisor
    if backend is None or capability not in backend.capabilities:
        kind = backend.kind if backend is not None else "none"
        raise Conflict("not_supported", f"This shop's hypervisor backend ({kind}) cannot {what}.")


async def reinstall_server(ctx: AppContext, customer: Customer, server_id: int, data: ReinstallInput) -> ReinstallOut:
    """Change the server's OS and first-boot data and queue the job, atomically; emits
    ``server.reinstalling``. Nothing is charged.

    :raises BadRequest: invalid_os, invalid_ssh_keys, invalid_user_data.
    :raises Conflict: server_not_active, reinstall_in_progress, not_supported.
    :raises NotFound: not the account's server.
    """
    require_capability(ctx, CAPABILITY_REINSTALL, "reinstall servers")
    if not any(o.id == data.os for o in ctx.catalog_data.operating_systems):
        raise BadRequest("invalid_os", f"No operating system {data.os!r}; GET /catalog lists them.")
    return await to_thread.run_sync(_reinstall, ctx, customer.account_id, server_id, data)


def _reinstall(ctx: AppContext, account_id: int, server_id: int, body: ReinstallInput) -> ReinstallOut:
    from vpsshop.servers.snapshots import drop_snapshots

    limits.count_write(ctx, account_id)
    stored_user_data = user_data_enc(ctx, body.user_data)
    password = body.root_password or generate_root_password()
    now = ctx.clock.now()
    with ctx.db.session() as session:
        server = owned(session, account_id, server_id, lock=True)
        if server.status != "active":
            raise Conflict(
                "server_not_active", f"Only an active server can be reinstalled; this one is {server.status}."
            )
        image = next(o.image for o in ctx.catalog_data.operating_systems if o.id == body.os)
        if not ctx.offers_os(server.location, image):
            raise Conflict(
                "os_unavailable", f"No host in {server.location} holds the image of {body.os} at the moment."
            )
        busy = session.exec(
            select(ServerJob.id).where(
                ServerJob.server_id == server_id,
                ServerJob.kind == "reinstall",
                col(ServerJob.status).in_(("queued", "running")),
            )
        ).first()
        if busy is not None:
            raise Conflict("reinstall_in_progress", "A reinstall of this server is already under way.")
        server.os = body.os
        server.ssh_keys = keys_for_server(session, account_id, body.ssh_keys)
        server.user_data_enc = stored_user_data
        server.root_password_enc = encrypt_password(ctx, password)
        server.status_reason = REINSTALLING.format(os=body.os)
        drop_snapshots(session, server, now)  # they live in the disk the job replaces
        session.add(server)
        job = enqueue(session, server_id, "reinstall", now)
        record(session, server_id, "reinstall", now, f"customer; {body.os}")
        assert job.id is not None
        out = server_event(session, server_id)
        events.emit(session, "server.reinstalling", account_id, out, now=now)
        return ReinstallOut(server=out, root_password=None if body.root_password else password, job_id=job.id)
