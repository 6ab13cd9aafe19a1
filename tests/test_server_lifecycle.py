"""Provisioning jobs and the paid-period lifecycle against libvirt's test driver, on a FrozenClock.

The hypervisor here is the real libvirt plugin talking to libvirt's own ``test:///default`` driver
(the sandbox's backend); ``tests/test_libvirt.py`` runs the plugin against a real libvirtd.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime, timedelta
from pathlib import Path

import libvirt
import pytest
from sqlmodel import select

from vpsshop import ledger
from vpsshop.hypervisor import DomainState, ServerHandle
from vpsshop.models import LedgerEntry, Server
from vpsshop.servers.jobs import claim, run_jobs
from vpsshop.servers.lifecycle import add_months, run_lifecycle
from vpsshop.servers.models import IpLease, ServerEvent, ServerJob

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}  # 3.99 a month


def _ctx(client):
    return client.app.state.ctx


def _jobs(client) -> dict[str, int]:
    return asyncio.run(run_jobs(_ctx(client)))


def _lifecycle(client):
    return asyncio.run(run_lifecycle(_ctx(client)))


def _server(client, account, server_id) -> dict:
    return client.get(f"/v1/servers/{server_id}", headers=account.headers).json()


def _order(client, account) -> dict:
    response = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert response.status_code == 201, response.text
    return response.json()["server"]


def _row(client, server_id) -> Server:
    with _ctx(client).db.session() as session:
        return session.get(Server, server_id)


def _domain_state(client, server_id) -> DomainState:
    row = _row(client, server_id)
    return asyncio.run(_ctx(client).hypervisor.state(ServerHandle(row.host, row.domain)))


def _events(client, server_id) -> list[str]:
    with _ctx(client).db.session() as session:
        return [
            e.kind
            for e in session.exec(
                select(ServerEvent).where(ServerEvent.server_id == server_id).order_by(ServerEvent.id)
            )
        ]


def test_provisioning_job_makes_the_server_active(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("10")
    server = _order(vpsshop_client, vpsshop_account)
    assert _jobs(vpsshop_client) == {"done": 1, "retry": 0, "failed": 0}
    shown = _server(vpsshop_client, vpsshop_account, server["id"])
    assert shown["status"] == "active"
    assert shown["ip"].startswith("10.99.") and shown["ip"] != "10.99.0.1"
    row = _row(vpsshop_client, server["id"])
    assert row.host == "test" and row.domain.startswith(f"vps-{server['id']}-")
    conn = libvirt.open("test:///default")
    dom = conn.lookupByName(row.domain)
    assert dom.isActive() and dom.maxMemory() == 1024 * 1024  # 1024 MiB in KiB: the unit was explicit
    vols = conn.storagePoolLookupByName("default-pool").listVolumes()
    assert f"{row.domain}.qcow2" in vols and f"{row.domain}-seed.iso" in vols
    assert _events(vpsshop_client, server["id"]) == ["ordered", "provisioned"]
    assert _jobs(vpsshop_client) == {"done": 0, "retry": 0, "failed": 0}  # nothing runs twice


def test_two_servers_never_share_an_address(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("20")
    ids = [_order(vpsshop_client, vpsshop_account)["id"] for _ in range(3)]
    _jobs(vpsshop_client)
    ips = [_server(vpsshop_client, vpsshop_account, i)["ip"] for i in ids]
    assert len(set(ips)) == 3 and None not in ips
    with _ctx(vpsshop_client).db.session() as session:
        assert sorted(lease.address for lease in session.exec(select(IpLease))) == sorted(ips)


def test_full_lifecycle_renew_suspend_resume_terminate(vpsshop_client, vpsshop_account, vpsshop_clock):
    h = vpsshop_account.headers
    vpsshop_account.credit("4")
    server = _order(vpsshop_client, vpsshop_account)
    sid = server["id"]
    _jobs(vpsshop_client)
    expires = _row(vpsshop_client, sid).expires_at
    assert expires == add_months(vpsshop_clock.now(), 1)

    # Inside the 72-hour lead window, balance 0.01 cannot renew: noted once, nothing charged.
    vpsshop_clock.set(expires - timedelta(hours=48))
    _lifecycle(vpsshop_client)
    _lifecycle(vpsshop_client)
    assert _events(vpsshop_client, sid).count("renewal_failed") == 1
    assert _server(vpsshop_client, vpsshop_account, sid)["status"] == "active"

    # Past expiry: suspended once, the VM stopped, the disk kept.
    vpsshop_clock.set(expires + timedelta(minutes=1))
    assert _lifecycle(vpsshop_client).suspended == 1
    assert _lifecycle(vpsshop_client).suspended == 0
    assert _jobs(vpsshop_client)["done"] == 1
    shown = _server(vpsshop_client, vpsshop_account, sid)
    assert shown["status"] == "suspended" and "balance" in shown["status_reason"]
    assert _domain_state(vpsshop_client, sid) == DomainState.STOPPED
    assert vpsshop_client.post(f"/v1/servers/{sid}/reboot", headers=h).json()["error"] == "server_not_active"

    # Renew without funds: 402, still suspended.
    short = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=h)
    assert short.status_code == 402 and short.json()["deficit"] == 3.98

    # Top up and renew: active again from now, the VM started.
    vpsshop_account.credit("10")
    renewed = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=h)
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["charged_usd"] == 3.99
    assert renewed.json()["server"]["status"] == "active"
    assert datetime.fromisoformat(renewed.json()["server"]["expires_at"]) == add_months(vpsshop_clock.now(), 1)
    _jobs(vpsshop_client)
    assert _domain_state(vpsshop_client, sid) == DomainState.RUNNING

    # Auto-renewal from the balance (6.02 left): charged exactly once however many passes run.
    expires = _row(vpsshop_client, sid).expires_at
    vpsshop_clock.set(expires - timedelta(hours=71))
    assert _lifecycle(vpsshop_client).renewed == 1
    assert _lifecycle(vpsshop_client).renewed == 0
    assert _row(vpsshop_client, sid).expires_at == add_months(expires, 1)
    me = vpsshop_client.get("/v1/account", headers=h).json()
    assert me["balance_usd"] == 2.03

    # Next period cannot be paid: suspended at expiry, terminated after the 7-day grace period.
    expires = _row(vpsshop_client, sid).expires_at
    vpsshop_clock.set(expires + timedelta(hours=1))
    _lifecycle(vpsshop_client)
    _jobs(vpsshop_client)
    vpsshop_clock.set(expires + timedelta(days=6))
    assert _lifecycle(vpsshop_client).terminated == 0
    vpsshop_clock.set(expires + timedelta(days=7, minutes=1))
    assert _lifecycle(vpsshop_client).terminated == 1
    assert _lifecycle(vpsshop_client).terminated == 0
    _jobs(vpsshop_client)
    row = _row(vpsshop_client, sid)
    assert row.status == "terminated"
    assert _domain_state(vpsshop_client, sid) == DomainState.MISSING
    vols = libvirt.open("test:///default").storagePoolLookupByName("default-pool").listVolumes()
    assert not [v for v in vols if v.startswith(row.domain)]
    with _ctx(vpsshop_client).db.session() as session:
        assert session.exec(select(IpLease).where(IpLease.server_id == sid)).first() is None
        assert ledger.balance_from_entries(session, vpsshop_account.user_id) == 2_030_000
    assert vpsshop_client.get("/v1/account", headers=h).json()["servers"] == 0
    assert vpsshop_client.get(f"/v1/servers/{sid}/credentials", headers=h).status_code == 410
    assert vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=h).json()["error"] == "server_not_renewable"
    assert _events(vpsshop_client, sid) == [
        "ordered",
        "provisioned",
        "renewal_failed",
        "suspended",
        "renewed",
        "resumed",
        "renewed",
        "renewal_failed",
        "suspended",
        "terminated",
        "destroyed",
    ]


def test_power_actions_run_as_jobs(vpsshop_client, vpsshop_account):
    h = vpsshop_account.headers
    vpsshop_account.credit("10")
    sid = _order(vpsshop_client, vpsshop_account)["id"]
    assert vpsshop_client.post(f"/v1/servers/{sid}/stop", headers=h).json()["error"] == "server_not_active"
    _jobs(vpsshop_client)
    stop = vpsshop_client.post(f"/v1/servers/{sid}/stop", headers=h)
    assert stop.status_code == 202 and stop.json()["action"] == "stop"
    _jobs(vpsshop_client)
    assert _domain_state(vpsshop_client, sid) == DomainState.STOPPED
    assert vpsshop_client.post(f"/v1/servers/{sid}/reboot", headers=h).status_code == 202
    _jobs(vpsshop_client)
    assert _domain_state(vpsshop_client, sid) == DomainState.RUNNING
    vpsshop_client.post(f"/v1/servers/{sid}/stop", headers=h)
    vpsshop_client.post(f"/v1/servers/{sid}/start", headers=h)
    assert _jobs(vpsshop_client)["done"] == 2
    assert _domain_state(vpsshop_client, sid) == DomainState.RUNNING
    assert _server(vpsshop_client, vpsshop_account, sid)["status"] == "active"
    # each action, once its job has run, is an event of the account (and so a webhook)
    events = vpsshop_client.get("/v1/events", headers=h, params={"type": "server.*"}).json()["events"]
    assert [(e["type"], e["data"]["power"]) for e in events] == [
        ("server.provisioning", None),
        ("server.active", "running"),
        ("server.stopped", "stopped"),
        ("server.rebooted", "running"),
        ("server.stopped", "stopped"),
        ("server.started", "running"),
    ]


def test_renewal_under_an_idempotency_key_is_made_once(vpsshop_client, vpsshop_account):
    h = vpsshop_account.headers
    vpsshop_account.credit("20")
    sid = _order(vpsshop_client, vpsshop_account)["id"]
    _jobs(vpsshop_client)
    keyed = {**h, "Idempotency-Key": "renew-once"}
    first = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=keyed, json={"periods": 2})
    assert first.status_code == 200 and "Idempotent-Replayed" not in first.headers, first.text
    balance = vpsshop_client.get("/v1/account", headers=h).json()["balance_usd"]
    again = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=keyed, json={"periods": 2})
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()  # the first answer, charged once
    assert vpsshop_client.get("/v1/account", headers=h).json()["balance_usd"] == balance
    for body in ({"periods": 1}, {}):  # the same key, another renewal: refused, nothing charged
        changed = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=keyed, json=body)
        assert changed.status_code == 409 and changed.json()["error"] == "idempotency_key_reused", changed.text
    assert vpsshop_client.get("/v1/account", headers=h).json()["balance_usd"] == balance
    assert _server(vpsshop_client, vpsshop_account, sid)["expires_at"] == first.json()["server"]["expires_at"]
    bad = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers={**h, "Idempotency-Key": "two words"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_idempotency_key"


def test_server_changes_are_events(vpsshop_client, vpsshop_account):
    h = vpsshop_account.headers
    vpsshop_account.credit("10")
    sid = _order(vpsshop_client, vpsshop_account)["id"]
    _jobs(vpsshop_client)
    off = vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"auto_renew": False})
    assert off.status_code == 200 and off.json()["auto_renew"] is False
    same = vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"auto_renew": False})
    assert same.status_code == 200  # nothing changed: no event
    events = vpsshop_client.get("/v1/events", headers=h, params={"type": "server.updated"}).json()["events"]
    assert [e["data"]["auto_renew"] for e in events] == [False]


@pytest.fixture
def vpsshop_overrides():
    # For every test of this module (a fixture is one per module, wherever it is defined): the libvirt
    # plugin on its test driver, which the sandbox no longer picks by itself (it runs the simulator).
    return {"servers": {"provision_attempts": 3, "retry_seconds": 10}, "hypervisor": {"backend": "libvirt"}}


def test_failed_provisioning_retries_then_refunds(vpsshop_client, vpsshop_account, vpsshop_clock):
    ctx = _ctx(vpsshop_client)
    ctx.hypervisor.cfg.locations["*"].hosts[0].max_memory_mib = 512  # no host has room for 1024 MiB
    try:
        vpsshop_account.credit("5")
        sid = _order(vpsshop_client, vpsshop_account)["id"]
        assert _jobs(vpsshop_client)["retry"] == 1
        assert _jobs(vpsshop_client) == {"done": 0, "retry": 0, "failed": 0}  # waits for its retry time
        vpsshop_clock.advance(seconds=10)
        assert _jobs(vpsshop_client)["retry"] == 1
        vpsshop_clock.advance(seconds=20)
        # The last attempt fails; the clean-up destroy job it queues runs in the same pass.
        assert _jobs(vpsshop_client) == {"done": 1, "retry": 0, "failed": 1}
        shown = _server(vpsshop_client, vpsshop_account, sid)
        assert shown["status"] == "terminated"
        assert "after 3 attempts" in shown["status_reason"] and "MiB free" in shown["status_reason"]
        assert "refunded" in shown["status_reason"]
        assert vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()["balance_usd"] == 5
        with ctx.db.session() as session:
            refunds = session.exec(select(LedgerEntry).where(LedgerEntry.reason == "refund")).all()
            assert [(r.amount_micros, r.dedupe_key) for r in refunds] == [(3_990_000, f"refund:server:{sid}")]
        assert _jobs(vpsshop_client) == {"done": 0, "retry": 0, "failed": 0}
        assert "refunded" in _events(vpsshop_client, sid)
    finally:
        ctx.hypervisor.cfg.locations["*"].hosts[0].max_memory_mib = 1024 * 1024


def test_placement_picks_a_host_with_room(tmp_path: Path):
    from vpsshop.hypervisor import ServerSpec
    from vpsshop_libvirt import HostConfig, LibvirtBackend

    node = tmp_path / "node.xml"
    node.write_text(
        "<node><memory>4194304</memory>"
        f"<pool type='dir'><name>vms</name><target><path>{tmp_path}</path></target></pool></node>"
    )
    uri = f"test://{node}"
    backend = LibvirtBackend.from_settings(
        {
            "domain_type": "test",
            "locations": {
                "nl": {
                    "hosts": [
                        {"uri": uri, "name": "kvm1", "max_memory_mib": 2048},
                        {"uri": uri + "?b", "name": "kvm2", "max_memory_mib": 3072},
                    ],
                    "pool": "vms",
                }
            },
        },
        sandbox=False,
        where="hypervisor.libvirt",
    )

    def spec(n: int) -> ServerSpec:
        return ServerSpec(
            name=f"vps-{n}",
            hostname=f"h{n}",
            location="nl",
            vcpu=1,
            memory_mib=1024,
            disk_gib=20,
            os_id="debian-12",
            os_image="debian.qcow2",
            root_password="x" * 12,
        )

    placed = [asyncio.run(backend.create(spec(n))).host for n in range(5)]
    # kvm2 has more room first, then they alternate by free memory; a sixth does not fit anywhere.
    assert placed == ["kvm2", "kvm1", "kvm2", "kvm1", "kvm2"]
    from vpsshop import PluginError

    with pytest.raises(PluginError, match="no host in location nl has 1024 MiB free"):
        asyncio.run(backend.create(spec(6)))
    # Idempotent: creating an existing server again finds it where it is.
    assert asyncio.run(backend.create(spec(0))).host == "kvm2"
    assert HostConfig(uri="x").key == "x"


def test_claims_are_exclusive_and_survive_a_dead_worker(vpsshop_client, vpsshop_account, vpsshop_clock):
    ctx = _ctx(vpsshop_client)
    vpsshop_account.credit("100")
    for _ in range(12):
        _order(vpsshop_client, vpsshop_account)
    claimed: list[int] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        while (job := claim(ctx, worker=f"w{n}")) is not None:
            with lock:
                claimed.append(job.id)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == list(range(1, 13))  # each job claimed once, by one worker
    # Those workers "died" holding the jobs. After the lease runs out another worker takes them over.
    assert claim(ctx, worker="late") is None
    vpsshop_clock.advance(seconds=601)
    assert _jobs(vpsshop_client)["done"] == 12
    with ctx.db.session() as session:
        jobs = session.exec(select(ServerJob)).all()
        assert {(j.status, j.attempts) for j in jobs} == {("done", 2)}
    assert {
        s["status"] for s in vpsshop_client.get("/v1/servers", headers=vpsshop_account.headers).json()["servers"]
    } == {"active"}


def test_parallel_workers_provision_each_server_once_with_distinct_addresses(vpsshop_client, vpsshop_account):
    ctx = _ctx(vpsshop_client)
    vpsshop_account.credit("100")
    ids = [_order(vpsshop_client, vpsshop_account)["id"] for _ in range(10)]
    results: list[dict[str, int]] = []

    def worker(n: int) -> None:
        results.append(asyncio.run(run_jobs(ctx, worker=f"worker-{n}")))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r["done"] for r in results) == 10 and sum(r["retry"] + r["failed"] for r in results) == 0
    servers = [_server(vpsshop_client, vpsshop_account, i) for i in ids]
    assert {s["status"] for s in servers} == {"active"}
    assert len({s["ip"] for s in servers}) == 10
    for sid in ids:
        assert _events(vpsshop_client, sid) == ["ordered", "provisioned"]


def test_racing_lifecycle_passes_charge_a_renewal_once(vpsshop_client, vpsshop_account, vpsshop_clock):
    ctx = _ctx(vpsshop_client)
    vpsshop_account.credit("24")
    ids = [_order(vpsshop_client, vpsshop_account)["id"] for _ in range(3)]
    _jobs(vpsshop_client)
    vpsshop_clock.set(_row(vpsshop_client, ids[0]).expires_at - timedelta(hours=1))
    results = []
    errors: list[BaseException] = []

    def lifecycle() -> None:
        try:
            results.append(asyncio.run(run_lifecycle(ctx)))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=lifecycle) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.renewed for r in results) == 3, results
    with ctx.db.session() as session:
        renewals = session.exec(select(LedgerEntry).where(LedgerEntry.reason == "renewal")).all()
        assert len(renewals) == 3
        assert ledger.balance_from_entries(session, vpsshop_account.user_id) == 24_000_000 - 6 * 3_990_000
    for sid in ids:
        assert _events(vpsshop_client, sid) == ["ordered", "provisioned", "renewed"]


def test_background_tasks_of_serve_provision_on_their_own(vpsshop_settings, tmp_path):
    """With background tasks on (as `vpsshop serve` runs them) an order becomes active by itself."""
    import time

    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.testing import create_test_account

    settings = vpsshop_settings.model_copy(
        update={"servers": vpsshop_settings.servers.model_copy(update={"jobs_interval_seconds": 0.1})}
    )
    with TestClient(create_app(settings, background=True)) as client:
        account = create_test_account(client)
        account.credit("5")
        sid = client.post("/v1/servers", headers=account.headers, json=ORDER).json()["server"]["id"]
        for _ in range(100):
            server = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
            if server["status"] == "active":
                break
            time.sleep(0.1)
        assert server["status"] == "active" and server["ip"]


def test_auto_renew_off_means_suspension_at_expiry(vpsshop_client, vpsshop_account, vpsshop_clock):
    h = vpsshop_account.headers
    vpsshop_account.credit("20")
    sid = _order(vpsshop_client, vpsshop_account)["id"]
    _jobs(vpsshop_client)
    off = vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"auto_renew": False})
    assert off.status_code == 200 and off.json()["auto_renew"] is False
    bad = vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"auto_renew": "sometimes"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_auto_renew"
    expires = _row(vpsshop_client, sid).expires_at
    vpsshop_clock.set(expires - timedelta(hours=1))
    assert _lifecycle(vpsshop_client).renewed == 0
    vpsshop_clock.set(expires + timedelta(seconds=1))
    assert _lifecycle(vpsshop_client).suspended == 1
    assert vpsshop_client.get("/v1/account", headers=h).json()["balance_usd"] == 16.01
    assert vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"auto_renew": True}).json()["auto_renew"] is True
