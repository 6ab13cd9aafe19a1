"""The operators' console drains, undrains and evacuates hosts and moves a server (the actions of
``vpsshop admin host`` and ``vpsshop admin migrate``), in process on the simulator with two hosts:
the Hosts page, the confirmation step, the owner-only moves, and the audit log."""

from __future__ import annotations

import asyncio
import io
import re
import time
from datetime import UTC
from html import unescape
from typing import Any

import pytest
from test_console import OWNER_PASSWORD, SHELL, console, csrf_of, ctx, sign_in  # noqa: F401 - fixtures
from test_images import POOL, _catalog, hosts, mirror  # noqa: F401 - fixtures
from test_images import _settings as _images_settings

from vpsshop import operators
from vpsshop.admin import audit_log
from vpsshop.servers.jobs import run_jobs


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {
        "hypervisor": {"simulator": {"hosts": ["sim-a", "sim-b"], "boot_seconds": 0}},
        "traffic": {"plan_allowance_bytes": {"pup": ALLOWANCE}},
    }


ALLOWANCE = 10_000


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


def _bytes(html: str, attribute: str, value: str, after: str = "") -> int | None:
    """The ``data-bytes`` of the element with ``attribute="value"`` (the first after ``after``)."""
    found = re.search(rf'{attribute}="{value}" data-bytes="(\d*)"', html[html.index(after) :] if after else html)
    assert found, (attribute, value)
    return int(found.group(1)) if found.group(1) else None


def _host_row(html: str, host: str) -> str:
    return next(row for row in re.findall(r"<tr>(.*?)</tr>", html, re.S) if f"<td>{host}</td>" in row)


