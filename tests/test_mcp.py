"""``vpsshop mcp`` driven by the official ``mcp`` SDK's client against a running ``vpsshop serve``.

The shop is the shipped command in sandbox mode (simulated hypervisor); the MCP server is the
shipped ``vpsshop mcp`` command, over stdio and over streamable HTTP. An agent session reads the
catalog, gets a quote, sees the 402 of a short balance (with the x402 ``PAYMENT-REQUIRED`` decoded),
is funded (``vpsshop admin credit``), orders a server and waits until it is active, then reads its
credentials, reboots it and asks for a renewal of two periods it cannot pay. Paying by x402 through
the tools: tests/test_x402_mcp.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import VPSSHOP, free_port, serve, shop_env, stop

pytestmark = pytest.mark.slow


async def agent_session(client: Any, env: dict[str, str], cwd: Path, user_id: int) -> dict[str, Any]:
    async def tool(name: str, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(name, arguments)
        assert not result.is_error, result
        return result.structured_content

    names = {t.name for t in (await client.list_tools()).tools}
    assert {
        "get_catalog",
        "quote",
        "get_account",
        "start_topup",
        "get_topup",
        "order_server",
        "list_servers",
        "get_server",
        "wait_for_server",
        "power_server",
        "renew_server",
        "get_credentials",
    } <= names
    catalog = await tool("get_catalog")
    assert catalog["http_status"] == 200
    plan, location, system = (
        catalog["plans"][0]["id"],
        catalog["locations"][0]["id"],
        catalog["operating_systems"][0]["id"],
    )
    quoted = await tool("quote", plan=plan, location=location)
    assert quoted["price_usd"] > 0 and quoted["balance_usd"] == 0 and quoted["deficit_usd"] == quoted["price_usd"]

    short = await tool("order_server", plan=plan, location=location, os=system, idempotency_key="agent-1")
    assert short["http_status"] == 402 and short["error"] == "insufficient_balance"
    assert short["deficit"] == quoted["price_usd"] and short["accepts"][0]["network"]  # x402 requirements too
    # the x402 v2 requirements travel in a header: the tool hands them over, decoded and raw
    required = short["payment_required"]
    assert required["x402Version"] == 2 and required["accepts"][0]["payTo"] == short["accepts"][0]["payTo"]
    assert required["resource"]["url"] == short["accepts"][0]["resource"] and short["payment_required_header"]
    topup = await tool("start_topup", amount_usd=25)  # no coin: the shop's default (BTC in the sandbox)
    assert topup["http_status"] == 201 and topup["deposit_address"] and topup["coin"] == "BTC", topup
    assert (await tool("get_topup", ref=topup["ref"]))["status"] == "pending"

    subprocess.run(
        [VPSSHOP, "admin", "credit", str(user_id), "10", "--reason", "agent test"],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
    )
    ordered = await tool("order_server", plan=plan, location=location, os=system, idempotency_key="agent-1")
    assert ordered["http_status"] == 201, ordered
    server_id = ordered["server"]["id"]
    again = await tool("order_server", plan=plan, location=location, os=system, idempotency_key="agent-1")
    assert again["server"]["id"] == server_id  # a retried call buys nothing more
    active = await tool("wait_for_server", server_id=server_id, timeout_seconds=120)
    assert active["status"] == "active" and active["ip"], active
    credentials = await tool("get_credentials", server_id=server_id)
    assert credentials["password"] == ordered["root_password"] and credentials["username"] == "root"
    rebooted = await tool("power_server", server_id=server_id, action="reboot")
    assert rebooted["http_status"] == 202 and rebooted["status"] == "queued"
    listed = await tool("list_servers")
    assert [s["id"] for s in listed["servers"]] == [server_id]
    account = await tool("get_account")
    assert abs(account["balance_usd"] - (10 - quoted["price_usd"])) < 0.001
    two = await tool("renew_server", server_id=server_id, periods=2)  # two cycles: more than the balance
    assert two["http_status"] == 402 and two["error"] == "insufficient_balance", two
    assert abs(two["price"] - 2 * quoted["price_usd"]) < 0.001 and two["payment_required"]["accepts"]
    return active


@pytest.fixture
def shop(tmp_path: Path, vpsshop_database_url: str) -> Any:
    env = shop_env(vpsshop_database_url)
    with serve(tmp_path, env) as served:
        created = httpx.post(f"{served.base}/account", timeout=30).json()
        yield served, env, created


def test_agent_orders_a_server_over_stdio(tmp_path: Path, shop: Any) -> None:
    from mcp import Client, StdioServerParameters

    served, env, created = shop
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=VPSSHOP,
        args=["mcp", "--api-url", served.base],
        env={"VPSSHOP_API_KEY": created["api_key"]},
        cwd=str(tmp_path),
    )
    stderr = tmp_path / "mcp-stderr.log"

    async def run() -> dict[str, Any]:
        with stderr.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=180) as client:
                return await agent_session(client, env, tmp_path, created["user_id"])

    assert asyncio.run(run())["status"] == "active"
    # the agent host's log gets no line per HTTP call (httpx logs only warnings, as under vpsshop serve)
    logged = stderr.read_text()
    assert "HTTP Request" not in logged and served.base not in logged, logged[-2000:]


def test_agent_orders_a_server_over_streamable_http(tmp_path: Path, shop: Any) -> None:
    from mcp import Client

    served, env, created = shop
    port = free_port()
    log = tmp_path / "mcp.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [VPSSHOP, "mcp", "--transport", "streamable-http", "--port", str(port), "--api-url", served.base],
            cwd=tmp_path,
            env={**env, "VPSSHOP_API_KEY": created["api_key"]},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)

        async def run() -> dict[str, Any]:
            async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=180) as client:
                return await agent_session(client, env, tmp_path, created["user_id"])

        assert asyncio.run(run())["status"] == "active"
    finally:
        stop(proc)
