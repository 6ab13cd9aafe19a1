"""A server's inbound firewall: the customer's rules, applied by the hypervisor (docs/servers.md,
"Firewall").

``PUT /servers/{id}/firewall`` replaces the whole rule set at once (what a customer edits is the
list, and a half-applied list would let in what neither the old nor the new one does). The rules
are stored on the server and a ``firewall`` job hands them to the backend's ``set_firewall``; once
it has run, ``server.firewall_changed`` reports them. With rules, only the new inbound connections
they allow reach the guest; with none, every one does. Anti-spoofing is on for every guest from
its first boot, whatever the rules: it is not the customer's to turn off.
"""

from __future__ import annotations

import json
from typing import Literal

from anyio import to_thread
from pydantic import BaseModel, Field

import vpsshop.events as events
from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict
from vpsshop.hypervisor import CAPABILITY_FIREWALL, FirewallRule
from vpsshop.inputs import Input, JsonInt
from vpsshop.models import Server
from vpsshop.servers.lifecycle import enqueue, policy, record
from vpsshop.servers.resource import FirewallRuleOut, firewall_rules, owned

__all__ = ["FirewallIn", "FirewallOut", "FirewallRuleIn", "get_firewall", "rules_of", "set_firewall"]


class FirewallRuleIn(Input):
    """One inbound rule as a customer gives it."""

    protocol: Literal["tcp", "udp", "icmp"] = Field(description="tcp, udp or icmp (ICMP and ICMPv6).")
    ports: str | JsonInt | None = Field(
        None,
        description='A port (22 or "22") or an inclusive range ("8000-8100"); absent or null: every port. None '
        "for icmp.",
    )
    source: str | None = Field(
        None,
        max_length=64,
        description='Where new connections may come from: a prefix ("198.51.100.0/24", "2001:db8::/48") or an '
        "address; absent or null: anywhere (IPv4 and IPv6).",
    )


class FirewallIn(Input):
    """Body of ``PUT /servers/{id}/firewall``: the whole new rule set."""

    rules: list[FirewallRuleIn] = Field(
        description="The inbound rules, replacing the ones before (at most servers.firewall_max_rules, 50 by "
        "default); an empty list lets every inbound connection in."
    )


class FirewallOut(BaseModel):
    server_id: int
    rules: list[FirewallRuleOut] = Field(description="The inbound rules, as stored.")
    anti_spoofing: bool = Field(
        True, description="Always true: the guest's packets leave only from its own MAC and IP addresses."
    )
    job_id: int | None = Field(
        None, description="After a PUT: the queued job that applies the rules (server.firewall_changed once done)."
    )


def rules_of(server: Server) -> tuple[FirewallRule, ...]:
    """The server's stored rules as the hypervisor contract takes them."""
    return tuple(FirewallRule.parse(r.protocol, r.ports, r.source) for r in firewall_rules(server))


def _checked(data: FirewallIn, most: int) -> list[FirewallRule]:
    if len(data.rules) > most:
        raise BadRequest("too_many_rules", f"A server's firewall holds at most {most} rules; {len(data.rules)} given.")
    rules: dict[FirewallRule, None] = {}
    for n, rule in enumerate(data.rules):
        try:
            parsed = FirewallRule.parse(rule.protocol, rule.ports, rule.source)
        except ValueError as exc:
            raise BadRequest("invalid_rule", f"rules[{n}]: {exc}") from None
        rules[parsed] = None  # the same rule twice is one rule
    return list(rules)


async def get_firewall(ctx: AppContext, customer: Customer, server_id: int) -> FirewallOut:
    """The server's inbound rules. :raises NotFound: not the account's server."""

    def read() -> FirewallOut:
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id)
            return FirewallOut(server_id=server_id, rules=firewall_rules(server))

    return await to_thread.run_sync(read)


async def set_firewall(ctx: AppContext, customer: Customer, server_id: int, data: FirewallIn) -> FirewallOut:
    """Replace the server's inbound rules and queue the job that applies them (within seconds).

    :raises BadRequest: invalid_rule, too_many_rules. :raises NotFound: not the account's server.
    :raises Conflict: not_supported (the hypervisor has no firewall), server_not_active.
    """
    backend = ctx.hypervisor
    if backend is None or CAPABILITY_FIREWALL not in backend.capabilities:
        raise Conflict("not_supported", "This shop's hypervisor has no firewall.")
    rules = _checked(data, policy(ctx).firewall_max_rules)

    def run() -> FirewallOut:
        limits.count_write(ctx, customer.account_id)
        now = ctx.clock.now()
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id, lock=True)
            if server.status != "active":
                raise Conflict(
                    "server_not_active", f"The firewall is set on an active server; this one is {server.status}."
                )
            server.firewall = json.dumps([rule.as_dict() for rule in rules])
            session.add(server)
            job = enqueue(session, server_id, "firewall", now)
            record(session, server_id, "firewall", now, f"{len(rules)} rules")
            assert job.id is not None
            return FirewallOut(server_id=server_id, rules=firewall_rules(server), job_id=job.id)

    return await to_thread.run_sync(run)


def firewall_applied(ctx: AppContext, server_id: int, account_id: int, applied: str | None) -> None:
    """After a ``firewall`` job: ``server.firewall_changed`` when the rules it applied are still the
    server's (a newer PUT queued a job of its own, whose event follows)."""
    from vpsshop.servers.resource import server_event

    with ctx.db.session() as session:
        server = session.get(Server, server_id)
        if server is None or server.status == "terminated" or server.firewall != applied:
            return
        events.emit(
            session, "server.firewall_changed", account_id, server_event(session, server_id), now=ctx.clock.now()
        )