def test_hosts_and_server_pages_show_the_traffic_the_api_shows_and_the_simulator_has_no_image_check(
    ctx,  # noqa: F811 - fixtures of test_console
    console,  # noqa: F811
    vpsshop_client,
    vpsshop_account,
    vpsshop_clock,
):
    """Each host's traffic is the sum of the current period of its servers as the API's ``traffic``
    shows it (a renewal starts a new period: the host's sum drops, /metrics' sum of every period does
    not); a server's page shows its API numbers, the allowance and the policy applied; the simulator
    says it has no image check instead of a table."""
    from vpsshop import shopview
    from vpsshop.backoffice.pages import images
    from vpsshop.dashboard.web import format_data_size
    from vpsshop.metrics import DatabaseCollector
    from vpsshop.models import Server
    from vpsshop.servers.traffic import _handle, run_traffic

    vpsshop_account.credit("30")
    owner = operators.add_operator(ctx, SHELL, "otto", "owner", OWNER_PASSWORD)
    sign_in(console, vpsshop_clock, "otto", OWNER_PASSWORD, owner.secret)
    small, big = _active(ctx, vpsshop_client, vpsshop_account), _active(ctx, vpsshop_client, vpsshop_account)
    with ctx.db.session() as session:
        handles = {sid: _handle(session.get(Server, sid)) for sid in (small, big)}
    for sid, (received, sent) in ((small, (1_500, 700)), (big, (ALLOWANCE, 2_345))):
        asyncio.run(ctx.hypervisor.simulate_traffic(handles[sid], received, sent))
    assert asyncio.run(run_traffic(ctx)).sampled == 2

    def api_traffic() -> dict[int, dict[str, Any]]:
        return {sid: _server(vpsshop_client, vpsshop_account.headers, sid)["traffic"] for sid in (small, big)}

    def expected_per_host(traffic: dict[int, dict[str, Any]]) -> dict[str, tuple[int, int]]:
        sums: dict[str, tuple[int, int]] = {}
        for sid, t in traffic.items():
            before = sums.get(_host_of(ctx, sid), (0, 0))
            sums[_host_of(ctx, sid)] = (before[0] + t["in_bytes"], before[1] + t["out_bytes"])
        return sums

    def shown_per_host() -> dict[str, tuple[int | None, int | None]]:
        page = console.get("/hosts")
        assert page.status_code == 200
        return {
            host: (
                _bytes(_host_row(page.text, host), "data-traffic", "in"),
                _bytes(_host_row(page.text, host), "data-traffic", "out"),
            )
            for host in ("sim-a", "sim-b")
        }

    traffic = api_traffic()
    assert traffic[big]["policy_applied"] == "throttle" and traffic[small]["policy_applied"] is None
    expected = expected_per_host(traffic)
    assert sum(t[0] + t[1] for t in expected.values()) > 0
    assert shopview.host_traffic(ctx) == expected
    shown = shown_per_host()
    assert shown == {host: expected.get(host, (0, 0)) for host in shown}
    hosts_page = console.get("/hosts").text
    in_a = expected[_host_of(ctx, small)][0]
    assert f">{format_data_size(in_a)}</td>" in _host_row(hosts_page, _host_of(ctx, small))

    # The simulator holds no base images: the page says so plainly, in the words of the image check.
    with pytest.raises(images.ImageError) as refused:
        asyncio.run(images.status(console.app.state.ctx))
    assert "Base images" in hosts_page and f"No image check here: {refused.value}." in hosts_page
    assert "data-state=" not in hosts_page

    # A server's page: the numbers of its API resource.
    for sid, t in traffic.items():
        page = console.get(f"/servers/{sid}").text
        assert "Traffic this period" in page
        for field in ("in_bytes", "out_bytes", "allowance_bytes"):
            assert _bytes(page, "data-field", field) == t[field], (sid, field)
        policy = re.search(r'data-field="policy_applied">([^<]*)<', page)
        assert policy and (policy.group(1) == t["policy_applied"] or t["policy_applied"] is None), policy
        assert t["policy_applied"] is not None or "within the allowance" in policy.group(1)
        start = re.search(r'data-field="period_start">([^<]*)<', page)
        assert start and _instant(start.group(1)) == _instant(t["period_start"])

    # A renewal starts a new period of the big server: its host's sum is of the new period alone,
    # while /metrics sums every period.
    vpsshop_clock.advance(hours=1)
    renewed = vpsshop_client.post(f"/v1/servers/{big}/renew", headers=vpsshop_account.headers)
    assert renewed.status_code == 200, renewed.text
    asyncio.run(ctx.hypervisor.simulate_traffic(handles[big], 321, 123))
    asyncio.run(run_traffic(ctx))
    after = api_traffic()
    console.cookies.clear()  # the hour ended the operator's session
    sign_in(console, vpsshop_clock, "otto", OWNER_PASSWORD, owner.secret)
    assert _instant(after[big]["period_start"]) > _instant(traffic[big]["period_start"])
    assert after[big]["policy_applied"] is None
    expected = expected_per_host(after)
    assert shopview.host_traffic(ctx) == expected
    assert shown_per_host() == {host: expected.get(host, (0, 0)) for host in ("sim-a", "sim-b")}
    families = {f.name: f for f in DatabaseCollector(ctx).collect()}
    metrics = {(s.labels["host"], s.labels["direction"]): s.value for s in families["vpsshop_traffic_bytes"].samples}
    big_host = _host_of(ctx, big)
    assert metrics[(big_host, "in")] > expected[big_host][0]  # the earlier period counts there, not here
    page = console.get(f"/servers/{big}").text
    assert _bytes(page, "data-field", "in_bytes") == after[big]["in_bytes"]


def _instant(text: str) -> Any:
    from datetime import datetime

    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _image_states(html: str) -> dict[tuple[str, str, str], str]:
    """(host, location, OS) -> the state the Hosts page's image table shows."""
    states = {}
    for host, location, row in re.findall(r'<tr data-host="([^"]+)" data-location="([^"]+)">(.*?)</tr>', html, re.S):
        for os_id, state in re.findall(r'data-os="([^"]+)" data-state="([^"]+)"', row):
            states[(host, location, os_id)] = state
    return states


def _libvirt_console(settings, clock):
    from starlette.testclient import TestClient

    from vpsshop.app import create_console_app

    return TestClient(create_console_app(settings, clock=clock), raise_server_exceptions=False)


