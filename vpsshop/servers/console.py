"""The serial console: a single-use ticket over the API, then a WebSocket carrying the console.

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

import asyncio
import contextlib
import hashlib
import logging
import secrets
from datetime import datetime, timedelta

import sqlalchemy as sa
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from vpsshop.context import AppContext
from vpsshop.errors import Conflict, PluginError
from vpsshop.hypervisor import CAPABILITY_CONSOLE, DomainState, ServerHandle
from vpsshop.models import Server
from vpsshop.routing import ApiRoute, Call, Reply
from vpsshop.servers.api import _NOT_YOURS, TAG, _owned
from vpsshop.servers.models import ConsoleTicket
from vpsshop.servers.reinstall import _require

log = logging.getLogger("vpsshop.servers")

TICKET_SECONDS = 30
WS_PATH = "/servers/{id}/console/ws"
# WebSocket close codes (RFC 6455 private range 4000-4999): the reason text says more.
CLOSE_BAD_TICKET = 4401
CLOSE_UNAVAILABLE = 4409


class ConsoleTicketOut(BaseModel):
    ticket: str = Field(description="Single use, valid for a few seconds; pass it as ?ticket= to the WebSocket.")
    url: str = Field(description="Path of the WebSocket, ticket included (use ws:// or wss:// on this host).")
    expires_at: datetime


def _digest(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


def issue_ticket(ctx: AppContext, account_id: int, server_id: int) -> ConsoleTicketOut:
    _require(ctx, CAPABILITY_CONSOLE, "open serial consoles")
    now = ctx.clock.now()
    ticket = secrets.token_urlsafe(32)
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id)
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


def redeem_ticket(ctx: AppContext, server_id: int, ticket: str) -> ServerHandle | None:
    """Use the ticket up; the server's handle if it was valid for this server, else None."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = session.execute(
            sa.update(ConsoleTicket)
            .where(
                ConsoleTicket.token_hash == _digest(ticket),
                ConsoleTicket.server_id == server_id,
                ConsoleTicket.used_at.is_(None),
                ConsoleTicket.expires_at > now,
            )  # type: ignore[union-attr]
            .values(used_at=now)
            .returning(ConsoleTicket.account_id)
        ).first()
        if row is None:
            return None
        server = session.get(Server, server_id)
        if server is None or server.account_id != row[0] or server.status != "active" or server.domain is None:
            return None
        return ServerHandle(host=server.host or "", domain=server.domain, ip=server.ip, location=server.location)


async def create_ticket(call: Call) -> Reply:
    out = await run_in_threadpool(issue_ticket, call.ctx, call.account_id, call.path["id"])
    return Reply(out, 201, {"Cache-Control": "no-store", "Pragma": "no-cache"})


async def console_socket(websocket: WebSocket) -> None:
    ctx: AppContext = websocket.app.state.ctx
    server_id = websocket.path_params["id"]
    ticket = websocket.query_params.get("ticket", "")
    handle = await run_in_threadpool(redeem_ticket, ctx, server_id, ticket) if 0 < len(ticket) <= 100 else None
    await websocket.accept()
    if handle is None:
        await websocket.close(CLOSE_BAD_TICKET, "invalid, used or expired ticket")
        return
    if ctx.hypervisor is None or CAPABILITY_CONSOLE not in ctx.hypervisor.capabilities:
        await websocket.close(CLOSE_UNAVAILABLE, "this backend has no console")
        return
    try:
        stream = await ctx.hypervisor.open_console(handle)
    except PluginError as exc:
        # The plugin's text names hosts and domains: the operator's log has it, the customer plain words.
        log.warning("server %s: the console could not be opened: %s", server_id, exc)
        await websocket.close(CLOSE_UNAVAILABLE, await _why_no_console(ctx, server_id, handle))
        return

    async def guest_to_client() -> None:
        while data := await stream.read():
            await websocket.send_bytes(data)

    async def client_to_guest() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes") or (message.get("text") or "").encode()
            if data:
                await stream.write(data)

    tasks = [asyncio.create_task(guest_to_client()), asyncio.create_task(client_to_guest())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, PluginError, RuntimeError):
                await task
        await stream.close()
        # The client may have closed first: then there is nobody to tell, which is no error.
        with contextlib.suppress(RuntimeError, WebSocketDisconnect):
            await websocket.close(1000, "console closed")


async def _why_no_console(ctx: AppContext, server_id: int, handle: ServerHandle) -> str:
    """The close reason for a console the backend would not open, in the customer's words."""
    assert ctx.hypervisor is not None
    try:
        state = await ctx.hypervisor.state(handle)
    except PluginError:
        state = None
    if state in (DomainState.STOPPED, DomainState.PAUSED):
        return f"the server is powered off: start it (POST /v1/servers/{server_id}/start), then open the console again"
    if state == DomainState.STARTING:
        return "the server is still starting: open the console again in a few seconds"
    return "the console is not available right now: try again shortly, or ask the shop if it persists"


def websocket_route(prefix: str) -> WebSocketRoute:
    # {id:id}: an id past the database's integer never reaches it (the handshake is refused before the ticket)
    return WebSocketRoute(prefix + WS_PATH.replace("{id}", "{id:id}"), console_socket)


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST",
            "/servers/{id}/console",
            create_ticket,
            "Open the serial console",
            ConsoleTicketOut,
            status=201,
            response_headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
            description=f"Issues a ticket for the server's serial console, valid once and for {TICKET_SECONDS} "
            f"seconds. Connect a WebSocket to `url` (GET /v1{WS_PATH}?ticket=...; no Authorization header is "
            "needed, the ticket is bound to this account and server). The socket carries the console both ways: "
            "binary frames from the guest (boot messages, the login prompt), binary or text frames to it "
            f"(keystrokes). A bad, used or expired ticket: the socket closes with code {CLOSE_BAD_TICKET}; a "
            f"console that cannot be opened (the server was powered off meanwhile, or the hypervisor cannot): code "
            f"{CLOSE_UNAVAILABLE}, with the reason in plain words.",
            errors={
                404: _NOT_YOURS,
                409: "server_not_active: the server is not active; server_stopped: the server is powered off "
                "(its power is stopped): start it first; not_supported: the shop's hypervisor backend has no serial "
                "console.",
            },
            tags=TAG,
            operation_id="openServerConsole",
        ),
    ]
