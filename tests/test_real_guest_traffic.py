"""Traffic of a real Debian guest under QEMU TCG on the system libvirtd, through ``vpsshop serve``
(its worker samples the counters): what the guest sends over SSH shows in the server's usage within
a minute; past a small allowance the throttle policy caps a transfer's measured rate at the
configured rate (libvirt's ``<bandwidth>`` on the guest's tap device), and a renewal lifts it.

One order, one boot (about 1-3 minutes on a loaded machine); tests/test_real_guest.py has the guest.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import libvirt
import pytest
from libvirt_peer import GUEST_IMAGE, URI, guest_image_pool, host_can_shape, isolated_network
from served import VPSSHOP, serve, shop_env
from test_real_guest import BOOT_SECONDS, _keypair, _libvirt_settings, _ssh_options, wait_for_login

REPO = Path(__file__).resolve().parents[1]
TAG = "vpsshop-traffic"
THROTTLE_KIB = 64
"""The throttled rate, KiB/s each way: well under what SSH moves unthrottled even under TCG."""
ALLOWANCE = 12_000_000
pytestmark = pytest.mark.slow


@pytest.fixture
def traffic_pool(test_guest: Path) -> Iterator[tuple[str, Path]]:
    with guest_image_pool(URI, test_guest, tag=TAG) as pool:
        yield pool


@pytest.fixture
def traffic_network() -> Iterator[tuple[str, str]]:
    with isolated_network(URI, first="10.214", tag=TAG) as network:
        yield network


def toml_value(value: Any) -> str:
    """``value`` as a TOML value: dicts as inline tables, every key quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def pull(ip: str, key: Path, nbytes: int, tmp: Path) -> float:
    """Send ``nbytes`` from the guest to this host over SSH; the rate in KiB/s, timed from the first
    byte to the last (the SSH handshake is left out)."""
    proc = subprocess.Popen(
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
            f"head -c {nbytes} /dev/zero",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    got = len(proc.stdout.read(1))
    started = time.monotonic()
    while got < nbytes:
        chunk = proc.stdout.read1(1 << 16)
        if not chunk:
            break
        got += len(chunk)
    took = time.monotonic() - started
    assert proc.wait(120) == 0 and got == nbytes, (got, proc.stderr.read() if proc.stderr else b"")
    return (nbytes - 1) / 1024 / took


def poll(read: Callable[[], Any], done: Callable[[Any], bool], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"{what} not within {timeout:g} s: {value}"
        time.sleep(1)


def test_guest_traffic_is_counted_throttled_past_the_allowance_and_lifted_by_a_renewal(
    traffic_pool, traffic_network, test_guest, tmp_path
):
    pool_name, directory = traffic_pool
    network, prefix = traffic_network
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        (REPO / "plugins" / "vpsshop_catalog" / "catalog.toml")
        .read_text()
        .replace("debian-12-genericcloud-amd64.qcow2", GUEST_IMAGE)
    )
    hypervisor = {
        "backend": "libvirt",
        "libvirt": _libvirt_settings(
            pool_name, network, prefix, directory, (test_guest / "cmdline").read_text().strip()
        ),
    }
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f"catalog = {toml_value({'file': {'path': str(catalog)}})}\n"
        f"hypervisor = {toml_value(hypervisor)}\n"
        f"traffic = {toml_value({'sample_seconds': 5, 'policy': 'throttle', 'throttle_kib_per_second': THROTTLE_KIB, 'plan_allowance_bytes': {'pup': ALLOWANCE}})}\n"  # noqa: E501
    )
    env = shop_env(f"sqlite:///{tmp_path / 'shop.db'}", VPSSHOP_CONFIG=str(config))
    key, public = _keypair(tmp_path)
    with serve(tmp_path, env) as served:
        base = served.base
        created = httpx.post(f"{base}/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        credit = [VPSSHOP, "admin", "credit", str(created["user_id"]), "20", "--reason", "traffic test"]
        assert subprocess.run(credit, cwd=tmp_path, env=env, capture_output=True, timeout=120).returncode == 0
        stored = httpx.post(f"{base}/ssh-keys", headers=headers, json={"name": "t", "public_key": public}).json()
        order = {"plan": "pup", "location": "nl", "os": "debian-12", "hostname": "traffic-one"}
        ordered = httpx.post(f"{base}/servers", headers=headers, json={**order, "ssh_keys": [stored["id"]]})
        assert ordered.status_code == 201, ordered.text
        sid = ordered.json()["server"]["id"]

        def server() -> dict:
            return httpx.get(f"{base}/servers/{sid}", headers=headers, timeout=10).json()

        try:
            shown = poll(
                server, lambda s: s["status"] != "provisioning", 2 * BOOT_SECONDS, "active"
            )  # a loaded machine
            assert shown["status"] == "active", (shown, served.output()[-3000:])
            ip = shown["ip"]
            assert wait_for_login(ip, key, tmp_path) == "traffic-one"
            domain = libvirt.open(URI).lookupByName(
                next(p.name for p in directory.iterdir() if p.name.endswith("-seed.iso"))[: -len("-seed.iso")]
            )
            before = poll(server, lambda s: s["traffic"] is not None, 60, "a first sample")["traffic"]
            assert before["allowance_bytes"] == ALLOWANCE and before["policy_applied"] is None

            # 4 MB sent by the guest over SSH shows in its usage within a minute (in from the SSH session too).
            sent = time.monotonic()
            free_rate = pull(ip, key, 4_000_000, tmp_path)
            counted = poll(
                server,
                lambda s: s["traffic"]["out_bytes"] >= before["out_bytes"] + 4_000_000,
                60 - (time.monotonic() - sent),
                "the transfer in the usage",
            )["traffic"]
            assert counted["in_bytes"] > before["in_bytes"] and counted["policy_applied"] is None
            assert free_rate > 4 * THROTTLE_KIB, f"unthrottled SSH moves only {free_rate:.0f} KiB/s"

            # Past the allowance: throttled within a sample; the cap is on the domain; the rate measured.
            pull(ip, key, ALLOWANCE, tmp_path)
            throttled = poll(server, lambda s: s["traffic"]["policy_applied"] == "throttle", 60, "the throttle")
            assert throttled["status"] == "active"
            # The cap on the domain, live and in its definition (so it outlives a power cycle). Where
            # the host cannot shape (its kernel lacks the qdiscs libvirt's tc commands use), the
            # worker logs libvirt's refusal: the rest is checked first, then that is the failure.
            deadline, capped = time.monotonic() + 30, False
            while not capped and time.monotonic() < deadline:
                capped = f"<inbound average='{THROTTLE_KIB}'/>" in domain.XMLDesc(0)
                time.sleep(1)
            refusals = [line for line in served.output().splitlines() if "bandwidth cap of server" in line]
            slow_rate = pull(ip, key, 24 * THROTTLE_KIB * 1024, tmp_path)  # ~24 s at the cap
            if capped:
                assert f"<outbound average='{THROTTLE_KIB}'/>" in domain.XMLDesc(0)
                inactive = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
                assert f"<inbound average='{THROTTLE_KIB}'/>" in inactive
            events = httpx.get(f"{base}/events", headers=headers).json()["events"]
            exceeded = [e for e in events if e["type"] == "server.traffic_exceeded"]
            assert len(exceeded) == 1 and exceeded[0]["data"]["traffic"]["policy_applied"] == "throttle"

            # A renewal starts a new period: the throttle is lifted, the rate is free again.
            renewed = httpx.post(f"{base}/servers/{sid}/renew", headers=headers, timeout=30)
            assert renewed.status_code == 200, renewed.text
            lifted = poll(server, lambda s: s["traffic"]["policy_applied"] is None, 30, "the new period")
            assert lifted["traffic"]["period_start"] > throttled["traffic"]["period_start"]
            poll(
                lambda: [e["type"] for e in httpx.get(f"{base}/events", headers=headers).json()["events"]],
                lambda types: "server.traffic_restored" in types,
                30,
                "server.traffic_restored",
            )
            # (libvirt may leave an empty <bandwidth/> behind: no average is no cap)
            poll(domain.XMLDesc, lambda xml: "average=" not in xml, 30, "the cap lifted")
            assert "average=" not in domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            again = pull(ip, key, 2_000_000, tmp_path)
            assert again > 4 * THROTTLE_KIB, f"after the renewal a transfer moved only {again:.0f} KiB/s"
            if host_can_shape():
                assert capped, f"the throttle never reached the domain: {refusals[-3:]}"
                assert 0.5 * THROTTLE_KIB < slow_rate < 1.3 * THROTTLE_KIB, (
                    f"throttled to {THROTTLE_KIB} KiB/s, a transfer moved {slow_rate:.0f} KiB/s (free: {free_rate:.0f})"
                )
            else:
                # This kernel has no sfq qdisc (a VM kernel without modules): libvirt refuses every cap,
                # and the shop must say so in its log at each pass, not pretend (see host_can_shape).
                assert not capped and refusals, "a kernel without sfq capped the domain, or the refusal went unsaid"
                assert "qdisc" in refusals[-1], refusals[-1]
        finally:
            ended = httpx.request("DELETE", f"{base}/servers/{sid}", headers=headers, timeout=60)
            assert ended.status_code in (200, 409), ended.text
            poll(server, lambda s: s["ip"] is None or (s["status"] == "terminated" and s["power"] is None), 120, "gone")