def test_hosts_page_shows_what_each_libvirt_host_holds_as_images_status_finds_it(
    mirror,  # noqa: F811 - fixtures of test_images
    hosts,  # noqa: F811
    tmp_path,
):
    """Two private libvirtd hosts; tiny synced to both, then taken off host1 by hand: the page shows
    per host and OS the state :func:`vpsshop.images.status` computes (host0 holds tiny, host1 lacks
    it), then host1 stopped: unreachable there, host0 as before."""
    from vpsshop.assembly import build_context
    from vpsshop.clock import FrozenClock
    from vpsshop.images import status, sync

    settings = _images_settings(tmp_path, _catalog(tmp_path, *mirror), hosts)
    shop = build_context(settings)
    shop.db.migrate()
    try:
        assert [r.error for r in asyncio.run(sync(shop, tmp_path / "cache", io.StringIO(), only=["tiny"]))] == [None]
    finally:
        asyncio.run(shop.close())
    for name in ("tiny.qcow2", "tiny.qcow2.vpsshop-version"):
        deleted = hosts[1].virsh("vol-delete", "--pool", POOL, name)
        assert deleted.returncode == 0, deleted.stderr
    clock = FrozenClock()
    owner = operators.add_operator(shop, SHELL, "otto", "owner", OWNER_PASSWORD)

    def expected() -> dict[tuple[str, str, str], str]:
        check = build_context(settings)
        try:
            return {(r.host, r.location, r.os_id): r.state for r in asyncio.run(status(check))}
        finally:
            asyncio.run(check.close())

    with _libvirt_console(settings, clock) as client:
        sign_in(client, clock, "otto", OWNER_PASSWORD, owner.secret)
        page = client.get("/hosts")
        assert page.status_code == 200 and "No image check here" not in page.text
        wanted = expected()
        assert wanted[("host0", "nl", "tiny")] != "missing" and wanted[("host1", "nl", "tiny")] == "missing"
        assert _image_states(page.text) == wanted
        lacks = dict(
            re.findall(
                r'data-host="([^"]+)" data-location="nl">.*?<td class="wrap" data-lacks>([^<]*)<', page.text, re.S
            )
        )
        missing = {
            host: ", ".join(os_id for (h, _, os_id), state in wanted.items() if h == host and state == "missing")
            for host in ("host0", "host1")
        }
        assert lacks == missing and "tiny" in lacks["host1"] and "tiny" not in lacks["host0"]

        hosts[1].stop()
        try:
            stopped = expected()
            assert stopped[("host1", "nl", "tiny")] == "unreachable"
            assert _image_states(client.get("/hosts").text) == stopped
        finally:
            hosts[1].start()


def test_a_location_whose_host_does_not_answer_does_not_hold_up_the_hosts_page(
    hosts,  # noqa: F811 - fixtures of test_images
    mirror,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """A host that accepts the connection and never answers (a socket that reads nothing, as a host
    that lost its network): the page answers once the image check's time is up, saying so."""
    import socket
    import threading

    from vpsshop import images
    from vpsshop.assembly import build_context
    from vpsshop.clock import FrozenClock

    path = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.extend(iter(lambda: listener.accept()[0], None)), daemon=True).start()

    class Silent:
        uri = f"qemu+unix:///session?socket={path}"

    settings = _images_settings(tmp_path, _catalog(tmp_path, *mirror), [hosts[0], Silent()])
    shop = build_context(settings)
    shop.db.migrate()
    clock = FrozenClock()
    owner = operators.add_operator(shop, SHELL, "otto", "owner", OWNER_PASSWORD)
    monkeypatch.setattr(images, "STATUS_TIMEOUT_SECONDS", 1.0)
    try:
        with _libvirt_console(settings, clock) as client:
            sign_in(client, clock, "otto", OWNER_PASSWORD, owner.secret)
            started = time.monotonic()
            page = client.get("/hosts")
            took = time.monotonic() - started
            assert page.status_code == 200 and took < 10, took
            assert "the hosts of nl did not answer (waited at most 1.0 s)" in page.text
            assert {
                (h, loc) for h, loc in re.findall(r'<tr data-host="([^"]+)" data-location="([^"]+)">', page.text)
            } == {
                ("host0", "nl"),
                ("host1", "nl"),
            }
            for conn in accepted:  # the hung call ends: the backend can close
                conn.close()
            listener.close()
    finally:
        asyncio.run(shop.close())
