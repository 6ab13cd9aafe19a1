"""The Server resource: what ``GET /v1/servers/{id}`` answers and every ``server.*`` event carries,
and reading the account's servers.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal, cast

from anyio import to_thread
from pydantic import BaseModel, Field
from sqlalchemy.orm import object_session
from sqlmodel import Session, col, select

from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import NotFound
from vpsshop.hypervisor import HostKey
from vpsshop.models import Server
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.servers.models import ServerTraffic

__all__ = [
    "FirewallRuleOut",
    "HostKeyOut",
    "ServerList",
    "ServerOut",
    "TrafficOut",
    "current_traffic",
    "firewall_rules",
    "get_server",
    "host_keys",
    "list_servers",
    "owned",
    "server_event",
    "server_out",
]


Cycle = Literal["monthly", "annual"]
ServerStatus = Literal["provisioning", "active", "suspended", "terminated"]
Power = Literal["running", "stopped"]


class FirewallRuleOut(BaseModel):
    """One inbound rule of a server's firewall."""

    protocol: Literal["tcp", "udp", "icmp"] = Field(description="tcp, udp, or icmp (ICMP and ICMPv6; no ports).")
    ports: str | None = Field(
        description='A port ("22") or an inclusive range ("8000-8100"); null: every port (always for icmp).'
    )
    source: str | None = Field(
        description='The prefix new connections may come from ("198.51.100.0/24", "2001:db8::/48"); null: '
        "anywhere, IPv4 and IPv6."
    )


def firewall_rules(server: Server) -> list[FirewallRuleOut]:
    """The server's inbound rules as stored (``servers.firewall``, JSON)."""
    return [FirewallRuleOut.model_validate(rule) for rule in json.loads(server.firewall or "[]")]


class HostKeyOut(BaseModel):
    """One SSH host key of the server, as its guest reported it."""

    type: str = Field(description="Key type, as in known_hosts: ssh-ed25519, ecdsa-sha2-nistp256, ssh-rsa.")
    key: str = Field(description="The public key, base64, as in known_hosts.")
    fingerprint: str = Field(
        description="SHA256:<base64>, as an SSH client shows it on first connection and ssh-keygen -l prints it."
    )


class TrafficOut(BaseModel):
    """The server's network traffic in its current traffic period (docs/servers.md, "Traffic")."""

    period_start: datetime = Field(
        description="When the period began: the order, then each renewal (a renewal starts a new allowance)."
    )
    in_bytes: int = Field(description="Bytes the server received this period, as its hypervisor counted them.")
    out_bytes: int = Field(description="Bytes the server sent this period.")
    allowance_bytes: int | None = Field(
        description="What the plan includes per period, in and out together (the catalog's bandwidth_tb, 10^12 "
        "bytes a TB); null: unlimited."
    )
    sampled_at: datetime | None = Field(description="When the counters were last read (every minute or so).")
    policy_applied: Literal["throttle", "suspend", "none"] | None = Field(
        description="Null while within the allowance. Once past it: throttle (the server's rate is capped until "
        "the next renewal), suspend (it was suspended; a renewal resumes it) or none (the shop only noted it)."
    )


class ServerOut(BaseModel):
    """The seed's Server."""

    id: int
    plan: str = Field(description="Plan id.")
    location: str
    os: str
    hostname: str
    cycle: Cycle
    price_usd: UsdAmount = Field(description="Price of one billing cycle, charged at order and at each renewal.")
    status: ServerStatus
    ip: str | None = Field(description="Null until the server is active.")
    username: str = Field(description="Login name: root.")
    created_at: datetime
    expires_at: datetime = Field(description="End of the paid period; see docs/servers.md for what follows.")
    auto_renew: bool = Field(description="Renewed from the balance shortly before expires_at.")
    status_reason: str | None = Field(
        description="Why the server is suspended or terminated; while provisioning, what it waits for (the guest's "
        "first boot); while a reinstall is under way, that it is reinstalling (null again once the new system is "
        "ready, or why it failed); when its first boot finished with errors, which; when the customer's user data "
        "turned SSH off, that; else null."
    )
    power: Power | None = Field(
        description="Whether the VM is powered on, as the last hypervisor job left it: running once provisioned "
        "and after start, reboot, resume or reinstall; stopped after stop or suspension. Null while provisioning "
        "and once the VM is destroyed (by the job that follows termination). A power action changes it when its "
        "job has run (within seconds)."
    )
    reverse_dns: str | None = Field(
        None, description="The PTR name of the server's addresses (ip and ipv6) set by PATCH, else null."
    )
    ready_at: datetime | None = Field(
        None,
        description="When the guest reported that its first boot (after the order, or the last reinstall) finished "
        "and its SSH daemon answered: the server turns active at that moment. Null while it boots, when that boot "
        "finished with errors (status_reason says which), and for servers made before vpsshop 1.1.",
    )
    ipv6: str | None = Field(
        None,
        description="The server's IPv6 address, configured on its first boot; null until it is active, and when "
        "its location has no IPv6 (docs/servers.md, IPv6). SSH answers on it as on ip.",
    )
    ipv6_prefix: str | None = Field(
        None,
        description="The /64 routed to this server (e.g. 2001:db8:0:5::/64; ipv6 is its ::1, the rest is the "
        "customer's to use) when its location routes a /64 per server; null when ipv6 is one address of a prefix "
        "the location's servers share.",
    )
    host_keys: list[HostKeyOut] = Field(
        default_factory=list,
        description="The SSH host keys the server's own guest reported on its first boot (the shop never makes or "
        "holds a guest's private key): compare the fingerprint your SSH client shows, or put "
        "'<ip> <type> <key>' in known_hosts. Empty until the server is ready; replaced by a reinstall.",
    )
    traffic: TrafficOut | None = Field(
        None,
        description="Network traffic in the current traffic period against the plan's allowance; null until the "
        "server's counters were first read (and where the hypervisor counts no traffic).",
    )
    firewall: list[FirewallRuleOut] = Field(
        default_factory=list,
        description="The inbound firewall's rules (PUT /servers/{id}/firewall): with rules, only new inbound "
        "connections they allow reach the server; empty: every one does. Anti-spoofing is always on.",
    )


