"""What a customer changes on a running server: its power (start, stop, reboot), automatic renewal
and reverse DNS.

A power action is queued as a hypervisor job (:mod:`vpsshop.servers.jobs`); the job reports the new
power state with ``server.started``, ``server.stopped`` or ``server.rebooted`` once it has run.
A change of automatic renewal or reverse DNS emits ``server.updated`` in the transaction that makes it.
"""

from __future__ import annotations

from typing import Literal

from anyio import to_thread
from pydantic import BaseModel, Field, StrictBool
from pydantic.config import JsonDict
from pydantic.json_schema import SkipJsonSchema

import vpsshop.events as events
from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict
from vpsshop.inputs import Input
from vpsshop.servers.lifecycle import enqueue, record
from vpsshop.servers.resource import ServerOut, owned, server_event, server_out

__all__ = ["FQDN_PATTERN", "POWER_ACTIONS", "PowerAction", "PowerActionOut", "ServerChange", "change_server", "power"]

PowerAction = Literal["start", "stop", "reboot"]
POWER_ACTIONS: tuple[PowerAction, ...] = ("start", "stop", "reboot")
FQDN_PATTERN = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"


def _no_default(schema: JsonDict) -> None:
    """A field's JSON schema without its default: absent means unchanged."""
    schema.pop("default", None)


class ServerChange(Input):
    """Body of ``PATCH /servers/{id}``: the fields given change, the others stay."""

    auto_renew: StrictBool | SkipJsonSchema[None] = Field(
        None,
        description="false: the server is not renewed automatically and is "
        "suspended at expires_at unless renewed by hand; absent: unchanged. Only true or false: a string, a "
        "number or null is refused (invalid_auto_renew).",
        json_schema_extra=_no_default,
    )
    reverse_dns: str | None = Field(
        None,
        max_length=253,
        pattern=FQDN_PATTERN,
        description="The name the server's address resolves back to (its PTR record): a fully qualified domain "
        "name without the trailing dot, e.g. mail.example.com; null removes it (invalid_reverse_dns). Set by a job "
        "through the shop's DNS provider within seconds; cleared when the server is terminated.",
    )


class PowerActionOut(BaseModel):
    server_id: int
    action: PowerAction
    job_id: int = Field(description="The queued hypervisor job.")
    status: Literal["queued"] = "queued"


async def power(ctx: AppContext, customer: Customer, server_id: int, action: PowerAction) -> PowerActionOut:
    """Queue a power action of an active server; the job runs within seconds.

    :raises Conflict: server_not_active. :raises NotFound: not the account's server.
    """
    if action not in POWER_ACTIONS:
        raise BadRequest("invalid_action", "The power action is start, stop or reboot.")

    def run() -> PowerActionOut:
        limits.count_write(ctx, customer.account_id)
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id)
            if server.status != "active":
                raise Conflict(
                    "server_not_active", f"Power actions need an active server; this one is {server.status}."
                )
            now = ctx.clock.now()
            job = enqueue(session, server_id, action, now)
            record(session, server_id, f"power_{action}", now, "customer")
            assert job.id is not None
            return PowerActionOut(server_id=server_id, action=action, job_id=job.id)

    return await to_thread.run_sync(run)


async def change_server(ctx: AppContext, customer: Customer, server_id: int, data: ServerChange) -> ServerOut:
    """Change the fields given (automatic renewal, reverse DNS); an absent field stays. Emits
    ``server.updated`` when something changed.

    :raises BadRequest: invalid_auto_renew (null). :raises NotFound: not the account's server.
    :raises Conflict: server_terminated; server_not_active and not_supported (reverse DNS).
    """
    if "auto_renew" in data.model_fields_set and data.auto_renew is None:
        raise BadRequest("invalid_auto_renew", "auto_renew must be true or false.")
    set_rdns = "reverse_dns" in data.model_fields_set
    if set_rdns and ctx.dns is None:
        raise Conflict("not_supported", "This shop has no DNS provider, so reverse DNS cannot be set.")

    def run() -> ServerOut:
        limits.count_write(ctx, customer.account_id)
        now = ctx.clock.now()
        changed = False
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id, lock=True)
            if set_rdns:
                name = data.reverse_dns.lower() if data.reverse_dns else None
                if server.status != "active" or not server.ip:
                    raise Conflict(
                        "server_not_active",
                        f"Reverse DNS needs an active server with an address; this one is {server.status}.",
                    )
                if server.reverse_dns != name:
                    server.reverse_dns = name
                    session.add(server)
                    enqueue(session, server_id, "rdns", now)
                    record(session, server_id, "reverse_dns", now, name or "cleared")
                    changed = True
            if data.auto_renew is not None:
                if server.status == "terminated":
                    raise Conflict("server_terminated", "A terminated server cannot be changed.")
                if server.auto_renew != data.auto_renew:
                    server.auto_renew = data.auto_renew
                    session.add(server)
                    kind = "auto_renew_on" if data.auto_renew else "auto_renew_off"
                    record(session, server_id, kind, now, "customer")
                    changed = True
            if changed:
                out = server_event(session, server_id)
                events.emit(session, "server.updated", customer.account_id, out, now=now)
                return out
            return server_out(server)

    return await to_thread.run_sync(run)
