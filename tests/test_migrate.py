"""Drain and migrate on two real libvirtd hosts of one location: the contract kit's migrate check
(disk marker kept, the old host left empty, a retried move changing nothing) and placement avoiding a
drained host.

The two hosts are private libvirtd instances (tests/libvirt_peer.py ``PrivateLibvirtd``), each with
its own dir pool under the same pool name but at another path, so a moved qcow2 overlay must have its
backing file pointed at the target pool's base image. The base image is blank: nothing boots (the
real guest's move, SSH and all, is tests/test_real_guest.py's).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from chain_nodes import peer_workdir, remove_workdir
from libvirt_peer import PrivateLibvirtd

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
