"""Resizing a server to another plan through the API and MCP's operation, on the simulator (SQLite
and PostgreSQL) with a frozen clock: the quote, the prorated charge in the ledger, the job, the
refusals, and renewals at the new price.

The real guest (tests/test_real_guest.py) checks nproc, free and df after a resize on libvirtd.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlmodel import select

from vpsshop.money import usd_to_micros
from vpsshop.servers.jobs import _prepare, run_jobs
from vpsshop.servers.models import ServerEvent

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"boot_seconds": 0}}}


def _monthly(client: Any, plan: str) -> int:
    prices = client.get("/v1/catalog").json()["pricing"]
    return usd_to_micros(str(next(p["monthly_usd"] for p in prices if p["plan"] == plan and p["location"] == "nl")))


def test_resize_charges_the_quote_and_changes_the_plan(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, vpsshop_client.app.state.ctx
    vpsshop_clock.set(datetime(2026, 3, 3, 12, 0, 0, 250000).astimezone())
    account.credit("10")
    order = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert order.status_code == 201, order.text
    sid = order.json()["server"]["id"]
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    vpsshop_clock.advance(days=9, hours=5, seconds=17.6)

    server = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
    # Independently: the paid time left, whole seconds, at the price difference of one month.
    now = vpsshop_clock.now().replace(microsecond=0)
    expires, created = datetime.fromisoformat(server["expires_at"]), datetime.fromisoformat(server["created_at"])
    old, new = _monthly(client, "pup"), _monthly(client, "beagle")
    micro = timedelta(microseconds=1)
    left, period = (expires - now) // micro, (expires - created) // micro
    expected = (new * left // period - old * left // period) // 10**4 * 10**4  # rounded down to the cent

    quote = client.post(f"/v1/servers/{sid}/resize/quote", headers=account.headers, json={"plan": "beagle"})
    assert quote.status_code == 200, quote.text
    q = quote.json()
    assert usd_to_micros(str(q["price_usd"])) == expected and 0 < expected < new - old
    assert (q["plan"], usd_to_micros(str(q["period_price_usd"])), q["seconds_left"]) == ("beagle", new, left // 10**6)
    assert q["sufficient"] is True and Decimal(q["deficit_usd"]) == 0
    before = client.get("/v1/account", headers=account.headers).json()["balance_usd"]
    assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == before  # the quote wrote nothing

    resized = client.post(f"/v1/servers/{sid}/resize", headers=account.headers, json={"plan": "beagle"})
    assert resized.status_code == 202, resized.text
    body = resized.json()
    assert body["charged_usd"] == q["price_usd"] and body["status"] == "queued"
    assert body["server"]["plan"] == "beagle" and body["server"]["status_reason"].startswith("Resizing to plan beagle")
    debits = client.get("/v1/events", headers=account.headers, params={"type": "ledger.debit"}).json()["events"]
    entry = next(e["data"] for e in debits if e["data"]["reason"] == "resize")
    assert usd_to_micros(str(entry["amount_usd"])) == -expected and entry["ref"] == f"server:{sid}"
    after = client.get("/v1/account", headers=account.headers).json()["balance_usd"]
    assert usd_to_micros(str(before)) - usd_to_micros(str(after)) == expected

    again = client.post(f"/v1/servers/{sid}/resize", headers=account.headers, json={"plan": "collie"})
    assert again.status_code == 409 and again.json()["error"] == "resize_in_progress"
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    spec = _prepare(ctx, sid, "active")[1]
    record = asyncio.run(ctx.hypervisor._state().get(spec.name)).data
    assert (record["vcpu"], record["memory_mib"], record["disk_gib"], record["power"]) == (2, 4096, 60, "on")
    shown = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
    assert (shown["status_reason"], shown["power"], shown["plan"]) == (None, "running", "beagle")
    assert shown["expires_at"] == server["expires_at"]  # a resize does not move the paid period
    listed = client.get("/v1/events", headers=account.headers, params={"type": "server.*"}).json()
    assert [e["type"] for e in listed["events"]][-2:] == ["server.resizing", "server.resized"]
    assert listed["events"][-1]["data"] == {"object": "server", **shown}
    with ctx.db.session() as session:
        kinds = [e.kind for e in session.exec(select(ServerEvent).where(ServerEvent.server_id == sid))]
    assert kinds[-2:] == ["resize", "resized"]

    # Renewals bill the new plan.
    renewal = client.post(f"/v1/servers/{sid}/renew/quote", headers=account.headers).json()
    assert usd_to_micros(str(renewal["price_usd"])) == new

    # Refusals, nothing charged: a smaller disk, the same plan, an unknown plan, a short balance.
    for plan, status, error in (
        ("pup", 409, "disk_would_shrink"),
        ("beagle", 409, "same_plan"),
        ("great-dane", 400, "invalid_plan"),
    ):
        refused = client.post(f"/v1/servers/{sid}/resize", headers=account.headers, json={"plan": plan})
        assert (refused.status_code, refused.json()["error"]) == (status, error), refused.text
        assert refused.json()["message"]
    shrink = client.post(f"/v1/servers/{sid}/resize/quote", headers=account.headers, json={"plan": "terrier"})
    assert shrink.status_code == 409 and shrink.json()["disk_gib"] == 60
    dear = client.post(f"/v1/servers/{sid}/resize/quote", headers=account.headers, json={"plan": "husky"}).json()
    assert dear["sufficient"] is False
    short = client.post(f"/v1/servers/{sid}/resize", headers=account.headers, json={"plan": "husky"})
    assert short.status_code == 402 and short.json()["error"] == "insufficient_balance", short.text
    assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == after
    assert client.get(f"/v1/servers/{sid}", headers=account.headers).json()["plan"] == "beagle"

    # Terminating refunds the unused time at the new price: the resize charge counts as paid.
    exact = vpsshop_clock.now()
    refund = new * ((expires - exact) // micro) // period
    ended = client.request(
        "DELETE", f"/v1/servers/{sid}", headers=account.headers, json={"confirm_hostname": server["hostname"]}
    )
    assert ended.status_code == 200, ended.text
    assert usd_to_micros(str(ended.json()["refunded_usd"])) == refund > old * ((expires - exact) // micro) // period


def test_resize_of_another_accounts_server_is_not_found(vpsshop_client, vpsshop_account):
    from vpsshop.testing import create_test_account

    client, ctx = vpsshop_client, vpsshop_client.app.state.ctx
    vpsshop_account.credit("10")
    sid = client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER).json()["server"]["id"]
    asyncio.run(run_jobs(ctx))
    other = create_test_account(client)
    other.credit("50")
    for path in ("resize", "resize/quote"):
        response = client.post(f"/v1/servers/{sid}/{path}", headers=other.headers, json={"plan": "beagle"})
        assert response.status_code == 404 and response.json()["error"] == "not_found"
    assert client.get(f"/v1/servers/{sid}", headers=vpsshop_account.headers).json()["plan"] == "pup"
