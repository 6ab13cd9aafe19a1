"""The firewall on a real Debian guest (QEMU TCG, the system libvirtd), set through the API and
checked from this host through a port of the guest's bridge (as the internet reaches it): with
rules, a port they do not allow is unreachable while SSH answers, and a rule opens it (to the
source prefix it names: over IPv4, not over IPv6); and whatever the rules, a packet the guest sends
from an address that is not its own does not leave it while one from its own address does. One
boot (tests/test_real_guest.py has the helpers; tests/libvirt_peer.py the peers).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import libvirt
import pytest
from libvirt_peer import URI, ipv6_prefix
from test_real_guest import (  # noqa: F401 - fixtures used by name
    BOOT_SECONDS,
    IMAGE,
    REPO,
    _keypair,
    _libvirt_settings,
    guest_network,
    guest_pool,
    run_jobs_until,
    ssh_with_key,
    wait_for_login,
)

pytestmark = pytest.mark.slow
UDP_PORT = 5999
HTTP_PORT = 8080


PROBE = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    with socket.create_connection((host, port), timeout=4) as sock:
        sock.settimeout(10)
        if port != 22:
            sock.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
        sys.exit(0 if sock.recv(64).startswith((b"SSH-", b"HTTP/1.0 200")) else 3)
except TimeoutError:
    sys.exit(2)
"""


