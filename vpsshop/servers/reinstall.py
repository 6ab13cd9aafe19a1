"""``POST /servers/{id}/reinstall``: a fresh disk from a catalog OS, with new keys and password.

The request changes the server's row (OS, keys, user data, encrypted password) and queues a
``reinstall`` job in one transaction; the job (:func:`vpsshop.servers.jobs._reinstall`) asks the
hypervisor to recreate the disk from the base image and boot it with new first-boot data. The
server stays ``active`` throughout; its address, hostname, paid period and price do not change.
From the request until the job is done its ``status_reason`` says it is reinstalling; the job
clears it and emits ``server.reinstalled`` (or, after its last failed attempt, says so there).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from sqlmodel import select
from starlette.concurrency import run_in_threadpool

from vpsshop.cloudinit import MAX_USER_DATA_BYTES
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict
from vpsshop.hypervisor import CAPABILITY_REINSTALL
from vpsshop.routing import ApiModel, ApiRoute, Call, Reply
from vpsshop.servers.api import _NOT_YOURS, _PRINTABLE, TAG, ServerOut, _owned, _user_data_enc, server_out
from vpsshop.servers.credentials import encrypt_password, generate_root_password
from vpsshop.servers.jobs import REINSTALLING
from vpsshop.servers.lifecycle import enqueue, record
from vpsshop.servers.models import ServerJob
from vpsshop.servers.sshkeys import MAX_KEYS_PER_SERVER, SshKeyId, keys_for_server


class ReinstallBody(ApiModel):
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
        pattern=_PRINTABLE,
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


def _require(ctx: AppContext, capability: str, what: str) -> None:
    backend = ctx.hypervisor
    if backend is None or capability not in backend.capabilities:
        kind = backend.kind if backend is not None else "none"
        raise Conflict("not_supported", f"This shop's hypervisor backend ({kind}) cannot {what}.")


def reinstall_server(ctx: AppContext, account_id: int, server_id: int, body: ReinstallBody) -> ReinstallOut:
    """Change the server's OS and first-boot data and queue the job, atomically."""
    _require(ctx, CAPABILITY_REINSTALL, "reinstall servers")
    if not any(o.id == body.os for o in ctx.catalog_data.operating_systems):
        raise BadRequest("invalid_os", f"No operating system {body.os!r}; GET /catalog lists them.")
    user_data_enc = _user_data_enc(ctx, body.user_data)
    password = body.root_password or generate_root_password()
    now = ctx.clock.now()
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id, lock=True)
        if server.status != "active":
            raise Conflict(
                "server_not_active", f"Only an active server can be reinstalled; this one is {server.status}."
            )
        busy = session.exec(
            select(ServerJob.id).where(
                ServerJob.server_id == server_id,
                ServerJob.kind == "reinstall",
                ServerJob.status.in_(("queued", "running")),
            )
        ).first()  # type: ignore[attr-defined]
        if busy is not None:
            raise Conflict("reinstall_in_progress", "A reinstall of this server is already under way.")
        server.os = body.os
        server.ssh_keys = keys_for_server(session, account_id, body.ssh_keys)
        server.user_data_enc = user_data_enc
        server.root_password_enc = encrypt_password(ctx, password)
        server.status_reason = REINSTALLING.format(os=body.os)
        session.add(server)
        job = enqueue(session, server_id, "reinstall", now)
        record(session, server_id, "reinstall", now, f"customer; {body.os}")
        assert job.id is not None
        return ReinstallOut(
            server=server_out(server), root_password=None if body.root_password else password, job_id=job.id
        )


async def reinstall(call: Call) -> Reply:
    done = await run_in_threadpool(reinstall_server, call.ctx, call.account_id, call.path["id"], call.body)
    return Reply(done, 202, {"Cache-Control": "no-store", "Pragma": "no-cache"})


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST",
            "/servers/{id}/reinstall",
            reinstall,
            "Reinstall a server",
            ReinstallOut,
            status=202,
            body=ReinstallBody,
            response_headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
            description="Erases the server's disk and installs `os` (any catalog OS) afresh: a job powers the VM "
            "off, recreates its disk from the OS's base image and boots it with new first-boot data (root password, "
            "the chosen SSH keys, user data). Everything on the old disk is lost. Address, hostname, plan, paid "
            "period and price stay; nothing is charged. The new password (generated unless given) is returned "
            "once, with Cache-Control: no-store, and by GET /servers/{id}/credentials afterwards. The server stays "
            "active throughout; poll GET /servers/{id}: its status_reason says it is reinstalling until the job is "
            "done, then is null again (power running, and a server.reinstalled event is emitted; the guest answers "
            "once the new system has booted). If the job fails after its retries, status_reason says so.",
            errors={
                400: "invalid_os, invalid_ssh_keys, invalid_root_password, invalid_user_data, unknown_field",
                404: _NOT_YOURS,
                409: "server_not_active: the server is provisioning, suspended or terminated; "
                "reinstall_in_progress; not_supported: the shop's hypervisor backend cannot reinstall.",
            },
            tags=TAG,
            operation_id="reinstallServer",
        ),
    ]
