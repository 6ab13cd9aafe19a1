"""The outbox: every change writes its event in its own transaction; GET /v1/events pages the
account's own events (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import select
from starlette.testclient import TestClient

from vpsshop.coins import DetectedPayment
from vpsshop.events.models import StoredEvent
from vpsshop.payments import engine_for
from vpsshop.payments.models import Topup
from vpsshop.servers.jobs import run_jobs
from vpsshop.servers.lifecycle import run_lifecycle
from vpsshop.testing import create_test_account

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}  # 3.99 a month


def events(client: TestClient, account: Any, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/v1/events", headers=account.headers, params={"limit": 100, **params})
    assert response.status_code == 200, response.text
    return response.json()["events"]


def types(client: TestClient, account: Any, **params: Any) -> list[str]:
    return [e["type"] for e in events(client, account, **params)]


def provision(ctx: Any, clock: Any) -> int:
    """Run the provisioning job past the sandbox simulator's boot: the jobs that ended done."""
    done = asyncio.run(run_jobs(ctx))["done"]
    clock.advance(seconds=10)  # the simulated guest has booted
    return done + asyncio.run(run_jobs(ctx))["done"]


def test_account_keys_orders_and_servers_write_events(vpsshop_client: TestClient, vpsshop_clock: Any) -> None:
    client = vpsshop_client
    account = create_test_account(client)
    assert types(client, account) == ["account.created", "api_key.created"]
    minted = client.post("/v1/keys", headers=account.headers, json={"name": "ci"}).json()
    client.delete(f"/v1/keys/{minted['id']}", headers=account.headers)

    refused = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert refused.status_code == 402  # rolled back: no server, no ledger entry, and no event either
    assert types(client, account)[-2:] == ["api_key.created", "api_key.revoked"]

    account.credit("10")
    order = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert order.status_code == 201
    server_id = order.json()["server"]["id"]
    assert provision(client.app.state.ctx, vpsshop_clock) == 1
    listed = events(client, account)
    assert [e["type"] for e in listed] == [
        "account.created",
        "api_key.created",
        "api_key.created",
        "api_key.revoked",
        "ledger.credit",
        "server.provisioning",
        "ledger.debit",
        "server.active",
    ]
    key_event = listed[3]
    assert key_event["data"] == {
        "object": "api_key",
        "id": minted["id"],
        "prefix": minted["prefix"],
        "name": "ci",
        "created_at": minted["created_at"],
        "revoked_at": key_event["data"]["revoked_at"],
    }
    assert minted["api_key"] not in str(listed)  # a key is never in an event
    debit = listed[6]["data"]
    assert (debit["object"], debit["amount_usd"], debit["balance_after_usd"], debit["reason"], debit["ref"]) == (
        "ledger_entry",
        -3.99,
        6.01,
        "order",
        f"server:{server_id}",
    )
    active = listed[-1]
    shown = client.get(f"/v1/servers/{server_id}", headers=account.headers).json()
    assert active["data"] == {"object": "server", **shown}  # the resource as the API shows it
    assert active["account_id"] == account.user_id and active["id"].startswith("evt_")
    assert listed[5]["data"]["status"] == "provisioning" and listed[5]["data"]["ip"] is None
    one = client.get(f"/v1/events/{active['id']}", headers=account.headers)
    assert one.status_code == 200 and one.json() == active


