"""Server snapshots through the API, on the simulator: taken, listed, restored and deleted by jobs
through the backend's snapshot verbs (read back from the simulated host), reported with events,
billed at renewal, refused where they cannot be, and gone with a reinstall or a termination. The real
guest's restored file is tests/test_real_guest.py."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from test_server_firewall import _active_server, _on_host

from vpsshop.models import Server
from vpsshop.servers.jobs import _handle, run_jobs
from vpsshop.testing import create_test_account

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def vpsshop_overrides(request, tmp_path) -> dict[str, Any]:
    overrides: dict[str, Any] = {"hypervisor": {"simulator": {"boot_seconds": 0}}, "servers": {"snapshots_max": 2}}
    if "priced" in request.node.name:  # the shipped catalog with a price for snapshots
        catalog = tmp_path / "catalog.toml"
        shipped = (REPO / "plugins" / "vpsshop_catalog" / "catalog.toml").read_text()
        catalog.write_text("snapshot_price_cents = 150\n" + shipped)
        overrides["catalog"] = {"file": {"path": str(catalog)}}
    return overrides


def _jobs(client) -> dict[str, int]:
    return asyncio.run(run_jobs(client.app.state.ctx))


def _mark(client, sid: int, marker: str) -> None:
    """Write a marker on the simulated disk (what the guest's files are, as far as the simulator goes)."""
    ctx = client.app.state.ctx
    with ctx.db.session() as session:
        handle = _handle(session.get(Server, sid))
    asyncio.run(ctx.hypervisor.mark_disk(handle, marker))


def _events(client, headers, kind: str) -> list[dict]:
    return client.get("/v1/events", headers=headers, params={"type": kind}).json()["events"]


def test_a_snapshot_is_taken_restored_and_deleted_by_jobs(vpsshop_client, vpsshop_account):
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    listed = client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()
    assert listed["snapshots"] == [] and listed["max_snapshots"] == 2
    _mark(client, sid, "before")
    taken = client.post(f"/v1/servers/{sid}/snapshots", headers=headers, json={"name": "before upgrade"})
    assert taken.status_code == 202, taken.text
    snap = taken.json()
    assert snap["status"] == "creating" and snap["name"] == "before upgrade" and snap["job_id"]
    assert _on_host(client, sid).snapshots == ()  # the job has not run yet
    assert _jobs(client)["done"] == 1
    assert _on_host(client, sid).snapshots == (f"snap-{snap['id']}",)
    (ready,) = client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()["snapshots"]
    assert ready["status"] == "ready" and ready["ready_at"] and ready["plan"] == "pup"
    (created,) = _events(client, headers, "server.snapshot_created")
    assert created["data"]["object"] == "snapshot" and created["data"]["id"] == snap["id"]

    _mark(client, sid, "after")  # the disk changes after the snapshot
    restore = client.post(f"/v1/servers/{sid}/snapshots/{snap['id']}/restore", headers=headers)
    assert restore.status_code == 202, restore.text
    assert restore.json()["server"]["status_reason"].startswith("Restoring snapshot")
    assert _jobs(client)["done"] == 1
    found = _on_host(client, sid)
    assert found.disk_marker == "before" and found.running == 1
    server = client.get(f"/v1/servers/{sid}", headers=headers).json()
    assert server["status_reason"] is None and server["power"] == "running"
    assert len(_events(client, headers, "server.snapshot_restored")) == 1

    deleted = client.delete(f"/v1/servers/{sid}/snapshots/{snap['id']}", headers=headers)
    assert deleted.status_code == 202 and deleted.json()["status"] == "deleting", deleted.text
    again = client.delete(f"/v1/servers/{sid}/snapshots/{snap['id']}", headers=headers)
    assert again.status_code == 409 and again.json()["error"] == "snapshot_not_ready"
    assert _jobs(client)["done"] == 1
    assert _on_host(client, sid).snapshots == ()
    assert client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()["snapshots"] == []
    assert len(_events(client, headers, "server.snapshot_deleted")) == 1
    gone = client.delete(f"/v1/servers/{sid}/snapshots/{snap['id']}", headers=headers)
    assert gone.status_code == 404 and gone.json()["error"] == "not_found"


def test_the_limit_unknown_snapshots_and_other_accounts(vpsshop_client, vpsshop_account):
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    first = client.post(f"/v1/servers/{sid}/snapshots", headers=headers).json()
    early = client.post(f"/v1/servers/{sid}/snapshots/{first['id']}/restore", headers=headers)
    assert early.status_code == 409 and early.json()["error"] == "snapshot_not_ready" and early.json()["message"]
    assert client.post(f"/v1/servers/{sid}/snapshots", headers=headers, json={}).status_code == 202
    full = client.post(f"/v1/servers/{sid}/snapshots", headers=headers)
    assert full.status_code == 409 and full.json()["error"] == "snapshot_limit_reached", full.text
    assert "2" in full.json()["message"]
    _jobs(client)
    for path in (f"/v1/servers/{sid}/snapshots/999999/restore", f"/v1/servers/{sid}/snapshots/abc/restore"):
        missing = client.post(path, headers=headers)
        assert missing.status_code == 404 and missing.json()["error"], missing.text
    bad = client.post(f"/v1/servers/{sid}/snapshots", headers=headers, json={"name": "x" * 65})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_name" and bad.json()["message"]
    other = create_test_account(client)
    assert client.get(f"/v1/servers/{sid}/snapshots", headers=other.headers).status_code == 404
    assert client.post(f"/v1/servers/{sid}/snapshots", headers=other.headers).status_code == 404
    restore = client.post(f"/v1/servers/{sid}/snapshots/{first['id']}/restore", headers=other.headers)
    assert restore.status_code == 404
    assert client.delete(f"/v1/servers/{sid}/snapshots/{first['id']}", headers=other.headers).status_code == 404
    # another server of the caller's does not reach this server's snapshot either
    own = _active_server(client, vpsshop_account)
    assert client.post(f"/v1/servers/{own}/snapshots/{first['id']}/restore", headers=headers).status_code == 404


def test_terminate_and_reinstall_leave_no_snapshot(vpsshop_client, vpsshop_account):
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    client.post(f"/v1/servers/{sid}/snapshots", headers=headers)
    _jobs(client)
    assert len(_on_host(client, sid).snapshots) == 1
    again = client.post(f"/v1/servers/{sid}/reinstall", headers=headers, json={"os": "debian-12"})
    assert again.status_code == 202, again.text
    assert client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()["snapshots"] == []
    _jobs(client)
    assert _on_host(client, sid).snapshots == ()
    client.post(f"/v1/servers/{sid}/snapshots", headers=headers)
    _jobs(client)
    assert len(_on_host(client, sid).snapshots) == 1
    assert client.delete(f"/v1/servers/{sid}", headers=headers).status_code in (200, 202)
    refused = client.post(f"/v1/servers/{sid}/snapshots", headers=headers)
    assert refused.status_code == 409 and refused.json()["error"] == "server_not_active"
    _jobs(client)
    assert _on_host(client, sid).resources == ()
    assert client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()["snapshots"] == []


def test_renewal_charges_the_snapshots_held_when_priced(vpsshop_client, vpsshop_account):
    """Nothing is charged when a snapshot is taken; a renewal charges the plan and each snapshot held."""
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    assert Decimal(str(client.get("/v1/catalog").json()["snapshot_monthly_usd"])) == Decimal("1.50")
    price = Decimal(str(client.get(f"/v1/servers/{sid}", headers=headers).json()["price_usd"]))
    balance = Decimal(str(client.get("/v1/account", headers=headers).json()["balance_usd"]))
    for _ in range(2):
        client.post(f"/v1/servers/{sid}/snapshots", headers=headers)
    _jobs(client)
    assert Decimal(str(client.get("/v1/account", headers=headers).json()["balance_usd"])) == balance
    quote = client.post(f"/v1/servers/{sid}/renew/quote", headers=headers, json={}).json()
    assert Decimal(str(quote["price_usd"])) == price + Decimal("3.00"), quote
    first = client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()["snapshots"][0]
    client.delete(f"/v1/servers/{sid}/snapshots/{first['id']}", headers=headers)
    before = Decimal(str(client.get("/v1/account", headers=headers).json()["balance_usd"]))
    renewed = client.post(f"/v1/servers/{sid}/renew", headers=headers, json={})
    assert renewed.status_code == 200, renewed.text
    after = Decimal(str(client.get("/v1/account", headers=headers).json()["balance_usd"]))
    assert before - after == price + Decimal("1.50")


def test_not_supported_without_the_capability(vpsshop_client, vpsshop_account):
    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    backend = client.app.state.ctx.hypervisor
    backend.capabilities = backend.capabilities - {"snapshots"}
    refused = client.post(f"/v1/servers/{sid}/snapshots", headers=headers)
    assert refused.status_code == 409 and refused.json()["error"] == "not_supported" and refused.json()["message"]


def test_the_dashboard_takes_restores_and_deletes_through_the_same_operations(vpsshop_client, vpsshop_account):
    from test_dashboard import D, post_form, sign_in

    client, headers = vpsshop_client, vpsshop_account.headers
    sid = _active_server(client, vpsshop_account)
    assert sign_in(client, vpsshop_account.login_token).status_code == 303
    assert f"{D}/servers/{sid}/snapshots" in client.get(f"{D}/servers/{sid}").text
    taken = post_form(client, f"{D}/servers/{sid}/snapshots", {"name": "nightly"})
    assert taken.status_code == 303, taken.text
    _jobs(client)
    (snap,) = client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()["snapshots"]
    assert snap["name"] == "nightly" and snap["status"] == "ready"
    page = client.get(f"{D}/servers/{sid}/snapshots").text
    assert "nightly" in page and f"/snapshots/{snap['id']}/restore" in page
    listing = f"{D}/servers/{sid}/snapshots"
    restored = post_form(client, f"{listing}/{snap['id']}/restore", {}, page=listing)
    assert restored.status_code == 303, restored.text
    assert _jobs(client)["done"] == 1
    assert len(_events(client, headers, "server.snapshot_restored")) == 1
    post_form(client, f"{D}/servers/{sid}/snapshots", {})
    full = post_form(client, f"{D}/servers/{sid}/snapshots", {})
    assert full.status_code == 409 and 'id="snapshot-error"' in full.text
    deleted = post_form(client, f"{listing}/{snap['id']}/delete", {}, page=listing)
    assert deleted.status_code == 303, deleted.text
    _jobs(client)
    assert [s["id"] for s in client.get(f"/v1/servers/{sid}/snapshots", headers=headers).json()["snapshots"]] != [
        snap["id"]
    ]
    assert _on_host(client, sid).snapshots and f"snap-{snap['id']}" not in _on_host(client, sid).snapshots
