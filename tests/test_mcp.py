"""The shop's MCP tools driven by the official ``mcp`` SDK's client, as an agent uses them.

The shop is the shipped ``vpsshop serve`` in sandbox mode (simulated hypervisor). The agent connects to
its own ``/mcp`` (streamable HTTP, the customer's API key as a Bearer header), then through the shipped
``vpsshop mcp`` bridge over stdio and over streamable HTTP. The session: the catalog and a quote, the
``isError`` 402 of a short balance (with the x402 requirements), a top-up, funds from ``vpsshop admin
credit``, an SSH key, an order with that key and cloud-init user data, waiting until the server is
active, the root login, a reboot that shows up in the account's events, a renewal it cannot pay, and
a ref that is refused rather than pasted into a path. Paying by x402 through the tools:
tests/test_x402_mcp.py; the tools against the REST API's operations: tests/test_mcp_tools.py.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from served import VPSSHOP, free_port, serve, shop_env, stop

pytestmark = pytest.mark.slow

USER_DATA = "#cloud-config\nruncmd:\n  - [touch, /root/made-by-mcp]\n"


def ssh_public_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


async def agent_session(client: Any, env: dict[str, str], cwd: Path, user_id: int) -> dict[str, Any]:
    async def tool(name: str, /, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(name, arguments)
        assert not result.is_error, result
        return result.structured_content

    async def refused(name: str, /, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(name, arguments)
        assert result.is_error, result
        return result.structured_content

    listed = (await client.list_tools()).tools
    names = {t.name for t in listed}
    assert {"get_catalog", "quote_order", "order_server", "add_ssh_key", "list_events", "wait_for_server"} <= names
    order_tool = next(t for t in listed if t.name == "order_server")
    assert "pup" in order_tool.input_schema["properties"]["plan"]["enum"]  # the live catalog's ids
    assert order_tool.input_schema["properties"]["user_data"]["description"]

    catalog = await tool("get_catalog")
    plan, location, system = (
        catalog["plans"][0]["id"],
        catalog["locations"][0]["id"],
        catalog["operating_systems"][0]["id"],
    )
    order = {"plan": plan, "location": location, "os": system}
    quoted = await tool("quote_order", **order)
    assert quoted["price_usd"] > 0 and quoted["balance_usd"] == 0 and quoted["deficit_usd"] == quoted["price_usd"]

    short = await refused("order_server", **order, idempotency_key="agent-1")
    assert (short["status"], short["error"]) == (402, "insufficient_balance")
    assert short["deficit"] == quoted["price_usd"] and short["accepts"][0]["network"]  # x402 requirements too
    required = short["payment_required"]  # x402's MCP binding: the result is the v2 PaymentRequired too
    assert required["x402Version"] == short["x402Version"] == 2 and required["accepts"] == short["accepts"]
    assert required["resource"] == short["resource"] and short["resource"]["url"] == "mcp://tool/order_server"
    topup = await tool("start_topup", amount=25)  # no coin: the shop's default (BTC in the sandbox)
    assert topup["deposit_address"] and topup["coin"] == "BTC" and topup["status"] == "pending", topup
    assert (await tool("get_topup", ref=topup["ref"]))["status"] == "pending"
    pasted = await refused("get_topup", ref="../keys")  # a ref is checked, never pasted into a path
    assert (pasted["status"], pasted["error"]) == (400, "invalid_ref")

    subprocess.run(
        [VPSSHOP, "admin", "credit", str(user_id), "10", "--reason", "agent test"],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
    )
    key = await tool("add_ssh_key", name="agent", public_key=ssh_public_key())
    ordered = await tool("order_server", **order, ssh_keys=[key["id"]], user_data=USER_DATA, idempotency_key="agent-1")
    server_id = ordered["server"]["id"]
    assert ordered["server"]["status"] == "provisioning" and ordered["root_password"]
    again = await tool("order_server", **order, ssh_keys=[key["id"]], user_data=USER_DATA, idempotency_key="agent-1")
    assert again["server"]["id"] == server_id and again["idempotent_replayed"] is True  # nothing bought twice
    changed = await refused("order_server", **order, idempotency_key="agent-1")  # the key, another order
    assert (changed["status"], changed["error"]) == (409, "idempotency_key_reused")
    active = await tool("wait_for_server", server_id=server_id, timeout_seconds=120)
    assert active["status"] == "active" and active["ip"], active
    credentials = await tool("get_credentials", server_id=server_id)
    assert credentials["password"] == ordered["root_password"] and credentials["username"] == "root"
    rebooted = await tool("power_server", server_id=server_id, action="reboot")
    assert rebooted["status"] == "queued" and rebooted["action"] == "reboot"
    deadline = time.monotonic() + 60
    while True:  # the reboot runs as a job of the serve process; its event follows
        page = await tool("list_events", type="server.*")
        kinds = [e["type"] for e in page["events"]]
        if "server.rebooted" in kinds or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert kinds == ["server.provisioning", "server.active", "server.rebooted"], kinds
    assert page["events"][-1]["data"]["id"] == server_id
    listed_servers = await tool("list_servers")
    assert [s["id"] for s in listed_servers["servers"]] == [server_id]
    account = await tool("get_account")
    assert abs(account["balance_usd"] - (10 - quoted["price_usd"])) < 0.001
    two = await refused("renew_server", server_id=server_id, periods=2)  # two cycles: more than the balance
    assert (two["status"], two["error"]) == (402, "insufficient_balance"), two
    assert abs(two["price"] - 2 * quoted["price_usd"]) < 0.001 and two["payment_required"]["accepts"]
    waited = await refused("wait_for_server", server_id=server_id, status="terminated", timeout_seconds=1)
    assert waited["error"] == "wait_timeout" and waited["server"]["status"] == "active"  # says it timed out
    return active


@pytest.fixture
def shop(tmp_path: Path, vpsshop_database_url: str) -> Any:
    env = shop_env(vpsshop_database_url)
    with serve(tmp_path, env) as served:
        created = httpx.post(f"{served.base}/account", timeout=30).json()
        yield served, env, created


def remote(url: str, api_key: str | None) -> Any:
    """The SDK's client on a streamable HTTP endpoint, with the customer's key as its Bearer header."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=180))
    return Client(streamable_http_client(url, http_client=http), read_timeout_seconds=180)


