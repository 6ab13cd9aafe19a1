"""The libvirt plugin against a real libvirtd running QEMU (TCG), started by this module.

``libvirtd_uri`` (tests/conftest.py, through tests/libvirt_peer.py) starts ``virtlogd -d`` and
``libvirtd -d`` (Debian packages in ``scripts/deps/apt-servers.txt``) unless a libvirtd already
answers, and stops what it started.
Guests run under TCG (``<domain type='qemu'>``), so /dev/kvm is not needed. There is no internet,
so the OS "base image" is a small blank qcow2 made with qemu-img: the domain still boots its
firmware and runs, which is all the lifecycle needs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest
from libvirt_peer import LibvirtdRelay
from seed_secrets import (
    attached_files,
    crypt_verifies,
    domain_host_files,
    files_holding,
    iso_files,
    seed_root_hash,
)

from vpsshop import DomainState, ServerSpec
from vpsshop.testing import HypervisorContract
from vpsshop_libvirt import LibvirtBackend, domain_xml

URI = "qemu:///system"
BASE_IMAGE = "debian-12-genericcloud-amd64.qcow2"  # the catalog's image name for debian-12


@pytest.fixture
def storage_pool(libvirtd_uri: str) -> Iterator[tuple[str, Path]]:
    """A transient dir pool holding a blank base image under the catalog's file name.

    It lives under /var/lib/libvirt/images because QEMU runs as libvirt-qemu, which cannot enter
    pytest's private temporary directories.
    """
    images = Path("/var/lib/libvirt/images")
    images.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="vpsshop-test-", dir=images))
    directory.chmod(0o755)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(directory / BASE_IMAGE), "1G"], check=True)
    name = f"vpsshop-test-{uuid.uuid4().hex[:8]}"
    conn = libvirt.open(libvirtd_uri)
    pool = conn.storagePoolCreateXML(
        f"<pool type='dir'><name>{name}</name><target><path>{directory}</path></target></pool>", 0
    )
    yield name, directory
    pool.destroy()
    conn.close()
    shutil.rmtree(directory)


def _settings(pool: str) -> dict:
    return {
        "domain_type": "qemu",
        "shutdown_grace_seconds": 2,
        "guest_reports": False,  # the blank base image boots no guest that could report
        "locations": {
            "nl": {
                "hosts": [{"uri": URI, "name": "local", "max_memory_mib": 4096}],
                "pool": pool,
                "network": "user",
                "addresses": "198.51.100.10-198.51.100.20",
                "gateway": "198.51.100.1",
            }
        },
    }


def _isoinfo(iso: Path, *args: str) -> str:
    return subprocess.run(["isoinfo", "-i", str(iso), *args], capture_output=True, text=True, check=True).stdout


def test_domain_lives_through_its_whole_life_on_real_libvirtd(storage_pool):
    pool_name, directory = storage_pool
    backend = LibvirtBackend.from_settings(_settings(pool_name), sandbox=False, where="hypervisor.libvirt")
    name = f"vps-t-{uuid.uuid4().hex[:6]}"
    spec = ServerSpec(
        name=name,
        hostname="web-1",
        location="nl",
        vcpu=1,
        memory_mib=256,
        disk_gib=5,
        os_id="debian-12",
        os_image=BASE_IMAGE,
        root_password="s3cret-Pass-42",
        ip="198.51.100.10",
        gateway="198.51.100.1",
        nameservers=("9.9.9.9",),
    )
    handle = asyncio.run(backend.create(spec))
    try:
        assert (handle.host, handle.domain, handle.ip) == ("local", name, "198.51.100.10")
        assert asyncio.run(backend.state(handle)) == DomainState.RUNNING
        conn = libvirt.open(URI)
        dom = conn.lookupByName(name)
        assert dom.isActive() and dom.maxMemory() == 256 * 1024  # KiB: the MiB unit was honoured
        xml = dom.XMLDesc()
        assert "bus='virtio'" in xml and "<model type='virtio'/>" in xml and "type='qemu'" in xml

        # The disk: a qcow2 overlay of the base image, sized to the plan.
        info = json.loads(
            subprocess.run(
                ["qemu-img", "info", "--output=json", "-U", str(directory / f"{name}.qcow2")],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert info["format"] == "qcow2" and info["virtual-size"] == 5 * 1024**3
        assert info["backing-filename"] == str(directory / BASE_IMAGE)

        # The NoCloud seed: volume id cidata, hostname, the root password's hash and the leased address.
        seed = directory / f"{name}-seed.iso"
        assert "Volume id: cidata" in _isoinfo(seed, "-d")
        user_data = _isoinfo(seed, "-R", "-x", "/user-data")
        assert user_data.startswith("#cloud-config\n")
        user = json.loads(user_data.split("\n", 1)[1])
        assert user["hostname"] == "web-1"
        assert crypt_verifies("s3cret-Pass-42", seed_root_hash(seed))
        # The password itself is in no file of the seed as the guest reads them, nor anywhere in the
        # pool (disk, seed image, base image), nor behind any device or file of the domain.
        assert set(iso_files(seed)) == {"/meta-data", "/user-data", "/network-config"}
        assert not any(b"s3cret-Pass-42" in data for data in iso_files(seed).values())
        assert domain_host_files(name)  # its definition and log at least
        assert files_holding(b"s3cret-Pass-42", [directory, *attached_files(xml), *domain_host_files(name)]) == []
        assert files_holding(seed_root_hash(seed).encode(), [directory]) == [str(seed)]  # the search finds
        assert user["ssh_pwauth"] is True and "PermitRootLogin yes" in user["write_files"][0]["content"]
        assert json.loads(_isoinfo(seed, "-R", "-x", "/meta-data"))["local-hostname"] == "web-1"
        network = json.loads(_isoinfo(seed, "-R", "-x", "/network-config"))
        eth = network["ethernets"]["primary"]
        assert eth["addresses"] == ["198.51.100.10/24"] and eth["routes"][0]["via"] == "198.51.100.1"

        # Creating again (a retried job) finds the same domain.
        assert asyncio.run(backend.create(spec)) == handle

        asyncio.run(backend.suspend(handle))
        assert asyncio.run(backend.state(handle)) == DomainState.STOPPED
        assert seed.exists() and (directory / f"{name}.qcow2").exists()  # suspension keeps the disk
        asyncio.run(backend.resume(handle))
        assert asyncio.run(backend.state(handle)) == DomainState.RUNNING
        asyncio.run(backend.reboot(handle))
        assert asyncio.run(backend.state(handle)) == DomainState.RUNNING
        assert asyncio.run(backend.check_ready()).ok
    finally:
        asyncio.run(backend.destroy(handle))
    assert asyncio.run(backend.state(handle)) == DomainState.MISSING
    assert sorted(p.name for p in directory.iterdir()) == [BASE_IMAGE]  # disk and seed removed
    asyncio.run(backend.destroy(handle))  # idempotent
    asyncio.run(backend.close())


def test_order_becomes_active_on_real_libvirtd(storage_pool, tmp_path):
    """The whole path: order through the API, the job provisions on libvirtd, credentials reveal."""
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.clock import FrozenClock
    from vpsshop.servers.jobs import run_jobs
    from vpsshop.servers.lifecycle import run_lifecycle
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, create_test_account

    pool_name, directory = storage_pool
    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path / 'shop.db'}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "hypervisor": {"backend": "libvirt", "libvirt": _settings(pool_name)},
            "servers": {"grace_days": 0},
        },
    )
    clock = FrozenClock()
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        ctx = client.app.state.ctx
        account = create_test_account(client)
        account.credit("10")
        order = client.post(
            "/v1/servers",
            headers=account.headers,
            json={"plan": "pup", "location": "nl", "os": "debian-12", "hostname": "api-test"},
        )
        assert order.status_code == 201, order.text
        sid, password = order.json()["server"]["id"], order.json()["root_password"]
        assert asyncio.run(run_jobs(ctx))["done"] == 1
        server = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
        assert server["status"] == "active" and server["ip"] == "198.51.100.10"
        creds = client.get(f"/v1/servers/{sid}/credentials", headers=account.headers).json()
        assert creds["password"] == password
        domain = next(p.name for p in directory.iterdir() if p.name.endswith("-seed.iso"))[: -len("-seed.iso")]
        user = json.loads(_isoinfo(directory / f"{domain}-seed.iso", "-R", "-x", "/user-data").split("\n", 1)[1])
        assert crypt_verifies(password, seed_root_hash(directory / f"{domain}-seed.iso"))
        assert user["hostname"] == "api-test" and files_holding(password.encode(), [directory]) == []
        assert libvirt.open(URI).lookupByName(domain).isActive()
        # Unpaid: suspended at expiry, terminated at once (grace 0): the domain and its volumes go.
        clock.set(ctx.clock.now().replace(year=ctx.clock.now().year + 1))
        asyncio.run(run_lifecycle(ctx))
        asyncio.run(run_jobs(ctx))
        asyncio.run(run_lifecycle(ctx))
        asyncio.run(run_jobs(ctx))
        assert client.get(f"/v1/servers/{sid}", headers=account.headers).json()["status"] == "terminated"
        with pytest.raises(libvirt.libvirtError):
            libvirt.open(URI).lookupByName(domain)
        assert sorted(p.name for p in directory.iterdir()) == [BASE_IMAGE]


def test_domain_xml_units_and_devices():
    from vpsshop_libvirt import LibvirtConfig, LocationConfig

    cfg = LibvirtConfig.model_validate(_settings("p") | {"domain_type": "kvm"})
    loc: LocationConfig = cfg.locations["nl"]
    spec = ServerSpec(
        name="vps-1-ab",
        hostname="h",
        location="nl",
        vcpu=2,
        memory_mib=4096,
        disk_gib=60,
        os_id="debian-12",
        os_image=BASE_IMAGE,
        root_password="x" * 12,
    )
    xml = domain_xml(spec, cfg, loc, "/p/vps-1-ab.qcow2", "/p/vps-1-ab-seed.iso")
    assert '<memory unit="MiB">4096</memory>' in xml and '<vcpu placement="static">2</vcpu>' in xml
    assert '<target dev="vda" bus="virtio" />' in xml and '<model type="virtio" />' in xml
    assert "<loader" not in xml and "firmware" not in xml  # BIOS: no firmware auto-selection
    assert "host-passthrough" in xml


def _contract_spec(name: str, location: str = "nl") -> ServerSpec:
    return ServerSpec(
        name=name,
        hostname="contract",
        location=location,
        vcpu=1,
        memory_mib=256,
        disk_gib=5,
        os_id="debian-12",
        os_image=BASE_IMAGE,
        root_password="contract-pass-1",
    )


def test_contract_on_the_sandbox_test_driver():
    from vpsshop.servers.contract import check_backend

    backend = LibvirtBackend.from_settings(None, sandbox=True, where="hypervisor.libvirt")
    name = f"vps-c-{uuid.uuid4().hex[:6]}"
    asyncio.run(check_backend(backend, _contract_spec(name, location="anywhere")))
    vols = libvirt.open("test:///default").storagePoolLookupByName("default-pool").listVolumes()
    assert not [v for v in vols if v.startswith(name)]


class TestLibvirtRealHostContract(HypervisorContract):
    """The whole kit, inspection included, against the real libvirtd: it looks at the host's domains
    and pool, marks the server's qcow2 disk, and counts guest starts and resets from libvirt's events.
    The guest boots nothing (a blank base image), so a reboot is the ACPI request and, unanswered
    for shutdown_grace_seconds, a reset."""

    @pytest.fixture
    def hypervisor_backend(self, storage_pool, hypervisor_run):
        # guest_reports on: the kit opens each domain's report channel, where nobody answers.
        settings = _settings(storage_pool[0]) | {"guest_reports": True}
        backend = LibvirtBackend.from_settings(settings, sandbox=False, where="hypervisor.libvirt")
        assert backend.inspectable and "guest_report" in backend.capabilities
        yield backend
        hypervisor_run(backend.close())
        assert sorted(p.name for p in storage_pool[1].iterdir()) == [BASE_IMAGE]

    @pytest.fixture
    def hypervisor_spec_overrides(self) -> dict:
        return {"os_image": BASE_IMAGE}

    @pytest.fixture
    def hypervisor_guest_reports(self) -> bool:
        return False  # the blank base image boots no guest: guest_report must come back with None


class _WithoutDiskContent:
    """libvirt's test driver keeps no volume content, so nothing can be marked on a disk or read back:
    the kit's inspection tests run against the real libvirtd (TestLibvirtRealHostContract)."""

    test_create_again_keeps_the_disk = None
    test_suspend_and_resume_keep_the_disk = None
    test_reboot_restarts_a_running_guest = None
    test_migrate = None  # nor can a volume be streamed from one host to another


