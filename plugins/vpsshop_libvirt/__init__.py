"""KVM servers through libvirt: domain XML, a qcow2 overlay, a NoCloud seed ISO, an address pool.

Settings (``[hypervisor] backend = "libvirt"``)::

    [hypervisor.libvirt]
    domain_type = "kvm"                 # "qemu" for TCG (no /dev/kvm), "test" for test:///default
    guest_reports = true                # active once the guest reports its first boot (docs/servers.md)
    [hypervisor.libvirt.kernel_boot."debian-12-test.raw"]   # optional, per base image
    kernel = "/var/lib/libvirt/boot/vmlinuz"
    initrd = "/var/lib/libvirt/boot/initrd.img"
    cmdline = "root=/dev/vda rw console=ttyS0"
    format = "raw"
    [hypervisor.libvirt.locations.nl]
    pool = "vpsshop"                    # storage pool holding the OS base images and the servers' disks
    network = "bridge:br0"              # or "network:default", or "user" (QEMU user networking)
    addresses = "203.0.113.0/26"        # CIDR or "203.0.113.10-203.0.113.60"; leased by core, never shared
    gateway = "203.0.113.1"
    nameservers = ["1.1.1.1", "9.9.9.9"]
    ipv6 = "2001:db8:1::/64"            # optional: one address each from ::100 (ipv6_mode = "address"), or
    ipv6_gateway = "2001:db8:1::1"      # ipv6_mode = "routed": a /64 each from a /40-/63 (gateway fe80::1)
    [[hypervisor.libvirt.locations.nl.hosts]]
    uri = "qemu+ssh://root@kvm1.nl.example/system"
    max_memory_mib = 120000             # default: the host's physical memory
    [[hypervisor.libvirt.locations.nl.hosts]]
    uri = "qemu+ssh://root@kvm2.nl.example/system"

A location named ``"*"`` serves every catalog location not listed. A sandbox that names
``backend = "libvirt"`` uses libvirt's ``test:///default`` driver for ``"*"`` (a sandbox that names
no backend runs the simulator instead).

Needs libvirt-python and libpass (``pip install 'vpsshop[libvirt]'``; libvirt-python compiles
against Debian's ``libvirt-dev``) and ``genisoimage`` or ``cloud-localds`` on the vpsshop host:
:meth:`preflight` refuses to start without them, naming the remedy, and names the setting of a host
that does not answer.

How a server is made (:meth:`LibvirtBackend.create`):

1. **placement**: of the location's hosts, the one with the most free memory (the host's
   ``max_memory_mib`` minus the memory of every domain defined on it) that fits the plan; none
   fits: :class:`~vpsshop.PluginError`, and core retries later;
2. **disk**: ``<name>.qcow2`` in the pool, a qcow2 overlay whose backing file is the catalog's
   base image (``<pool path>/<os image>``), sized to the plan's disk;
3. **seed**: ``<name>-seed.iso``, a NoCloud ISO (volume id ``cidata``, made with ``cloud-localds``
   or ``genisoimage``) carrying ``meta-data`` (instance id, hostname), ``user-data`` (hostname, the
   root password's sha512-crypt hash, never the password itself; password SSH login) and
   ``network-config`` (the leased address), uploaded into the pool. It stays attached and in the
   pool until the server is destroyed or reinstalled: nothing yet tells the backend when cloud-init
   has applied it, and a guest rebooted without any seed takes itself for a new instance (new host
   keys, no static address), so it could only ever be swapped for one without the hash;
4. **domain**: memory with explicit ``unit='MiB'`` (a bare ``<memory>`` is KiB), BIOS boot (no
   firmware auto-selection), virtio disk and virtio network, started at once.

Base images that are a bare file system boot by direct kernel boot: with the kernel and initrd
``vpsshop images sync`` put beside the image in each host's pool (the catalog source's
``kernel_boot``; ``images.py``), or with files already on the host named by
``[hypervisor.libvirt.kernel_boot."<image file>"]`` (``kernel``, ``initrd``, ``cmdline``, ``format``),
which wins when both are there.
The optional verbs: :meth:`LibvirtBackend.reinstall` (disk and seed made again),
:meth:`LibvirtBackend.open_console` (``virDomainOpenConsole``; not on the ``test:///default`` driver)
and the base images of ``vpsshop images`` (:meth:`LibvirtBackend.install_image`,
:meth:`LibvirtBackend.image_versions`: storage-stream uploads and a record volume beside each image,
``images.py``), and moving a server to another host of its location (:meth:`LibvirtBackend.migrate`:
shut down, disk and seed copied through download and upload streams by way of a temporary file on
the vpsshop host, the overlay's backing file pointed at the target pool's base image with
``qemu-img rebase -u``, the domain defined there from its old definition and started, the old host
cleaned last; placement skips the hosts in ``spec.avoid_hosts``). :meth:`LibvirtBackend.offers`
answers from each host's pool as last listed (start-up,
health checks, ``vpsshop images``).

Every libvirt call runs in a worker thread; the event loop never waits on a hypervisor.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import shutil
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vpsshop import (
    AddressPool,
    ConsoleStream,
    DomainState,
    FirewallRule,
    GuestReport,
    HostImages,
    HostInspection,
    HostKey,
    HypervisorBackend,
    InterfaceCounters,
    Ipv6Pool,
    KernelBootFiles,
    PluginError,
    Readiness,
    ServerHandle,
    ServerSpec,
    StartupError,
    check_address_range,
    check_ipv6_prefix,
    compose_user_data,
    hookimpl,
)
from vpsshop_libvirt import images

try:
    import libvirt
except ImportError:  # pragma: no cover - preflight then refuses to start, naming the remedy
    libvirt = None

try:  # libpass (the maintained fork of passlib): sha512-crypt without the crypt module (gone in 3.13)
    from passlib.hash import sha512_crypt
except ImportError:  # pragma: no cover - preflight then refuses to start, naming the remedy
    sha512_crypt = None


class _LibvirtError(Exception):
    """What this plugin uses of ``libvirt.libvirtError`` (libvirt-python ships no type stubs), and its
    stand-in when libvirt-python is not installed: nothing raises it then, so no ``except`` matches."""

    def get_error_code(self) -> int:
        raise NotImplementedError

    def get_error_message(self) -> str:
        raise NotImplementedError


LibvirtError: type[_LibvirtError] = libvirt.libvirtError if libvirt is not None else _LibvirtError

_P = ParamSpec("_P")
_T = TypeVar("_T")

INSTALL_BINDING = (
    "pip install 'vpsshop[libvirt]' (libvirt-python; it compiles against the system's libvirt: "
    "apt-get install libvirt-dev pkg-config gcc python3-dev first)"
)
INSTALL_SEED_TOOL = "apt-get install genisoimage (or cloud-image-utils, which has cloud-localds)"
INSTALL_HASHER = "pip install 'vpsshop[libvirt]' (libpass: pure Python, nothing to compile)"
ROOT_PASSWORD_ROUNDS = 656_000
"""sha512-crypt rounds of the root password's hash in the seed (passlib's default; glibc's is 5,000).
About 0.4 s to make here (in a worker thread), about 0.2 s of the guest's CPU (libxcrypt, under
KVM) at each password login."""
PREFLIGHT_CONNECT_SECONDS = 10.0

SHUTDOWN_GRACE_SECONDS = 30.0
GUEST_CHANNEL = "org.vpsshop.guest.0"
"""The virtio-serial channel a guest reports its boot on (``/dev/virtio-ports/<name>`` in the guest)."""
REPORTER_PATH = "/usr/local/lib/vpsshop/report-boot"
REPORTER_UNIT = "vpsshop-report-boot.service"
MAX_REPORT_BYTES = 65536
HOLD_SSH = (
    "for unit in ssh sshd; do mkdir -p /run/systemd/system/$unit.service.d && "
    "printf '[Unit]\\nConditionPathExists=/run/vpsshop/first-boot-done\\n' "
    "> /run/systemd/system/$unit.service.d/50-vpsshop-first-boot.conf; done; systemctl daemon-reload"
)
"""The first boot's hold on the SSH daemon: a runtime drop-in (gone at the next boot) whose condition
the reporter satisfies. A start while it holds is skipped, not failed, so cloud-init's own restart of
the daemon (after setting the password) is no error."""
ASK_AGAIN_SECONDS = 5.0
_STATES = {
    1: DomainState.RUNNING,  # VIR_DOMAIN_RUNNING
    2: DomainState.RUNNING,  # BLOCKED: running, waiting on I/O
    3: DomainState.PAUSED,
    4: DomainState.STOPPED,  # SHUTDOWN: on its way down
    5: DomainState.STOPPED,  # SHUTOFF
    6: DomainState.STOPPED,  # CRASHED
    7: DomainState.PAUSED,  # PMSUSPENDED
}


class HostConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uri: str = Field(description="libvirt URI of the host, e.g. qemu+ssh://root@kvm1/system.")
    name: str | None = Field(None, description="Name stored with each server; default the URI.")
    max_memory_mib: int | None = Field(None, ge=256, description="Memory to sell; default the host's memory.")

    @property
    def key(self) -> str:
        return self.name or self.uri


class LocationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[HostConfig] = Field(min_length=1)
    pool: str = Field("default", description="Storage pool with the base images; disks and seeds go there.")
    network: str = Field("network:default", pattern=r"^(network:.+|bridge:.+|user)$")
    addresses: str | None = Field(None, description="CIDR or first-last range of the addresses to hand out.")
    gateway: str | None = None
    nameservers: list[str] = Field(default_factory=lambda: ["1.1.1.1", "9.9.9.9"])
    ipv6: str | None = Field(
        None,
        description="IPv6 for the location's servers: a prefix they share (ipv6_mode address, a /64 to /120: one "
        "address each, from ::100) or a block cut into a routed /64 per server (ipv6_mode routed, a /40 to /63).",
    )
    ipv6_mode: Literal["address", "routed"] = "address"
    ipv6_gateway: str | None = Field(
        None,
        description="The IPv6 router the guests use: its address on the shared prefix (address mode), or the "
        "link-local address the host's bridge answers on, e.g. fe80::1 (routed mode).",
    )

    @field_validator("addresses")
    @classmethod
    def _parse(cls, value: str | None) -> str | None:
        if value is not None:
            check_address_range(value)
        return value

    @model_validator(mode="after")
    def _check_ipv6(self) -> LocationConfig:
        if self.ipv6 is not None:
            check_ipv6_prefix(self.ipv6, self.ipv6_mode)
            if self.ipv6_gateway is None and self.ipv6_mode == "routed":
                raise ValueError("a routed IPv6 block needs ipv6_gateway (the host's link-local, e.g. fe80::1)")
        if self.ipv6_gateway is not None:
            try:
                ipaddress.IPv6Address(self.ipv6_gateway)
            except ValueError:
                raise ValueError(f"ipv6_gateway {self.ipv6_gateway!r} is not an IPv6 address") from None
        return self


class KernelBoot(BaseModel):
    """Direct kernel boot for one base image: QEMU loads the kernel and initrd, no boot loader.

    For images that are a bare file system (``mkfs.ext4 -d``) rather than a partitioned disk with a
    boot loader, such as the one ``scripts/build-test-guest.sh`` makes. The paths are on the host.
    """

    model_config = ConfigDict(extra="forbid")

    kernel: str = Field(description="Path of the kernel (vmlinuz) on the libvirt host.")
    initrd: str | None = Field(None, description="Path of the initrd on the libvirt host.")
    cmdline: str = Field("root=/dev/vda rw console=ttyS0", max_length=1000, description="Kernel command line.")
    format: Literal["qcow2", "raw"] | None = Field(
        None, description="Format of this base image; default base_image_format."
    )


class LibvirtConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    domain_type: Literal["kvm", "qemu", "test"] = "kvm"
    guest_reports: bool = Field(
        True,
        description="Wait for each new guest's report of its first boot (over a virtio-serial channel; the "
        "image needs cloud-init and Python 3, as every catalog image has): a server turns active once it has "
        "booted and SSH answers, with its host keys. false: active as soon as the domain runs, no host keys "
        "(for images without cloud-init or Python).",
    )
    machine: str = Field("pc", description="QEMU machine type (pc boots with BIOS, no firmware auto-selection).")
    base_image_format: Literal["qcow2", "raw"] = "qcow2"
    kernel_boot: dict[str, KernelBoot] = Field(
        default_factory=dict, description="Base image file name -> direct kernel boot settings for that image."
    )
    shutdown_grace_seconds: float = Field(
        SHUTDOWN_GRACE_SECONDS,
        ge=0,
        le=600,
        description="Wait this long for an ACPI shutdown (then power off) or an ACPI reboot (then reset).",
    )
    keepalive_interval_seconds: int = Field(
        5,
        ge=1,
        le=300,
        description="Probe each remote host connection this often; after keepalive_count unanswered probes "
        "the connection is closed and the call waiting on it fails (retried later) instead of hanging.",
    )
    keepalive_count: int = Field(3, ge=1, le=100)
    locations: dict[str, LocationConfig] = Field(min_length=1)


def choose_host(candidates: Iterable[tuple[HostConfig, int, int]], need_mib: int) -> HostConfig | None:
    """The host with the most free memory that fits ``need_mib``: (host, used MiB, capacity MiB)."""
    best: tuple[int, HostConfig] | None = None
    for host, used, capacity in candidates:
        free = capacity - used
        if free >= need_mib and (best is None or free > best[0]):
            best = (free, host)
    return best[1] if best else None


def mac_address(name: str) -> str:
    """The domain's MAC address, derived from its name (QEMU's 52:54:00 prefix).

    The seed's network-config matches the interface by this address, so the leased address lands on
    the right interface whatever the guest names it.
    """
    digest = hashlib.sha256(name.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


FILTER_PREFIX = "vpsshop-fw-"
"""Each server's network filter is ``vpsshop-fw-<domain>`` (and ``...-ipv6`` beside it for IPv6)."""
RULE_PRIORITY = "500"
"""The priority of the customer's accept rules in the filter (what :func:`parse_firewall` reads back)."""
_V6_TAGS = {"tcp": "tcp-ipv6", "udp": "udp-ipv6", "icmp": "icmpv6"}


