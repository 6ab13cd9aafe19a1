"""``vpsshop mcp``: a shop's MCP tools for an agent host that starts a command (stdio), relayed to the
shop's own ``/mcp`` with the customer's API key.

The bridge holds no tool of its own: it lists and calls the shop's (:mod:`vpsshop.mcp.server`), so an
agent sees exactly what the deployment offers, its catalog's ids included. It needs no database, no
config file and no shop secret; a shop that does not answer is a tool result with ``isError`` and
``error: "unreachable"``, and the next call tries again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from vpsshop.mcp.server import INSTRUCTIONS
from vpsshop.version import __version__

__all__ = ["Bridge", "mcp_url_of", "run"]

log = logging.getLogger("vpsshop.mcp")
T = TypeVar("T")


def mcp_url_of(api_url: str) -> str:
    """The MCP endpoint of a shop whose API is at ``api_url`` (``https://shop.example/v1`` ->
    ``https://shop.example/mcp``)."""
    base = api_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return f"{base}/mcp"


def unreachable(url: str, exc: BaseException) -> types.CallToolResult:
    body = {
        "error": "unreachable",
        "message": f"The shop's MCP server at {url} did not answer: {type(exc).__name__}. Try again shortly.",
        "status": 0,
    }
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body))], structured_content=body, is_error=True
    )


class Bridge:
    """Relays the MCP calls of an agent to the shop: each call in a connection of its own (the shop's
    MCP server is stateless, so a call needs no session before it), the tool list remembered once read."""

    def __init__(self, mcp_url: str, api_key: str | None, timeout: float = 180.0) -> None:
        self.url = mcp_url
        headers = {"User-Agent": f"vpsshop-mcp/{__version__}"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.headers = headers
        self.timeout = timeout
        self.tools: types.ListToolsResult | None = None

    async def _relay(self, call: Callable[[Client], Awaitable[T]]) -> T:
        async with (
            httpx2.AsyncClient(headers=self.headers, timeout=httpx2.Timeout(30.0, read=self.timeout)) as http,
            Client(streamable_http_client(self.url, http_client=http), read_timeout_seconds=self.timeout) as remote,
        ):
            return await call(remote)

    async def list_tools(
        self, _rctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if self.tools is None:
            try:
                self.tools = await self._relay(lambda remote: remote.list_tools())
            except Exception as exc:  # noqa: BLE001 - a shop that does not answer lists no tools yet
                log.warning("the shop's MCP server at %s did not answer: %s", self.url, type(exc).__name__)
                return types.ListToolsResult(tools=[])
        return self.tools

    async def call_tool(
        self, _rctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            return await self._relay(  # _meta too: an x402 MCP client's payment travels there
                lambda remote: remote.call_tool(params.name, params.arguments or {}, meta=params.meta)
            )
        except Exception as exc:  # noqa: BLE001 - every failure to reach the shop is said in the result
            log.warning("calling %s on %s failed: %s", params.name, self.url, type(exc).__name__)
            return unreachable(self.url, exc)

    def server(self) -> Server[Any]:
        return Server(
            "vpsshop",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )


async def _serve_stdio(bridge: Bridge) -> None:
    server = bridge.server()
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def run(
    api_url: str,
    api_key: str | None,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    mcp_url: str | None = None,
) -> None:
    """Serve the shop's tools until stopped (stdio: until the client closes the pipe; streamable HTTP: a
    local endpoint at ``http://host:port/mcp``, for agent hosts that connect to a URL but cannot send the
    shop the key themselves)."""
    from vpsshop.logs import QUIET_LIBRARIES

    for name in (*QUIET_LIBRARIES, "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)
    bridge = Bridge(mcp_url or mcp_url_of(api_url), api_key)
    if transport == "stdio":
        anyio.run(_serve_stdio, bridge)
        return

    import uvicorn

    async def serve_http() -> None:
        app = bridge.server().streamable_http_app(json_response=True, stateless_http=True, host=host)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
        await uvicorn.Server(config).serve()

    anyio.run(serve_http)
