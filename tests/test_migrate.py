"""Drain and migrate on two real libvirtd hosts of one location: the contract kit's migrate check
(disk marker kept, the old host left empty, a retried move changing nothing) and placement avoiding a
drained host.

The two hosts are private libvirtd instances (tests/libvirt_peer.py ``PrivateLibvirtd``), each with
its own dir pool under the same pool name but at another path, so a moved qcow2 overlay must have its
backing file pointed at the target pool's base image. The base image is blank: nothing boots (the
real guest's move, SSH and all, is tests/test_real_guest_migrate.py's).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from chain_nodes import peer_workdir, remove_workdir
from libvirt_peer import PrivateLibvirtd
from served import active_server, serve, shop_env
from test_admin import ORDER, admin

from vpsshop.testing import HypervisorContract
from vpsshop_libvirt import LibvirtBackend

POOL = "vpsshop-migrate"
BASE_IMAGE = "debian-12-genericcloud-amd64.qcow2"


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[list[PrivateLibvirtd]]:
    """Two private libvirtd instances, each with a dir pool holding a blank base image."""
    started = []
    try:
        for index in range(2):
            workdir = peer_workdir(f"migrate-host{index}")
            daemon = PrivateLibvirtd(workdir)
            started.append(daemon)
            directory = workdir / f"pool-{index}"
            directory.mkdir()
            subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(directory / BASE_IMAGE), "1G"], check=True)
            for path in (directory, directory / BASE_IMAGE):
                shutil.chown(path, daemon.user.pw_uid, daemon.user.pw_gid)
            xml = workdir / "pool.xml"
            xml.write_text(f"<pool type='dir'><name>{POOL}</name><target><path>{directory}</path></target></pool>")
            created = daemon.virsh("pool-create", str(xml))
            assert created.returncode == 0, created.stderr
        yield started
    finally:
        for daemon in started:
            daemon.close()
            remove_workdir(daemon.dir)


def two_host_settings(hosts: list[PrivateLibvirtd]) -> dict[str, Any]:
    return {
        "domain_type": "qemu",
        "shutdown_grace_seconds": 2,
        "guest_reports": False,  # the blank base image boots no guest that could report
        "locations": {
            "nl": {
                "hosts": [
                    {"uri": daemon.uri, "name": f"kvm{index}", "max_memory_mib": 4096}
                    for index, daemon in enumerate(hosts)
                ],
                "pool": POOL,
                "network": "user",
                "addresses": "198.51.100.10-198.51.100.20",
                "gateway": "198.51.100.1",
            }
        },
    }


class TestLibvirtTwoHostsContract(HypervisorContract):
    """The whole kit against two real hosts of one location, migrate included."""

    @pytest.fixture
    def hypervisor_backend(self, two_hosts, hypervisor_run):
        backend = LibvirtBackend.from_settings(two_host_settings(two_hosts), sandbox=False, where="hypervisor.libvirt")
        assert backend.inspectable and "migrate" in backend.capabilities
        yield backend
        hypervisor_run(backend.close())
        for index, daemon in enumerate(two_hosts):
            assert sorted(p.name for p in (daemon.dir / f"pool-{index}").iterdir()) == [BASE_IMAGE]

    @pytest.fixture
    def hypervisor_spec_overrides(self) -> dict:
        return {"os_image": BASE_IMAGE}

    @pytest.fixture
    def hypervisor_guest_reports(self) -> bool:
        return False


def _row(url: str, server_id: int) -> dict[str, Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT host, status, status_reason, power FROM servers WHERE id = :id"), {"id": server_id}
            ).one()
            kinds = conn.execute(
                sa.text("SELECT kind FROM server_events WHERE server_id = :id ORDER BY id"), {"id": server_id}
            ).scalars()
            return {**row._asdict(), "history": list(kinds)}
    finally:
        engine.dispose()


def _until_host(url: str, server_id: int, host: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        row = _row(url, server_id)
        if row["host"] == host and row["status_reason"] is None:
            return row
        assert time.monotonic() < deadline, f"server {server_id} never moved to {host}: {row}"
        time.sleep(0.3)


def test_drain_migrate_and_evacuate_through_the_command_line(vpsshop_database_url, tmp_path):
    """`vpsshop admin host drain` keeps new orders off a host; `vpsshop admin migrate` moves a server
    (events and status_reason while it moves, its address kept); `host evacuate` drains and moves
    every server of a host; each with its audit entry. The shop runs the simulator with two hosts."""
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0.3",
        VPSSHOP__HYPERVISOR__SIMULATOR__HOSTS='["sim-a", "sim-b"]',
    )
    with serve(tmp_path, env) as api:
        drained = admin(env, tmp_path, "host", "drain", "sim-a", "--reason", "disk swap")
        assert drained.returncode == 0 and "drained" in drained.stdout, drained.stderr
        assert admin(env, tmp_path, "host", "drain", "sim-z", "--reason", "typo").returncode == 1
        headers, sid = active_server(api, tmp_path, env, ORDER, "migrate test")
        first = _row(vpsshop_database_url, sid)
        assert first["host"] == "sim-b", first  # the drained host got no order
        address = httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()["ip"]
        listed = json.loads(admin(env, tmp_path, "host", "list").stdout)
        assert [(h["host"], h["servers"]) for h in listed] == [("sim-a", 0)]

        assert admin(env, tmp_path, "host", "undrain", "sim-a", "--reason", "swapped").returncode == 0
        refused = admin(env, tmp_path, "migrate", str(sid), "--to", "sim-z", "--reason", "typo")
        assert refused.returncode == 1 and "not a host of location" in refused.stderr
        moved = admin(env, tmp_path, "migrate", str(sid), "--to", "sim-a", "--reason", "rebalance")
        assert moved.returncode == 0 and "sim-b -> sim-a" in moved.stdout, moved.stderr
        row = _until_host(vpsshop_database_url, sid, "sim-a")
        assert row["status"] == "active" and row["power"] == "running"
        assert row["history"][-2:] == ["migrating", "migrated"]
        server = httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()
        assert server["ip"] == address and server["status_reason"] is None
        kinds = [e["type"] for e in httpx.get(f"{api.base}/events", headers=headers).json()["events"]]
        assert "server.migrating" in kinds and "server.migrated" in kinds

        evacuated = admin(env, tmp_path, "host", "evacuate", "sim-a", "--reason", "decommission")
        assert evacuated.returncode == 0 and "sim-a -> sim-b" in evacuated.stdout, evacuated.stderr
        _until_host(vpsshop_database_url, sid, "sim-b")
        _, second = active_server(api, tmp_path, env, ORDER, "after evacuation")
        assert _row(vpsshop_database_url, second)["host"] == "sim-b"
    entries = json.loads(admin(env, tmp_path, "audit").stdout)[::-1]
    actions = [e["action"] for e in entries if e["action"] != "admin_credit"]
    assert actions == ["host_drain", "host_undrain", "migrate", "host_drain", "migrate"], actions