class Uplink:
    """The way the internet reaches a guest in production: through a port of its bridge. A veth pair
    with one end in the guest network's bridge and the other in a network namespace of its own,
    holding ``<prefix>.2`` and ``<ipv6 prefix>2``. (Packets this host itself sends to a guest leave
    through the bridge's own interface, which no bridge port filter sees: the hypervisor's filter
    is for what crosses the bridge, from the uplink or from other guests.)"""

    def __init__(self, bridge: str, prefix: str) -> None:
        short = uuid.uuid4().hex[:6]
        self.ns, outside, inside = f"vpsshop-fw-{short}", f"vfw{short}a", f"vfw{short}b"
        self.address, self.address6 = f"{prefix}.2", f"{ipv6_prefix(prefix)}2"
        for command in (
            f"ip netns add {self.ns}",
            f"ip link add {outside} type veth peer name {inside}",
            f"ip link set {inside} netns {self.ns}",
            f"ip link set {outside} master {bridge} up",
            f"ip -n {self.ns} link set lo up",
            f"ip -n {self.ns} addr add {self.address}/24 dev {inside}",
            f"ip -n {self.ns} addr add {self.address6}/64 dev {inside} nodad",
            f"ip -n {self.ns} link set {inside} up",
        ):
            subprocess.run(command.split(), check=True)
        self.outside = outside

    def answers(self, host: str, port: int) -> bool:
        """Whether ``host:port`` answers a connection from the uplink (SSH's banner, or a web page);
        False when the attempt times out (dropped on the way)."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.ns, "python3", "-c", PROBE, host, str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode in (0, 2), (host, port, done.returncode, done.stderr)
        return done.returncode == 0

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.outside], check=False)
        subprocess.run(["ip", "netns", "del", self.ns], check=False)


class UdpCatcher:
    """A UDP listener on this host (the guest network's bridge holds the gateway addresses): the
    payloads that arrive, with the address each came from."""

    def __init__(self, family: socket.AddressFamily, address: str) -> None:
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((address, UDP_PORT))
        self.sock.settimeout(0.2)
        self.seen: list[tuple[bytes, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            self.seen.append((data, peer[0]))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def send_from(source: str, target: str, payload: str) -> str:
    """A shell command for the guest: five UDP datagrams ``payload`` to ``target`` sent from ``source``."""
    family = "AF_INET6" if ":" in target else "AF_INET"
    code = (
        f"import socket,time\ns=socket.socket(socket.{family},socket.SOCK_DGRAM)\ns.bind(('{source}',0))\n"
        f"for _ in range(5):\n s.sendto(b'{payload}',('{target}',{UDP_PORT}))\n time.sleep(0.2)\n"
    )
    return f'python3 -c "{code}"'


def test_firewall_and_anti_spoofing_on_a_booted_guest(guest_pool, guest_network, test_guest, tmp_path):  # noqa: F811
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.models import Server
    from vpsshop.servers.jobs import run_jobs
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, create_test_account

    pool_name, directory = guest_pool
    network, prefix = guest_network
    v6 = ipv6_prefix(prefix)
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
    conn = libvirt.open(URI)
    domain_name = None
    uplink: Uplink | None = None
    with TestClient(create_app(settings, background=False)) as client:
        ctx = client.app.state.ctx
        account = create_test_account(client)
        account.credit("50")
        headers = account.headers
        stored = client.post("/v1/ssh-keys", headers=headers, json={"name": "laptop", "public_key": public})
        assert stored.status_code == 201, stored.text
        order = client.post(
            "/v1/servers",
            headers=headers,
            json={"plan": "pup", "location": "nl", "os": "debian-12", "ssh_keys": [stored.json()["id"]]},
        )
        assert order.status_code == 201, order.text
        sid = order.json()["server"]["id"]
        try:
            server = run_jobs_until(
                ctx, client, headers, sid, lambda s: s["status"] != "provisioning", timeout=2 * BOOT_SECONDS
            )
            assert server["status"] == "active", server
            ip, ipv6 = server["ip"], server["ipv6"]
            with ctx.db.session() as session:
                domain_name = session.get(Server, sid).domain
            wait_for_login(ip, key, tmp_path)
            # Every guest is filtered from its first boot: its interface references its filter, which
            # references libvirt's clean-traffic with the leased address.
            nic = conn.lookupByName(domain_name).XMLDesc(0)
            assert f"filter='vpsshop-fw-{domain_name}'" in nic and f"value='{ip}'" in nic, nic
            assert "clean-traffic" in conn.nwfilterLookupByName(f"vpsshop-fw-{domain_name}").XMLDesc(0)

            # A web server on a port no rule names; with no rules (the default) it answers.
            started = ssh_with_key(
                ip,
                key,
                f"nohup python3 -m http.server {HTTP_PORT} --bind :: </dev/null >/dev/null 2>&1 & sleep 3; "
                f"ss -ltn | grep -c ':{HTTP_PORT} '",
                tmp_path,
            )
            assert started.returncode == 0 and started.stdout.strip() == "1", (started.stdout, started.stderr)
            uplink = Uplink(conn.networkLookupByName(network).bridgeName(), prefix)
            assert uplink.answers(ip, HTTP_PORT) and uplink.answers(ipv6, HTTP_PORT)

            def firewall(rules: list[dict]) -> None:
                put = client.put(f"/v1/servers/{sid}/firewall", headers=headers, json={"rules": rules})
                assert put.status_code == 200, put.text
                assert asyncio.run(run_jobs(ctx))["done"] == 1
                shown = client.get(f"/v1/servers/{sid}", headers=headers).json()
                assert [r["ports"] for r in shown["firewall"]] == [str(r["ports"]) for r in rules]

            # Only SSH allowed: SSH answers over both families, the web server over neither.
            firewall([{"protocol": "tcp", "ports": 22}])
            assert uplink.answers(ip, 22) and uplink.answers(ipv6, 22)
            assert not uplink.answers(ip, HTTP_PORT) and not uplink.answers(ipv6, HTTP_PORT)
            # The guest's own outbound connections and their answers still pass.
            out = ssh_with_key(
                ip, key, f"python3 -c \"import socket; socket.create_connection(('{prefix}.1', 22), 5)\"", tmp_path
            )
            assert out.returncode == 0 or "refused" in out.stderr.lower(), out.stderr

            # A rule opens the web server to the IPv4 prefix of this host, and to nobody over IPv6.
            firewall(
                [{"protocol": "tcp", "ports": 22}, {"protocol": "tcp", "ports": HTTP_PORT, "source": f"{prefix}.0/24"}]
            )
            assert uplink.answers(ip, HTTP_PORT)
            assert not uplink.answers(ipv6, HTTP_PORT)
            assert uplink.answers(ip, 22)

            # Anti-spoofing: from a second address the guest gives itself, nothing reaches this host;
            # from its own address, everything does (IPv4 and IPv6; firewall rules in force or not).
            spoofed4, spoofed6 = f"{prefix}.99", f"{v6}99"
            added = ssh_with_key(
                ip,
                key,
                f"ip addr add {spoofed4}/24 dev eth0 && ip -6 addr add {spoofed6}/64 dev eth0 nodad && sleep 2 "
                "&& ip -o addr",
                tmp_path,
            )
            assert added.returncode == 0 and spoofed4 in added.stdout and spoofed6 in added.stdout, added.stderr
            catchers = [UdpCatcher(socket.AF_INET, f"{prefix}.1"), UdpCatcher(socket.AF_INET6, f"{v6}1")]
            try:
                for rules in ([{"protocol": "tcp", "ports": 22}], []):
                    firewall(rules)
                    for catcher in catchers:
                        catcher.seen.clear()
                    sent = ssh_with_key(
                        ip,
                        key,
                        "; ".join(
                            [
                                # its own first: the guest then knows the host's MAC (a neighbour
                                # solicitation sent from the spoofed address would be dropped too)
                                send_from(ip, f"{prefix}.1", "own4"),
                                send_from(ipv6, f"{v6}1", "own6"),
                                send_from(spoofed4, f"{prefix}.1", "spoofed4"),
                                send_from(spoofed6, f"{v6}1", "spoofed6"),
                            ]
                        ),
                        tmp_path,
                    )
                    assert sent.returncode == 0, sent.stderr
                    time.sleep(2)
                    got = {(payload, peer) for c in catchers for payload, peer in c.seen}
                    assert got == {(b"own4", ip), (b"own6", ipv6)}, (rules, got)
            finally:
                for catcher in catchers:
                    catcher.close()

            # Terminated: the domain and its filters are gone from the host.
            ended = client.request("DELETE", f"/v1/servers/{sid}", headers=headers)
            assert ended.status_code == 200, ended.text
            run_jobs_until(ctx, client, headers, sid, lambda s: s["ip"] is None, timeout=120)
            assert not [n for n in conn.listNWFilters() if domain_name in n]
        finally:
            if uplink is not None:
                uplink.close()
            with ctx.db.session() as session:
                domain_name = session.get(Server, sid).domain
            if domain_name is not None:
                try:
                    dom = conn.lookupByName(domain_name)
                    if dom.isActive():
                        dom.destroy()
                    dom.undefine()
                except libvirt.libvirtError:
                    pass  # terminated by the test: gone already
                for name in conn.listNWFilters():
                    if domain_name in name:
                        conn.nwfilterLookupByName(name).undefine()
            for vol in conn.storagePoolLookupByName(pool_name).listAllVolumes():
                if vol.name() not in (IMAGE, "vmlinuz", "initrd.img"):
                    vol.delete(0)
    conn.close()
    assert Path(directory).is_dir()
