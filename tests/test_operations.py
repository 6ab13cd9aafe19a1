"""One operation under every front end: an order placed through the REST API, the dashboard and the
MCP tools is the same call to :func:`vpsshop.servers.orders.place_order` (an order paid by x402 too:
tests/test_x402_orders.py replaces that function's transaction to race it), with the same limits and
the same events. HTTP tests on SQLite and PostgreSQL, each front end through the app as it is served."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient
from test_dashboard import D, post_form, sign_in

from vpsshop.servers import orders

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
MCP = {"Accept": "application/json, text/event-stream", "Host": "127.0.0.1:8000"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"ratelimit": {"writes_per_account": 4, "write_window_seconds": 60}}


def mcp_call(client: TestClient, key: str, name: str, /, **arguments: Any) -> dict[str, Any]:
    answer = client.post(
        "/mcp",
        headers={**MCP, "Authorization": f"Bearer {key}"},
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
    )
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()["result"]
    return result


def test_every_front_end_orders_through_place_order(
    vpsshop_client: TestClient, vpsshop_account: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, account = vpsshop_client, vpsshop_account
    account.credit("20")
    real = orders.place_order
    calls: list[tuple[int, str]] = []

    async def recorded(ctx: Any, customer: Any, data: Any, **kwargs: Any) -> Any:
        calls.append((customer.account_id, data.plan))
        return await real(ctx, customer, data, **kwargs)

    monkeypatch.setattr(orders, "place_order", recorded)
    api = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert api.status_code == 201, api.text
    assert sign_in(client, account.login_token).status_code == 303
    page = post_form(client, f"{D}/servers", {**ORDER, "idempotency_key": "dash-1"}, page=f"{D}/servers/new")
    assert page.status_code == 303, page.text
    tool = mcp_call(client, account.api_key, "order_server", **ORDER)
    assert tool.get("isError") is not True, tool
    assert calls == [(account.user_id, "pup")] * 3
    servers = client.get("/v1/servers", headers=account.headers).json()["servers"]
    assert len(servers) == 3
    events = client.get("/v1/events", headers=account.headers, params={"type": "server.provisioning"}).json()
    assert sorted(e["data"]["id"] for e in events["events"]) == sorted(s["id"] for s in servers)


def test_one_write_limit_for_every_front_end(vpsshop_client: TestClient, vpsshop_account: Any) -> None:
    client, account = vpsshop_client, vpsshop_account
    assert client.post("/v1/keys", headers=account.headers).status_code == 201  # 1
    assert sign_in(client, account.login_token).status_code == 303
    assert post_form(client, f"{D}/keys", {"name": "two"}).status_code == 201  # 2
    assert mcp_call(client, account.api_key, "create_api_key", name="three").get("isError") is not True  # 3
    assert mcp_call(client, account.api_key, "quote_order", **ORDER).get("isError") is not True  # 4: quotes count
    refused = mcp_call(client, account.api_key, "create_api_key", name="five")
    assert refused["isError"] is True and refused["structuredContent"]["error"] == "rate_limited"
    assert 0 < refused["structuredContent"]["retry_after"] <= 2 * 60  # a sliding window of 60 s
    assert client.post("/v1/keys", headers=account.headers).status_code == 429
    assert post_form(client, f"{D}/keys", {"name": "six"}).status_code == 429
    keys = client.get("/v1/keys", headers=account.headers).json()["keys"]
    assert [k["name"] for k in keys] == ["default", None, "two", "three"]  # nothing past the limit was made
