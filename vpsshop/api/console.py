"""The serial console's WebSocket: ``GET /v1/servers/{id}/console/ws?ticket=...``.

A browser cannot send an ``Authorization`` header on a WebSocket, hence the ticket
(:func:`vpsshop.servers.console.open_console`): redeemed once, it opens the guest's serial console
through the backend's :meth:`~vpsshop.HypervisorBackend.open_console`. The socket carries it both
ways as binary frames (text frames are sent to the guest as UTF-8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from vpsshop.context import AppContext
from vpsshop.errors import PluginError
from vpsshop.hypervisor import CAPABILITY_CONSOLE, DomainState, ServerHandle
from vpsshop.servers.console import WS_PATH, redeem_ticket

__all__ = ["CLOSE_BAD_TICKET", "CLOSE_UNAVAILABLE", "console_socket", "websocket_route"]

log = logging.getLogger("vpsshop.servers")

# WebSocket close codes (RFC 6455 private range 4000-4999): the reason text says more.
CLOSE_BAD_TICKET = 4401
CLOSE_UNAVAILABLE = 4409


async def console_socket(websocket: WebSocket) -> None:
    ctx: AppContext = websocket.app.state.ctx
    server_id = websocket.path_params["id"]
    ticket = websocket.query_params.get("ticket", "")
    handle = await redeem_ticket(ctx, server_id, ticket)
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
    """The console's WebSocket under ``prefix``. Its id is bounded as every API path's id is (0 to
    ``inputs.MAX_ID``: a larger number matches no route instead of overflowing the database's integer)."""
    return WebSocketRoute(prefix + WS_PATH.replace("{id}", "{id:id}"), console_socket)
