"""Order to ready on a real guest: how much of the wait is the shop's own work, how much the guest's boot.

Runs ``vpsshop serve`` (its worker included, as the sandbox runs it) against the machine's libvirtd
with the Debian guest of ``scripts/build-test-guest.sh`` (QEMU under TCG, direct kernel boot), on a
transient pool and an isolated network of its own, orders servers through the API and times each
from outside the shop:

* ``pickup``: the order's 201 -> the server's disk file appears in the pool (the job is claimed,
  the host chosen, the address leased);
* ``disk``: the disk file -> the seed image file appears (the qcow2 overlay made, the seed built);
* ``define``: the seed file -> libvirt's "defined" event (the seed uploaded, the domain defined);
* ``start``: "defined" -> libvirt's "started" event;
* ``guest boot``: "started" -> the guest's SSH daemon sends its banner to this host (the guest's
  own time: kernel, systemd, cloud-init; not the shop's);
* ``detect``: the banner -> ``GET /v1/servers/{id}`` says ``active`` (the guest's report read over
  its channel and the server activated; polled every 20 ms, so up to 20 ms of this is the poll).

The shop's share is pickup + disk + define + start + detect; its ratio to the whole is printed
beside the guest's boot, the baseline measured in the same run. Needs root, libvirtd and the
guest image (the test suite's ``scripts/test.sh`` installs both).

    .venv/bin/python bench/order_to_ready.py                 # 2 orders, one after the other
    .venv/bin/python bench/order_to_ready.py --orders 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import libvirt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from libvirt_peer import GUEST_IMAGE, URI, guest_image_pool, isolated_network, system_libvirtd
from served import VPSSHOP, serve, shop_env

IMAGE = GUEST_IMAGE
STEPS = ("pickup", "disk", "define", "start", "guest_boot", "detect")
SHOP_STEPS = ("pickup", "disk", "define", "start", "detect")


class Timeline:
    """When each thing happened to one domain, seen from this host (time.time())."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def mark(self, what: str, when: float | None = None) -> None:
        with self.lock:
            self.at.setdefault(what, time.time() if when is None else when)