def test_events_are_the_accounts_own_and_page_both_ways(vpsshop_client: TestClient) -> None:
    client = vpsshop_client
    mine, other = create_test_account(client), create_test_account(client)
    for name in ("a", "b", "c"):
        client.post("/v1/keys", headers=mine.headers, json={"name": name})
    everything = events(client, mine)
    assert len(everything) == 5 and all(e["account_id"] == mine.user_id for e in everything)
    theirs = events(client, other)
    assert {e["account_id"] for e in theirs} == {other.user_id}

    first = client.get("/v1/events", headers=mine.headers, params={"limit": 2}).json()
    assert [e["id"] for e in first["events"]] == [e["id"] for e in everything[:2]] and first["has_more"]
    second = client.get("/v1/events", headers=mine.headers, params={"limit": 2, "after": first["cursor"]}).json()
    third = client.get("/v1/events", headers=mine.headers, params={"limit": 2, "after": second["cursor"]}).json()
    paged = first["events"] + second["events"] + third["events"]
    assert paged == everything and not third["has_more"]
    caught_up = client.get("/v1/events", headers=mine.headers, params={"after": third["cursor"]}).json()
    assert caught_up == {"events": [], "has_more": False, "cursor": third["cursor"]}  # poll again from here

    newest = client.get("/v1/events", headers=mine.headers, params={"before": everything[-1]["id"], "limit": 2}).json()
    assert [e["id"] for e in newest["events"]] == [everything[-2]["id"], everything[-3]["id"]]
    assert types(client, mine, type="api_key.*") == ["api_key.created"] * 4
    assert types(client, mine, type="account.created") == ["account.created"]

    between = client.get(
        "/v1/events", headers=mine.headers, params={"after": everything[0]["id"], "before": everything[-1]["id"]}
    ).json()
    assert [e["id"] for e in between["events"]] == [e["id"] for e in everything[1:-1]]  # oldest first
    for after, before in ((everything[-1], everything[0]), (everything[2], everything[2])):  # nothing can be between
        wrong = client.get("/v1/events", headers=mine.headers, params={"after": after["id"], "before": before["id"]})
        assert (wrong.status_code, wrong.json()["error"]) == (400, "invalid_cursor")
        assert "after must name an older event than before" in wrong.json()["message"]
    for params in ({"after": theirs[0]["id"]}, {"before": theirs[0]["id"]}):  # another account's id is unknown here
        assert client.get("/v1/events", headers=mine.headers, params=params).status_code == 404
    assert client.get(f"/v1/events/{theirs[0]['id']}", headers=mine.headers).status_code == 404
    for params, code in (
        ({"limit": 0}, "invalid_limit"),
        ({"limit": "x"}, "invalid_limit"),
        ({"after": "nope"}, "invalid_cursor"),
        ({"type": "server.exploded"}, "invalid_type"),
    ):
        bad = client.get("/v1/events", headers=mine.headers, params=params)
        assert (bad.status_code, bad.json()["error"]) == (400, code)
    assert client.get("/v1/events").status_code == 401


def test_server_lifecycle_events(vpsshop_client: TestClient, vpsshop_clock: Any) -> None:
    client = vpsshop_client
    ctx = client.app.state.ctx
    account = create_test_account(client)
    account.credit("3.99")
    server = client.post("/v1/servers", headers=account.headers, json=ORDER).json()["server"]
    assert provision(ctx, vpsshop_clock) == 1
    vpsshop_clock.set(
        vpsshop_clock.now() + (ctx_expiry(client, account, server["id"]) - vpsshop_clock.now()) - timedelta(hours=1)
    )
    asyncio.run(run_lifecycle(ctx))
    asyncio.run(run_lifecycle(ctx))  # a second pass in the same period tells nobody again
    vpsshop_clock.advance(hours=2)
    asyncio.run(run_lifecycle(ctx))
    account.credit("3.99")
    renewed = client.post(f"/v1/servers/{server['id']}/renew", headers=account.headers)
    assert renewed.status_code == 200
    client.patch(f"/v1/servers/{server['id']}", headers=account.headers, json={"auto_renew": False})
    vpsshop_clock.set(vpsshop_clock.now() + timedelta(days=40))
    asyncio.run(run_lifecycle(ctx))
    vpsshop_clock.advance(days=8)
    asyncio.run(run_lifecycle(ctx))
    server_events = [e for e in events(client, account) if e["type"].startswith("server.")]
    assert [e["type"] for e in server_events] == [
        "server.provisioning",
        "server.active",
        "server.renewal_failed",
        "server.suspended",
        "server.renewed",
        "server.unsuspended",
        "server.updated",
        "server.suspended",
        "server.terminated",
    ]
    assert [e["data"]["status"] for e in server_events] == [
        "provisioning",
        "active",
        "active",
        "suspended",
        "active",
        "active",
        "active",
        "suspended",
        "terminated",
    ]
    assert server_events[6]["data"]["auto_renew"] is False
    assert server_events[-1]["data"]["status_reason"].startswith("Not renewed within 7 days")
    assert server_events[4]["data"]["expires_at"] > server_events[1]["data"]["expires_at"]


