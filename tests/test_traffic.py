"""Traffic per server and period (vpsshop/servers/traffic.py) on the hypervisor simulator, on a
FrozenClock: counting across counter resets, the throttle and suspend policies, their events, the
lift at renewal, the resource and /metrics' totals per host. tests/test_real_guest_traffic.py does it
on a real guest under libvirtd, measuring the throttled rate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlmodel import select

from vpsshop.metrics import DatabaseCollector
from vpsshop.servers.jobs import run_jobs
from vpsshop.servers.models import ServerTraffic
from vpsshop.servers.traffic import grown, run_traffic
from vpsshop.testing import create_test_account

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
ALLOWANCE = 1000


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {
        "hypervisor": {"backend": "simulator", "simulator": {"boot_seconds": 0}},
        "traffic": {"plan_allowance_bytes": {"pup": ALLOWANCE}, "throttle_kib_per_second": 64},
    }


def _active_server(client: Any) -> tuple[Any, int]:
    account = create_test_account(client)
    account.credit("20")
    ordered = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert ordered.status_code == 201, ordered.text
    sid = ordered.json()["server"]["id"]
    asyncio.run(run_jobs(client.app.state.ctx))
    assert _server(client, account, sid)["status"] == "active"
    return account, sid


def _server(client: Any, account: Any, sid: int) -> dict:
    response = client.get(f"/v1/servers/{sid}", headers=account.headers)
    assert response.status_code == 200, response.text
    return response.json()


def _handle(client: Any, sid: int) -> Any:
    from vpsshop.models import Server
    from vpsshop.servers.traffic import _handle as handle_of

    with client.app.state.ctx.db.session() as session:
        return handle_of(session.get(Server, sid))


def _traffic(client: Any, sid: int, received: int, sent: int) -> None:
    backend = client.app.state.ctx.hypervisor
    asyncio.run(backend.simulate_traffic(_handle(client, sid), received, sent))


def _sample(client: Any) -> Any:
    return asyncio.run(run_traffic(client.app.state.ctx))


def _cap(client: Any, sid: int) -> int | None:
    backend = client.app.state.ctx.hypervisor
    record = asyncio.run(backend.records.get(_handle(client, sid).domain))
    return record.data.get("bandwidth_kib")


def _event_types(client: Any, account: Any) -> list[str]:
    events = client.get("/v1/events", headers=account.headers).json()["events"]
    return [e["type"] for e in events]


def test_a_counter_that_went_down_started_again():
    assert grown(None, 500) == 500  # the first sample of a new guest: everything since it started
    assert grown(500, 800) == 300
    assert grown(800, 120) == 120  # rebooted or migrated: the counter started from zero


def test_traffic_is_counted_across_reboots_throttled_past_the_allowance_and_lifted_by_a_renewal(
    vpsshop_client, vpsshop_clock
):
    client = vpsshop_client
    account, sid = _active_server(client)
    assert _server(client, account, sid)["traffic"] is None  # not sampled yet
    _traffic(client, sid, 300, 200)
    assert _sample(client).sampled == 1
    traffic = _server(client, account, sid)["traffic"]
    assert (traffic["in_bytes"], traffic["out_bytes"], traffic["allowance_bytes"]) == (300, 200, ALLOWANCE)
    assert traffic["policy_applied"] is None and traffic["sampled_at"]
    _sample(client)  # the same counters again: nothing new
    assert _server(client, account, sid)["traffic"]["in_bytes"] == 300

    # A reboot starts the guest's counters again; what it moves after counts in full.
    assert client.post(f"/v1/servers/{sid}/reboot", headers=account.headers).status_code == 202
    asyncio.run(run_jobs(client.app.state.ctx))
    _traffic(client, sid, 100, 50)
    _sample(client)
    traffic = _server(client, account, sid)["traffic"]
    assert (traffic["in_bytes"], traffic["out_bytes"]) == (400, 250)
    assert _cap(client, sid) is None

    # Past the allowance (in and out together): throttled, once, with an event carrying the usage.
    _traffic(client, sid, 400, 0)
    assert _sample(client).throttled == 1
    server = _server(client, account, sid)
    assert server["traffic"]["policy_applied"] == "throttle" and server["status"] == "active"
    assert server["traffic"]["in_bytes"] + server["traffic"]["out_bytes"] == 1050
    assert _cap(client, sid) == 64
    _sample(client)
    assert _event_types(client, account).count("server.traffic_exceeded") == 1
    exceeded = next(
        e
        for e in client.get("/v1/events", headers=account.headers).json()["events"]
        if e["type"] == "server.traffic_exceeded"
    )
    assert exceeded["data"]["traffic"]["policy_applied"] == "throttle"
    # The dashboard's server page shows the usage against the allowance, and the throttle.
    from test_dashboard import D, sign_in

    assert sign_in(client, account.login_token).status_code == 303
    page = client.get(f"{D}/servers/{sid}").text
    assert "1.05 kB of 1 kB since" in page and "800 B in, 250 B out" in page, page
    assert "the speed is limited until the next renewal" in page

    # A renewal starts a new period: the next pass lifts the throttle, usage starts from zero.
    vpsshop_clock.advance(hours=1)
    assert client.post(f"/v1/servers/{sid}/renew", headers=account.headers).status_code == 200
    assert _sample(client).lifted == 1
    assert _cap(client, sid) is None
    traffic = _server(client, account, sid)["traffic"]
    assert (traffic["in_bytes"], traffic["out_bytes"], traffic["policy_applied"]) == (0, 0, None)
    assert traffic["period_start"] > server["traffic"]["period_start"]
    types = _event_types(client, account)
    assert types.index("server.traffic_restored") > types.index("server.renewed")
    _traffic(client, sid, 10, 5)
    _sample(client)
    assert (_server(client, account, sid)["traffic"]["in_bytes"], _cap(client, sid)) == (10, None)

    # Both periods are kept, and /metrics sums them per host.
    with client.app.state.ctx.db.session() as session:
        assert len(session.exec(select(ServerTraffic).where(ServerTraffic.server_id == sid)).all()) == 2
    families = {f.name: f for f in DatabaseCollector(client.app.state.ctx).collect()}
    samples = {(s.labels["host"], s.labels["direction"]): s.value for s in families["vpsshop_traffic_bytes"].samples}
    assert samples[("simulator", "in")] == 810 and samples[("simulator", "out")] == 255


@pytest.mark.parametrize("policy", ["suspend", "none"])
def test_the_suspend_and_none_policies(vpsshop_client, vpsshop_clock, policy):
    client = vpsshop_client
    client.app.state.ctx.settings.traffic.policy = policy
    account, sid = _active_server(client)
    _traffic(client, sid, ALLOWANCE, 1)
    _sample(client)
    server = _server(client, account, sid)
    assert server["traffic"]["policy_applied"] == policy
    assert _cap(client, sid) is None
    if policy == "none":
        assert server["status"] == "active"
        assert "server.suspended" not in _event_types(client, account)
        return
    assert server["status"] == "suspended" and "traffic allowance" in server["status_reason"]
    asyncio.run(run_jobs(client.app.state.ctx))
    assert _server(client, account, sid)["power"] == "stopped"
    types = _event_types(client, account)
    assert types.index("server.traffic_exceeded") < types.index("server.suspended")
    # A renewal resumes it with a new allowance.
    vpsshop_clock.advance(minutes=5)
    assert client.post(f"/v1/servers/{sid}/renew", headers=account.headers).status_code == 200
    asyncio.run(run_jobs(client.app.state.ctx))
    server = _server(client, account, sid)
    assert server["status"] == "active" and server["power"] == "running"
    assert server["traffic"]["policy_applied"] is None and server["traffic"]["in_bytes"] == 0


@pytest.mark.parametrize(("network", "counted"), [("network:default", True), ("bridge:br0", True), ("user", False)])
def test_libvirt_counts_and_shapes_only_tap_networks(network, counted):
    """QEMU's user networking has no tap device on the host: the libvirt backend then offers no traffic."""
    from vpsshop_libvirt import LibvirtBackend, _interfaces

    location = {"hosts": [{"uri": "qemu:///system"}], "pool": "p", "network": network, "addresses": "10.9.0.0/24"}
    backend = LibvirtBackend.from_settings(
        {"domain_type": "qemu", "locations": {"nl": location}}, sandbox=True, where="hypervisor.libvirt"
    )
    assert ("traffic" in backend.capabilities) is counted
    xml = (
        "<domain><devices><interface type='network'><mac address='52:54:00:00:00:01'/><target dev='vnet7'/>"
        "</interface><interface type='user'><mac address='52:54:00:00:00:02'/></interface></devices></domain>"
    )
    assert _interfaces(xml) == [("vnet7", "52:54:00:00:00:01"), (None, "52:54:00:00:00:02")]
