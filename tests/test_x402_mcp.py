"""The MCP tools when the agent pays by x402 through them: a USDCBASE-only shop (``vpsshop serve`` with a
config file, sandbox servers) settling directly on anvil, driven by the ``mcp`` SDK's client over stdio
(``vpsshop mcp``, relaying to the shop's own ``/mcp``). A tool's refused call (``isError``) hands over the
402's x402 requirements (``payment_required``, ``accepts``); the agent's payments are signed by the PyPI
``x402`` client (v2, as x402's MCP binding states them) and sent back as the tools' ``payment`` argument (the
order) or in the call's ``_meta["x402/payment"]`` relayed by the bridge (the renewal); the order,
its replay and the renewal each answer with the settlement, and a replay with another body is refused.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import VPSSHOP, free_port, serve, shop_env
from x402_coin import chain  # noqa: F401 - a fixture
from x402_peers import USDC_UNIT, Chain, sign_v2_header

pytestmark = pytest.mark.slow


DEPOSIT_COINS = ("BTC", "XMR", "ETH", "USDTTRC", "LTC", "TRX", "SOL", "USDT")


def test_agent_pays_by_x402_through_the_tools(tmp_path: Path, vpsshop_database_url: str, chain: Chain) -> None:
    """A USDCBASE-only shop settling on anvil: the agent signs what the tools hand it and pays in the same call."""
    from mcp import Client, StdioServerParameters

    shop_wallet, relayer = chain.new_account(), chain.new_account(eth_wei=10**18)
    customer = chain.new_account(usdc=100 * USDC_UNIT)
    port = free_port()
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f'''public_url = "http://127.0.0.1:{port}/v1"

[coins.USDCBASE]
mode = "direct"
network = "base"
pay_to = "{shop_wallet.address}"
asset = "{chain.asset}"
rpc_url = "{chain.url}"
relayer_key_env = "TEST_MCP_RELAYER_KEY"
max_timeout_seconds = 120
'''
        + "".join(f"\n[coins.{code}]\nenabled = false\n" for code in DEPOSIT_COINS)
    )
    env = shop_env(vpsshop_database_url, TEST_MCP_RELAYER_KEY="0x" + bytes(relayer.key).hex())

    paid_total: list[int] = []

    async def session(client: Any) -> None:
        async def tool(name: str, /, **arguments: Any) -> dict[str, Any]:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result
            return result.structured_content

        async def refused(name: str, /, **arguments: Any) -> dict[str, Any]:
            result = await client.call_tool(name, arguments)
            assert result.is_error, result
            return result.structured_content

        asked = await refused("start_topup", amount=25)  # no coin: the shop's only one, USDCBASE
        assert asked["status"] == 402 and asked["payment_required"]["accepts"][0]["network"] == "eip155:8453"
        catalog = await tool("get_catalog")
        order = {
            "plan": catalog["plans"][0]["id"],
            "location": catalog["locations"][0]["id"],
            "os": catalog["operating_systems"][0]["id"],
        }
        short = await refused("order_server", **order)
        required = short["payment_required"]
        payment = sign_v2_header(customer, required["accepts"][0], required["resource"]["url"])
        paid = await tool("order_server", **order, payment=payment)
        assert paid["server"]["status"] == "provisioning", paid
        settled = paid["payment_response"]
        assert settled["success"] is True and settled["payer"] == customer.address
        assert settled["network"] == "eip155:8453" and int(settled["amount"]) == int(required["accepts"][0]["amount"])
        again = await tool("order_server", **order, payment=payment)  # a retry: the same order, nothing paid
        assert again["server"]["id"] == paid["server"]["id"] and again["idempotent_replayed"] is True
        assert again["payment_response"] == settled

        server_id = paid["server"]["id"]
        assert (await tool("wait_for_server", server_id=server_id))["status"] == "active"
        renewal = await refused("renew_server", server_id=server_id)
        assert renewal["status"] == 402 and renewal["error"] == "insufficient_balance"
        renewing = sign_v2_header(customer, renewal["accepts"][0], renewal["resource"]["url"])
        payload = json.loads(base64.b64decode(renewing))
        result = await client.call_tool("renew_server", {"server_id": server_id}, meta={"x402/payment": payload})
        assert not result.is_error, result
        renewed = result.structured_content
        assert renewed["server"]["expires_at"] > paid["server"]["expires_at"], renewed
        assert renewed["payment_response"]["network"] == "eip155:8453", renewed
        assert result.meta["x402/payment-response"] == renewed["payment_response"]  # the binding's place
        replayed = await tool("renew_server", server_id=server_id, payment=renewing)  # the same payment: nothing more
        assert replayed["idempotent_replayed"] is True and replayed["server"] == renewed["server"]
        assert replayed["payment_response"] == renewed["payment_response"]
        changed = await refused("renew_server", server_id=server_id, periods=2, payment=renewing)  # another body
        assert (changed["status"], changed["error"]) == (409, "idempotency_key_reused")
        assert (await tool("get_account"))["balance_usd"] == 0
        paid_total.append(int(settled["amount"]) + int(renewal["accepts"][0]["amount"]))

    with serve(tmp_path, env, "--config", str(config), port=port) as served:
        created = httpx.post(f"{served.base}/account", timeout=30).json()
        params = StdioServerParameters(
            command=VPSSHOP,
            args=["mcp", "--api-url", served.base],
            env={"VPSSHOP_API_KEY": created["api_key"]},
            cwd=str(tmp_path),
        )

        async def run() -> None:
            async with Client(params, read_timeout_seconds=180) as client:
                await session(client)

        asyncio.run(run())
    paid_atomic = chain.usdc(shop_wallet.address)
    assert paid_atomic == paid_total[0] > 0 and chain.usdc(customer.address) == 100 * USDC_UNIT - paid_atomic
