"""The paid MCP tools under x402's MCP transport binding, paid by the official client: the PyPI ``x402``
package's ``x402MCPClient`` (unmodified; its spend limits set) over the ``mcp`` SDK's streamable HTTP client as
docs/mcp.md shows it (the test runs that block), against ``vpsshop serve``'s ``/mcp`` on a USDCBASE-only shop
settling directly on anvil.

A keyless session orders a server by paying the tool call (pay as sign-up: the wallet's new account and its
API key come back once), and another wallet tops up keyless the same way; the first account renews by a paid
call; a re-sent payment is the same order and pays
nothing more, a payment used for something else is refused, a payer without the USDC and a forged signature
are clear errors, a client whose spend limit is below the price pays nothing, and the chain shows each price
paid exactly once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import free_port, serve, shop_env
from x402_coin import chain  # noqa: F401 - a fixture
from x402_peers import USDC_UNIT, Chain

pytestmark = pytest.mark.slow

DEPOSIT_COINS = ("BTC", "XMR", "ETH", "USDTTRC", "LTC", "TRX", "SOL", "USDT")


DOC = (Path(__file__).resolve().parents[1] / "docs" / "mcp.md").read_text()


def doc_client() -> dict[str, Any]:
    """The client code of docs/mcp.md ("The official Python client"), run as the reader runs it."""
    match = re.search(r"<!-- x402-mcp-client[^>]*-->\n```python\n(.*?)```", DOC, re.S)
    assert match, "docs/mcp.md lost its x402 MCP client block"
    names: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/mcp.md", "exec"), names)  # the documentation's own code
    return names


@asynccontextmanager
async def mcp_session(url: str, api_key: str | None = None) -> AsyncIterator[Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=180.0)) as http,
        Client(streamable_http_client(url, http_client=http), read_timeout_seconds=180) as client,
    ):
        yield client


def paying_client(client: Any, payer: Any, asset: str, max_atomic: int, paid: list[Any]) -> Any:
    """The documented x402 MCP client paying with ``payer``'s key, at most ``max_atomic`` of ``asset`` (the
    test token) a call; the payloads it signs are kept in ``paid`` (its after-payment hook)."""
    limits = {"allowed_assets": [{"network": "eip155:8453", "asset": asset, "max_amount_per_payment": str(max_atomic)}]}
    x402_mcp = doc_client()["paying"](client, payer, limits)
    x402_mcp.on_after_payment(lambda done: paid.append(done.payment_payload))
    return x402_mcp


def answer(result: Any) -> dict[str, Any]:
    """A tool result's JSON (its first text content)."""
    data: dict[str, Any] = json.loads(result.content[0]["text"])
    return data