def ctx_expiry(client: TestClient, account: Any, server_id: int) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(client.get(f"/v1/servers/{server_id}", headers=account.headers).json()["expires_at"])


def test_topup_events_from_creation_to_odd_payments(vpsshop_client: TestClient, vpsshop_clock: Any) -> None:
    client = vpsshop_client
    account = create_test_account(client)
    h = account.headers
    engine = engine_for(client.app.state.ctx)
    made = [client.post("/v1/topups", json={"amount": 60, "coin": "BTC"}, headers=h).json() for _ in range(5)]
    exact, under, over, cancelled, expired = made
    client.post(f"/v1/topups/{cancelled['ref']}/cancel", headers=h)
    with engine.ctx.db.session() as session:
        rows = {t.ref: t for t in session.exec(select(Topup).where(Topup.account_id == account.user_id)).all()}

    def pay(topup: dict[str, Any], sats: int, n: int) -> None:
        row = rows[topup["ref"]]
        found = DetectedPayment(f"{n:064x}:0", row.watch_key, sats, f"{n:064x}", 0, None, None)
        engine.record_payments([("BTC", found)], {("BTC", row.watch_key): row.id})

    # 60 USD at the sandbox's 60,000 USD/BTC: 100,000 sat each
    pay(exact, 100_000, 1)
    pay(under, 40_000, 2)
    pay(over, 150_000, 3)
    vpsshop_clock.advance(minutes=61)
    assert engine.expire_due() == 1  # `expired` (the others have payments waiting)
    pay(cancelled, 100_000, 4)  # after cancellation: late
    seen = [e for e in events(client, account) if e["type"] == "topup.payment_seen"]
    assert [e["data"]["ref"] for e in seen] == [exact["ref"], under["ref"], over["ref"], cancelled["ref"]]
    assert seen[0]["data"]["payment"] == {
        "coin": "BTC",
        "txid": f"{1:064x}",
        "amount": "0.00100000",
        "confirmations": 0,
        "late": False,
        "credited_usd": None,
    }
    from vpsshop.payments.models import TopupPayment

    with engine.ctx.db.session() as session:  # as if the chain gave every payment its confirmations
        session.execute(TopupPayment.__table__.update().values(confirmations=6))
    assert client.portal.call(engine.credit_confirmed, engine.ctx.coins["BTC"]) == 4
    by_ref: dict[str, list[str]] = {}
    for e in events(client, account, type="topup.*"):
        by_ref.setdefault(e["data"]["ref"], []).append(e["type"])
    assert by_ref[exact["ref"]] == ["topup.created", "topup.payment_seen", "topup.payment_confirmed", "topup.completed"]
    assert by_ref[under["ref"]] == [
        "topup.created",
        "topup.payment_seen",
        "topup.payment_confirmed",
        "topup.underpaid",
        "topup.completed",
    ]
    assert by_ref[over["ref"]] == [
        "topup.created",
        "topup.payment_seen",
        "topup.payment_confirmed",
        "topup.overpaid",
        "topup.completed",
    ]
    assert by_ref[cancelled["ref"]] == [
        "topup.created",
        "topup.cancelled",
        "topup.payment_seen",
        "topup.payment_confirmed",
        "topup.late_payment",
        "topup.completed",
    ]
    assert by_ref[expired["ref"]] == ["topup.created", "topup.expired"]
    under_event = next(e for e in events(client, account, type="topup.underpaid"))
    assert (under_event["data"]["amount_received"], under_event["data"]["credited_usd"]) == ("0.00040000", 24)
    credits = [e["data"]["amount_usd"] for e in events(client, account, type="ledger.credit")]
    assert credits == [60, 24, 90, 60]