class TestLibvirtTestDriverContract(_WithoutDiskContent, HypervisorContract):
    """The contract kit of vpsshop.testing against libvirt's test:///default driver (the sandbox's
    libvirt configuration)."""

    @pytest.fixture
    def hypervisor_backend(self, hypervisor_run):
        backend = LibvirtBackend.from_settings(None, sandbox=True, where="hypervisor.libvirt")
        assert not backend.inspectable
        yield backend
        hypervisor_run(backend.close())

    @pytest.fixture
    def hypervisor_location(self) -> str:
        return "anywhere"


class TestLibvirtOneLocationContract(_WithoutDiskContent, HypervisorContract):
    """The kit on a configuration with hosts in nl only: it serves nl, not fr, and creates nothing in fr."""

    @pytest.fixture
    def hypervisor_backend(self, hypervisor_run):
        settings = LibvirtBackend.sandbox_config()
        settings["locations"] = {"nl": settings["locations"]["*"]}
        backend = LibvirtBackend.from_settings(settings, sandbox=False, where="hypervisor.libvirt")
        yield backend
        hypervisor_run(backend.close())

    @pytest.fixture
    def hypervisor_unserved_location(self) -> str:
        return "fr"


def test_a_host_that_stops_answering_fails_calls_within_the_keepalive(libvirtd_uri, tmp_path):
    """A host that loses power or its network answers nothing and closes nothing: without keepalive
    probes a call would wait for TCP to give up (many minutes) while its job kept renewing its lease.
    Here the relay in front of libvirtd swallows everything, and the call fails within seconds."""
    relay = LibvirtdRelay(tmp_path / "libvirt.sock")
    settings = _settings("default")
    settings["locations"]["nl"]["hosts"] = [{"uri": relay.uri, "name": "far", "max_memory_mib": 4096}]
    settings.update(keepalive_interval_seconds=1, keepalive_count=2)
    backend = LibvirtBackend.from_settings(settings, sandbox=False, where="hypervisor.libvirt")
    try:
        assert asyncio.run(backend.check_ready()).ok  # connected, through the relay
        relay.freeze()
        started = time.monotonic()
        readiness = asyncio.run(asyncio.wait_for(backend.check_ready(), 60))
        waited = time.monotonic() - started
        assert not readiness.ok and "far" in readiness.detail
        assert waited < 15, f"the call waited {waited:.1f} s on a host that answers nothing"
    finally:
        relay.cut()
        asyncio.run(backend.close())