def guest_image() -> Path:
    out = subprocess.run([str(REPO / "scripts" / "build-test-guest.sh")], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def shop_config(root: Path, pool: str, network: str, prefix: str, image_dir: Path) -> Path:
    catalog = root / "catalog.toml"
    catalog.write_text(
        (REPO / "plugins" / "vpsshop_catalog" / "catalog.toml")
        .read_text()
        .replace("debian-12-genericcloud-amd64.qcow2", IMAGE)
    )
    cmdline = (image_dir / "cmdline").read_text().strip()
    config = root / "shop.toml"
    config.write_text(
        f"""mode = "sandbox"
[catalog.file]
path = "{catalog}"
[hypervisor]
backend = "libvirt"
[hypervisor.libvirt]
domain_type = "qemu"
shutdown_grace_seconds = 5
[hypervisor.libvirt.kernel_boot."{IMAGE}"]
kernel = "{root / "boot" / "vmlinuz"}"
initrd = "{root / "boot" / "initrd.img"}"
cmdline = "{cmdline}"
format = "raw"
[hypervisor.libvirt.locations.nl]
pool = "{pool}"
network = "network:{network}"
addresses = "{prefix}.10-{prefix}.20"
gateway = "{prefix}.1"
nameservers = ["{prefix}.1"]
[[hypervisor.libvirt.locations.nl.hosts]]
uri = "{URI}"
name = "local"
max_memory_mib = 4096
"""
    )
    return config


def watch_files(directory: Path, timeline: Timeline, stop: threading.Event) -> None:
    """Note when the disk and seed files of the first new domain appear (their ctime)."""
    while not stop.is_set():
        for path in directory.iterdir():
            if path.name.startswith("vps-"):
                kind = "seed_file" if path.name.endswith("-seed.iso") else "disk_file"
                timeline.mark(kind, path.stat().st_ctime)
        if "seed_file" in timeline.at and "disk_file" in timeline.at:
            return
        time.sleep(0.005)


def watch_banner(ip: str, timeline: Timeline, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection((ip, 22), timeout=0.3) as sock:
                sock.settimeout(2)
                if sock.recv(64).startswith(b"SSH-"):
                    timeline.mark("banner")
                    return
        except OSError:
            pass
        time.sleep(0.05)


def order_once(base: str, headers: dict[str, str], directory: Path, ip: str, events: dict[str, Timeline]) -> dict:
    timeline = Timeline()
    stop = threading.Event()
    threads = [
        threading.Thread(target=watch_files, args=(directory, timeline, stop), daemon=True),
        threading.Thread(target=watch_banner, args=(ip, timeline, stop), daemon=True),
    ]
    for thread in threads:
        thread.start()
    events.clear()
    events["current"] = timeline
    response = httpx.post(
        f"{base}/servers", headers=headers, json={"plan": "pup", "location": "nl", "os": "debian-12"}, timeout=30
    )
    timeline.mark("ordered")
    assert response.status_code == 201, response.text
    sid = response.json()["server"]["id"]
    deadline = time.monotonic() + 900
    while True:
        server = httpx.get(f"{base}/servers/{sid}", headers=headers, timeout=30).json()
        if server["status"] != "provisioning":
            timeline.mark("active")
            break
        assert time.monotonic() < deadline, f"server {sid} not active in 900 s"
        time.sleep(0.02)
    stop.set()
    assert server["status"] == "active" and server["ready_at"], server
    at = timeline.at
    steps = {
        "pickup": at["disk_file"] - at["ordered"],
        "disk": at["seed_file"] - at["disk_file"],
        "define": at["defined"] - at["seed_file"],
        "start": at["started"] - at["defined"],
        "guest_boot": at["banner"] - at["started"],
        "detect": at["active"] - at["banner"],
    }
    deleted = httpx.request("DELETE", f"{base}/servers/{sid}", headers=headers, timeout=30)
    assert deleted.status_code == 200, deleted.text
    gone = time.monotonic() + 120
    while any(p.name.startswith("vps-") for p in directory.iterdir()) and time.monotonic() < gone:
        time.sleep(0.2)
    return {"server": sid, **{k: round(v, 3) for k, v in steps.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    started_daemons = system_libvirtd()
    image_dir = guest_image()
    libvirt.virEventRegisterDefaultImpl()

    def run_events() -> None:
        while True:
            libvirt.virEventRunDefaultImpl()

    threading.Thread(target=run_events, daemon=True).start()
    events: dict[str, Timeline] = {}

    def lifecycle(_conn: Any, dom: Any, event: int, _detail: int, _opaque: Any) -> None:
        timeline = events.get("current")
        if timeline is None or not dom.name().startswith("vps-"):
            return
        if event == libvirt.VIR_DOMAIN_EVENT_DEFINED:
            timeline.mark("defined")
        elif event == libvirt.VIR_DOMAIN_EVENT_STARTED:
            timeline.mark("started")

    events_conn = libvirt.open(URI)
    callback = events_conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle, None)
    root = Path(tempfile.mkdtemp(prefix="vpsshop-bench-ready-"))
    (root / "boot").mkdir()
    for name in ("vmlinuz", "initrd.img"):
        shutil.copy(image_dir / name, root / "boot" / name)
    os.chmod(root, 0o755)
    results = []
    try:
        with (
            guest_image_pool(URI, image_dir, tag="vpsshop-bench") as (pool, directory),
            isolated_network(URI, first="10.214", tag="vpsshop-bench") as (network, prefix),
        ):
            config = shop_config(root, pool, network, prefix, image_dir)
            env = shop_env(f"sqlite:///{root / 'shop.db'}", VPSSHOP_CONFIG=str(config))
            with serve(root, env, "--config", str(config)) as served:
                created = httpx.post(f"{served.base}/account").json()
                headers = {"Authorization": f"Bearer {created['api_key']}"}
                credit = [VPSSHOP, "admin", "credit", str(created["user_id"]), "100", "--reason", "bench"]
                subprocess.run(credit, cwd=root, env=env, check=True, capture_output=True, timeout=60)
                for _ in range(args.orders):
                    results.append(order_once(served.base, headers, directory, f"{prefix}.10", events))
    finally:
        events_conn.domainEventDeregisterAny(callback)
        shutil.rmtree(root, ignore_errors=True)
        for pid in started_daemons:
            os.kill(pid, 15)

    summary: dict[str, Any] = {"orders": results}
    for step in STEPS:
        summary[f"median_{step}"] = round(statistics.median(r[step] for r in results), 3)
    shop = [sum(r[s] for s in SHOP_STEPS) for r in results]
    whole = [sum(r[s] for s in STEPS) for r in results]
    summary.update(
        median_shop_seconds=round(statistics.median(shop), 3),
        max_shop_seconds=round(max(shop), 3),
        median_order_to_ready_seconds=round(statistics.median(whole), 3),
        shop_share=round(statistics.median(s / w for s, w in zip(shop, whole, strict=True)), 4),
    )
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{'order':>6} " + " ".join(f"{s:>10}" for s in STEPS) + f" {'shop':>8} {'total':>8}")
    for r, s, w in zip(results, shop, whole, strict=True):
        print(f"{r['server']:>6} " + " ".join(f"{r[k]:>10.3f}" for k in STEPS) + f" {s:>8.3f} {w:>8.3f}")
    print(
        f"shop's own work: median {summary['median_shop_seconds']:.3f} s (max {summary['max_shop_seconds']:.3f} s); "
        f"the guest's boot: median {summary['median_guest_boot']:.3f} s; "
        f"shop share of order-to-ready: {summary['shop_share']:.2%}"
    )


if __name__ == "__main__":
    main()