def filter_name(domain: str) -> str:
    return FILTER_PREFIX + domain


def ipv6_filter_name(domain: str) -> str:
    return FILTER_PREFIX + domain + "-ipv6"


def ipv6_filter_xml(domain: str, address: str, prefix_length: int, uuid: str | None = None) -> str:
    """IPv6 anti-spoofing in the ``ipv6-ip`` chain: the guest sends from its link-local addresses,
    the unspecified address (duplicate address detection) and its own address (its /64 when routed)."""
    # jumped to before the root chain's accept of IPv6 (priority -640), as clean-traffic's IPv4 check is
    flt = ET.Element("filter", name=ipv6_filter_name(domain), chain="ipv6-ip", priority="-710")
    if uuid is not None:  # redefining a filter keeps its UUID
        ET.SubElement(flt, "uuid").text = uuid
    network = ipaddress.IPv6Network(f"{address}/{prefix_length}", strict=False)
    sources = (("fe80::", "10"), ("::", "128"), (str(network.network_address), str(network.prefixlen)))
    for n, (source, mask) in enumerate(sources):
        rule = ET.SubElement(flt, "rule", action="return", direction="out", priority=str(100 + n))
        ET.SubElement(rule, "ipv6", srcipaddr=source, srcipmask=mask)
    ET.SubElement(flt, "rule", action="drop", direction="out", priority="1000")
    return ET.tostring(flt, encoding="unicode")


def firewall_xml(domain: str, rules: Iterable[FirewallRule], ipv6: bool, uuid: str | None = None) -> str:
    """The server's filter: libvirt's ``clean-traffic`` (no MAC, IPv4 or ARP spoofing: the domain's
    interface passes the leased address as ``IP``), IPv6 anti-spoofing when the guest has IPv6, and,
    with rules, stateful inbound filtering: answers to the guest's connections and its own new
    outbound ones pass, DHCP replies and ICMPv6 (neighbour discovery) come in, new inbound
    connections only where a rule allows them, the rest is dropped."""
    rules = tuple(rules)
    flt = ET.Element("filter", name=filter_name(domain), chain="root")
    if uuid is not None:  # redefining a filter keeps its UUID
        ET.SubElement(flt, "uuid").text = uuid
    ET.SubElement(flt, "filterref", filter="clean-traffic")
    families = ("", "-ipv6") if ipv6 else ("",)
    if ipv6:
        ET.SubElement(flt, "filterref", filter=ipv6_filter_name(domain))
        out = ET.SubElement(flt, "rule", action="accept", direction="out", priority="-640")
        ET.SubElement(out, "mac", protocolid="ipv6")
        ET.SubElement(flt, "filterref", filter="allow-incoming-ipv6")
    if not rules:
        return ET.tostring(flt, encoding="unicode")
    for family in families:
        answer = ET.SubElement(flt, "rule", action="accept", direction="in", priority="100")
        ET.SubElement(answer, "all" + family, state="ESTABLISHED,RELATED")
        leave = ET.SubElement(flt, "rule", action="accept", direction="out", priority="100")
        ET.SubElement(leave, "all" + family, state="NEW,ESTABLISHED,RELATED")
    dhcp = ET.SubElement(flt, "rule", action="accept", direction="in", priority="110")
    ET.SubElement(dhcp, "udp", srcportstart="67", dstportstart="68")
    if ipv6:
        # neighbour discovery both ways; conntrack does not track it, so no state may be asked for
        nd = ET.SubElement(flt, "rule", action="accept", direction="inout", priority="110", statematch="false")
        ET.SubElement(nd, "icmpv6")
    for rule in rules:
        version = ipaddress.ip_network(rule.source).version if rule.source else None
        for family in families:
            if version == (4 if family else 6):
                continue
            attrs = {"state": "NEW"}
            if rule.port_start is not None:
                attrs.update(dstportstart=str(rule.port_start), dstportend=str(rule.port_end))
            if rule.source is not None:
                network = ipaddress.ip_network(rule.source)
                attrs.update(srcipaddr=str(network.network_address), srcipmask=str(network.prefixlen))
            tag = _V6_TAGS[rule.protocol] if family else rule.protocol
            el = ET.SubElement(flt, "rule", action="accept", direction="in", priority=RULE_PRIORITY)
            ET.SubElement(el, tag, attrs)
    for family in families:
        drop = ET.SubElement(flt, "rule", action="drop", direction="in", priority="900")
        ET.SubElement(drop, "all" + family)
    return ET.tostring(flt, encoding="unicode")


def parse_firewall(xml: str) -> tuple[tuple[FirewallRule, ...], bool]:
    """The customer's rules in a filter :func:`firewall_xml` made, and whether it references
    ``clean-traffic`` (anti-spoofing)."""
    root = ET.fromstring(xml)
    clean = any(ref.get("filter") == "clean-traffic" for ref in root.findall("filterref"))
    found: dict[FirewallRule, None] = {}
    for rule in root.findall("rule"):
        if rule.get("priority") != RULE_PRIORITY or rule.get("direction") != "in" or len(rule) != 1:
            continue
        el = rule[0]
        protocol = {"tcp-ipv6": "tcp", "udp-ipv6": "udp", "icmpv6": "icmp"}.get(el.tag, el.tag)
        start, end = el.get("dstportstart"), el.get("dstportend")
        address, mask = el.get("srcipaddr"), el.get("srcipmask")
        source = str(ipaddress.ip_network(f"{address}/{mask}", strict=False)) if address else None
        found[FirewallRule(protocol, int(start) if start else None, int(end) if end else None, source)] = None
    # a rule from anywhere is written once per family: read back, both are the same rule
    return tuple(found), clean


