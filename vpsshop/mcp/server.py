"""The shop's own MCP server at ``/mcp``: streamable HTTP (stateless, JSON answers), the tools of
:mod:`vpsshop.mcp.tools` acting for the account of the request's API key.

* **Who acts**: ``Authorization: Bearer vpsk_...`` as on the REST API (the same authentication, the same
  limit on failed keys per client address). Without the header only the tools that need no account
  answer (``get_catalog``, ``create_account``, ``sign_in``), and the tools paid as sign-up; a wrong key
  is a 401 before any MCP message is read.
* **Host and Origin**: a request must name this shop's host (``public_url``; the sandbox also takes
  loopback), and a browser's ``Origin`` must be the shop's own (DNS rebinding cannot turn a visitor's
  browser into a client of the shop).
* **Stateless**: every request stands alone, so any ``vpsshop serve`` worker or host answers it.
* **Paid tools** (``order_server``, ``renew_server``, ``resize_server``, ``start_topup``) follow x402's MCP
  transport binding (x402 ``specs/transports-v2/mcp.md``), so an unmodified x402 MCP client pays them:
  unpaid, the result is ``isError`` with the x402 v2 ``PaymentRequired`` (``x402Version``, ``resource``, ``accepts``) in
  ``structuredContent`` beside the shop's error body, and ``{"x402/error": {code: 402, message, data}}`` as
  its text; the call sent again with the signed ``PaymentPayload`` in ``params._meta["x402/payment"]`` is
  settled through the same operation as the REST API's payment header, and its result carries the
  settlement response in ``_meta["x402/payment-response"]``. Keyless, ``order_server`` and an x402
  ``start_topup`` are paid as sign-up, as ``POST /v1/servers`` and ``POST /v1/topups`` without a key are.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from vpsshop import limits
from vpsshop.accounts import MissingCredential, authenticator
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import ApiError, PluginError, Unauthorized
from vpsshop.inputs import parse
from vpsshop.mcp.tools import TOOLS, Tool
from vpsshop.openapi import catalog_ids, mark_catalog_enums
from vpsshop.routing import client_address, json_default, json_response
from vpsshop.version import __version__
from vpsshop.x402.offers import PaidButFailed, PaymentOffer

__all__ = ["INSTRUCTIONS", "McpEndpoint", "tool_schemas"]

log = logging.getLogger("vpsshop.mcp")

PATH = "/mcp"
CUSTOMER_SCOPE_KEY = "vpsshop.customer"
CLIENT_SCOPE_KEY = "vpsshop.client"
PAYMENT_META_KEY = "x402/payment"
"""The binding's ``_meta`` key of a tool call's x402 ``PaymentPayload``."""
PAYMENT_RESPONSE_META_KEY = "x402/payment-response"
"""The binding's ``_meta`` key of a result's x402 settlement response."""
PAYMENT_ERRORS = frozenset({"invalid_payment", "invalid_coin", "nonce_used", "idempotency_key_reused"})
"""Refusals of a paid call that are about its payment besides every 402 (the x402 client is told the
payment failed: ``x402/payment-response`` with ``success: false``)."""
INSTRUCTIONS = (
    "Tools of a prepaid VPS shop; prices and balances are USD. Typical session: get_catalog to choose plan, "
    "location and os; quote_order for the price and the deficit; if the balance is short, start_topup (a deposit "
    "address) or pay the order itself: order_server answers a short balance with the x402 requirements "
    "(x402Version 2, accepts: the x402 MCP binding), and an x402 MCP client pays it in _meta['x402/payment'] "
    "(or sign them yourself and call again with payment); without an API key order_server is paid as sign-up "
    "and answers the new account's api_key once. Send idempotency_key to retry safely. wait_for_server until "
    "active; get_credentials for the root login. A "
    "refused call is isError with the shop's error body (error, message)."
)


def tool_schemas(ctx: AppContext) -> list[types.Tool]:
    """The tools as MCP lists them for this shop: input schemas from the operations' input models, with
    the ids this shop offers (plans, locations, systems, coins) as enums."""
    listed = []
    ids = catalog_ids(ctx)
    for tool in TOOLS:
        schema = tool.arguments.model_json_schema(mode="validation")
        schema.pop("title", None)
        schema.pop("description", None)
        definitions = schema.pop("$defs", {})
        mark_catalog_enums({"args": schema, **definitions}, ids)
        if definitions:  # the arguments are flat: a nested model would be a reference to inline
            schema["$defs"] = definitions
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        listed.append(
            types.Tool(
                name=tool.name,
                title=tool.title,
                description=tool.description + ("" if tool.needs_key else " Needs no API key."),
                input_schema=schema,
                annotations=types.ToolAnnotations(
                    title=tool.title,
                    read_only_hint=tool.read_only,
                    destructive_hint=tool.destructive,
                    idempotent_hint=tool.idempotent,
                    open_world_hint=False,
                ),
            )
        )
    return listed


def _text(data: Any) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=json.dumps(data, separators=(",", ":")))]


def _as_json(result: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """JSON values as the REST API writes them (money as numbers, times in ISO 8601)."""
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    data: dict[str, Any] = json.loads(json.dumps(result, default=json_default))
    return data


def error_result(exc: ApiError, tool: str = "", paid_network: str | None = None) -> types.CallToolResult:
    """An operation's refusal as MCP answers it: ``isError`` with the API's error body, its HTTP status
    (``status``), and the x402 requirements or settlement the REST API sends in headers.

    A payment asked for follows x402's MCP binding: the body is also the v2 ``PaymentRequired``
    (``x402Version`` 2, ``resource`` ``mcp://tool/<tool>``, ``accepts``; ``payment_required`` repeats it)
    and the text is its ``x402/error`` wrapper. ``paid_network``: the call carried a payment for this
    network; a refusal of that payment adds the binding's failed settlement response."""
    body = _as_json(exc.body())
    body["status"] = exc.status
    meta: dict[str, Any] = {}
    offer = getattr(exc, "offer", None)
    required = offer.payment_required() if isinstance(offer, PaymentOffer) else None
    if required is not None:  # the x402 v2 form of the requirements, which the REST API sends as a header
        required["resource"]["url"] = f"mcp://tool/{tool}"
        required.pop("error", None)
        body.update(x402Version=required["x402Version"], resource=required["resource"], accepts=required["accepts"])
        body["payment_required"] = {**required, "error": body["error"]}
    if isinstance(exc, PaidButFailed):
        body["payment_response"] = meta[PAYMENT_RESPONSE_META_KEY] = exc.settled.response()
    elif paid_network is not None and (exc.status == 402 or exc.error in PAYMENT_ERRORS):
        failed = {"success": False, "errorReason": exc.error, "transaction": "", "network": paid_network}
        body[PAYMENT_RESPONSE_META_KEY] = meta[PAYMENT_RESPONSE_META_KEY] = failed
    if "retry_after" not in body and "Retry-After" in exc.headers:
        body["retry_after"] = int(exc.headers["Retry-After"])
    text = _text(body)
    if required is not None:
        text = _text({"x402/error": {"code": 402, "message": body["message"], "data": body}})
    return types.CallToolResult(content=text, structured_content=body, is_error=True, meta=meta or None)


def meta_payment(value: Any) -> tuple[str, str | None]:
    """The ``x402/payment`` of a call's ``_meta`` (a ``PaymentPayload`` object, or its JSON as a string) as
    the base64 JSON the REST API's payment header carries, and the network it pays on.

    :raises ApiError: 400 invalid_payment when it is neither."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_payment", f"_meta['{PAYMENT_META_KEY}'] must be an x402 PaymentPayload object.")
    accepted = value.get("accepted")
    network = accepted.get("network") if isinstance(accepted, dict) else value.get("network")
    encoded = base64.b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()
    return encoded, network if isinstance(network, str) else None


class ShopTools:
    """The MCP server of one shop: its tools, answered through :mod:`vpsshop.mcp.tools`."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.tools = {tool.name: tool for tool in TOOLS}
        self.listed = tool_schemas(ctx)
        self.server: Server[Any] = Server(
            "vpsshop",
            version=__version__,
            title=ctx.settings.dashboard.shop_name,
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    async def list_tools(
        self, rctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.listed)

    async def call_tool(
        self, rctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        request = rctx.request
        scope = request.scope if isinstance(request, Request) else {}
        meta = params.meta or {}
        return await self.run(
            params.name,
            params.arguments or {},
            scope.get(CUSTOMER_SCOPE_KEY),
            payment=meta.get(PAYMENT_META_KEY),
            client=scope.get(CLIENT_SCOPE_KEY, "mcp"),
        )

    async def run(
        self,
        name: str,
        arguments: dict[str, Any],
        customer: Customer | None,
        *,
        payment: Any = None,
        client: str = "mcp",
    ) -> types.CallToolResult:
        """Call tool ``name`` with ``arguments`` for ``customer`` (None: no API key was sent). ``payment``:
        the call's ``_meta["x402/payment"]``; ``client``: the caller's address (the sign-up limit)."""
        tool: Tool | None = self.tools.get(name)
        network: str | None = None
        try:
            if tool is None:
                raise ApiError(404, "unknown_tool", f"There is no tool {name[:80]!r}; tools/list names them.")
            if payment is not None:
                if "payment" not in tool.arguments.model_fields:
                    raise ApiError(400, "invalid_payment", f"{tool.name} costs nothing: it takes no x402 payment.")
                if arguments.get("payment") is not None:
                    raise ApiError(
                        400, "invalid_payment", f"Send the payment once: _meta['{PAYMENT_META_KEY}'] or payment."
                    )
                encoded, network = meta_payment(payment)
                arguments = {**arguments, "payment": encoded}
            if customer is None and tool.keyless is not None:
                args = parse(tool.arguments, arguments)
                result = await tool.keyless(self.ctx, client, args)
            else:
                if tool.needs_key and customer is None:
                    raise Unauthorized(
                        "This tool acts for an account: send the account's API key as Authorization: Bearer vpsk_..."
                    )
                args = parse(tool.arguments, arguments)
                result = await tool.run(self.ctx, customer or Customer(0), args)
        except ApiError as exc:
            return error_result(exc, name, network)
        except PluginError as exc:  # the plugin's words (hosts, nodes) go to the operator's log only
            log.error("plugin failure in MCP tool %s: %s: %s", name, type(exc).__name__, exc)
            return error_result(
                ApiError(503, "service_unavailable", "A backend this call needs is not available; retry shortly."),
            )
        except Exception:
            log.exception("MCP tool %s failed", name)
            return error_result(ApiError(500, "internal_error", "The server failed; retry shortly."))
        data = _as_json(result)
        settled = data.get("payment_response")
        meta = {PAYMENT_RESPONSE_META_KEY: settled} if isinstance(settled, dict) else None
        return types.CallToolResult(content=_text(data), structured_content=data, meta=meta)


class McpEndpoint:
    """``/mcp``: Host and Origin checked, the API key authenticated, then the MCP transport."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.tools = ShopTools(ctx)
        self.manager: StreamableHTTPSessionManager | None = None
        self.authenticate = authenticator(ctx).customer
        self.blocked = limits.blocked_clients(ctx)
        public = urlsplit(ctx.settings.public_url)
        self.hosts = {public.netloc.lower()}
        self.origins = {f"{public.scheme}://{public.netloc}".lower()}
        self.loopback = ctx.settings.sandbox  # a sandbox serves on any loopback port

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transport's task group, for the app's lifespan (a fresh one each time the app starts: a
        manager runs once)."""
        self.manager = StreamableHTTPSessionManager(app=self.tools.server, json_response=True, stateless=True)
        async with self.manager.run():
            yield

    def _allowed(self, value: str, allowed: set[str]) -> bool:
        value = value.lower()
        if value in allowed:
            return True
        host = value.split("://", 1)[-1].rsplit(":", 1)[0]
        return self.loopback and host in ("127.0.0.1", "localhost", "[::1]")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        host = request.headers.get("host", "")
        origin = request.headers.get("origin")
        if not self._allowed(host, self.hosts):
            await self._refuse(
                scope,
                receive,
                send,
                ApiError(421, "wrong_host", "This shop's MCP server is not served under this host name."),
            )
            return
        if origin is not None and not self._allowed(origin, self.origins):
            await self._refuse(
                scope, receive, send, ApiError(403, "wrong_origin", "Requests from other sites' pages are refused.")
            )
            return
        scope[CLIENT_SCOPE_KEY] = client_address(request)
        try:
            scope[CUSTOMER_SCOPE_KEY] = await self._customer(request)
        except ApiError as exc:
            await self._refuse(scope, receive, send, exc)
            return
        if self.manager is None:  # the app's lifespan has not started it
            await self._refuse(scope, receive, send, ApiError(503, "service_unavailable", "MCP is starting."))
            return
        await self.manager.handle_request(scope, receive, send)

    async def _customer(self, request: Request) -> Customer | None:
        client = client_address(request)
        limits.auth_blocked(self.blocked, client)
        try:
            return await self.authenticate(request.headers.get("authorization"))
        except MissingCredential:
            return None
        except Unauthorized:
            await run_in_threadpool(limits.auth_failed, self.ctx, client)
            raise

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, exc: ApiError) -> None:
        headers = dict(exc.headers)
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="vpsshop"'
        await json_response(exc.body(), exc.status, headers)(scope, receive, send)