def test_emit_refuses_an_unknown_type_and_rolls_back_with_the_change(vpsshop_client: TestClient) -> None:
    from vpsshop import events as outbox

    ctx = vpsshop_client.app.state.ctx
    account = create_test_account(vpsshop_client)
    with pytest.raises(ValueError, match="unknown event type"), ctx.db.session() as session:
        outbox.emit(session, "server.exploded", account.user_id, {"id": 1})
    with pytest.raises(RuntimeError), ctx.db.session() as session:
        outbox.emit(session, "account.created", account.user_id, {"user_id": account.user_id})
        raise RuntimeError("the change failed")
    with ctx.db.session() as session:
        assert len(session.exec(select(StoredEvent)).all()) == 2  # account.created + api_key.created only


def test_every_event_type_is_documented_and_in_the_openapi_webhooks(vpsshop_client: TestClient) -> None:
    from pathlib import Path

    from openapi_spec_validator import validate

    from vpsshop.events.types import EVENT_TYPES

    doc = (Path(__file__).parent.parent / "docs" / "events.md").read_text()
    document = vpsshop_client.get("/v1/openapi.json").json()
    validate(document)
    schemas = document["components"]["schemas"]
    for name, info in EVENT_TYPES.items():
        assert f"| `{name}` | {info.object} |" in doc, f"docs/events.md does not describe {name}"
        hook = document["webhooks"][name]["post"]
        ref = hook["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        declared = schemas[ref]["properties"]["type"]
        assert name in declared.get("enum", [declared.get("const")])
        assert {p["name"] for p in hook["parameters"]} == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert set(document["webhooks"]) == set(EVENT_TYPES)
    listed = document["paths"]["/events"]["get"]
    assert {p["name"] for p in listed["parameters"]} == {"after", "before", "limit", "type"}
    for path in (
        "/webhooks",
        "/webhooks/{id}",
        "/webhooks/{id}/deliveries",
        "/webhooks/{id}/redeliver",
        "/events/{event_id}",
    ):
        assert path in document["paths"]


def test_every_event_type_is_emitted_somewhere() -> None:
    """A type listed in vpsshop.events.types (and so in the docs and the OpenAPI webhooks) that no code
    emits is a promise nobody keeps. Every ``emit(session, <type>, ...)`` call of vpsshop and its
    default plugins is read from the source: its type is a string, or (computed) one of the type
    names its module spells out."""
    import ast
    from pathlib import Path

    from vpsshop.events.types import EVENT_TYPES

    root = Path(__file__).parent.parent
    emitted: dict[str, list[str]] = {}
    for path in [*root.joinpath("vpsshop").rglob("*.py"), *root.joinpath("plugins").rglob("*.py")]:
        if path.name == "types.py" and path.parent.name == "events":
            continue
        tree = ast.parse(path.read_text())
        named = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in EVENT_TYPES}
        for call in ast.walk(tree):
            if not isinstance(call, ast.Call) or len(call.args) < 2:
                continue
            func = call.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)) != "emit":
                continue
            kind = call.args[1]
            found = {kind.value} if isinstance(kind, ast.Constant) else named
            for name in found:
                emitted.setdefault(name, []).append(str(path.relative_to(root)))
    never = sorted(set(EVENT_TYPES) - set(emitted))
    assert not never, f"event types listed but never emitted: {never}"
