"""``vpsshop mcp``: a Model Context Protocol server that lets an AI agent use a vpsshop deployment.

It talks to any vpsshop deployment through its public HTTP API with the customer's API key (it
holds no database and no shop secret), and offers tools for the catalog, a price quote, the
account, top-ups, ordering, server status and power actions, renewals and credentials. Built on
the official ``mcp`` SDK (``MCPServer``); transports: stdio (the default, for a local agent) and
streamable HTTP (``--transport streamable-http``, served on loopback unless told otherwise).

Every tool answers with the API's JSON plus ``http_status``; an API error is returned, not raised,
so that the agent reads ``error``, ``message`` and, for a short balance, ``deficit`` and the x402
payment requirements (``accepts``) it may pay with its own x402 client. The x402 headers of the
answer come along: ``payment_required`` (the v2 ``PAYMENT-REQUIRED``, raw in
``payment_required_header``), ``payment_response`` (``X-PAYMENT-RESPONSE`` or ``PAYMENT-RESPONSE``,
decoded) and ``idempotent_replayed``. The paying tools take the signed payment back as ``payment``.
See docs/mcp.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from typing import Any, Literal

import httpx

INSTRUCTIONS = (
    "Tools of a prepaid VPS shop. Typical session: get_catalog (or quote) to choose plan, location and os; "
    "get_account to see the balance; if the balance is short, start_topup (deposit address) or sign the order's "
    "x402 requirements (payment_required, or accepts) with your own x402 client and call order_server again "
    "with that signed payment; order_server (send an idempotency_key to retry safely); "
    "wait_for_server until status is active; get_credentials for the root login. Prices and balances are USD."
)


class ShopApi:
    """The deployment's HTTP API, as the customer ``api_key`` sees it."""

    def __init__(
        self,
        api_url: str,
        api_key: str | None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        headers = {"User-Agent": "vpsshop-mcp"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.client = httpx.AsyncClient(base_url=self.api_url, headers=headers, timeout=timeout, transport=transport)

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """The JSON answer with ``http_status``; a transport failure is an answer too (status 0)."""
        try:
            response = await self.client.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            return {
                "http_status": 0,
                "error": "unreachable",
                "message": f"The shop at {self.api_url} did not answer: {type(exc).__name__}.",
            }
        try:
            data = response.json()
        except ValueError:
            data = {"error": "not_json", "message": response.text[:500]}
        if not isinstance(data, dict):
            data = {"items": data}
        return {"http_status": response.status_code, **data, **x402_headers(response.headers)}

    async def aclose(self) -> None:
        await self.client.aclose()


def _decoded(value: str) -> Any:
    try:
        return json.loads(base64.b64decode(value + "=" * (-len(value) % 4)))
    except (binascii.Error, ValueError):
        return None


def x402_headers(headers: httpx.Headers) -> dict[str, Any]:
    """What an agent needs of an answer's x402 headers (see the module docs); empty when there are none."""
    found: dict[str, Any] = {}
    required = headers.get("payment-required")
    if required:
        found["payment_required_header"] = required
        found["payment_required"] = _decoded(required)
    settled = headers.get("payment-response") or headers.get("x-payment-response")
    if settled:
        found["payment_response"] = _decoded(settled)
    if headers.get("idempotent-replayed") == "true":
        found["idempotent_replayed"] = True
    return found


def payment_headers(payment: str | None) -> dict[str, str]:
    """The request header carrying a signed x402 payment: ``PAYMENT-SIGNATURE`` for an x402 v2 payload,
    ``X-PAYMENT`` for v1 (the version is read from the payload; the shop checks the rest)."""
    if not payment:
        return {}
    payment = payment.strip()
    decoded = _decoded(payment)
    version = decoded.get("x402Version") if isinstance(decoded, dict) else None
    return {"PAYMENT-SIGNATURE" if version == 2 else "X-PAYMENT": payment}


def quote_from_catalog(catalog: dict[str, Any], plan: str, location: str, cycle: str) -> dict[str, Any]:
    """The price of ``plan`` at ``location`` for ``cycle`` from ``GET /catalog``'s pricing table."""
    for row in catalog.get("pricing", []):
        if row.get("plan") == plan and row.get("location") == location:
            key = "annual_usd" if cycle == "annual" else "monthly_usd"
            return {"plan": plan, "location": location, "cycle": cycle, "price_usd": row[key]}
    return {
        "error": "invalid_plan_or_location",
        "message": f"No price for plan {plan!r} at location {location!r}; see get_catalog.",
    }


def build_server(api: ShopApi, name: str = "vpsshop") -> Any:
    """The MCP server with the shop's tools bound to ``api``."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name=name, instructions=INSTRUCTIONS)

    @server.tool()
    async def get_catalog() -> dict[str, Any]:
        """Plans, locations, operating systems, every price, top-up limits and the coins accepted."""
        return await api.call("GET", "/catalog")

    @server.tool()
    async def quote(plan: str, location: str, cycle: Literal["monthly", "annual"] = "monthly") -> dict[str, Any]:
        """The price of a server (plan at location, monthly or annual) and, with the account's balance,
        how much is missing (deficit_usd)."""
        catalog = await api.call("GET", "/catalog")
        if catalog["http_status"] != 200:
            return catalog
        answer = quote_from_catalog(catalog, plan, location, cycle)
        if "price_usd" in answer:
            account = await api.call("GET", "/account")
            if account["http_status"] == 200:
                balance = float(account["balance_usd"])
                answer["balance_usd"] = balance
                answer["deficit_usd"] = round(max(0.0, float(answer["price_usd"]) - balance), 2)
        return answer

    @server.tool()
    async def get_account() -> dict[str, Any]:
        """The account of the API key: balance (USD), number of servers, 2FA state."""
        return await api.call("GET", "/account")

    @server.tool()
    async def start_topup(amount_usd: float, coin: str | None = None, payment: str | None = None) -> dict[str, Any]:
        """Start a top-up of amount_usd (25 to 2000) paid in coin, one of get_catalog's payment_options
        (omitted: the shop's default coin). A deposit coin answers with the address and the amount to send;
        an x402 coin (USDCBASE) answers http_status 402 with the payment requirements (accepts, and
        payment_required for x402 v2). payment: the x402 payment your x402 client signed for them (base64, as
        the client made it), sent as PAYMENT-SIGNATURE (v2) or X-PAYMENT (v1); the completed top-up then
        carries payment_response."""
        body: dict[str, Any] = {"amount": amount_usd}
        if coin:
            body["coin"] = coin
        return await api.call("POST", "/topups", body, payment_headers(payment) or None)

    @server.tool()
    async def get_topup(ref: str) -> dict[str, Any]:
        """A top-up and the progress of its payment (status completed once credited)."""
        return await api.call("GET", f"/topups/{ref}")

    @server.tool()
    async def order_server(
        plan: str,
        location: str,
        os: str,
        cycle: Literal["monthly", "annual"] = "monthly",
        hostname: str | None = None,
        idempotency_key: str | None = None,
        payment: str | None = None,
    ) -> dict[str, Any]:
        """Order a server, paid from the balance. http_status 201: the server (provisioning) and its generated
        root password (shown once). 402 insufficient_balance: nothing was charged; deficit says how much is
        missing, and when the shop takes x402 accepts (v1) and payment_required (v2) are the payment
        requirements for it. payment: the x402 payment your x402 client signed for them (base64, as the
        client made it): the same call with it pays the deficit and places the order (payment_response
        reports the settlement). Send the same idempotency_key (or payment) to retry safely."""
        body: dict[str, Any] = {"plan": plan, "location": location, "os": os, "cycle": cycle}
        if hostname:
            body["hostname"] = hostname
        headers = payment_headers(payment)
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        return await api.call("POST", "/servers", body, headers or None)

    @server.tool()
    async def list_servers() -> dict[str, Any]:
        """The account's servers, terminated ones included."""
        return await api.call("GET", "/servers")

    @server.tool()
    async def get_server(server_id: int) -> dict[str, Any]:
        """One server: status (provisioning, active, suspended, terminated), ip, expires_at."""
        return await api.call("GET", f"/servers/{server_id}")

    @server.tool()
    async def wait_for_server(server_id: int, status: str = "active", timeout_seconds: float = 120) -> dict[str, Any]:
        """Poll a server until it has status (default active) or timeout_seconds pass; the last state read."""
        deadline = time.monotonic() + min(max(timeout_seconds, 1), 900)
        while True:
            answer = await api.call("GET", f"/servers/{server_id}")
            if answer["http_status"] != 200 or answer.get("status") == status or time.monotonic() > deadline:
                return answer
            await asyncio.sleep(2)

    @server.tool()
    async def power_server(server_id: int, action: Literal["start", "stop", "reboot"]) -> dict[str, Any]:
        """Start, stop or reboot an active server (queued; the job runs within seconds)."""
        return await api.call("POST", f"/servers/{server_id}/{action}")

    @server.tool()
    async def renew_server(server_id: int, periods: int = 1, payment: str | None = None) -> dict[str, Any]:
        """Pay periods more billing cycles (default 1) from the balance now (brings a suspended server back).
        402 insufficient_balance: as for order_server, with the x402 payment requirements for the deficit;
        payment: the x402 payment your x402 client signed for them, which pays and renews in the same call."""
        return await api.call(
            "POST", f"/servers/{server_id}/renew", {"periods": periods}, payment_headers(payment) or None
        )

    @server.tool()
    async def get_credentials(server_id: int) -> dict[str, Any]:
        """The root username and password, ip and hostname of a server."""
        return await api.call("GET", f"/servers/{server_id}/credentials")

    return server


def run(api_url: str, api_key: str | None, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the tools until stopped (stdio: until the client closes the pipe).

    ``httpx`` and ``httpcore`` log only warnings, as under ``vpsshop serve``: their INFO lines carry every
    URL the tools call (the shop's address, a top-up's ref)."""
    from vpsshop.logs import QUIET_LIBRARIES

    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)
    api = ShopApi(api_url, api_key)
    server = build_server(api)
    if transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=port)