def host_keys(server: Server) -> list[HostKey]:
    """The host keys the server's guest reported (stored as ``"<type> <base64>"`` lines)."""
    return [HostKey.parse(line) for line in json.loads(server.host_keys)] if server.host_keys else []


def current_traffic(session: Session, server_id: int) -> ServerTraffic | None:
    """The server's current traffic period (its latest), None before the first one."""
    query = (
        select(ServerTraffic)
        .where(ServerTraffic.server_id == server_id)
        .order_by(col(ServerTraffic.period_start).desc(), col(ServerTraffic.id).desc())
        .limit(1)
    )
    return session.exec(query).first()


def traffic_out(row: ServerTraffic | None) -> TrafficOut | None:
    if row is None:
        return None
    return TrafficOut(
        period_start=row.period_start,
        in_bytes=row.in_bytes,
        out_bytes=row.out_bytes,
        allowance_bytes=row.allowance_bytes,
        sampled_at=row.sampled_at,
        policy_applied=cast(Literal["throttle", "suspend", "none"] | None, row.policy_applied),
    )


def server_out(server: Server) -> ServerOut:
    """The resource of ``server``; its traffic is read in the session ``server`` belongs to (none: null)."""
    assert server.id is not None
    session = object_session(server)
    traffic = traffic_out(current_traffic(cast(Session, session), server.id)) if session is not None else None
    # The str columns cycle, status and power hold only the values vpsshop.servers writes (ServerOut checks them).
    return ServerOut(
        id=server.id,
        plan=server.plan,
        location=server.location,
        os=server.os,
        hostname=server.hostname,
        cycle=cast(Cycle, server.cycle),
        price_usd=micros_to_usd(server.price_micros),
        status=cast(ServerStatus, server.status),
        ip=server.ip,
        username=server.username,
        created_at=server.created_at,
        expires_at=server.expires_at,
        auto_renew=server.auto_renew,
        status_reason=server.status_reason,
        power=cast(Power | None, server.power),
        reverse_dns=server.reverse_dns,
        ipv6=server.ipv6,
        ipv6_prefix=server.ipv6_prefix,
        ready_at=server.ready_at,
        host_keys=[HostKeyOut(type=k.type, key=k.key, fingerprint=k.fingerprint) for k in host_keys(server)],
        traffic=traffic,
        firewall=firewall_rules(server),
    )


class ServerList(BaseModel):
    servers: list[ServerOut] = Field(description="The caller's servers, terminated ones included, oldest first.")


def server_event(session: Session, server_id: int) -> ServerOut:
    """The server as an event carries it: read in ``session``, after the change."""
    session.flush()
    server = session.get(Server, server_id, populate_existing=True)
    assert server is not None
    return server_out(server)


def owned(session: Session, account_id: int, server_id: int, *, lock: bool = False) -> Server:
    """The account's server ``server_id`` (another account's is not found either).

    :raises NotFound: no such server on this account.
    """
    query = select(Server).where(Server.id == server_id, Server.account_id == account_id)
    server = session.exec(query.with_for_update() if lock else query).first()
    if server is None:
        raise NotFound("server")
    return server


async def list_servers(ctx: AppContext, customer: Customer) -> ServerList:
    """The account's servers, terminated ones included, oldest first."""

    def read() -> ServerList:
        with ctx.db.session() as session:
            rows = session.exec(
                select(Server).where(Server.account_id == customer.account_id).order_by(col(Server.id))
            ).all()
            return ServerList(servers=[server_out(s) for s in rows])

    return await to_thread.run_sync(read)


async def get_server(ctx: AppContext, customer: Customer, server_id: int) -> ServerOut:
    """One of the account's servers. :raises NotFound: not the account's (or no such server)."""

    def read() -> ServerOut:
        with ctx.db.session() as session:
            return server_out(owned(session, customer.account_id, server_id))

    return await to_thread.run_sync(read)
