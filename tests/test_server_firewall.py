"""A server's inbound firewall through the API, on the simulator: the rules are checked, stored, applied
by a job through the backend's set_firewall (read back from the simulated host), reported with
server.firewall_changed, and refused where they cannot be. The real guest's filtering is
tests/test_real_guest_firewall.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vpsshop import FirewallRule
from vpsshop.models import Server
from vpsshop.servers.jobs import _handle, run_jobs
from vpsshop.testing import create_test_account

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"boot_seconds": 0}}, "servers": {"firewall_max_rules": 3}}


def _active_server(client, account) -> int:
    account.credit("20")
    order = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert order.status_code == 201, order.text
    assert asyncio.run(run_jobs(client.app.state.ctx))["done"] == 1
    return order.json()["server"]["id"]


def _on_host(client, sid: int) -> Any:
    ctx = client.app.state.ctx
    with ctx.db.session() as session:
        server = session.get(Server, sid)
        handle = _handle(server)
    return asyncio.run(ctx.hypervisor.inspect(handle))


def test_rules_are_applied_by_a_job_and_reported(vpsshop_client, vpsshop_account):
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    fresh = _on_host(client, sid)
    assert fresh.anti_spoofing is True and fresh.firewall == ()
    assert client.get(f"/v1/servers/{sid}/firewall", headers=headers).json() == {
        "server_id": sid,
        "rules": [],
        "anti_spoofing": True,
        "job_id": None,
    }
    rules = [
        {"protocol": "tcp", "ports": 22},
        {"protocol": "tcp", "ports": "8000-8100", "source": "198.51.100.7/24"},
        {"protocol": "icmp", "source": "2001:db8::1"},
    ]
    put = client.put(f"/v1/servers/{sid}/firewall", headers=headers, json={"rules": rules})
    assert put.status_code == 200, put.text
    stored = [
        {"protocol": "tcp", "ports": "22", "source": None},
        {"protocol": "tcp", "ports": "8000-8100", "source": "198.51.100.0/24"},
        {"protocol": "icmp", "ports": None, "source": "2001:db8::1/128"},
    ]
    assert put.json()["rules"] == stored and put.json()["job_id"]
    assert _on_host(client, sid).firewall == ()  # the job has not run yet
    assert asyncio.run(run_jobs(client.app.state.ctx))["done"] == 1
    applied = _on_host(client, sid)
    assert set(applied.firewall) == {
        FirewallRule("tcp", 22, 22),
        FirewallRule("tcp", 8000, 8100, "198.51.100.0/24"),
        FirewallRule("icmp", source="2001:db8::1/128"),
    }
    assert applied.anti_spoofing is True
    server = client.get(f"/v1/servers/{sid}", headers=headers).json()
    assert server["firewall"] == stored
    listed = client.get("/v1/events", headers=headers, params={"type": "server.firewall_changed"}).json()["events"]
    assert len(listed) == 1 and listed[0]["data"]["firewall"] == stored
    # an empty list opens the server again
    assert client.put(f"/v1/servers/{sid}/firewall", headers=headers, json={"rules": []}).status_code == 200
    asyncio.run(run_jobs(client.app.state.ctx))
    assert _on_host(client, sid).firewall == ()
    assert client.get(f"/v1/servers/{sid}/firewall", headers=headers).json()["rules"] == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"rules": [{"protocol": "sctp"}]}, "invalid_rules"),
        ({"rules": [{"protocol": "tcp", "ports": "0"}]}, "invalid_rule"),
        ({"rules": [{"protocol": "tcp", "ports": "90-80"}]}, "invalid_rule"),
        ({"rules": [{"protocol": "tcp", "ports": "http"}]}, "invalid_rule"),
        ({"rules": [{"protocol": "icmp", "ports": "1"}]}, "invalid_rule"),
        ({"rules": [{"protocol": "tcp", "source": "10.0.0.0/33"}]}, "invalid_rule"),
        ({"rules": [{"protocol": "tcp", "ports": True}]}, "invalid_rules"),
        ({"rules": [{"protocol": "tcp", "port": 22}]}, "unknown_field"),
        ({"rules": [{"protocol": "tcp", "ports": p} for p in (1, 2, 3, 4)]}, "too_many_rules"),
        ({}, "invalid_rules"),
    ],
)
def test_bad_rules_are_refused_and_nothing_changes(vpsshop_client, vpsshop_account, body, code):
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    response = client.put(f"/v1/servers/{sid}/firewall", headers=headers, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == code and response.json()["message"]
    assert client.get(f"/v1/servers/{sid}/firewall", headers=headers).json()["rules"] == []


def test_another_accounts_server_and_a_terminated_one(vpsshop_client, vpsshop_account):
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    other = create_test_account(client)
    body = {"rules": [{"protocol": "tcp", "ports": 22}]}
    assert client.get(f"/v1/servers/{sid}/firewall", headers=other.headers).status_code == 404
    assert client.put(f"/v1/servers/{sid}/firewall", headers=other.headers, json=body).status_code == 404
    assert client.delete(f"/v1/servers/{sid}", headers=headers).status_code in (200, 202)
    refused = client.put(f"/v1/servers/{sid}/firewall", headers=headers, json=body)
    assert refused.status_code == 409 and refused.json()["error"] == "server_not_active"
    asyncio.run(run_jobs(client.app.state.ctx))
    assert _on_host(client, sid).resources == ()  # destroy removed the domain and its filter


def test_the_dashboard_edits_the_same_rules(vpsshop_client, vpsshop_account):
    """The dashboard's firewall page: the rules one a line, saved through the same operation."""
    import html

    from test_dashboard import D, post_form, sign_in

    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    assert sign_in(client, vpsshop_account.login_token).status_code == 303
    assert f"{D}/servers/{sid}/firewall" in client.get(f"{D}/servers/{sid}").text
    saved = post_form(
        client, f"{D}/servers/{sid}/firewall", {"rules": "tcp 22\n# the web\ntcp 8000-8100 198.51.100.0/24\n\nicmp\n"}
    )
    assert saved.status_code == 303, saved.text
    assert client.get(f"/v1/servers/{sid}/firewall", headers=headers).json()["rules"] == [
        {"protocol": "tcp", "ports": "22", "source": None},
        {"protocol": "tcp", "ports": "8000-8100", "source": "198.51.100.0/24"},
        {"protocol": "icmp", "ports": None, "source": None},
    ]
    page = html.unescape(client.get(f"{D}/servers/{sid}/firewall").text)
    assert "tcp 22\ntcp 8000-8100 198.51.100.0/24\nicmp</textarea>" in page
    bad = post_form(client, f"{D}/servers/{sid}/firewall", {"rules": "tcp 70000"})
    assert bad.status_code == 400 and 'id="firewall-error"' in bad.text and "tcp 70000" in bad.text
    assert len(client.get(f"/v1/servers/{sid}/firewall", headers=headers).json()["rules"]) == 3
    asyncio.run(run_jobs(client.app.state.ctx))
    assert len(_on_host(client, sid).firewall) == 3