def test_x402_mcp_client_orders_and_renews_by_paid_tool_calls(
    tmp_path: Path, vpsshop_database_url: str, chain: Chain
) -> None:
    shop_wallet, relayer = chain.new_account(), chain.new_account(eth_wei=10**18)
    payer = chain.new_account(usdc=1000 * USDC_UNIT)
    broke = chain.new_account()  # holds no USDC
    topper = chain.new_account(usdc=100 * USDC_UNIT)
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
    paid: list[Any] = []
    cap = 1000 * USDC_UNIT

    async def session(url: str) -> None:
        async with mcp_session(url) as keyless:
            catalog = (await keyless.call_tool("get_catalog", {})).structured_content
            order = {
                "plan": catalog["plans"][0]["id"],
                "location": catalog["locations"][0]["id"],
                "os": catalog["operating_systems"][0]["id"],
            }

            # the binding's payment-required result, as a plain MCP client sees it
            asked = await keyless.call_tool("order_server", order)
            assert asked.is_error and asked.structured_content["x402Version"] == 2
            required = asked.structured_content
            assert required["error"] == "payment_required" and required["status"] == 402
            assert required["resource"]["url"] == "mcp://tool/order_server"
            price_atomic = int(required["accepts"][0]["amount"])
            assert required["accepts"][0]["network"] == "eip155:8453" and price_atomic > 0
            wrapped = json.loads(asked.content[0].text)["x402/error"]
            assert wrapped["code"] == 402 and wrapped["data"]["accepts"] == required["accepts"]

            # a payment that is not a PaymentPayload: a clear error, nothing moves
            junk = await keyless.call_tool("order_server", order, meta={"x402/payment": "not a payload"})
            assert junk.is_error and junk.structured_content["error"] == "invalid_payment"

            # the spend limit below the price: the client signs nothing
            thrifty = paying_client(keyless, payer, chain.asset, price_atomic - 1, [])
            with pytest.raises(Exception, match=r"(?i)spend|filtered|requirements"):
                await thrifty.call_tool("order_server", order)
            assert chain.usdc(shop_wallet.address) == 0

            # a wallet without the USDC: the payment's own error, and the binding's failed settlement
            poor = await paying_client(keyless, broke, chain.asset, cap, []).call_tool("order_server", order)
            assert poor.payment_made and poor.is_error
            assert answer(poor)["error"] == "insufficient_funds", answer(poor)
            assert answer(poor)["x402/payment-response"]["success"] is False
            assert poor.payment_response is not None and poor.payment_response.success is False

            # pay as sign-up: the official client pays the keyless order in the call
            x402_mcp = paying_client(keyless, payer, chain.asset, cap, paid)
            ordered = await x402_mcp.call_tool("order_server", order)
            assert ordered.payment_made and not ordered.is_error, ordered.content
            made = answer(ordered)
            assert made["server"]["status"] == "provisioning" and made["account"]["created"] is True
            api_key = made["account"]["api_key"]
            assert api_key.startswith("vpsk_") and made["account"]["address"] == payer.address.lower()
            settled = ordered.payment_response
            assert settled is not None and settled.success and settled.payer == payer.address
            assert settled.network == "eip155:8453" and settled.transaction == made["payment_response"]["transaction"]
            assert chain.usdc(shop_wallet.address) == price_atomic

            # the same payment again: the same order, its settlement, no key, nothing more paid
            again = await x402_mcp.call_tool_with_payment("order_server", order, paid[0])
            replayed = answer(again)
            assert not again.is_error and replayed["idempotent_replayed"] is True
            assert replayed["server"]["id"] == made["server"]["id"] and replayed["account"]["api_key"] is None
            assert again.payment_response is not None and again.payment_response.transaction == settled.transaction

            # the same payment for another order: refused, nothing made or paid
            other = await x402_mcp.call_tool_with_payment("order_server", {**order, "hostname": "other"}, paid[0])
            assert other.is_error and answer(other)["error"] == "idempotency_key_reused"
            assert answer(other)["x402/payment-response"]["success"] is False

            # a forged authorization (a nonce its signature does not sign): refused before anything is sent
            forged = paid[0].model_copy(deep=True)
            forged.payload["authorization"]["nonce"] = "0x" + "22" * 32
            bad = await x402_mcp.call_tool_with_payment("order_server", {**order, "hostname": "forged"}, forged)
            assert bad.is_error and answer(bad)["error"] == "invalid_signature", answer(bad)
            assert chain.usdc(shop_wallet.address) == price_atomic

            # a keyless x402 top-up: pay as sign-up too, another wallet's new account credited
            topped = await paying_client(keyless, topper, chain.asset, cap, []).call_tool(
                "start_topup", {"amount": 25, "coin": "USDCBASE"}
            )
            assert topped.payment_made and not topped.is_error, topped.content
            topup = answer(topped)
            assert topup["status"] == "completed" and topup["account"]["api_key"].startswith("vpsk_"), topup
            assert topped.payment_response is not None and topped.payment_response.payer == topper.address
            assert chain.usdc(topper.address) == 75 * USDC_UNIT

        async with mcp_session(url, topup["account"]["api_key"]) as topped_up:
            account = (await topped_up.call_tool("get_account", {})).structured_content
            assert account["balance_usd"] == 25, account

        async with mcp_session(url, api_key) as keyed:
            renewals: list[Any] = []
            renewing = paying_client(keyed, payer, chain.asset, cap, renewals)
            server_id = made["server"]["id"]
            waited = await keyed.call_tool("wait_for_server", {"server_id": server_id})
            assert waited.structured_content["status"] == "active", waited.structured_content
            # the order's payment for a renewal: used already, refused
            reused = await renewing.call_tool_with_payment("renew_server", {"server_id": server_id}, paid[0])
            assert reused.is_error and answer(reused)["error"] == "nonce_used", answer(reused)
            renewed = await renewing.call_tool("renew_server", {"server_id": server_id})
            assert renewed.payment_made and not renewed.is_error, renewed.content
            assert answer(renewed)["server"]["expires_at"] > made["server"]["expires_at"]
            assert renewed.payment_response is not None and renewed.payment_response.success
            renewal_atomic = int(renewals[-1].accepted.amount)
            again = await renewing.call_tool_with_payment("renew_server", {"server_id": server_id}, renewals[-1])
            assert not again.is_error and answer(again)["idempotent_replayed"] is True
            account = (await keyed.call_tool("get_account", {})).structured_content
            assert account["balance_usd"] == 0
            totals.append(price_atomic + renewal_atomic)
            keys.append((api_key, server_id))

    totals: list[int] = []
    keys: list[tuple[str, int]] = []
    with serve(tmp_path, env, "--config", str(config), port=port) as served:
        mcp_url = served.base.removesuffix("/v1") + "/mcp"
        asyncio.run(session(mcp_url))
        # the key the paid tool call showed is the REST API's too: the same account, the same server
        api_key, server_id = keys[0]
        listed = httpx.get(f"{served.base}/servers", headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
        assert [server["id"] for server in listed.json()["servers"]] == [server_id], listed.text
    assert chain.usdc(shop_wallet.address) == totals[0] + 25 * USDC_UNIT
    assert chain.usdc(payer.address) == 1000 * USDC_UNIT - totals[0]
