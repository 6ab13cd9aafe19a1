"""A real Debian guest moved between the two hosts of one location, through ``vpsshop serve`` and
``vpsshop admin``: ordered while the second host is drained (so it lands on the first), a file written
over SSH, ``vpsshop admin migrate`` to the second host, then SSH answers on the same address with the
file intact, the first host keeps neither domain nor volumes, and the traffic counted before the move
is still counted after it (the new QEMU's interface counters start from zero).

The first host is the system libvirtd; the second a privileged libvirtd of this test in its own mount
namespace (tests/libvirt_peer.py ``NamespacedLibvirtd``): a bridged guest needs the nwfilter driver,
which a session-mode daemon has not. Both share this machine's network, so the guest joins one bridge
whichever host runs it, and each has its own pool of the same name in another directory.

One order, two boots (each about 1-3 minutes under TCG on a loaded machine).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import libvirt
import pytest
from chain_nodes import peer_workdir, remove_workdir
from libvirt_peer import GUEST_IMAGE, URI, NamespacedLibvirtd, guest_image_pool, isolated_network
from served import serve, shop_env
from test_admin import admin
from test_migrate import _row, _until_host
from test_real_guest import BOOT_SECONDS, _keypair, _libvirt_settings, ssh_with_key, wait_for_login
from test_real_guest_traffic import poll, toml_value

from vpsshop.servers.jobs import MIGRATING

REPO = Path(__file__).resolve().parents[1]
TAG = "vpsshop-move"
pytestmark = pytest.mark.slow


@pytest.fixture
def second_host(libvirtd_uri: str) -> Iterator[NamespacedLibvirtd]:
    workdir = peer_workdir("move-host")
    daemon = NamespacedLibvirtd(workdir)
    try:
        yield daemon
    finally:
        daemon.close()
        remove_workdir(workdir)


def test_a_guest_moved_to_another_host_answers_on_its_address_with_its_files(second_host, test_guest, tmp_path):
    pool = f"{TAG}-{uuid.uuid4().hex[:8]}"  # one name on both hosts, none other's on the system daemon
    with (
        guest_image_pool(URI, test_guest, tag=TAG, pool_name=pool) as (_, first_dir),
        guest_image_pool(second_host.uri, test_guest, tag=TAG, pool_name=pool) as (_, second_dir),
        isolated_network(URI, first="10.215", tag=TAG) as (network, prefix),
    ):
        bridge = libvirt.open(URI).networkLookupByName(network).bridgeName()
        settings = _libvirt_settings(pool, network, prefix, first_dir, (test_guest / "cmdline").read_text().strip())
        location = settings["locations"]["nl"]
        location["network"] = f"bridge:{bridge}"  # the Linux bridge both hosts' guests join
        location["hosts"] = [
            {"uri": URI, "name": "kvm0", "max_memory_mib": 4096},
            {"uri": second_host.uri, "name": "kvm1", "max_memory_mib": 4096},
        ]
        catalog = tmp_path / "catalog.toml"
        catalog.write_text(
            (REPO / "plugins" / "vpsshop_catalog" / "catalog.toml")
            .read_text()
            .replace("debian-12-genericcloud-amd64.qcow2", GUEST_IMAGE)
        )
        config = tmp_path / "vpsshop.toml"
        config.write_text(
            f"catalog = {toml_value({'file': {'path': str(catalog)}})}\n"
            f"hypervisor = {toml_value({'backend': 'libvirt', 'libvirt': settings})}\n"
            f"traffic = {toml_value({'sample_seconds': 5})}\n"
        )
        database = f"sqlite:///{tmp_path / 'shop.db'}"
        env = shop_env(database, VPSSHOP_CONFIG=str(config))
        key, public = _keypair(tmp_path)
        with serve(tmp_path, env) as served:
            base = served.base
            created = httpx.post(f"{base}/account").json()
            headers = {"Authorization": f"Bearer {created['api_key']}"}
            assert admin(env, tmp_path, "credit", str(created["user_id"]), "20", "--reason", "move").returncode == 0
            drained = admin(env, tmp_path, "host", "drain", "kvm1", "--reason", "the order must land on kvm0")
            assert drained.returncode == 0, drained.stderr
            stored = httpx.post(f"{base}/ssh-keys", headers=headers, json={"name": "t", "public_key": public}).json()
            order = {"plan": "pup", "location": "nl", "os": "debian-12", "hostname": "moving-one"}
            ordered = httpx.post(f"{base}/servers", headers=headers, json={**order, "ssh_keys": [stored["id"]]})
            assert ordered.status_code == 201, ordered.text
            sid = ordered.json()["server"]["id"]

            def server() -> dict:
                return httpx.get(f"{base}/servers/{sid}", headers=headers, timeout=10).json()

            try:
                shown = poll(server, lambda s: s["status"] != "provisioning", 2 * BOOT_SECONDS, "active")
                assert shown["status"] == "active", (shown, served.output()[-3000:])
                assert _row(database, sid)["host"] == "kvm0"  # the drained host got no order
                ip = shown["ip"]
                assert wait_for_login(ip, key, tmp_path) == "moving-one"
                written = ssh_with_key(
                    ip, key, "head -c 24 /dev/urandom | base64 > /root/marker && sync && cat /root/marker", tmp_path
                )
                marker = written.stdout.strip()
                assert written.returncode == 0 and len(marker) == 32, written
                counted = poll(server, lambda s: (s["traffic"] or {}).get("in_bytes", 0) > 0, 60, "a first sample")
                before = counted["traffic"]

                assert admin(env, tmp_path, "host", "undrain", "kvm1", "--reason", "ready").returncode == 0
                moved = admin(env, tmp_path, "migrate", str(sid), "--to", "kvm1", "--reason", "host maintenance")
                assert moved.returncode == 0 and "kvm0 -> kvm1" in moved.stdout, moved.stderr
                during = server()
                row = _until_host(database, sid, "kvm1", timeout=2 * BOOT_SECONDS)
                assert row["status"] == "active" and row["power"] == "running", row
                assert row["history"][-2:] == ["migrating", "migrated"], row["history"]
                after = server()
                assert after["ip"] == ip and after["status_reason"] is None, after

                # The same address answers SSH from the other host, with the file written before the move.
                assert wait_for_login(ip, key, tmp_path) == "moving-one"
                read = ssh_with_key(ip, key, "cat /root/marker", tmp_path)
                assert read.stdout.strip() == marker, read
                domain = second_host.virsh("list", "--name").stdout.split()
                assert len(domain) == 1 and f"{domain[0]}.qcow2" in {p.name for p in second_dir.iterdir()}
                assert not [d for d in libvirt.open(URI).listAllDomains() if f"{first_dir}/" in d.XMLDesc()]
                assert sorted(p.name for p in first_dir.iterdir()) == sorted([GUEST_IMAGE, "vmlinuz", "initrd.img"])

                # The usage of the period goes on from where it was: the new QEMU's counters start at zero.
                ssh_with_key(ip, key, "head -c 2000000 /dev/zero", tmp_path)
                grown = poll(
                    server,
                    lambda s: s["traffic"]["out_bytes"] >= before["out_bytes"] + 2_000_000,
                    60,
                    "traffic after the move",
                )["traffic"]
                assert grown["in_bytes"] >= before["in_bytes"] and grown["period_start"] == before["period_start"]
                kinds = [e["type"] for e in httpx.get(f"{base}/events", headers=headers).json()["events"]]
                assert "server.migrating" in kinds and "server.migrated" in kinds
                assert during["status_reason"] in (None, MIGRATING), during  # queued, or moving
            finally:
                ended = httpx.request("DELETE", f"{base}/servers/{sid}", headers=headers, timeout=60)
                assert ended.status_code in (200, 409), ended.text
                poll(server, lambda s: s["status"] == "terminated" and s["power"] is None, 180, "gone")