def mcp_url(served: Any) -> str:
    return served.base.removesuffix("/v1") + "/mcp"


def test_agent_orders_a_server_through_the_shops_own_mcp(tmp_path: Path, shop: Any) -> None:
    served, env, created = shop

    async def run() -> dict[str, Any]:
        async with remote(mcp_url(served), created["api_key"]) as client:
            return await agent_session(client, env, tmp_path, created["user_id"])

    assert asyncio.run(run())["status"] == "active"


def test_the_shops_mcp_asks_for_a_valid_key_and_checks_host_and_origin(shop: Any) -> None:
    served, _, _ = shop
    url = mcp_url(served)
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    wrong = httpx.post(url, json=call, headers={**headers, "Authorization": "Bearer vpsk_" + "x" * 43})
    assert wrong.status_code == 401 and wrong.json()["error"] == "unauthorized"
    assert wrong.headers["www-authenticate"].startswith("Bearer")
    host = httpx.post(url, json=call, headers={**headers, "Host": "evil.example"})
    assert host.status_code == 421 and host.json()["error"] == "wrong_host"
    origin = httpx.post(url, json=call, headers={**headers, "Origin": "https://evil.example"})
    assert origin.status_code == 403 and origin.json()["error"] == "wrong_origin"

    async def anonymous() -> tuple[Any, Any]:
        async with remote(url, None) as client:
            return await client.call_tool("get_catalog", {}), await client.call_tool("get_account", {})

    catalog, account = asyncio.run(anonymous())
    assert not catalog.is_error and catalog.structured_content["plans"]
    assert account.is_error and account.structured_content["error"] == "unauthorized"


def test_agent_orders_a_server_over_stdio(tmp_path: Path, shop: Any) -> None:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    served, env, created = shop
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


def test_the_bridge_says_when_the_shop_does_not_answer(tmp_path: Path) -> None:
    from mcp import Client, StdioServerParameters

    gone = f"http://127.0.0.1:{free_port()}/v1"
    params = StdioServerParameters(
        command=VPSSHOP, args=["mcp", "--api-url", gone], env={"VPSSHOP_API_KEY": "vpsk_" + "x" * 43}
    )

    async def run() -> Any:
        async with Client(params, read_timeout_seconds=60) as client:
            return await client.call_tool("get_account", {})

    result = asyncio.run(run())
    assert result.is_error and result.structured_content["error"] == "unreachable"


def test_agent_orders_a_server_over_streamable_http(tmp_path: Path, shop: Any) -> None:
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
        while True:  # listening: a connection is taken
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)

        async def run() -> dict[str, Any]:
            async with remote(f"http://127.0.0.1:{port}/mcp", None) as client:  # the bridge holds the key
                return await agent_session(client, env, tmp_path, created["user_id"])

        assert asyncio.run(run())["status"] == "active"
    finally:
        stop(proc)
