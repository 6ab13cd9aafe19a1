"""A real Debian guest, booted under QEMU TCG on a real libvirtd, ordered and reached through the API.

The guest is the image ``scripts/build-test-guest.sh`` builds from Debian packages (cached outside
the repository, so only the first run pays the few minutes of debootstrap). It boots by direct
kernel boot with the shop's NoCloud seed ISO; a real cloud-init reads the seed. The guest sits on
a transient, isolated libvirt network of its own (no DHCP, no dnsmasq) whose bridge has the
gateway address, so this host reaches the leased address directly, and logs in with OpenSSH's
client: as root with the ordered key, then with the password. Once it is in, no file on the host
(the pool, the domain's disk and seed cdrom, libvirtd's files for it) holds the password in clear:
the seed carried only its hash. The same boot then serves a reinstall and a snapshot: a file
deleted after the snapshot is back once the snapshot is restored, and after the termination no
domain, volume or snapshot of the server is left on the host.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import libvirt
import pytest
from libvirt_peer import GUEST_IMAGE, URI, guest_image_pool, ipv6_prefix, isolated_network
from seed_secrets import attached_files, crypt_verifies, domain_host_files, files_holding, seed_root_hash

REPO = Path(__file__).resolve().parents[1]
IMAGE = GUEST_IMAGE
BOOT_SECONDS = 420
"""Upper bound for a boot under TCG on a loaded 2-core machine (about 60 s when quiet)."""
pytestmark = pytest.mark.slow


@pytest.fixture
def guest_pool(libvirtd_uri: str, test_guest: Path) -> Iterator[tuple[str, Path]]:
    """A transient dir pool with the guest image, kernel and initrd (readable by libvirt-qemu)."""
    with guest_image_pool(libvirtd_uri, test_guest) as pool:
        yield pool


@pytest.fixture
def guest_network(libvirtd_uri: str) -> Iterator[tuple[str, str]]:
    """A transient isolated network: (libvirt network name, /24 prefix such as "10.213.7")."""
    with isolated_network(libvirtd_uri) as network:
        yield network


def _libvirt_settings(pool: str, network: str, prefix: str, boot_dir: Path, cmdline: str) -> dict:
    return {
        "domain_type": "qemu",  # TCG: KVM is nested here and the guest crashes under it
        "shutdown_grace_seconds": 5,
        "kernel_boot": {
            IMAGE: {
                "kernel": str(boot_dir / "vmlinuz"),
                "initrd": str(boot_dir / "initrd.img"),
                "cmdline": cmdline,
                "format": "raw",
            }
        },
        "locations": {
            "nl": {
                "hosts": [{"uri": URI, "name": "local", "max_memory_mib": 4096}],
                "pool": pool,
                "network": f"network:{network}",
                "addresses": f"{prefix}.10-{prefix}.20",
                "gateway": f"{prefix}.1",
                "nameservers": [f"{prefix}.1"],
                "ipv6": f"{ipv6_prefix(prefix)}/64",
                "ipv6_gateway": f"{ipv6_prefix(prefix)}1",
            }
        },
    }


def _keypair(directory: Path) -> tuple[Path, str]:
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "guest-test", "-f", str(key)], check=True)
    return key, (directory / "id_ed25519.pub").read_text().strip()


def _ssh_options(known_hosts: Path) -> list[str]:
    # A reinstalled guest has new host keys; remembering the old ones would disable password login.
    return [
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "BatchMode=no",
        "-o",
        "LogLevel=ERROR",
    ]


def ssh_with_key(ip: str, key: Path, command: str, tmp: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "ssh",
            *_ssh_options(tmp / "known_hosts"),
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            str(key),
            f"root@{ip}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def ssh_with_password(ip: str, password: str, command: str, tmp: Path) -> subprocess.CompletedProcess:
    """OpenSSH's client reads the password from SSH_ASKPASS (forced, no terminal needed)."""
    askpass = tmp / "askpass.sh"
    askpass.write_text("#!/bin/sh\nprintf '%s\\n' \"$VPSSHOP_TEST_PASSWORD\"\n")
    askpass.chmod(0o700)
    env = {
        **os.environ,
        "SSH_ASKPASS": str(askpass),
        "SSH_ASKPASS_REQUIRE": "force",
        "VPSSHOP_TEST_PASSWORD": password,
        "DISPLAY": ":0",
    }
    return subprocess.run(
        [
            "ssh",
            *_ssh_options(tmp / "known_hosts"),
            "-o",
            "PubkeyAuthentication=no",
            "-o",
            "PreferredAuthentications=password,keyboard-interactive",
            "-o",
            "NumberOfPasswordPrompts=1",
            f"root@{ip}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )


class BannerWatch:
    """Notes, from this host, the first moment the guest's SSH daemon answers: the time the TCP
    connection that then brought its banner was accepted (polled every 0.1 s). Under TCG the daemon
    takes about half a second to re-execute itself for each connection before its banner comes, so
    the banner's arrival would lag the moment it started answering by that much."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.first: float | None = None  # time.time() of the first banner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and self.first is None:
            try:
                with socket.create_connection((self.ip, 22), timeout=0.5) as sock:
                    accepted = time.time()
                    sock.settimeout(5)
                    if sock.recv(64).startswith(b"SSH-"):
                        self.first = accepted
                        return
            except OSError:
                pass
            time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def run_jobs_until(ctx: Any, client: Any, headers: dict, sid: int, done: Any, timeout: float = BOOT_SECONDS) -> dict:
    """Run the worker's job passes until ``done(server)`` holds; return the server."""
    from vpsshop.servers.jobs import run_jobs

    deadline = time.monotonic() + timeout
    while True:
        asyncio.run(run_jobs(ctx))
        server = client.get(f"/v1/servers/{sid}", headers=headers).json()
        if done(server):
            return server
        assert time.monotonic() < deadline, f"server {sid} not done within {timeout:g} s: {server}"
        time.sleep(0.5)


def dashboard_known_hosts(client: Any, account: Any, sid: int) -> str:
    """The known_hosts lines the dashboard's server page shows, signed in with the login token."""
    import html
    import re

    from test_dashboard import D, sign_in

    assert sign_in(client, account.login_token).status_code == 303
    page = client.get(f"{D}/servers/{sid}").text
    found = re.search(r'<pre class="known-hosts" id="known-hosts"[^>]*>(.*?)</pre>', page, re.S)
    assert found, "the server page shows no known_hosts lines"
    return html.unescape(found.group(1))


def keyscan_fingerprints(ip: str) -> set[str]:
    """SHA256 fingerprints of the host keys ``ssh-keyscan`` sees from this host."""
    out = subprocess.run(["ssh-keyscan", "-T", "5", ip], capture_output=True, text=True, timeout=60).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            digest = hashlib.sha256(base64.b64decode(parts[2])).digest()
            found.add("SHA256:" + base64.b64encode(digest).decode().rstrip("="))
    return found


def ssh_strict(ip: str, key: Path, known_hosts: Path, command: str) -> subprocess.CompletedProcess:
    """An SSH login that trusts only ``known_hosts`` (StrictHostKeyChecking=yes)."""
    return subprocess.run(
        [
            "ssh",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=10",
            "-i",
            str(key),
            f"root@{ip}",
            command,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def wait_for_login(ip: str, key: Path, tmp: Path, timeout: float = BOOT_SECONDS, expect_errors: bool = False) -> str:
    """Poll until root logs in with ``key``; return the guest's hostname. cloud-init's verdict on the
    first boot must be ``done`` (``error`` with ``expect_errors``)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((ip, 22), timeout=3):
                pass
        except OSError as exc:
            last = str(exc)
            time.sleep(3)
            continue
        try:  # cloud-init's last stage may still be running: wait for it inside the guest
            done = ssh_with_key(
                ip,
                key,
                "cloud-init status --wait --long; hostname",
                tmp,
                timeout=max(10.0, deadline - time.monotonic()),
            )
        except subprocess.TimeoutExpired:
            last = "cloud-init did not finish"
            continue
        if done.stdout.strip():  # logged in: cloud-init's verdict on the first boot, then the hostname
            *status, hostname = done.stdout.strip().splitlines()
            if expect_errors:
                assert "status: error" in status, "the first boot was expected to fail:\n" + "\n".join(status)
            else:
                assert "status: done" in status, "the first boot ended in cloud-init errors:\n" + "\n".join(status)
            return hostname
        last = done.stderr.strip()
        time.sleep(3)
    raise AssertionError(f"no root login with the ordered key on {ip} within {timeout:g} s: {last}")


def assert_password_only_hashed(
    domain: Any, directory: Path, passwords: list[str], ip: str, key: Path, tmp: Path
) -> None:
    """Once the guest is ready: the seed it booted from carries the root password's hash (the host's
    crypt(3) checks it), and no file of the pool, behind a device of the domain (its disk with the
    guest's cloud-init cache and /etc/shadow, the seed cdrom, the base image, kernel and initrd) or
    kept by libvirtd for it holds any of ``passwords``."""
    name = domain.name()
    xml = domain.XMLDesc()
    seed, disk = directory / f"{name}-seed.iso", directory / f"{name}.qcow2"
    assert {str(seed), str(disk)} <= {str(p) for p in attached_files(xml)}  # the cdrom and disk it runs on
    hashed = seed_root_hash(seed)
    assert crypt_verifies(passwords[-1], hashed)
    # What the guest wrote is on the disk file before it is searched (QEMU passes the flush through).
    assert ssh_with_key(ip, key, "sync", tmp).returncode == 0
    searched = [directory, *attached_files(xml), *domain_host_files(name)]
    for password in passwords:
        assert files_holding(password.encode(), searched) == [], "the root password in clear on the host"
    # The search does see what cloud-init wrote inside the guest: the hash, in /etc/shadow and its cache.
    # (The seed holds it in clear unless the customer's user data is a script: then the seed is a MIME
    # message whose parts are base64.)
    found = files_holding(hashed.encode(), [directory])
    assert str(disk) in found and set(found) <= {str(seed), str(disk)}, found


def test_ordered_guest_boots_logs_in_reinstalls_restores_a_snapshot_and_shows_its_console(
    guest_pool, guest_network, test_guest, tmp_path
):
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, create_test_account

    pool_name, directory = guest_pool
    network, prefix = guest_network
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        (REPO / "plugins" / "vpsshop_catalog" / "catalog.toml")
        .read_text()
        .replace("debian-12-genericcloud-amd64.qcow2", IMAGE)
    )
    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path / 'shop.db'}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "catalog": {"file": {"path": str(catalog)}},
            "hypervisor": {
                "backend": "libvirt",
                "libvirt": _libvirt_settings(
                    pool_name, network, prefix, directory, (test_guest / "cmdline").read_text().strip()
                ),
            },
        },
    )
    key, public = _keypair(tmp_path)
    with TestClient(create_app(settings, background=False)) as client:
        ctx = client.app.state.ctx
        account = create_test_account(client)
        account.credit("50")
        stored = client.post("/v1/ssh-keys", headers=account.headers, json={"name": "laptop", "public_key": public})
        assert stored.status_code == 201, stored.text
        order = client.post(
            "/v1/servers",
            headers=account.headers,
            json={
                "plan": "pup",
                "location": "nl",
                "os": "debian-12",
                "hostname": "guest-one",
                "ssh_keys": [stored.json()["id"]],
                "user_data": "#cloud-config\nwrite_files:\n- path: /etc/vpsshop-user-data\n  content: hello\n",
            },
        )
        assert order.status_code == 201, order.text
        sid, password = order.json()["server"]["id"], order.json()["root_password"]
        banner = BannerWatch(f"{prefix}.10")  # the first address of the pool
        try:
            server = run_jobs_until(ctx, client, account.headers, sid, lambda s: s["status"] != "provisioning")
        finally:
            banner.stop()
        assert server["status"] == "active" and server["ip"] == f"{prefix}.10", server
        ip = server["ip"]
        # Ready no earlier than the SSH banner, and within 2 s of it; the guest's own host keys.
        assert server["status_reason"] is None and server["ready_at"] and banner.first is not None, server
        ready = datetime.fromisoformat(server["ready_at"]).timestamp()
        assert banner.first <= ready + 0.1, f"active {banner.first - ready:.2f} s before SSH answered"
        assert ready - banner.first < 2.0, f"active {ready - banner.first:.2f} s after the SSH banner"
        reported = {k["fingerprint"] for k in server["host_keys"]}
        assert reported and reported == keyscan_fingerprints(ip), server["host_keys"]
        domain = libvirt.open(URI).lookupByName(
            next(p.name for p in directory.iterdir() if p.name.endswith("-seed.iso"))[: -len("-seed.iso")]
        )
        try:
            assert "<kernel>" in domain.XMLDesc() and domain.isActive()
            assert wait_for_login(ip, key, tmp_path) == "guest-one"
            # IPv6: the advertised address (the pool's first, ::100) is on the guest's interface, SSH
            # answers on it with the same host keys, and the guest routes through the gateway given
            ipv6 = server["ipv6"]
            assert ipv6 == f"{ipv6_prefix(prefix)}100" and server["ipv6_prefix"] is None, server
            over_v6 = ssh_with_key(ipv6, key, "hostname; ip -6 -o addr show scope global; ip -6 route", tmp_path)
            assert over_v6.returncode == 0 and over_v6.stdout.startswith("guest-one\n"), over_v6.stderr
            assert f"inet6 {ipv6}/64" in over_v6.stdout, over_v6.stdout
            assert f"default via {ipv6_prefix(prefix)}1 " in over_v6.stdout, over_v6.stdout
            assert keyscan_fingerprints(ipv6) == reported
            # The dashboard's known_hosts lines: a client that trusts only them logs in.
            known_hosts = tmp_path / "known_hosts_strict"
            known_hosts.write_text(dashboard_known_hosts(client, account, sid))
            assert {line.split()[0] for line in known_hosts.read_text().splitlines()} == {f"{ip},{ipv6}"}
            strict = ssh_strict(ip, key, known_hosts, "hostname")
            assert strict.returncode == 0 and strict.stdout.strip() == "guest-one", strict.stderr
            unknown = tmp_path / "known_hosts_other"
            unknown.write_text(f"{ip} ssh-ed25519 {public.split()[1]}\n")  # a key that is not the server's
            assert ssh_strict(ip, key, unknown, "true").returncode != 0
            user_data = ssh_with_key(ip, key, "cat /etc/vpsshop-user-data; cat /root/.ssh/authorized_keys", tmp_path)
            assert user_data.returncode == 0 and user_data.stdout.startswith("hello")
            assert public.rsplit(" ", 1)[0] in user_data.stdout
            by_password = ssh_with_password(ip, password, "id -u", tmp_path)
            assert by_password.returncode == 0 and by_password.stdout.strip() == "0", by_password.stderr
            wrong = ssh_with_password(ip, password + "x", "id -u", tmp_path)
            assert wrong.returncode != 0
            assert_password_only_hashed(domain, directory, [password], ip, key, tmp_path)
            assert ssh_with_key(ip, key, "touch /root/old-disk", tmp_path).returncode == 0

            # Reinstall with a second key and a generated password: a new disk, the old file gone.
            key2, public2 = _keypair(tmp_path / "second")
            stored2 = client.post(
                "/v1/ssh-keys", headers=account.headers, json={"name": "second", "public_key": public2}
            ).json()
            # Its user data fails in cloud-init's last stage (a script that exits 1): reported, not ready.
            again = client.post(
                f"/v1/servers/{sid}/reinstall",
                headers=account.headers,
                json={
                    "os": "debian-12",
                    "ssh_keys": [stored2["id"]],
                    "user_data": "#!/bin/sh\necho broken\nexit 1\n",
                },
            )
            assert again.status_code == 202, again.text
            new_password = again.json()["root_password"]
            assert new_password and new_password != password
            import vpsshop.servers.jobs as jobs

            waits, jobs.REPORT_WAIT_SECONDS = jobs.REPORT_WAIT_SECONDS, 0.5
            try:  # the new disk is made and the guest boots; the job goes on waiting for its report later
                asyncio.run(jobs.run_jobs(ctx, limit=1))
            finally:
                jobs.REPORT_WAIT_SECONDS = waits
            domain = libvirt.open(URI).lookupByName(domain.name())

            # Straight away, while it boots: the boot messages through the console WebSocket.
            ticket = client.post(f"/v1/servers/{sid}/console", headers=account.headers).json()
            seen = b""
            with client.websocket_connect(ticket["url"]) as ws:
                deadline = time.monotonic() + BOOT_SECONDS
                while b"login:" not in seen and time.monotonic() < deadline:
                    seen += ws.receive_bytes()
            text = seen.decode(errors="replace")
            assert "login:" in text and "guest-one" in text, text[-2000:]
            assert "cloud-init" in text or "systemd" in text or "Reached target" in text, text[-2000:]

            failed = run_jobs_until(
                ctx, client, account.headers, sid, lambda s: not (s["status_reason"] or "").startswith("Reinstalling")
            )
            assert failed["status"] == "active" and failed["ready_at"] is None, failed
            assert "first boot finished with errors" in failed["status_reason"], failed
            assert "scripts-user" in failed["status_reason"], failed
            kinds = [e["type"] for e in client.get("/v1/events", headers=account.headers).json()["events"]]
            assert "server.boot_failed" in kinds and kinds.count("server.reinstalled") == 0, kinds
            renewed = {k["fingerprint"] for k in failed["host_keys"]}
            assert renewed and renewed.isdisjoint(reported) and renewed == keyscan_fingerprints(ip)
            assert wait_for_login(ip, key2, tmp_path, expect_errors=True) == "guest-one"
            assert ssh_with_key(ip, key2, "test ! -e /root/old-disk", tmp_path).returncode == 0
            assert ssh_with_key(ip, key, "true", tmp_path).returncode != 0  # the first key is gone
            by_new = ssh_with_password(ip, new_password, "id -u", tmp_path)
            assert by_new.returncode == 0 and by_new.stdout.strip() == "0", by_new.stderr
            assert_password_only_hashed(domain, directory, [password, new_password], ip, key2, tmp_path)

            # A snapshot (disk and memory of the running guest), a file deleted after it, the snapshot
            # restored: the file is back. The snapshot is left for the termination to remove.
            assert ssh_with_key(ip, key2, "echo kept > /root/snapshot-file && sync", tmp_path).returncode == 0
            taken = client.post(f"/v1/servers/{sid}/snapshots", headers=account.headers, json={"name": "before rm"})
            assert taken.status_code == 202, taken.text
            snap_id = taken.json()["id"]
            snapshots_url = f"/v1/servers/{sid}/snapshots"
            run_jobs_until(
                ctx,
                client,
                account.headers,
                sid,
                lambda s: (
                    client.get(snapshots_url, headers=account.headers).json()["snapshots"][0]["status"] != "creating"
                ),
            )
            (ready,) = client.get(snapshots_url, headers=account.headers).json()["snapshots"]
            assert ready["status"] == "ready", ready
            assert domain.snapshotListNames() == [f"snap-{snap_id}"]
            removed = ssh_with_key(
                ip, key2, "rm /root/snapshot-file && sync && test ! -e /root/snapshot-file", tmp_path
            )
            assert removed.returncode == 0, removed.stderr
            restore = client.post(f"{snapshots_url}/{snap_id}/restore", headers=account.headers)
            assert restore.status_code == 202, restore.text
            restored = run_jobs_until(
                ctx, client, account.headers, sid, lambda s: not (s["status_reason"] or "").startswith("Restoring")
            )
            assert restored["status"] == "active" and restored["power"] == "running", restored
            kinds = [e["type"] for e in client.get("/v1/events", headers=account.headers).json()["events"]]
            assert "server.snapshot_created" in kinds and "server.snapshot_restored" in kinds, kinds
            assert wait_for_login(ip, key2, tmp_path, expect_errors=True) == "guest-one"
            back = ssh_with_key(ip, key2, "cat /root/snapshot-file", tmp_path)
            assert back.returncode == 0 and back.stdout.strip() == "kept", back.stderr

            # The customer ends it: nothing of it is left on the host (domain, disk, seed image, snapshots).
            name = domain.name()
            ended = client.request("DELETE", f"/v1/servers/{sid}", headers=account.headers)
            assert ended.status_code == 200 and ended.json()["status"] == "terminated", ended.text
            run_jobs_until(ctx, client, account.headers, sid, lambda s: s["ip"] is None, timeout=120)
            assert name not in [d.name() for d in libvirt.open(URI).listAllDomains()]
            assert sorted(p.name for p in directory.iterdir()) == sorted([IMAGE, "vmlinuz", "initrd.img"])
            assert client.get(snapshots_url, headers=account.headers).json()["snapshots"] == []
            metadata = Path("/var/lib/libvirt/qemu/snapshot") / name  # libvirtd's record of the domain's snapshots
            assert not metadata.exists() or not any(metadata.iterdir()), list(metadata.iterdir())
        finally:
            try:
                if domain.isActive():
                    domain.destroy()
                domain.undefine()
            except libvirt.libvirtError:
                pass  # terminated by the test: gone already
            for vol in libvirt.open(URI).storagePoolLookupByName(pool_name).listAllVolumes():
                if vol.name() not in (IMAGE, "vmlinuz", "initrd.img"):
                    vol.delete(0)


GROWN_PLAN = """
[[plans]]
id = "pup-plus"
name = "Pup Plus"
vcpu = 2
memory_mib = 1536
disk_gib = 24
bandwidth_tb = 1
base_price_cents = 599
"""
"""A plan one size up from ``pup`` (a vCPU, 512 MiB and 4 GiB more): small enough for this machine."""


class HeldClock:
    """The wall clock moved on by ``offset``, or held at one instant while ``held`` is set: the
    worker's retries need time to pass, the quote and the resize are priced at one instant."""

    def __init__(self) -> None:
        from datetime import UTC

        self.utc = UTC
        self.offset = timedelta()
        self.held: datetime | None = None

    def now(self) -> datetime:
        return self.held or datetime.now(self.utc) + self.offset


def _guest_sizes(ip: str, key: Path, tmp: Path) -> tuple[int, int, int]:
    """(nproc, total memory in MiB as `free -m` shows it, size of / in bytes as `df` shows it) in the guest."""
    out = ssh_with_key(ip, key, "nproc; free -m | awk '/^Mem:/ {print $2}'; df -B1 --output=size / | tail -1", tmp)
    assert out.returncode == 0, out.stderr
    nproc, memory, disk = (int(v) for v in out.stdout.split())
    return nproc, memory, disk


LOADED_BOOT_SECONDS = 1200
"""This test boots its guest twice, on a machine whose load may be several times its cores."""


def test_a_resized_guest_has_the_new_plan_and_paid_the_quote(guest_pool, guest_network, test_guest, tmp_path):
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.money import usd_to_micros
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, create_test_account

    pool_name, directory = guest_pool
    network, prefix = guest_network
    catalog = tmp_path / "catalog.toml"
    shipped = (REPO / "plugins" / "vpsshop_catalog" / "catalog.toml").read_text()
    catalog.write_text(shipped.replace("debian-12-genericcloud-amd64.qcow2", IMAGE) + GROWN_PLAN)
    libvirt_settings = _libvirt_settings(
        pool_name, network, prefix, directory, (test_guest / "cmdline").read_text().strip()
    )
    libvirt_settings["locations"]["nl"]["hosts"][0]["max_memory_mib"] = 16384  # other guests share this host
    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path / 'shop.db'}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "catalog": {"file": {"path": str(catalog)}},
            "hypervisor": {"backend": "libvirt", "libvirt": libvirt_settings},
            "servers": {"boot_timeout_seconds": 2 * LOADED_BOOT_SECONDS},
        },
    )
    # The quote and the resize are priced at one instant, days into the paid period.
    clock = HeldClock()
    key, public = _keypair(tmp_path)
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        ctx = client.app.state.ctx
        account = create_test_account(client)
        account.credit("20")
        stored = client.post("/v1/ssh-keys", headers=account.headers, json={"name": "laptop", "public_key": public})
        order = client.post(
            "/v1/servers",
            headers=account.headers,
            json={
                "plan": "pup",
                "location": "nl",
                "os": "debian-12",
                "hostname": "grows",
                "ssh_keys": [stored.json()["id"]],
            },
        )
        assert order.status_code == 201, order.text
        sid = order.json()["server"]["id"]
        server = run_jobs_until(
            ctx, client, account.headers, sid, lambda s: s["status"] != "provisioning", LOADED_BOOT_SECONDS
        )
        assert server["status"] == "active", server
        ip = server["ip"]
        try:
            assert wait_for_login(ip, key, tmp_path, LOADED_BOOT_SECONDS) == "grows"
            nproc, memory, disk = _guest_sizes(ip, key, tmp_path)
            assert nproc == 1 and 800 < memory <= 1024 and 19 * 2**30 < disk <= 20 * 2**30, (nproc, memory, disk)
            assert ssh_with_key(ip, key, "echo kept > /root/before-resize; sync", tmp_path).returncode == 0

            clock.offset = timedelta(days=11, hours=3, seconds=41)
            clock.held = clock.now()
            quote = client.post(f"/v1/servers/{sid}/resize/quote", headers=account.headers, json={"plan": "pup-plus"})
            assert quote.status_code == 200, quote.text
            price = usd_to_micros(str(quote.json()["price_usd"]))
            assert price > 0 and quote.json()["sufficient"], quote.json()
            balance = usd_to_micros(str(client.get("/v1/account", headers=account.headers).json()["balance_usd"]))
            resized = client.post(f"/v1/servers/{sid}/resize", headers=account.headers, json={"plan": "pup-plus"})
            assert resized.status_code == 202, resized.text
            assert usd_to_micros(str(resized.json()["charged_usd"])) == price
            debits = client.get("/v1/events", headers=account.headers, params={"type": "ledger.debit"}).json()
            entry = next(e["data"] for e in debits["events"] if e["data"]["reason"] == "resize")
            assert usd_to_micros(str(entry["amount_usd"])) == -price and entry["ref"] == f"server:{sid}"
            after = usd_to_micros(str(client.get("/v1/account", headers=account.headers).json()["balance_usd"]))
            assert balance - after == price
            clock.held = None

            done = run_jobs_until(
                ctx, client, account.headers, sid, lambda s: s["status_reason"] is None, LOADED_BOOT_SECONDS
            )
            assert (done["plan"], done["power"], done["status"]) == ("pup-plus", "running", "active"), done
            assert wait_for_login(ip, key, tmp_path, LOADED_BOOT_SECONDS) == "grows"
            nproc, memory, disk = _guest_sizes(ip, key, tmp_path)
            assert nproc == 2 and 1024 < memory <= 1536 and 23 * 2**30 < disk <= 24 * 2**30, (nproc, memory, disk)
            kept = ssh_with_key(ip, key, "cat /root/before-resize", tmp_path)
            assert kept.stdout.strip() == "kept", kept.stderr
            renewal = client.post(f"/v1/servers/{sid}/renew/quote", headers=account.headers).json()
            assert renewal["period_price_usd"] == quote.json()["period_price_usd"]
        finally:
            connection = libvirt.open(URI)
            for dom in connection.listAllDomains():
                if any(p.name.startswith(dom.name()) for p in directory.iterdir()):
                    if dom.isActive():
                        dom.destroy()
                    dom.undefine()
            for vol in connection.storagePoolLookupByName(pool_name).listAllVolumes():
                if vol.name() not in (IMAGE, "vmlinuz", "initrd.img"):
                    vol.delete(0)
