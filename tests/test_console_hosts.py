"""The operators' console drains, undrains and evacuates hosts and moves a server (the actions of
``vpsshop admin host`` and ``vpsshop admin migrate``), in process on the simulator with two hosts:
the Hosts page, the confirmation step, the owner-only moves, and the audit log."""

from __future__ import annotations

import asyncio
import re
import time
from html import unescape
from typing import Any

import pytest
from test_console import OWNER_PASSWORD, SHELL, console, csrf_of, ctx, sign_in  # noqa: F401 - fixtures

from vpsshop import operators
from vpsshop.admin import audit_log
from vpsshop.servers.jobs import run_jobs


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"hosts": ["sim-a", "sim-b"], "boot_seconds": 0}}}


def _server(client, headers, server_id: int) -> dict[str, Any]:
    return client.get(f"/v1/servers/{server_id}", headers=headers).json()


def _active(shop, client, account) -> int:
    ordered = client.post(
        "/v1/servers", headers=account.headers, json={"plan": "pup", "location": "nl", "os": "debian-12"}
    )
    assert ordered.status_code == 201, ordered.text
    server_id = ordered.json()["server"]["id"]
    deadline = time.monotonic() + 30
    while _server(client, account.headers, server_id)["status"] != "active":
        assert time.monotonic() < deadline, _server(client, account.headers, server_id)
        asyncio.run(run_jobs(shop))
    return server_id


def _host_of(shop, server_id: int) -> str:
    from vpsshop.models import Server

    with shop.db.session() as session:
        server = session.get(Server, server_id)
        assert server is not None and server.host
        return server.host


def _text(html: str) -> str:
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)))


def test_hosts_page_drains_and_the_server_page_moves_a_server(
    ctx,  # noqa: F811 - fixtures of test_console
    console,  # noqa: F811
    vpsshop_client,
    vpsshop_account,
    vpsshop_clock,
):
    vpsshop_account.credit("20")
    support = operators.add_operator(ctx, SHELL, "sue", "support", "support password 1")
    owner = operators.add_operator(ctx, SHELL, "otto", "owner", OWNER_PASSWORD)
    sign_in(console, vpsshop_clock, "otto", OWNER_PASSWORD, owner.secret)

    listed = console.get("/hosts")
    assert listed.status_code == 200
    assert "sim-a" in listed.text and "sim-b" in listed.text and 'href="/hosts"' in listed.text
    csrf = csrf_of(listed.text)
    asked = console.post("/hosts/sim-a/drain", data={"csrf": csrf, "reason": "disk swap"})
    assert asked.status_code == 200 and "Confirm: drain sim-a" in asked.text
    assert "sim-a" not in [row["target"] for row in audit_log(ctx)]  # nothing done before the confirmation
    done = console.post("/hosts/sim-a/drain", data={"csrf": csrf, "reason": "disk swap", "confirm": "yes"})
    assert done.status_code == 200 and "drained" in done.text, done.text
    assert "drained since" in _text(console.get("/hosts").text) and "disk swap" in console.get("/hosts").text

    server_id = _active(ctx, vpsshop_client, vpsshop_account)
    assert _host_of(ctx, server_id) == "sim-b"  # the drained host got no new server
    address = _server(vpsshop_client, vpsshop_account.headers, server_id)["ip"]
    page = console.get(f"/servers/{server_id}")
    assert "Move to another host" in page.text and '<option value="sim-a" disabled>' in page.text

    undrained = console.post("/hosts/sim-a/undrain", data={"csrf": csrf, "reason": "swapped", "confirm": "yes"})
    assert undrained.status_code == 200 and "placed there again" in undrained.text
    asked = console.post(f"/servers/{server_id}/migrate", data={"csrf": csrf, "reason": "rebalance", "host": "sim-a"})
    assert asked.status_code == 200 and "Move server" in asked.text and "sim-a" in asked.text
    moved = console.post(
        f"/servers/{server_id}/migrate", data={"csrf": csrf, "reason": "rebalance", "host": "sim-a", "confirm": "yes"}
    )
    assert moved.status_code == 200 and "sim-b -&gt; sim-a" in moved.text, moved.text
    asyncio.run(run_jobs(ctx))
    assert _host_of(ctx, server_id) == "sim-a"
    after = _server(vpsshop_client, vpsshop_account.headers, server_id)
    assert (after["status"], after["ip"]) == ("active", address)
    again = console.post(
        f"/servers/{server_id}/migrate", data={"csrf": csrf, "reason": "x", "host": "sim-a", "confirm": "yes"}
    )
    assert again.status_code == 409 and "is on sim-a already" in again.text

    # a support operator may drain, not move servers
    console.cookies.clear()
    sign_in(console, vpsshop_clock, "sue", "support password 1", support.secret)
    csrf = csrf_of(console.get("/hosts").text)
    refused = console.post("/hosts/sim-a/evacuate", data={"csrf": csrf, "reason": "decommission", "confirm": "yes"})
    assert refused.status_code == 403 and "may not evacuate" in refused.text
    assert _host_of(ctx, server_id) == "sim-a"
    assert console.post("/hosts/sim-a/reboot", data={"csrf": csrf, "reason": "x"}).status_code == 404

    console.cookies.clear()
    sign_in(console, vpsshop_clock, "otto", OWNER_PASSWORD, owner.secret)
    csrf = csrf_of(console.get("/hosts").text)
    evacuated = console.post("/hosts/sim-a/evacuate", data={"csrf": csrf, "reason": "decommission", "confirm": "yes"})
    assert evacuated.status_code == 200 and "sim-a -&gt; sim-b" in evacuated.text, evacuated.text
    asyncio.run(run_jobs(ctx))
    assert _host_of(ctx, server_id) == "sim-b"
    actions = [(r["actor"], r["action"], r["target"]) for r in audit_log(ctx) if r["actor"] != "root"][::-1]
    assert actions == [
        ("console:otto", "host_drain", "host:sim-a"),
        ("console:otto", "host_undrain", "host:sim-a"),
        ("console:otto", "migrate", f"server:{server_id}"),
        ("console:sue", "evacuate_refused", "host:sim-a"),
        ("console:otto", "host_drain", "host:sim-a"),
        ("console:otto", "migrate", f"server:{server_id}"),
    ], actions


def test_hosts_page_says_when_the_backend_cannot_move_servers(
    ctx,  # noqa: F811 - fixtures of test_console
    console,  # noqa: F811
    vpsshop_clock,
    monkeypatch,
):
    owner = operators.add_operator(ctx, SHELL, "otto", "owner", OWNER_PASSWORD)
    sign_in(console, vpsshop_clock, "otto", OWNER_PASSWORD, owner.secret)
    console_ctx = console.app.state.ctx
    monkeypatch.setattr(console_ctx.hypervisor, "capabilities", frozenset())
    page = console.get("/hosts")
    assert page.status_code == 200 and "cannot move servers between hosts" in page.text