def domain_xml(
    spec: ServerSpec,
    cfg: LibvirtConfig,
    loc: LocationConfig,
    disk_path: str,
    seed_path: str,
    boot: KernelBoot | None = None,
) -> str:
    """The domain definition. Memory carries an explicit unit; disk and network are virtio.
    ``boot``: direct kernel boot with these files (default: ``cfg.kernel_boot`` of the image)."""
    dom = ET.Element("domain", type=cfg.domain_type)
    ET.SubElement(dom, "name").text = spec.name
    ET.SubElement(dom, "description").text = f"vpsshop server {spec.hostname}"
    ET.SubElement(dom, "memory", unit="MiB").text = str(spec.memory_mib)
    ET.SubElement(dom, "currentMemory", unit="MiB").text = str(spec.memory_mib)
    ET.SubElement(dom, "vcpu", placement="static").text = str(spec.vcpu)
    os_el = ET.SubElement(dom, "os")
    ET.SubElement(os_el, "type", arch="x86_64", machine=cfg.machine).text = "hvm"
    boot = boot or cfg.kernel_boot.get(spec.os_image)
    if boot is not None:
        ET.SubElement(os_el, "kernel").text = boot.kernel
        if boot.initrd:
            ET.SubElement(os_el, "initrd").text = boot.initrd
        ET.SubElement(os_el, "cmdline").text = boot.cmdline
    else:
        ET.SubElement(os_el, "boot", dev="hd")
    features = ET.SubElement(dom, "features")
    ET.SubElement(features, "acpi")
    ET.SubElement(features, "apic")
    if cfg.domain_type == "kvm":
        ET.SubElement(dom, "cpu", mode="host-passthrough")
    ET.SubElement(dom, "clock", offset="utc")
    ET.SubElement(dom, "on_poweroff").text = "destroy"
    ET.SubElement(dom, "on_reboot").text = "restart"
    ET.SubElement(dom, "on_crash").text = "destroy"
    devices = ET.SubElement(dom, "devices")
    disk = ET.SubElement(devices, "disk", type="file", device="disk")
    ET.SubElement(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    ET.SubElement(disk, "source", file=disk_path)
    ET.SubElement(disk, "target", dev="vda", bus="virtio")
    seed = ET.SubElement(devices, "disk", type="file", device="cdrom")
    ET.SubElement(seed, "driver", name="qemu", type="raw")
    ET.SubElement(seed, "source", file=seed_path)
    ET.SubElement(seed, "target", dev="hdc", bus="ide")
    ET.SubElement(seed, "readonly")
    kind, _, name = loc.network.partition(":")
    nic = ET.SubElement(devices, "interface", type=kind)
    ET.SubElement(nic, "mac", address=mac_address(spec.name))
    if kind == "network":
        ET.SubElement(nic, "source", network=name)
    elif kind == "bridge":
        ET.SubElement(nic, "source", bridge=name)
    ET.SubElement(nic, "model", type="virtio")
    if kind != "user" and cfg.domain_type != "test":
        # anti-spoofing and the customer's firewall (firewall_xml); without a leased address libvirt
        # learns the guest's from its DHCP exchange
        ref = ET.SubElement(nic, "filterref", filter=filter_name(spec.name))
        if spec.ip is not None:
            ET.SubElement(ref, "parameter", name="IP", value=spec.ip)
    ET.SubElement(devices, "serial", type="pty")
    ET.SubElement(devices, "console", type="pty")
    if cfg.guest_reports and cfg.domain_type != "test":
        # The guest's report of its boot (reporter.py): a socket libvirt names and only libvirt opens.
        # (libvirt puts it under its state directory; a session libvirtd whose directory is deep
        # makes a path longer than a UNIX socket may have, and the domain does not start.)
        channel = ET.SubElement(devices, "channel", type="unix")
        ET.SubElement(channel, "source", mode="bind")
        ET.SubElement(channel, "target", type="virtio", name=GUEST_CHANNEL)
    ET.SubElement(devices, "memballoon", model="virtio")
    return ET.tostring(dom, encoding="unicode")


def volume_xml(name: str, capacity: int, unit: str, fmt: str, backing: tuple[str, str] | None = None) -> str:
    vol = ET.Element("volume")
    ET.SubElement(vol, "name").text = name
    ET.SubElement(vol, "capacity", unit=unit).text = str(capacity)
    if backing is not None:
        ET.SubElement(vol, "allocation").text = "0"  # a sparse overlay: grows as the guest writes
    target = ET.SubElement(vol, "target")
    ET.SubElement(target, "format", type=fmt)
    if fmt == "qcow2":  # qcow2 v3 (libvirt's default is v2): zero clusters, lazy refcounts, persistent bitmaps
        ET.SubElement(target, "compat").text = "1.1"
    if backing is not None:
        store = ET.SubElement(vol, "backingStore")
        ET.SubElement(store, "path").text = backing[0]
        ET.SubElement(store, "format", type=backing[1])
    return ET.tostring(vol, encoding="unicode")


def root_password_hash(password: str) -> str:
    """The password as a sha512-crypt hash (``$6$rounds=...$<salt>$...``, a fresh random salt each call).

    What the seed carries instead of the password: cloud-init hands it to ``chpasswd -e`` as it is.
    sha512-crypt because every guest in the catalog checks it (glibc and libxcrypt alike), where
    yescrypt (``$y$``) needs Debian 12 or newer. The password never leaves this process: no program
    is run, nothing is written.

    :raises PluginError: libpass is not installed (the message names the remedy).
    """
    if sha512_crypt is None:
        raise PluginError(f"libpass is not installed, so the root password cannot be hashed: {INSTALL_HASHER}")
    return str(sha512_crypt.using(rounds=ROOT_PASSWORD_ROUNDS).hash(password))


def seed_files(spec: ServerSpec) -> dict[str, str]:
    """The NoCloud files. YAML is written as JSON (a subset of YAML), so no value needs escaping.

    The root password travels as its hash (:func:`root_password_hash`, cloud-init's ``chpasswd``
    ``type: hash``, which cloud-init has read since 22.3): the seed image, the files it is made
    from and the guest's cloud-init cache never hold the password itself.
    """
    meta = {"instance-id": spec.name, "local-hostname": spec.hostname}
    hashed = root_password_hash(spec.root_password)
    user = {
        "hostname": spec.hostname,
        "preserve_hostname": False,
        "disable_root": False,
        "ssh_pwauth": True,
        "chpasswd": {"expire": False, "users": [{"name": "root", "password": hashed, "type": "hash"}]},
        # Debian and Ubuntu ship "PermitRootLogin prohibit-password": the customer logs in as root with
        # this password, so allow it; set_passwords restarts sshd after write_files has run.
        "write_files": [
            {
                "path": "/etc/ssh/sshd_config.d/60-vpsshop-root-login.conf",
                "content": "PermitRootLogin yes\nPasswordAuthentication yes\n",
                "permissions": "0644",
            },
            *reporter_files(),
        ],
        # Hold the SSH daemon back during the instance's first boot (the reporter releases it): bootcmd
        # runs in cloud-init's network stage, which systemd orders before ssh.service.
        "bootcmd": [["cloud-init-per", "instance", "vpsshop-hold-ssh", "sh", "-c", HOLD_SSH]],
        # After the customer's runcmd: the unit runs once cloud-init's last stage has ended.
        "runcmd": [["systemctl", "start", "--no-block", REPORTER_UNIT]],
    }
    if spec.ssh_keys:
        # With disable_root false, cloud-init writes these to root's authorized_keys (and the image's
        # default user's, if it has one).
        user["ssh_authorized_keys"] = list(spec.ssh_keys)
    files = {"meta-data": json.dumps(meta) + "\n", "user-data": compose_user_data(user, spec.user_data)}
    if spec.ip is not None:
        eth: dict[str, Any] = {
            "match": {"macaddress": mac_address(spec.name)},
            "set-name": "eth0",
            "addresses": [f"{spec.ip}/{spec.prefix_length}"],
        }
        if spec.gateway:
            # "0.0.0.0/0", not "default": cloud-init before 23.x (Debian 12 ships 22.4) rejects "default".
            eth["routes"] = [{"to": "0.0.0.0/0", "via": spec.gateway}]
        if spec.nameservers:
            eth["nameservers"] = {"addresses": list(spec.nameservers)}
        if spec.ipv6 is not None:
            eth["addresses"].append(f"{spec.ipv6}/{spec.ipv6_prefix_length}")
            if spec.ipv6_gateway:
                # gateway6, not a route: Debian's ifupdown renderer writes it as the inet6 stanza's own
                # gateway (a route would need net-tools' `route`); a link-local one (fe80::1) works too
                eth["gateway6"] = spec.ipv6_gateway
        files["network-config"] = json.dumps({"version": 2, "ethernets": {"primary": eth}}) + "\n"
    return files


def reporter_files() -> list[dict[str, str]]:
    """cloud-init ``write_files`` entries: the guest's reporter (``reporter.py``) and its unit."""
    unit = (
        "[Unit]\n"
        "Description=Report this server's first boot to the shop (vpsshop, over a virtio-serial channel)\n"
        "After=cloud-final.service ssh.service sshd.service\n"
        f"ConditionPathExists=/dev/virtio-ports/{GUEST_CHANNEL}\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart=/usr/bin/python3 {REPORTER_PATH}\n"
    )
    return [
        {"path": REPORTER_PATH, "content": REPORTER.read_text(), "permissions": "0755"},
        {"path": f"/etc/systemd/system/{REPORTER_UNIT}", "content": unit, "permissions": "0644"},
    ]


REPORTER = Path(__file__).with_name("reporter.py")


def parse_report(line: bytes) -> GuestReport | None:
    """The guest's report from one line it wrote on the channel; None for anything else (a partial
    line, noise). A report is the customer's guest talking, so every field is checked."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("vpsshop_guest") != 1:
        return None
    keys = []
    for entry in data.get("host_keys") or []:
        if isinstance(entry, str):
            try:
                keys.append(HostKey.parse(entry))
            except ValueError:
                continue
    errors = tuple(str(e)[:300] for e in (data.get("errors") or [])[:10])
    return GuestReport(host_keys=tuple(keys[:10]), ssh=data.get("ssh") is True, errors=errors)


def build_seed_iso(spec: ServerSpec, out: Path) -> None:
    """Write the NoCloud ISO (volume id ``cidata``) with cloud-localds, else genisoimage."""
    files = seed_files(spec)
    with tempfile.TemporaryDirectory(prefix="vpsshop-seed-") as tmp:
        paths = {}
        for name, text in files.items():
            path = Path(tmp) / name
            path.write_text(text)
            path.chmod(0o600)
            paths[name] = str(path)
        if shutil.which("cloud-localds"):
            cmd = ["cloud-localds", str(out), paths["user-data"], paths["meta-data"]]
            if "network-config" in paths:
                cmd += ["--network-config", paths["network-config"]]
        elif shutil.which("genisoimage"):
            cmd = [
                "genisoimage",
                "-quiet",
                "-output",
                str(out),
                "-volid",
                "cidata",
                "-joliet",
                "-rock",
                *paths.values(),
            ]
        else:
            raise PluginError("neither cloud-localds nor genisoimage is installed on the vpsshop host")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise PluginError(f"building the seed ISO failed: {result.stderr.strip()[:200]}")


class LibvirtConsole(ConsoleStream):
    """A domain's serial console through ``virDomainOpenConsole``.

    A blocking libvirt stream is read by a daemon thread that hands the bytes to the event loop,
    so no read ever occupies the loop or its thread pool, and a console nobody reads any more ends
    with the stream.
    """

    CHUNK = 4096

    def __init__(self, conn: Any, dom: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._stream = conn.newStream(0)
        # FORCE: take the console over from an earlier session (a customer's stale tab).
        dom.openConsole(None, self._stream, libvirt.VIR_DOMAIN_CONSOLE_FORCE)
        self._loop = loop
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._closed = False
        threading.Thread(target=self._pump, name=f"console-{dom.name()}", daemon=True).start()

    def _pump(self) -> None:
        while not self._closed:
            try:
                data = self._stream.recv(self.CHUNK)
            except LibvirtError:
                data = b""
            if not isinstance(data, bytes):  # -2 (would block) cannot happen on a blocking stream; be safe
                data = b""
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, data)
            except RuntimeError:  # the loop has closed
                return
            if not data:
                return

    async def read(self) -> bytes:
        if self._closed and self._queue.empty():
            return b""
        return await self._queue.get()

    async def write(self, data: bytes) -> None:
        def send() -> None:
            view = memoryview(data)
            while view:
                sent = self._stream.send(bytes(view))
                if sent < 0:
                    raise PluginError("the console stream refused input")
                view = view[sent:]

        try:
            await asyncio.to_thread(send)
        except LibvirtError as exc:
            raise PluginError(f"console: {exc.get_error_message()}") from None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(b"")
        try:
            await asyncio.to_thread(self._stream.abort)
        except LibvirtError:
            pass


_event_loop_lock = threading.Lock()
_event_loop_running = False


def _start_event_loop() -> None:
    """Run libvirt's default event loop in a daemon thread, once per process, before the first
    connection opens: it sends and checks the keepalive probes, so a host that stops answering
    (power loss, a cut network) fails the calls waiting on it within seconds instead of leaving a
    provisioning job hanging until TCP gives up."""
    global _event_loop_running
    with _event_loop_lock:
        if _event_loop_running:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _event_loop_running = True


class LibvirtBackend(HypervisorBackend):
    """Servers as libvirt domains on the hosts of each location (see the module docstring)."""

    kind = "libvirt"
    Config = LibvirtConfig
    capabilities = frozenset(
        {
            "reinstall",
            "console",
            "guest_report",
            "images",
            "kernel_boot",
            "ipv6",
            "resize",
            "migrate",
            "traffic",
            "firewall",
            "snapshots",
        }
    )

    config: LibvirtConfig

    def __init__(self, config: LibvirtConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.cfg = config
        if self.cfg.domain_type == "test":  # libvirt's test driver has no consoles, channels or guests
            self.capabilities = frozenset({"reinstall", "ipv6"})
        elif not self.cfg.guest_reports:
            self.capabilities = self.capabilities - {"guest_report"}
        if all(loc.network == "user" for loc in self.cfg.locations.values()):
            # QEMU's user networking has no tap device on the host: nothing to count, shape or filter
            self.capabilities = self.capabilities - {"traffic", "firewall"}
        self._conns: dict[str, Any] = {}
        self._watches: dict[str, list[int]] = {}  # uri -> ids of the event callbacks on its connection
        self._boots: dict[str, int] = {}  # domain -> guest starts and resets seen since it was connected
        self._held: dict[str, frozenset[str]] = {}  # host key -> volume names of its pool, as last listed
        self._lock = threading.Lock()
        self._boots_lock = threading.Lock()  # taken on libvirt's event thread: never held while calling libvirt
        if libvirt is not None:
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors arrive as exceptions

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {
            "domain_type": "test",
            "locations": {
                "*": {
                    "hosts": [{"uri": "test:///default", "name": "test", "max_memory_mib": 1024 * 1024}],
                    "pool": "default-pool",
                    "network": "network:default",
                    "addresses": "10.99.0.0/16",
                    "gateway": "10.99.0.1",
                }
            },
        }

    # ---- configuration lookups ----------------------------------------------------------------

    def serves(self, location: str) -> bool:
        """A location with its own ``[hypervisor.libvirt.locations.<id>]`` table, or any when there is a ``"*"``."""
        return location in self.cfg.locations or "*" in self.cfg.locations

    def location_setting(self, location: str) -> str:
        return f"hypervisor.libvirt.locations.{location}"

    def location(self, location: str) -> LocationConfig:
        loc = self.cfg.locations.get(location) or self.cfg.locations.get("*")
        if loc is None:
            raise PluginError(f"location {location!r} has no hosts in [hypervisor.libvirt.locations]")
        return loc

    def _host(self, key: str) -> tuple[HostConfig, LocationConfig]:
        for loc in self.cfg.locations.values():
            for host in loc.hosts:
                if host.key == key:
                    return host, loc
        raise PluginError(f"host {key!r} is no longer in [hypervisor.libvirt]; add it back to manage its servers")

    def ipv6_pool(self, location: str) -> Ipv6Pool | None:
        loc = self.location(location)
        if loc.ipv6 is None:
            return None
        name = location if location in self.cfg.locations else "*"
        return Ipv6Pool(
            f"libvirt:{name}:v6",
            loc.ipv6,
            mode=loc.ipv6_mode,
            gateway=loc.ipv6_gateway,
            nameservers=tuple(loc.nameservers),
        )

    def address_pool(self, location: str) -> AddressPool | None:
        loc = self.location(location)
        if loc.addresses is None:
            return None
        name = location if location in self.cfg.locations else "*"
        return AddressPool.from_range(
            f"libvirt:{name}", loc.addresses, gateway=loc.gateway, nameservers=loc.nameservers
        )

    # ---- connections ----------------------------------------------------------------------------

    def _conn(self, uri: str) -> Any:
        if libvirt is None:
            raise PluginError(f"libvirt-python is not installed: {INSTALL_BINDING}")
        with self._lock:
            conn = self._conns.get(uri)
            if conn is not None:
                try:
                    if conn.isAlive():
                        return conn
                except LibvirtError:
                    pass
            _start_event_loop()
            try:
                conn = libvirt.open(uri)
            except LibvirtError as exc:
                raise PluginError(f"cannot connect to {uri}: {exc.get_error_message()}") from None
            try:  # remote connections only; a local driver (test:///) has no keepalive
                conn.setKeepAlive(self.cfg.keepalive_interval_seconds, self.cfg.keepalive_count)
            except LibvirtError:
                pass
            self._conns[uri] = conn
            self._watch(uri, conn)
            return conn

    def _watch(self, uri: str, conn: Any) -> None:
        """Count each guest start and reset the host reports (libvirt's lifecycle and reboot events,
        delivered on the event loop thread): :meth:`reboot` waits for one, :meth:`inspect` reports them."""

        def started(_conn: Any, dom: Any, event: int, _detail: int, _opaque: Any) -> None:
            if event == libvirt.VIR_DOMAIN_EVENT_STARTED:
                self._count_boot(dom.name())

        def reset(_conn: Any, dom: Any, _opaque: Any) -> None:
            self._count_boot(dom.name())

        ids = []
        try:
            ids.append(conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, started, None))
            ids.append(conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_REBOOT, reset, None))
        except LibvirtError:  # a driver without events: reboot does not wait for one
            pass
        self._watches[uri] = ids

    def _count_boot(self, domain: str) -> None:
        with self._boots_lock:
            self._boots[domain] = self._boots.get(domain, 0) + 1

    def _boot_count(self, domain: str) -> int:
        with self._boots_lock:
            return self._boots.get(domain, 0)

    def _lookup(self, conn: Any, name: str) -> Any | None:
        try:
            return conn.lookupByName(name)
        except LibvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise PluginError(f"looking up domain {name}: {exc.get_error_message()}") from None

    def _domain(self, handle: ServerHandle) -> Any | None:
        host, _ = self._host(handle.host)
        return self._lookup(self._conn(host.uri), handle.domain)

    # ---- create ---------------------------------------------------------------------------------

    def _used_mib(self, conn: Any) -> int:
        return int(sum(dom.maxMemory() for dom in conn.listAllDomains())) // 1024

    def _capacity_mib(self, host: HostConfig, conn: Any) -> int:
        return host.max_memory_mib if host.max_memory_mib is not None else int(conn.getInfo()[1])

    def _place(self, spec: ServerSpec, loc: LocationConfig) -> tuple[HostConfig, Any]:
        candidates = []
        errors = []
        for host in loc.hosts:
            try:
                conn = self._conn(host.uri)
                existing = self._lookup(conn, spec.name)
                if existing is not None:  # an earlier attempt defined it here
                    return host, conn
                if host.key in spec.avoid_hosts:  # drained by the operator: no new server here
                    continue
                candidates.append((host, self._used_mib(conn), self._capacity_mib(host, conn)))
            except (PluginError, LibvirtError) as exc:
                errors.append(f"{host.key}: {exc}")
        chosen = choose_host(candidates, spec.memory_mib)
        if chosen is None:
            detail = f" (unreachable: {'; '.join(errors)})" if errors else ""
            drained = f" ({len(spec.avoid_hosts)} drained)" if spec.avoid_hosts else ""
            raise PluginError(f"no host in location {spec.location}{drained} has {spec.memory_mib} MiB free{detail}")
        return chosen, self._conn(chosen.uri)

    def _volume(self, pool: Any, name: str) -> Any | None:
        try:
            return pool.storageVolLookupByName(name)
        except LibvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
                return None
            raise

    def _pool(self, conn: Any, loc: LocationConfig) -> tuple[Any, str]:
        try:
            pool = conn.storagePoolLookupByName(loc.pool)
        except LibvirtError as exc:
            raise PluginError(f"storage pool {loc.pool!r}: {exc.get_error_message()}") from None
        path = ET.fromstring(pool.XMLDesc()).findtext("target/path")
        if not path:
            raise PluginError(f"storage pool {loc.pool!r} has no target path (use a dir or fs pool)")
        return pool, path

    def _boot(self, conn: Any, pool: Any, image: str) -> KernelBoot | None:
        """How servers of ``image`` boot on this host: the ``kernel_boot`` setting of the image, else
        the kernel boot files ``vpsshop images sync`` put beside it in the pool, else from the disk."""
        configured = self.cfg.kernel_boot.get(image)
        if configured is not None:
            return configured
        if conn.getURI().startswith("test:"):
            return None  # libvirt's test driver keeps no volume content
        record = images.read_boot_record(conn, pool, image)
        if record is None:
            return None
        kernel = self._volume(pool, images.kernel_name(image))
        initrd = self._volume(pool, images.initrd_name(image)) if record.get("initrd") else None
        if kernel is None or (record.get("initrd") and initrd is None):
            raise PluginError(f"the kernel boot files of {image} are incomplete on this host: run vpsshop images sync")
        return KernelBoot(
            kernel=kernel.path(),
            initrd=initrd.path() if initrd is not None else None,
            cmdline=str(record.get("cmdline") or KernelBoot.model_fields["cmdline"].default),
            format=record.get("format") if record.get("format") in ("qcow2", "raw") else None,
        )

    def _disk(self, pool: Any, pool_path: str, spec: ServerSpec, boot: KernelBoot | None = None) -> Any:
        name = f"{spec.name}.qcow2"
        vol = self._volume(pool, name)
        if vol is None:
            base = f"{pool_path}/{spec.os_image}"
            boot = boot or self.cfg.kernel_boot.get(spec.os_image)
            fmt = (boot.format if boot is not None else None) or self.cfg.base_image_format
            xml = volume_xml(name, spec.disk_gib, "GiB", "qcow2", (base, fmt))
            try:
                vol = pool.createXML(xml, 0)
            except LibvirtError as exc:
                raise PluginError(
                    f"creating disk {name} on base image {spec.os_image}: {exc.get_error_message()}"
                ) from None
        return vol

    def _disk_and_seed(
        self, conn: Any, pool: Any, pool_path: str, spec: ServerSpec, boot: KernelBoot | None = None
    ) -> tuple[Any, Any]:
        """The disk and the seed volumes. The seed image (the password's hash: a few hundred ms of CPU)
        is built in a thread while libvirt makes the disk, so a new server waits for the slower one."""
        with tempfile.TemporaryDirectory(prefix="vpsshop-iso-") as tmp:
            iso = Path(tmp) / f"{spec.name}-seed.iso"
            with ThreadPoolExecutor(1, thread_name_prefix="vpsshop-seed") as builder:
                built = builder.submit(build_seed_iso, spec, iso)
                disk = self._disk(pool, pool_path, spec, boot)
                built.result()
            return disk, self._seed(conn, pool, spec, iso)

    def _seed(self, conn: Any, pool: Any, spec: ServerSpec, built: Path | None = None) -> Any:
        name = f"{spec.name}-seed.iso"
        old = self._volume(pool, name)
        if old is not None:  # rebuilt on each attempt: the content must match this spec
            old.delete(0)
        with tempfile.TemporaryDirectory(prefix="vpsshop-iso-") as tmp:
            iso = built or Path(tmp) / name
            if built is None:
                build_seed_iso(spec, iso)
            size = iso.stat().st_size
            vol = pool.createXML(volume_xml(name, size, "bytes", "raw"), 0)
            stream = conn.newStream(0)
            try:
                vol.upload(stream, 0, size, 0)
            except LibvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT and conn.getURI().startswith("test:"):
                    return vol  # libvirt's test driver keeps no volume content: nothing to upload to
                raise PluginError(f"uploading seed ISO: {exc.get_error_message()}") from None
            with iso.open("rb") as fh:
                stream.sendAll(lambda _stream, nbytes, f: f.read(nbytes), fh)
            stream.finish()
        return vol

    def _create(self, spec: ServerSpec) -> ServerHandle:
        loc = self.location(spec.location)
        host, conn = self._place(spec, loc)
        try:
            dom = self._lookup(conn, spec.name)
            if dom is None:
                pool, pool_path = self._pool(conn, loc)
                boot = self._boot(conn, pool, spec.os_image)
                disk, seed = self._disk_and_seed(conn, pool, pool_path, spec, boot)
                self._ensure_filters(conn, loc, spec)
                dom = conn.defineXML(domain_xml(spec, self.cfg, loc, disk.path(), seed.path(), boot))
            if not dom.isActive():
                dom.create()
        except LibvirtError as exc:
            raise PluginError(f"creating {spec.name} on {host.key}: {exc.get_error_message()}") from None
        return ServerHandle(host=host.key, domain=spec.name, ip=spec.ip)

    async def create(self, spec: ServerSpec) -> ServerHandle:
        return await asyncio.to_thread(self._create, spec)

    # ---- power ----------------------------------------------------------------------------------

    def _start(self, handle: ServerHandle) -> None:
        dom = self._require(handle)
        state = dom.state()[0]
        if state in (3, 7):  # paused by someone: let it run
            dom.resume()
        elif not dom.isActive():
            dom.create()

    def _stop(self, handle: ServerHandle) -> None:
        grace = self.cfg.shutdown_grace_seconds
        dom = self._domain(handle)
        if dom is None or not dom.isActive():
            return
        try:
            dom.shutdown()  # ACPI: the guest shuts down cleanly if it listens
        except LibvirtError:
            pass
        deadline = time.monotonic() + grace
        while dom.isActive() and time.monotonic() < deadline:
            time.sleep(0.5)
        if dom.isActive():
            dom.destroy()  # hard power-off, like pulling the plug

    def _reboot(self, handle: ServerHandle) -> None:
        """Ask the guest to restart (ACPI); one that has not restarted within the shutdown grace
        period (hung, or it ignores ACPI) is reset, like pressing the reset button."""
        dom = self._require(handle)
        if not dom.isActive():
            dom.create()
            return
        host, _ = self._host(handle.host)
        before = self._boot_count(handle.domain)
        try:
            dom.reboot(0)
        except LibvirtError:
            dom.reset(0)
            return
        if not self._watches.get(host.uri) or self.cfg.domain_type == "test":
            return  # no events from this host, or no guest (the test driver): nothing to wait for
        deadline = time.monotonic() + self.cfg.shutdown_grace_seconds
        while self._boot_count(handle.domain) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        if self._boot_count(handle.domain) == before and dom.isActive():
            dom.reset(0)

    def _destroy(self, handle: ServerHandle) -> None:
        if not handle.host:  # creation failed part-way: clean up wherever a piece may have landed
            for host in self.location(handle.location or "").hosts:
                self._destroy(ServerHandle(host=host.key, domain=handle.domain, location=handle.location))
            return
        host, loc = self._host(handle.host)
        conn = self._conn(host.uri)
        dom = self._lookup(conn, handle.domain)
        if dom is not None:
            if dom.isActive():
                dom.destroy()
            _undefine(dom)
        pool, _ = self._pool(conn, loc)
        for name in (f"{handle.domain}.qcow2", f"{handle.domain}-seed.iso"):
            vol = self._volume(pool, name)
            if vol is not None:
                vol.delete(0)
        if self._filtered(loc):
            for name in (filter_name(handle.domain), ipv6_filter_name(handle.domain)):
                flt = self._filter(conn, name)
                if flt is not None:
                    flt.undefine()

    # ---- snapshots ------------------------------------------------------------------------------

    def _create_snapshot(self, handle: ServerHandle, name: str) -> None:
        dom = self._require(handle)
        if _lookup_snapshot(dom, name) is not None:
            return  # a retried job: taken already
        xml = ET.Element("domainsnapshot")
        ET.SubElement(xml, "name").text = name
        ET.SubElement(xml, "description").text = "vpsshop snapshot"
        # running: an internal checkpoint (disk and memory, the guest paused meanwhile); stopped: the
        # disk only. Either lives in the server's qcow2 (the read-only seed cdrom is left out).
        dom.snapshotCreateXML(ET.tostring(xml, encoding="unicode"), 0)

    async def create_snapshot(self, handle: ServerHandle, name: str) -> None:
        """A qcow2 internal snapshot through ``virDomainSnapshotCreateXML``: of a running guest a
        checkpoint of its disk and memory (QEMU's ``savevm``: the guest is paused while its memory is
        written, then goes on), of a stopped one its disk."""
        await self._run(self._create_snapshot, handle, name)

    def _restore_snapshot(self, handle: ServerHandle, name: str) -> None:
        dom = self._require(handle)
        snap = _lookup_snapshot(dom, name)
        if snap is None:
            raise PluginError(f"domain {handle.domain} has no snapshot {name!r} on {handle.host}")
        # a checkpoint resumes where it was taken; a disk-only snapshot boots the restored disk
        dom.revertToSnapshot(snap, libvirt.VIR_DOMAIN_SNAPSHOT_REVERT_RUNNING)

    async def restore_snapshot(self, handle: ServerHandle, name: str) -> None:
        """``virDomainRevertToSnapshot`` with ``REVERT_RUNNING``: the disk (and a checkpoint's
        memory) as it was; the domain runs. QEMU cannot revert a disk that carries persistent dirty
        bitmaps (libvirt checkpoints, incremental backups of the operator's): refused then."""
        await self._run(self._restore_snapshot, handle, name)

    def _delete_snapshot(self, handle: ServerHandle, name: str) -> None:
        dom = self._domain(handle)
        snap = _lookup_snapshot(dom, name) if dom is not None else None
        if snap is not None:
            snap.delete(0)

    async def delete_snapshot(self, handle: ServerHandle, name: str) -> None:
        """``virDomainSnapshotDelete``: the internal snapshot and its metadata go."""
        await self._run(self._delete_snapshot, handle, name)

    # ---- firewall -------------------------------------------------------------------------------

    def _filtered(self, loc: LocationConfig) -> bool:
        return self.cfg.domain_type != "test" and loc.network != "user"

    def _filter(self, conn: Any, name: str) -> Any | None:
        try:
            return conn.nwfilterLookupByName(name)
        except LibvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_NWFILTER:
                return None
            raise

    def _ensure_filters(self, conn: Any, loc: LocationConfig, spec: ServerSpec) -> None:
        """Anti-spoofing before the domain first starts: the server's filter, without rules unless it
        has some already (a reinstall keeps the customer's firewall)."""
        if not self._filtered(loc):
            return
        ipv6 = spec.ipv6 is not None
        if ipv6 and spec.ipv6 is not None:
            length = spec.ipv6_prefix_length if loc.ipv6_mode == "routed" else 128
            old = self._filter(conn, ipv6_filter_name(spec.name))
            uuid = old.UUIDString() if old is not None else None
            conn.nwfilterDefineXML(ipv6_filter_xml(spec.name, spec.ipv6, length, uuid))
        if self._filter(conn, filter_name(spec.name)) is None:
            conn.nwfilterDefineXML(firewall_xml(spec.name, (), ipv6))

    def _set_firewall(self, handle: ServerHandle, rules: tuple[FirewallRule, ...]) -> None:
        host, loc = self._host(handle.host)
        if not self._filtered(loc):
            raise PluginError(f"location {handle.location!r} uses QEMU user networking: it has no firewall")
        conn = self._conn(host.uri)
        self._require(handle)
        ipv6 = self._filter(conn, ipv6_filter_name(handle.domain)) is not None
        old = self._filter(conn, filter_name(handle.domain))
        uuid = old.UUIDString() if old is not None else None
        # redefining a filter in use makes libvirt apply it again to the running guest's interface
        conn.nwfilterDefineXML(firewall_xml(handle.domain, rules, ipv6, uuid))

    async def set_firewall(self, handle: ServerHandle, rules: tuple[FirewallRule, ...]) -> None:
        """Redefine the server's network filter ``vpsshop-fw-<domain>`` (:func:`firewall_xml`):
        libvirt applies it to the running guest at once (ebtables and iptables on the host)."""
        await self._run(self._set_firewall, handle, tuple(rules))

    def _state(self, handle: ServerHandle) -> DomainState:
        dom = self._domain(handle)
        if dom is None:
            return DomainState.MISSING
        return _STATES.get(dom.state()[0], DomainState.STOPPED)

    def _require(self, handle: ServerHandle) -> Any:
        dom = self._domain(handle)
        if dom is None:
            raise PluginError(f"domain {handle.domain} does not exist on {handle.host}")
        return dom

    async def _run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except LibvirtError as exc:
            raise PluginError(f"libvirt: {exc.get_error_message()}") from None

    async def start(self, handle: ServerHandle) -> None:
        await self._run(self._start, handle)

    async def stop(self, handle: ServerHandle) -> None:
        await self._run(self._stop, handle)

    async def reboot(self, handle: ServerHandle) -> None:
        await self._run(self._reboot, handle)

    async def suspend(self, handle: ServerHandle) -> None:
        """Non-payment: the VM is shut down (hard after the grace period); its disk stays."""
        await self._run(self._stop, handle)

    async def resume(self, handle: ServerHandle) -> None:
        await self._run(self._start, handle)

    async def destroy(self, handle: ServerHandle) -> None:
        await self._run(self._destroy, handle)

    def _reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        host, loc = self._host(handle.host)
        conn = self._conn(host.uri)
        dom = self._lookup(conn, handle.domain)
        if dom is not None:
            if dom.isActive():
                dom.destroy()  # the disk is about to be erased: no point in a clean shutdown
            _undefine(dom)  # its snapshots live in the disk and go with it
        pool, pool_path = self._pool(conn, loc)
        for name in (f"{handle.domain}.qcow2", f"{handle.domain}-seed.iso"):
            vol = self._volume(pool, name)
            if vol is not None:
                vol.delete(0)
        boot = self._boot(conn, pool, spec.os_image)
        disk, seed = self._disk_and_seed(conn, pool, pool_path, spec, boot)
        self._ensure_filters(conn, loc, spec)
        dom = conn.defineXML(domain_xml(spec, self.cfg, loc, disk.path(), seed.path(), boot))
        dom.create()
        return ServerHandle(host=host.key, domain=handle.domain, ip=spec.ip or handle.ip, location=spec.location)

    async def reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        """Power off, undefine, delete disk and seed, then create both again from ``spec`` and start."""
        return await self._run(self._reinstall, handle, spec)

    def _resize(self, handle: ServerHandle, spec: ServerSpec) -> None:
        host, loc = self._host(handle.host)
        conn = self._conn(host.uri)
        dom = self._require(handle)
        grow_mib = spec.memory_mib - dom.maxMemory() // 1024
        if grow_mib > 0 and self._used_mib(conn) + grow_mib > self._capacity_mib(host, conn):
            raise PluginError(f"host {host.key} has not {grow_mib} MiB more memory free for {handle.domain}")
        disk = self._volume(self._pool(conn, loc)[0], f"{handle.domain}.qcow2")
        if disk is None:
            raise PluginError(f"domain {handle.domain} has no disk {handle.domain}.qcow2")
        self._stop(handle)  # memory and vCPU maxima change only in the definition: the next boot takes them
        config = libvirt.VIR_DOMAIN_AFFECT_CONFIG
        kib = spec.memory_mib * 1024
        if kib > dom.maxMemory():  # raise the maximum first, lower it last: current <= maximum throughout
            dom.setMemoryFlags(kib, config | libvirt.VIR_DOMAIN_MEM_MAXIMUM)
            dom.setMemoryFlags(kib, config)
        else:
            dom.setMemoryFlags(kib, config)
            dom.setMemoryFlags(kib, config | libvirt.VIR_DOMAIN_MEM_MAXIMUM)
        maximum = config | libvirt.VIR_DOMAIN_VCPU_MAXIMUM
        if spec.vcpu > dom.vcpusFlags(maximum):
            dom.setVcpusFlags(spec.vcpu, maximum)
            dom.setVcpusFlags(spec.vcpu, config)
        else:
            dom.setVcpusFlags(spec.vcpu, config)
            dom.setVcpusFlags(spec.vcpu, maximum)
        capacity = spec.disk_gib * 1024**3
        if disk.info()[1] < capacity:  # never shrunk: a retried job finds it grown already
            disk.resize(capacity, 0)
        dom.create()

    async def resize(self, handle: ServerHandle, spec: ServerSpec) -> None:
        """Shut the guest down, set memory and vCPUs (maxima too) in the domain's definition
        (``virDomainSetMemoryFlags``, ``virDomainSetVcpusFlags`` with ``AFFECT_CONFIG``), grow the
        qcow2 volume (``virStorageVolResize``) and start it: cloud-init grows the partition and the
        file system at that boot."""
        await self._run(self._resize, handle, spec)

    # ---- migrate ------------------------------------------------------------------------------------

    def hosts(self, location: str) -> list[str]:
        return [host.key for host in self.location(location).hosts]

    def _migrate(self, handle: ServerHandle, target: str, start: bool) -> ServerHandle:
        """Stop, copy disk and seed through storage streams, define and start on ``target``, then
        remove the domain and its volumes from the old host. A domain defined on ``target`` marks a
        finished copy (it is defined only after both volumes arrived whole)."""
        moved = ServerHandle(host=target, domain=handle.domain, ip=handle.ip, location=handle.location)
        dst_host, dst_loc = self._host(target)
        dst_conn = self._conn(dst_host.uri)
        dst_dom = self._lookup(dst_conn, handle.domain)
        src: tuple[HostConfig, LocationConfig] | None = None
        if handle.host and handle.host != target:
            src = self._host(handle.host)
            if src[1] is not dst_loc:
                raise PluginError(f"host {target!r} is not in the location of host {handle.host!r}")
        if src is None:  # on the target already (a retried move whose record was not saved yet)
            if dst_dom is None:
                raise PluginError(f"domain {handle.domain} does not exist on {target}")
            if start and not dst_dom.isActive():
                dst_dom.create()
            return moved
        src_conn = self._conn(src[0].uri)
        src_dom = self._lookup(src_conn, handle.domain)
        if dst_dom is None:
            if src_dom is None:
                raise PluginError(f"domain {handle.domain} is on neither {handle.host} nor {target}")
            need = int(src_dom.maxMemory()) // 1024
            free = self._capacity_mib(dst_host, dst_conn) - self._used_mib(dst_conn)
            if need > free:  # checked before the server is stopped: refused, it keeps running where it is
                raise PluginError(f"host {target} has {free} MiB free, {handle.domain} needs {need} MiB")
            self._stop(handle)
            dst_pool, dst_path = self._pool(dst_conn, dst_loc)
            src_pool, src_path = self._pool(src_conn, src[1])
            paths = {}
            for name in (f"{handle.domain}.qcow2", f"{handle.domain}-seed.iso"):
                vol = self._volume(src_pool, name)
                if vol is None:
                    raise PluginError(f"volume {name} is missing on {handle.host}")
                paths[vol.path()] = self._copy_volume(src_conn, vol, dst_conn, dst_pool, dst_path, name)
            desc = ET.fromstring(src_dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
            _move_disks(desc, paths)
            _move_boot_files(desc, src_path, dst_path)
            if self._filtered(dst_loc):  # the firewall and anti-spoofing move along
                filters = (filter_name(handle.domain), ipv6_filter_name(handle.domain))
                for flt in filter(None, (self._filter(src_conn, n) for n in filters)):
                    dst_conn.nwfilterDefineXML(flt.XMLDesc(0))
            dst_dom = dst_conn.defineXML(ET.tostring(desc, encoding="unicode"))
            _carry_snapshots(src_dom, dst_dom, paths)  # the snapshots came inside the qcow2: their metadata too
        if start and not dst_dom.isActive():
            dst_dom.create()
        if src_dom is not None:  # only now that the target holds (and runs) it
            if src_dom.isActive():
                src_dom.destroy()
            _undefine(src_dom)
        src_pool, _ = self._pool(src_conn, src[1])
        for name in (f"{handle.domain}.qcow2", f"{handle.domain}-seed.iso"):
            vol = self._volume(src_pool, name)
            if vol is not None:
                vol.delete(0)
        if self._filtered(src[1]):
            for name in (filter_name(handle.domain), ipv6_filter_name(handle.domain)):
                left = self._filter(src_conn, name)
                if left is not None:
                    left.undefine()
        return moved

    def _copy_volume(self, src_conn: Any, vol: Any, dst_conn: Any, dst_pool: Any, dst_path: str, name: str) -> str:
        """``vol`` into ``dst_pool`` as ``name`` through a download and an upload stream, by way of a
        file here; a qcow2 overlay's backing file is pointed at the target pool's base image (its
        header names a path, which may differ between hosts). Returns the new volume's path."""
        old = self._volume(dst_pool, name)
        if old is not None:  # a copy cut short: made again
            old.delete(0)
        with tempfile.TemporaryDirectory(prefix="vpsshop-migrate-") as tmp:
            local = Path(tmp) / name
            with local.open("wb") as out:

                def sink(block: bytes) -> None:
                    out.write(block)

                images.read_volume(src_conn, vol, sink)
            if name.endswith(".qcow2"):
                info = json.loads(_qemu_img("info", "--output=json", str(local)))
                backing = info.get("full-backing-filename") or info.get("backing-filename")
                if backing:
                    fmt = info.get("backing-filename-format", "raw")
                    base = f"{dst_path}/{Path(backing).name}"
                    _qemu_img("rebase", "-u", "-b", base, "-F", fmt, str(local))
            size = local.stat().st_size
            with local.open("rb") as source:
                copied = images.upload(dst_conn, dst_pool, name, source.read, size)
        return str(copied.path())

    async def migrate(self, handle: ServerHandle, host: str, *, start: bool) -> ServerHandle:
        return await self._run(self._migrate, handle, host, start)

    def _open_console(self, handle: ServerHandle, loop: asyncio.AbstractEventLoop) -> LibvirtConsole:
        dom = self._require(handle)
        if not dom.isActive():
            raise PluginError(f"domain {handle.domain} is not running")
        host, _ = self._host(handle.host)
        return LibvirtConsole(self._conn(host.uri), dom, loop)

    async def open_console(self, handle: ServerHandle) -> ConsoleStream:
        return await self._run(self._open_console, handle, asyncio.get_running_loop())

    async def state(self, handle: ServerHandle) -> DomainState:
        return await self._run(self._state, handle)

    # ---- traffic --------------------------------------------------------------------------------

    def _interface_counters(self, handle: ServerHandle) -> InterfaceCounters | None:
        dom = self._domain(handle)
        if dom is None or not dom.isActive():
            return None
        received = sent = 0
        for device, _mac in _interfaces(dom.XMLDesc(0)):
            if device:  # virDomainInterfaceStats: libvirt swaps a tap's counters to the guest's view
                stats = dom.interfaceStats(device)
                received, sent = received + int(stats[0]), sent + int(stats[4])
        return InterfaceCounters(received, sent)

    async def interface_counters(self, handle: ServerHandle) -> InterfaceCounters | None:
        """``virDomainInterfaceStats`` of each of the domain's interfaces (their host-side tap
        devices), summed; None when the domain is missing or not running."""
        return await self._run(self._interface_counters, handle)

    def _limit_bandwidth(self, handle: ServerHandle, kib_per_second: int | None) -> None:
        dom = self._require(handle)
        average = kib_per_second or 0  # an average of 0 removes the limit
        params = {
            libvirt.VIR_DOMAIN_BANDWIDTH_IN_AVERAGE: average,
            libvirt.VIR_DOMAIN_BANDWIDTH_OUT_AVERAGE: average,
        }
        # The running domain and its definition, one at a time: QEMU's driver refuses both flags at once.
        targets = [libvirt.VIR_DOMAIN_AFFECT_CONFIG]
        if dom.isActive():
            targets.insert(0, libvirt.VIR_DOMAIN_AFFECT_LIVE)
        for flags in targets:
            inactive = libvirt.VIR_DOMAIN_XML_INACTIVE if flags == libvirt.VIR_DOMAIN_AFFECT_CONFIG else 0
            for _device, mac in _interfaces(dom.XMLDesc(inactive)):
                dom.setInterfaceParameters(mac, params, flags)

    async def limit_bandwidth(self, handle: ServerHandle, kib_per_second: int | None) -> None:
        """``virDomainSetInterfaceParameters``: the ``<bandwidth>`` ``inbound`` and ``outbound``
        average of each interface (tc on its tap device), live and in the definition."""
        await self._run(self._limit_bandwidth, handle, kib_per_second)

    # ---- the guest's report ------------------------------------------------------------------------

    def _guest_report(self, handle: ServerHandle, wait_seconds: float) -> GuestReport | None:
        dom = self._require(handle)
        host, _ = self._host(handle.host)
        conn = self._conn(host.uri)
        stream = conn.newStream(libvirt.VIR_STREAM_NONBLOCK)
        # FORCE: take the channel over from a worker that died holding it.
        dom.openChannel(GUEST_CHANNEL, stream, libvirt.VIR_DOMAIN_CHANNEL_FORCE)
        try:
            return self._read_report(stream, time.monotonic() + wait_seconds)
        finally:
            try:
                stream.abort()
            except LibvirtError:
                pass

    def _read_report(self, stream: Any, deadline: float) -> GuestReport | None:
        """Ask (``report``) every few seconds until a report line arrives; answer ``ok`` to it."""
        buffered = b""
        ask_at = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= ask_at:
                stream.send(b"report\n")  # a request the guest has not read yet waits in the channel
                ask_at = time.monotonic() + ASK_AGAIN_SECONDS
            data = stream.recv(MAX_REPORT_BYTES)
            if data == -2:  # nothing yet (non-blocking)
                time.sleep(0.05)
                continue
            if not data:
                return None  # the guest went away (a reboot, a crash): the next call opens the channel again
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                report = parse_report(line)
                if report is not None:
                    stream.send(b"ok\n")
                    return report
            buffered = buffered[-MAX_REPORT_BYTES:]
        return None

    async def guest_report(self, handle: ServerHandle, wait_seconds: float) -> GuestReport | None:
        """The report the guest's reporter (``reporter.py``, installed by the seed, run after
        cloud-init's last stage) writes on the virtio-serial channel ``org.vpsshop.guest.0``,
        through ``virDomainOpenChannel``: the guest never reaches the shop's network, and the host
        keys come from the guest's own SSH daemon."""
        return await self._run(self._guest_report, handle, wait_seconds)

    # ---- inspection (for the contract kit) -------------------------------------------------------

    @property
    def inspectable(self) -> bool:
        """Inspection reads and marks disks as files, so every host must be this machine (and not
        the test driver, whose volumes have no content)."""
        if self.cfg.domain_type == "test":
            return False
        return all(_is_local(host.uri) for loc in self.cfg.locations.values() for host in loc.hosts)

    def _hosts_of(self, handle: ServerHandle) -> list[tuple[HostConfig, LocationConfig]]:
        if handle.host:
            return [self._host(handle.host)]
        loc = self.location(handle.location or "")
        return [(host, loc) for host in loc.hosts]

    def _inspect(self, handle: ServerHandle) -> HostInspection:
        name = handle.domain
        resources: list[str] = []
        running = 0
        marker = None
        sizes: dict[str, int | None] = {"vcpu": None, "memory_mib": None, "disk_gib": None}
        firewall: tuple[FirewallRule, ...] | None = None
        spoofing: bool | None = None
        snapshots: list[str] = []
        for host, loc in self._hosts_of(handle):
            conn = self._conn(host.uri)
            dom = self._lookup(conn, name)
            if dom is not None:
                resources.append(f"domain {name} on {host.key}")
                snapshots += dom.snapshotListNames(0)
                running += 1 if dom.isActive() else 0
                defined = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
                sizes["vcpu"] = int(defined.findtext("vcpu") or 0)
                sizes["memory_mib"] = dom.maxMemory() // 1024
            pool, _ = self._pool(conn, loc)
            pool.refresh(0)  # a file written beside libvirt's back is a volume too
            for volume in sorted(pool.listVolumes()):
                if volume.startswith((f"{name}.", f"{name}-seed")):
                    resources.append(f"volume {volume} on {host.key}")
            disk = self._volume(pool, f"{name}.qcow2")
            if disk is not None and marker is None:
                marker = _read_marker(disk.path())
                sizes["disk_gib"] = disk.info()[1] // 1024**3
            if self._filtered(loc):
                for filter_ in (filter_name(name), ipv6_filter_name(name)):
                    if self._filter(conn, filter_) is not None:
                        resources.append(f"nwfilter {filter_} on {host.key}")
                flt = self._filter(conn, filter_name(name))
                if flt is not None and firewall is None:
                    firewall, clean = parse_firewall(flt.XMLDesc(0))
                    nic = ET.fromstring(dom.XMLDesc(0)).find("devices/interface/filterref") if dom else None
                    spoofing = clean and nic is not None and nic.get("filter") == filter_name(name)
        return HostInspection(
            tuple(resources),
            running,
            self._boot_count(name),
            marker,
            firewall=firewall,
            anti_spoofing=spoofing,
            snapshots=tuple(snapshots),
            **sizes,
        )

    async def inspect(self, handle: ServerHandle) -> HostInspection:
        """The domain and the volumes of the server on its host (every host of its location when
        ``handle.host`` is empty), guest starts and resets seen through libvirt's events, and the
        marker on its disk (a qcow2 internal snapshot named ``vpsshop-marker-<marker>``), and the
        domain's snapshots."""
        return await self._run(self._inspect, handle)

    def _mark_disk(self, handle: ServerHandle, marker: str) -> None:
        for host, loc in self._hosts_of(handle):
            conn = self._conn(host.uri)
            dom = self._lookup(conn, handle.domain)
            if dom is None:
                continue
            if dom.isActive():
                raise PluginError(f"domain {handle.domain} is running: its disk is marked while it is stopped")
            disk = self._volume(self._pool(conn, loc)[0], f"{handle.domain}.qcow2")
            if disk is None:
                raise PluginError(f"domain {handle.domain} has no disk {handle.domain}.qcow2")
            for old in _markers(disk.path()):  # one marker: the latest
                _qemu_img("snapshot", "-d", MARKER_PREFIX + old, disk.path())
            _qemu_img("snapshot", "-c", MARKER_PREFIX + marker, disk.path())
            return
        raise PluginError(f"domain {handle.domain} does not exist")

    async def mark_disk(self, handle: ServerHandle, marker: str) -> None:
        """A qcow2 internal snapshot named after ``marker`` on the server's disk, made by ``qemu-img``
        beside libvirt (not a snapshot of libvirt's, and not a persistent bitmap: QEMU reverts no disk
        that has one): the guest never sees it, and a disk made anew has none."""
        await self._run(self._mark_disk, handle, marker)

    # ---- base images (images.py) ----------------------------------------------------------------

    def offers(self, location: str, os_image: str) -> bool:
        """Some host of the location held ``os_image`` in its pool when last listed (at start-up, by
        each health check, by ``vpsshop images``); a host not listed yet counts as holding it. The
        test driver keeps no images: always True there."""
        if self.cfg.domain_type == "test" or not self.serves(location):
            return True
        held = self._held
        hosts = self.location(location).hosts
        return any(host.key not in held or os_image in held[host.key] for host in hosts)

    def _list_pool(self, host: HostConfig, loc: LocationConfig) -> list[str]:
        conn = self._conn(host.uri)
        pool, _ = self._pool(conn, loc)
        pool.refresh(0)
        names = [str(name) for name in pool.listVolumes()]
        self._held = {**self._held, host.key: frozenset(names)}
        return names

    def _refresh_images(self) -> None:
        for loc in self.cfg.locations.values():
            for host in loc.hosts:
                try:
                    self._list_pool(host, loc)
                except (PluginError, LibvirtError):
                    self._held = {k: v for k, v in self._held.items() if k != host.key}  # unknown again

    async def refresh_images(self) -> None:
        """List every host's pool again for :meth:`offers` (a host that does not answer: unknown)."""
        if libvirt is not None and self.cfg.domain_type != "test":
            await asyncio.to_thread(self._refresh_images)

    def _image_versions(self, location: str) -> list[HostImages]:
        loc = self.location(location)
        found = []
        for host in loc.hosts:
            try:
                names = self._list_pool(host, loc)
                conn = self._conn(host.uri)
                pool, _ = self._pool(conn, loc)
                versions: dict[str, str | None] = {}
                boots: dict[str, str] = {}
                for name, recorded in images.held(names).items():
                    record = self._volume(pool, images.record_name(name)) if recorded else None
                    versions[name] = images.read_record(conn, record) if record is not None else None
                    if images.boot_record_name(name) in names:
                        boot = images.read_boot_record(conn, pool, name)
                        if boot is not None and images.boot_complete(boot, name, names):
                            boots[name] = str(boot.get("version"))
                found.append(HostImages(host.key, versions, kernel_boot=boots))
            except (PluginError, LibvirtError) as exc:
                message = exc.get_error_message() if isinstance(exc, LibvirtError) else str(exc)
                found.append(HostImages(host.key, error=message))
        return found

    async def image_versions(self, location: str) -> list[HostImages]:
        """Each host's base images and the version recorded beside each (``<image>.vpsshop-version``)."""
        return await asyncio.to_thread(self._image_versions, location)

    def _check_format(self, image: str, path: str, fmt: str, recorded: bool = False) -> None:
        """The file is in the format the catalog says, and the one this backend's overlays name as
        their backing format (``kernel_boot.<image>.format``, else, unless the format is ``recorded``
        with the image's kernel boot files, ``base_image_format``)."""
        boot = self.cfg.kernel_boot.get(image)
        expected: str
        if boot is not None:
            expected = boot.format or self.cfg.base_image_format
        else:
            expected = fmt if recorded else self.cfg.base_image_format
        if fmt != expected:
            raise PluginError(
                f"the catalog's source of {image} is {fmt}, but disks here are made on a {expected} base image: "
                f'set hypervisor.libvirt.kernel_boot."{image}".format or base_image_format'
            )
        if shutil.which("qemu-img"):
            found = json.loads(_qemu_img("info", "--output=json", path)).get("format")
            if found != fmt:
                raise PluginError(f"{image} is a {found} file, not the {fmt} image the catalog names")

    def _install_image(
        self,
        location: str,
        image: str,
        path: str,
        fmt: str,
        version: str,
        progress: Callable[[int], None] | None,
        kernel_boot: KernelBootFiles | None,
    ) -> list[str]:
        self._check_format(image, path, fmt, recorded=kernel_boot is not None)
        loc = self.location(location)
        written = []
        for host in loc.hosts:
            conn = self._conn(host.uri)
            pool, _ = self._pool(conn, loc)
            try:
                if images.install(conn, pool, image, Path(path), version, progress, kernel_boot, fmt):
                    written.append(host.key)
            except PluginError as exc:
                raise PluginError(f"{host.key}: {exc}") from None
            except LibvirtError as exc:
                raise PluginError(f"{host.key}: uploading {image}: {exc.get_error_message()}") from None
            self._list_pool(host, loc)
        return written

    async def install_image(
        self,
        location: str,
        image: str,
        path: str,
        fmt: str,
        version: str,
        progress: Callable[[int], None] | None = None,
        *,
        kernel_boot: KernelBootFiles | None = None,
    ) -> list[str]:
        """Check the file's format (``qemu-img info``, when installed) against ``fmt`` and this
        backend's backing format, then upload it into each host's pool with a storage stream (``virStorageVolUpload``),
        then record ``version`` beside it. A pool holding ``image`` already is left as it is when the
        version matches (or, unrecorded, when the file read back has that checksum) and refused
        otherwise: servers' disks are overlays on it. ``kernel_boot``: its kernel and initrd are
        uploaded the same way first and recorded (with the command line and ``fmt``) in
        ``<image>.vpsshop-boot``; servers of the image boot with them unless the
        ``kernel_boot`` setting names the image."""
        return await self._run(self._install_image, location, image, path, fmt, version, progress, kernel_boot)

    # ---- health ---------------------------------------------------------------------------------

    def _check(self) -> Readiness:
        problems = []
        hosts = 0
        for loc in self.cfg.locations.values():
            for host in loc.hosts:
                hosts += 1
                try:
                    self._conn(host.uri).getVersion()
                except (PluginError, LibvirtError) as exc:
                    problems.append(f"{host.key}: {exc}")
        if problems:
            return Readiness(False, "; ".join(problems)[:300])
        if self.cfg.domain_type != "test":
            self._refresh_images()
        return Readiness(True, f"{hosts} host(s) answer")

    async def check_ready(self) -> Readiness:
        if libvirt is None:
            return Readiness(False, f"libvirt-python is not installed: {INSTALL_BINDING}")
        return await asyncio.to_thread(self._check)

    async def preflight(self) -> None:
        """Refuse to start without the binding, without a seed-ISO tool or the password hasher, or
        with a host that does not answer at all (each message names the remedy)."""
        if libvirt is None:
            raise StartupError(
                f"hypervisor backend 'libvirt' needs libvirt-python, which is not installed: {INSTALL_BINDING}"
            )
        problems = []  # every one at once: an operator should not fix them one restart at a time
        if not (shutil.which("cloud-localds") or shutil.which("genisoimage")):
            problems.append(
                "hypervisor backend 'libvirt' builds each server's first-boot (NoCloud) seed image "
                f"with genisoimage or cloud-localds, and neither is installed: {INSTALL_SEED_TOOL}"
            )
        if sha512_crypt is None:
            problems.append(
                "hypervisor backend 'libvirt' writes the root password's hash into each seed image "
                f"with libpass, which is not installed: {INSTALL_HASHER}"
            )
        unanswered = []
        for name, loc in self.cfg.locations.items():
            for index, host in enumerate(loc.hosts):
                try:
                    await asyncio.wait_for(asyncio.to_thread(self._preflight_host, host.uri), PREFLIGHT_CONNECT_SECONDS)
                except TimeoutError:
                    problem = f"no answer within {PREFLIGHT_CONNECT_SECONDS:g} s"
                except PluginError as exc:
                    problem = str(exc)
                else:
                    continue
                unanswered.append(
                    f"host {host.uri} (setting hypervisor.libvirt.locations.{name}.hosts[{index}].uri) "
                    f"does not answer: {problem}"
                )
        if unanswered:
            problems.append(
                "; ".join(unanswered)
                + ". Is libvirtd running there, and can this user reach it (virsh -c URI version)?"
            )
        if problems:
            raise StartupError("; ".join(problems))
        await self.refresh_images()

    def _preflight_host(self, uri: str) -> None:
        try:
            self._conn(uri).getVersion()
        except LibvirtError as exc:
            raise PluginError(exc.get_error_message()) from None

    async def close(self) -> None:
        with self._lock:
            conns, self._conns = dict(self._conns), {}
            watches, self._watches = self._watches, {}
        for uri, conn in conns.items():
            try:
                for callback in watches.get(uri, []):
                    conn.domainEventDeregisterAny(callback)
                conn.close()
            except LibvirtError:
                pass


MARKER_PREFIX = "vpsshop-marker-"


def _interfaces(xml: str) -> list[tuple[str | None, str]]:
    """(target device or None when not running, MAC address) of each interface in a domain's XML."""
    found = []
    for nic in ET.fromstring(xml).findall("./devices/interface"):
        target, mac = nic.find("target"), nic.find("mac")
        if mac is not None and mac.get("address"):
            found.append((target.get("dev") if target is not None else None, mac.get("address", "")))
    return found


def _is_local(uri: str) -> bool:
    """A libvirt URI of a daemon on this machine (``qemu:///system``, ``qemu+unix:///system?socket=...``)."""
    parts = urlsplit(uri)
    return parts.hostname in (None, "", "localhost") and parts.scheme.split("+")[-1] in ("", "unix", parts.scheme)


def _qemu_img(*args: str) -> str:
    result = subprocess.run(["qemu-img", *args], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise PluginError(f"qemu-img {args[0]}: {result.stderr.strip()[:200]}")
    return result.stdout


def _undefine(dom: Any) -> None:
    """Undefine ``dom`` with the metadata of its snapshots (libvirt refuses a domain that has some
    otherwise); the snapshots themselves are inside its disk, deleted or moved by the caller."""
    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA)


def _carry_snapshots(src_dom: Any, dst_dom: Any, paths: dict[str, str]) -> None:
    """Redefine on ``dst_dom`` the metadata of ``src_dom``'s snapshots (parents first), with the
    volume paths of the domain each holds moved as in ``paths`` (old path -> new one)."""
    for snap in src_dom.listAllSnapshots(libvirt.VIR_DOMAIN_SNAPSHOT_LIST_TOPOLOGICAL):
        desc = ET.fromstring(snap.getXMLDesc(libvirt.VIR_DOMAIN_SNAPSHOT_XML_SECURE))
        if _lookup_snapshot(dst_dom, desc.findtext("name") or "") is not None:
            continue
        _move_disks(desc, paths)
        dst_dom.snapshotCreateXML(ET.tostring(desc, encoding="unicode"), libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE)


def _move_disks(desc: ET.Element, paths: dict[str, str]) -> None:
    """Point the disks of a domain definition (or of the one a snapshot holds) at their copies
    (``paths``: old path -> new one), without the backing chain libvirt recorded for the old files."""
    for disk in desc.iter("disk"):
        source = disk.find("source")
        if source is not None and source.get("file") in paths:
            source.set("file", paths[source.get("file", "")])
        for backing in disk.findall("backingStore"):
            disk.remove(backing)


def _move_boot_files(desc: ET.Element, src_path: str, dst_path: str) -> None:
    """Point a domain definition's kernel and initrd from the source host's pool (the files
    ``vpsshop images sync`` put there) at the same files in the target host's pool."""
    for tag in ("os/kernel", "os/initrd"):
        el = desc.find(tag)
        if el is None or not el.text:
            continue
        folder, _, name = el.text.rpartition("/")
        if folder == src_path.rstrip("/") and name.endswith((images.KERNEL_SUFFIX, images.INITRD_SUFFIX)):
            el.text = f"{dst_path.rstrip('/')}/{name}"


def _lookup_snapshot(dom: Any, name: str) -> Any | None:
    try:
        return dom.snapshotLookupByName(name, 0)
    except LibvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN_SNAPSHOT:
            return None
        raise


def _read_marker(path: str) -> str | None:
    """The marker of :meth:`LibvirtBackend.mark_disk` on the qcow2 file at ``path`` (read while the
    domain runs: ``-U`` shares the image)."""
    names = _markers(path)
    return names[-1] if names else None


def _markers(path: str) -> list[str]:
    """The markers on the qcow2 file at ``path``, oldest first."""
    if not Path(path).is_file():
        return []
    info = json.loads(_qemu_img("info", "-U", "--output=json", path))
    snapshots = info.get("snapshots", [])
    return [s["name"].removeprefix(MARKER_PREFIX) for s in snapshots if s.get("name", "").startswith(MARKER_PREFIX)]


@hookimpl(trylast=True)
async def vpsshop_startup(ctx: Any) -> None:
    """List each host's pool once the service or worker starts, for :meth:`LibvirtBackend.offers`
    (uvicorn's workers and ``vpsshop worker`` skip the preflight that does it in ``vpsshop serve``)."""
    backend = getattr(ctx, "hypervisor", None)
    if isinstance(backend, LibvirtBackend):
        await backend.refresh_images()


@hookimpl(trylast=True)
def vpsshop_register_hypervisors() -> Iterable[type[HypervisorBackend]]:
    # Offered even without libvirt-python: a config naming it then fails preflight with the remedy,
    # not with "no plugin offers hypervisor backend 'libvirt'".
    return [LibvirtBackend]