def test_the_report_channel_is_there_only_when_guests_report():
    """guest_reports = false (images without cloud-init or Python): no channel in the domain, so
    nothing depends on libvirt's socket for it."""
    from vpsshop.testing import contract_spec
    from vpsshop_libvirt import GUEST_CHANNEL, LibvirtConfig, domain_xml

    spec = contract_spec("nl", os_image=BASE_IMAGE)
    for reports in (True, False):
        cfg = LibvirtConfig.model_validate(_settings("p") | {"guest_reports": reports})
        xml = domain_xml(spec, cfg, cfg.locations["nl"], "/d.qcow2", "/s.iso")
        assert (GUEST_CHANNEL in xml) is reports


def test_kit_walk_with_the_firewall_on_a_libvirt_network(storage_pool, libvirtd_uri):
    """The kit's walk on a libvirt network, where the firewall capability is on: every domain gets
    its network filter (clean-traffic) from create on, set_firewall redefines it on the running
    domain and inspect reads it back, a reinstall keeps it, and destroy leaves no filter behind."""
    from libvirt_peer import host_can_shape, isolated_network

    from vpsshop.servers.contract import check_hypervisor, contract_spec

    with isolated_network(libvirtd_uri, tag="vpsshop-fw") as (network, prefix):
        settings = _settings(storage_pool[0])
        settings["locations"]["nl"] |= {
            "network": f"network:{network}",
            "addresses": f"{prefix}.10-{prefix}.20",
            "gateway": f"{prefix}.1",
            "ipv6": f"fd42:{prefix.split('.')[1]}:{prefix.split('.')[2]}::/64",
        }
        backend = LibvirtBackend.from_settings(settings, sandbox=False, where="hypervisor.libvirt")
        assert "firewall" in backend.capabilities and backend.inspectable
        if not host_can_shape():
            # a kernel without sfq (this CI VM's) refuses libvirt's every bandwidth cap: this walk is
            # the firewall's; the traffic verbs are walked by the simulator's kit and the real guest
            backend.capabilities = backend.capabilities - {"traffic"}
        name = f"vps-fw-{uuid.uuid4().hex[:6]}"
        spec = contract_spec(
            "nl", name=name, os_image=BASE_IMAGE, ip=f"{prefix}.11", ipv6=f"fd42:1:2::{uuid.uuid4().hex[:3]}"
        )
        try:
            asyncio.run(check_hypervisor(backend, spec, guest_reports=False))
        finally:
            asyncio.run(backend.close())
        names = libvirt.open(URI).listNWFilters()
        assert not [n for n in names if name in n], names
