"""The MCP tools against the REST API they stand beside: one tool for every customer operation, input
schemas a model can fill in (descriptions, the live catalog's ids as enums), annotations that say what a
call does, and refusals that say so (``isError`` with the API's error body)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from vpsshop.mcp.tools import TOOLS

NOT_CUSTOMER_OPERATIONS = {
    "getHealth": "for monitoring: the database and the components, nothing of an account",
    "getOpenApi": "the description itself, which the tools' schemas are built from",
}
"""REST operations with no tool, and why."""

MCP = {"Accept": "application/json, text/event-stream", "Host": "127.0.0.1:8000"}


def rpc(client: TestClient, method: str, params: dict[str, Any] | None = None, key: str | None = None) -> Any:
    headers = {**MCP, **({"Authorization": f"Bearer {key}"} if key else {})}
    answer = client.post(
        "/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


def call(client: TestClient, name: str, key: str | None = None, **arguments: Any) -> dict[str, Any]:
    return rpc(client, "tools/call", {"name": name, "arguments": arguments}, key)


def test_every_customer_operation_of_the_api_has_a_tool(vpsshop_client: TestClient) -> None:
    """A new endpoint without a tool fails here: add the tool (vpsshop/mcp/tools.py) or say why it has none."""
    document = vpsshop_client.get("/v1/openapi.json").json()
    operations = {op["operationId"] for path in document["paths"].values() for op in path.values()}
    covered = {operation for tool in TOOLS for operation in tool.operations}
    assert sorted(operations - covered - set(NOT_CUSTOMER_OPERATIONS)) == []
    assert sorted(covered - operations) == []  # no tool names an operation the API does not have
    assert len({tool.name for tool in TOOLS}) == len(TOOLS)
    for tool in TOOLS:
        methods = {
            method
            for path in document["paths"].values()
            for method, op in path.items()
            if op["operationId"] in tool.operations
        }
        if methods == {"get"}:
            assert tool.read_only, f"{tool.name} only reads: annotate it read-only"
        if "delete" in methods:
            assert tool.destructive, f"{tool.name} deletes: annotate it destructive"
        secured = {
            bool(op.get("security"))
            for path in document["paths"].values()
            for op in path.values()
            if op["operationId"] in tool.operations
        }
        assert secured in (set(), {tool.needs_key}), tool.name  # the tool asks for a key when the API does


def test_input_schemas_describe_every_argument_and_list_the_catalog(vpsshop_client: TestClient) -> None:
    listed = {tool["name"]: tool for tool in rpc(vpsshop_client, "tools/list")["tools"]}
    assert set(listed) == {tool.name for tool in TOOLS}
    catalog = vpsshop_client.get("/v1/catalog").json()
    for name, tool in listed.items():
        schema = tool["inputSchema"]
        assert schema["type"] == "object" and schema.get("additionalProperties") is False, name
        for field, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{name}.{field} has no description"
        assert set(tool["annotations"]) >= {"readOnlyHint", "destructiveHint", "idempotentHint"}, name
    order = listed["order_server"]["inputSchema"]["properties"]
    assert order["plan"]["enum"] == [plan["id"] for plan in catalog["plans"]]
    assert order["os"]["enum"] == [system["id"] for system in catalog["operating_systems"]]
    assert order["location"]["enum"] == [location["id"] for location in catalog["locations"]]
    assert order["cycle"]["enum"] == ["monthly", "annual"]
    assert set(listed["start_topup"]["inputSchema"]["properties"]["coin"]["enum"]) == {
        *(option["coin"] for option in catalog["payment_options"]),
        None,  # omitted: the shop's default coin
    }
    assert listed["get_server"]["inputSchema"]["properties"]["server_id"]["minimum"] == 1
    assert listed["get_topup"]["inputSchema"]["properties"]["ref"]["pattern"]
    assert listed["get_server"]["annotations"]["readOnlyHint"] is True
    assert listed["delete_webhook"]["annotations"]["destructiveHint"] is True
    assert listed["update_server"]["annotations"]["idempotentHint"] is True


def test_refusals_are_errors_with_the_api_body(vpsshop_client: TestClient, vpsshop_account: Any) -> None:
    key = vpsshop_account.api_key
    short = call(vpsshop_client, "order_server", key, plan="pup", location="nl", os="debian-12")
    assert short["isError"] is True
    body = short["structuredContent"]
    assert (body["status"], body["error"]) == (402, "insufficient_balance")
    assert body["deficit"] == body["price"] > 0 and body["balance"] == 0  # numbers, as the REST API writes them
    assert body["accepts"][0]["amount"] and body["x402Version"] == body["payment_required"]["x402Version"] == 2
    for name, arguments, code in (
        ("get_server", {"server_id": 2**63}, "invalid_server_id"),  # bounded before the database sees it
        ("get_server", {"server_id": "seven"}, "invalid_server_id"),
        ("get_topup", {"ref": "../keys"}, "invalid_ref"),
        ("get_event", {"event_id": "evt_../x"}, "invalid_event_id"),
        ("order_server", {"plan": "pup"}, "invalid_location"),
        ("order_server", {"plan": "pup", "location": "nl", "os": "debian-12", "extra": 1}, "unknown_field"),
        ("renew_server", {"server_id": 1, "periods": True}, "invalid_periods"),
        ("start_topup", {"amount": 10}, "amount_too_low"),
        ("no_such_tool", {}, "unknown_tool"),
    ):
        refused = call(vpsshop_client, name, key, **arguments)
        assert refused["isError"] is True and refused["structuredContent"]["error"] == code, (name, refused)
    missing = call(vpsshop_client, "get_server", key, server_id=99)
    assert missing["isError"] and missing["structuredContent"]["status"] == 404
    anonymous = call(vpsshop_client, "list_servers")
    assert anonymous["isError"] and anonymous["structuredContent"]["error"] == "unauthorized"
    assert call(vpsshop_client, "get_catalog")["structuredContent"]["plans"]  # needs no key


def test_a_wait_that_times_out_says_so(vpsshop_client: TestClient, vpsshop_account: Any) -> None:
    vpsshop_account.credit("10")
    key = vpsshop_account.api_key
    ordered = call(vpsshop_client, "order_server", key, plan="pup", location="nl", os="debian-12")
    assert ordered.get("isError") is not True, ordered
    server_id = ordered["structuredContent"]["server"]["id"]
    waited = call(vpsshop_client, "wait_for_server", key, server_id=server_id, timeout_seconds=1)
    assert waited["isError"] is True  # no job runs here: it is still provisioning
    assert waited["structuredContent"]["error"] == "wait_timeout"
    assert waited["structuredContent"]["server"]["status"] == "provisioning"


@pytest.mark.parametrize(
    ("headers", "status", "error"),
    [
        ({"Authorization": "Bearer vpsk_" + "x" * 43}, 401, "unauthorized"),
        ({"Host": "evil.example"}, 421, "wrong_host"),
        ({"Origin": "https://evil.example"}, 403, "wrong_origin"),
    ],
)
def test_the_endpoint_checks_the_key_the_host_and_the_origin(
    vpsshop_client: TestClient, headers: dict[str, str], status: int, error: str
) -> None:
    answer = vpsshop_client.post(
        "/mcp", headers={**MCP, **headers}, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    )
    assert (answer.status_code, answer.json()["error"]) == (status, error)


def test_a_wallet_links_and_signs_in_through_the_tools(vpsshop_client: TestClient, vpsshop_account: Any) -> None:
    from eth_account import Account
    from test_x402_signup import signed

    wallet = Account.create()
    key = vpsshop_account.api_key
    asked = call(vpsshop_client, "link_wallet", key)
    assert asked["isError"] is True and asked["structuredContent"]["error"] == "wallet_signature_required"
    challenge = asked["structuredContent"]
    linked = call(vpsshop_client, "link_wallet", key, signed_message=signed(wallet, challenge))
    assert linked.get("isError") is not True, linked
    listed = call(vpsshop_client, "list_wallets", key)["structuredContent"]["wallets"]
    assert [w["address"] for w in listed] == [wallet.address.lower()]

    login = call(vpsshop_client, "sign_in_with_wallet")["structuredContent"]
    assert login["error"] == "wallet_signature_required"
    signed_in = call(vpsshop_client, "sign_in_with_wallet", signed_message=signed(wallet, login))
    assert signed_in.get("isError") is not True, signed_in
    fresh = signed_in["structuredContent"]["api_key"]
    assert call(vpsshop_client, "get_account", fresh)["structuredContent"]["user_id"] == vpsshop_account.user_id

    removed = call(vpsshop_client, "unlink_wallet", key, wallet_id=listed[0]["id"])
    assert removed.get("isError") is not True, removed
    again = call(vpsshop_client, "sign_in_with_wallet", signed_message=signed(wallet, login))
    assert again["isError"] is True and again["structuredContent"]["error"] == "invalid_siwx_nonce"  # used once
