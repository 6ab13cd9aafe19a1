"""The serial console: a single-use ticket, then a WebSocket carrying the console
(:mod:`vpsshop.api.console`).

1. ``POST /v1/servers/{id}/console`` (API key) answers a ticket: 32 random bytes, valid for
   :data:`TICKET_SECONDS`, bound to the account and the server. Only its SHA-256 is stored.
2. ``GET /v1/servers/{id}/console/ws?ticket=...`` (a WebSocket; browsers cannot send an
   ``Authorization`` header there, hence the ticket) redeems it in one conditional ``UPDATE``: a
   ticket works once, within its lifetime, for the server it was issued for. The socket then
   carries the guest's serial console both ways as binary frames (text frames are sent to the guest
   as UTF-8), through the backend's :meth:`~vpsshop.HypervisorBackend.open_console`.

Tickets live in the database, so any ``vpsshop serve`` process can redeem one another issued.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

import sqlalchemy as sa
from anyio import to_thread
from pydantic import BaseModel, Field
from sqlmodel import col

from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import Conflict
from vpsshop.hypervisor import CAPABILITY_CONSOLE, ServerHandle
from vpsshop.models import Server
from vpsshop.servers.models import ConsoleTicket
from vpsshop.servers.reinstall import require_capability
from vpsshop.servers.resource import owned

__all__ = ["TICKET_SECONDS", "WS_PATH", "ConsoleTicketOut", "open_console", "redeem_ticket"]

TICKET_SECONDS = 30
WS_PATH = "/servers/{id}/console/ws"


class ConsoleTicketOut(BaseModel):
    ticket: str = Field(description="Single use, valid for a few seconds; pass it as ?ticket= to the WebSocket.")
    url: str = Field(description="Path of the WebSocket, ticket included (use ws:// or wss:// on this host).")
    expires_at: datetime


def _digest(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


async def open_console(ctx: AppContext, customer: Customer, server_id: int) -> ConsoleTicketOut:
    """A ticket for the serial console of an active, running server: valid once, for
    :data:`TICKET_SECONDS`, bound to the account and the server. Only its SHA-256 is stored.

    :raises Conflict: server_not_active, server_stopped, not_supported. :raises NotFound: not the account's.
    """
    require_capability(ctx, CAPABILITY_CONSOLE, "open serial consoles")
    return await to_thread.run_sync(_issue_ticket, ctx, customer.account_id, server_id)


def _issue_ticket(ctx: AppContext, account_id: int, server_id: int) -> ConsoleTicketOut:
    limits.count_write(ctx, account_id)
    now = ctx.clock.now()
    ticket = secrets.token_urlsafe(32)
    with ctx.db.session() as session:
        server = owned(session, account_id, server_id)
        if server.status != "active" or server.domain is None:
            raise Conflict("server_not_active", f"The console needs an active server; this one is {server.status}.")
        if server.power == "stopped":
            raise Conflict(
                "server_stopped",
                f"The server is powered off: start it (POST /servers/{server_id}/start), then open the console.",
            )
        expires = now + timedelta(seconds=TICKET_SECONDS)
        session.add(
            ConsoleTicket(
                token_hash=_digest(ticket),
                account_id=account_id,
                server_id=server_id,
                created_at=now,
                expires_at=expires,
            )
        )
    return ConsoleTicketOut(
        ticket=ticket, url=f"/v1/servers/{server_id}/console/ws?ticket={ticket}", expires_at=expires
    )


async def redeem_ticket(ctx: AppContext, server_id: int, ticket: str) -> ServerHandle | None:
    """Use the ticket up; the server's handle if it was valid for this server, else None."""
    if not 0 < len(ticket) <= 100:
        return None
    return await to_thread.run_sync(_redeem_ticket, ctx, server_id, ticket)


def _redeem_ticket(ctx: AppContext, server_id: int, ticket: str) -> ServerHandle | None:
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = session.execute(
            sa.update(ConsoleTicket)
            .where(
                col(ConsoleTicket.token_hash) == _digest(ticket),
                col(ConsoleTicket.server_id) == server_id,
                col(ConsoleTicket.used_at).is_(None),
                col(ConsoleTicket.expires_at) > now,
            )
            .values(used_at=now)
            .returning(col(ConsoleTicket.account_id))
        ).first()
        if row is None:
            return None
        server = session.get(Server, server_id)
        if server is None or server.account_id != row[0] or server.status != "active" or server.domain is None:
            return None
        return ServerHandle(host=server.host or "", domain=server.domain, ip=server.ip, location=server.location)
