"""Base class of hypervisor backends: the verbs core uses to run a customer's server.

Core calls every verb from a provisioning job (``vpsshop/servers/jobs.py``), never inside an HTTP
request, and retries a verb whose job was interrupted. So every verb must be idempotent: creating a
domain that already exists returns its handle, starting a running domain or destroying a missing
one succeeds. A verb that cannot do its work raises :class:`vpsshop.PluginError` with a message an
operator may read (core stores it as the job's error and, after the last retry, tells the customer
the order failed and refunds it).

Blocking client libraries (libvirt-python) must run in a thread (``asyncio.to_thread``) so that
the event loop serving the API never waits on a hypervisor.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import ipaddress
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vpsshop.component import Component


class DomainState(str, enum.Enum):  # noqa: UP042 - str() of a member stays "DomainState.X"
    """What the hypervisor reports about a server's virtual machine."""

    STARTING = "starting"
    """Powered on but not up yet (the guest is booting). Core waits for ``RUNNING`` without
    counting a failed attempt; a domain that stays ``STARTING`` longer than
    ``servers.boot_timeout_seconds`` after its order counts as a failed attempt."""
    RUNNING = "running"
    STOPPED = "stopped"
    PAUSED = "paused"
    MISSING = "missing"


@dataclass(frozen=True)
class AddressPool:
    """The addresses a location can hand out, as :meth:`HypervisorBackend.address_pool` returns them.

    ``pool`` names the pool; core leases each address of a pool to at most one server (a unique
    row in the ``ip_leases`` table), so two servers never share an address even with several
    workers provisioning at once.
    """

    pool: str
    addresses: Iterable[str]
    prefix_length: int = 24
    gateway: str | None = None
    nameservers: tuple[str, ...] = ()

    @classmethod
    def from_range(
        cls, pool: str, addresses: str, *, gateway: str | None = None, nameservers: Iterable[str] = ()
    ) -> AddressPool:
        """A pool of ``"203.0.113.0/26"`` (its host addresses) or ``"203.0.113.10-203.0.113.60"``
        (a range, prefix /24), without the gateway. Addresses are produced lazily, so a /16 costs
        nothing until core looks for a free one.

        :raises ValueError: a malformed range, an empty one, or one larger than a /14.
        """
        prefix = check_address_range(addresses)
        skip = {gateway} if gateway else set()
        return cls(
            pool=pool,
            addresses=_addresses(addresses, skip),
            prefix_length=prefix,
            gateway=gateway,
            nameservers=tuple(nameservers),
        )


def check_address_range(value: str) -> int:
    """Validate ``"10.0.0.0/24"`` or ``"10.0.0.10-10.0.0.20"``; return its prefix length (24 for a
    range). Use it in a settings validator so a bad range stops start-up.

    :raises ValueError: naming what is wrong.
    """
    if "-" in value:
        first_s, last_s = value.split("-", 1)
        first, last = ipaddress.ip_address(first_s.strip()), ipaddress.ip_address(last_s.strip())
        if first.version != last.version:  # `last < first` would raise TypeError, which no validator reports
            raise ValueError(f"address range {value!r} mixes IPv{first.version} and IPv{last.version}")
        if int(last) < int(first) or int(last) - int(first) > 65535:
            raise ValueError(f"address range {value!r} is empty or larger than 65536")
        return 24
    network = ipaddress.ip_network(value, strict=False)
    if network.num_addresses > 65536 * 4:
        raise ValueError(f"address pool {value!r} is larger than a /14")
    return network.prefixlen


def _addresses(value: str, skip: set[str]) -> Iterator[str]:
    if "-" in value:
        first_s, last_s = value.split("-", 1)
        first, last = ipaddress.ip_address(first_s.strip()), ipaddress.ip_address(last_s.strip())
        for i in range(int(last) - int(first) + 1):
            address = str(ipaddress.ip_address(int(first) + i))
            if address not in skip:
                yield address
        return
    for host in ipaddress.ip_network(value, strict=False).hosts():
        if str(host) not in skip:
            yield str(host)


IPV6_FIRST_HOST = 0x100
"""In ``"address"`` mode, the first interface identifier handed out (``<prefix>::100``): the
addresses below are left to the reseller's router and hosts."""


@dataclass(frozen=True)
class Ipv6Pool:
    """The IPv6 space of a location, as :meth:`HypervisorBackend.ipv6_pool` returns it.

    Two layouts, as upstreams give them (docs/servers.md, "IPv6"):

    * ``mode="address"``: one address per server from a shared on-link prefix (``prefix`` is that
      network, usually a /64 the upstream routes to the hosts' bridge); the guest gets
      ``<address>/<prefix length>`` and the ``gateway`` (the router's address on that link).
    * ``mode="routed"``: a /64 per server cut from a larger block (``prefix``, a /48 to /63) that
      the upstream routes to the host; the guest gets ``<its /64>::1/64`` and reaches the
      ``gateway`` on the link (usually the host bridge's link-local ``fe80::1``); the host routes
      each /64 to its guest.

    ``pool`` names the pool: core leases each address (or /64) to at most one server, as it leases
    IPv4 addresses.

    .. versionadded:: 1.1
    """

    pool: str
    prefix: str
    mode: str = "address"
    gateway: str | None = None
    nameservers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_ipv6_prefix(self.prefix, self.mode)

    def leases(self) -> Iterator[str]:
        """What core leases, lazily: addresses (``"address"``) or ``/64`` networks (``"routed"``)."""
        network = ipaddress.IPv6Network(self.prefix, strict=False)
        if self.mode == "routed":
            yield from (str(n) for n in network.subnets(new_prefix=64))
            return
        skip = {self.gateway} if self.gateway else set()
        for i in range(IPV6_FIRST_HOST, network.num_addresses - 1):
            address = str(network.network_address + i)
            if address not in skip:
                yield address

    def guest_address(self, lease: str) -> tuple[str, int]:
        """The address a guest holding ``lease`` configures, and its prefix length."""
        if self.mode == "routed":
            network = ipaddress.IPv6Network(lease)
            return str(network.network_address + 1), 64
        return lease, ipaddress.IPv6Network(self.prefix, strict=False).prefixlen


def check_ipv6_prefix(value: str, mode: str = "address") -> None:
    """Validate an IPv6 pool's prefix for ``mode`` (``"address"``: a /64 to /120; ``"routed"``: a
    /40 to /63, cut into /64s). Use it in a settings validator so a bad prefix stops start-up.

    :raises ValueError: naming what is wrong.

    .. versionadded:: 1.1
    """
    if mode not in ("address", "routed"):
        raise ValueError(f"IPv6 mode {mode!r} is neither 'address' nor 'routed'")
    try:
        network = ipaddress.IPv6Network(value, strict=False)
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv6 prefix such as 2001:db8:1::/64") from None
    if mode == "routed" and not 40 <= network.prefixlen <= 63:
        raise ValueError(f"a routed IPv6 block is cut into /64s: {value!r} must be a /40 to /63")
    if mode == "address" and not 64 <= network.prefixlen <= 120:
        raise ValueError(f"an IPv6 prefix shared by servers must be a /64 to /120, not {value!r}")


@dataclass(frozen=True)
class ServerSpec:
    """Everything a backend needs to create a server, resolved by core from the catalog."""

    name: str
    """Unique name for the domain on its host (core uses ``vps-<server id>-<random>``)."""
    hostname: str
    location: str
    vcpu: int
    memory_mib: int
    disk_gib: int
    os_id: str
    os_image: str
    """Base image file name of the operating system, as the catalog gives it."""
    root_password: str
    """The password in clear, for the backend to set. Write only a hash of it to a host (the libvirt
    plugin puts a sha512-crypt hash in cloud-init's ``chpasswd`` with ``type: hash``), never the
    password itself: a seed image or a file on a host outlives the customer's next password change."""
    ip: str | None = None
    """The address core leased from :meth:`HypervisorBackend.address_pool` (None: no pool)."""
    prefix_length: int = 24
    gateway: str | None = None
    nameservers: tuple[str, ...] = ()
    extra: dict[str, str] = field(default_factory=dict)
    ssh_keys: tuple[str, ...] = ()
    """OpenSSH public keys (``<type> <base64>``) to put in root's ``authorized_keys``.

    .. versionadded:: 1.1"""
    user_data: str | None = None
    """The customer's cloud-init user data (validated by core); a backend writing a cloud-init seed
    combines it with its own cloud-config through :func:`vpsshop.compose_user_data`.

    .. versionadded:: 1.1"""
    ipv6: str | None = None
    """The IPv6 address core leased from :meth:`HypervisorBackend.ipv6_pool` (None: no IPv6).

    .. versionadded:: 1.1"""
    ipv6_prefix_length: int = 64
    ipv6_gateway: str | None = None
    avoid_hosts: tuple[str, ...] = ()
    """Hosts (:attr:`ServerHandle.host` names) the operator drained (``vpsshop admin host drain``):
    placement must choose another host of the location, or fail when no other fits.

    .. versionadded:: 1.1"""


@dataclass(frozen=True)
class ServerHandle:
    """Where a created server lives: returned by :meth:`HypervisorBackend.create`, stored by core."""

    host: str
    """The host the domain was placed on; empty when creation failed before placement finished."""
    domain: str
    ip: str | None = None
    location: str | None = None
    """The server's location, so a backend can look on every host of it when ``host`` is empty."""


class ConsoleStream:
    """A guest's serial console, opened by :meth:`HypervisorBackend.open_console`.

    Bytes both ways; core copies them to and from a customer's WebSocket and calls :meth:`close`
    when either side goes away.

    .. versionadded:: 1.1
    """

    async def read(self) -> bytes:
        """The next bytes the guest wrote; ``b""`` once the console has closed. Must not block the
        event loop (run a blocking read in a thread)."""
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        """Send keystrokes to the guest."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release the console; :meth:`read` then returns what had arrived before, then ``b""``.
        Idempotent."""
        raise NotImplementedError


@dataclass(frozen=True)
class HostInspection:
    """What exists on a host for one server, as :meth:`HypervisorBackend.inspect` finds it there.

    Core never asks for it: a backend offers it to its contract kit (``vpsshop.testing``), which
    then checks what the backend did rather than what the backend says it did: that ``destroy``
    leaves nothing, that a repeated ``create``, ``suspend`` and ``resume`` keep the disk and
    ``reinstall`` replaces it, that ``reboot`` restarts the guest, and that no test leaves anything
    behind.

    .. versionadded:: 1.1
    """

    resources: tuple[str, ...] = ()
    """Everything on the host that belongs to the server, one ``"<kind> <name>"`` each:
    ``"domain vps-1-ab"``, ``"volume vps-1-ab.qcow2"``, ``"file /var/lib/x/vps-1-ab.img"``,
    ``"process 4121"``. Empty once the server is destroyed."""
    running: int = 0
    """How many guests of this server run now (active domains, live VM processes): 0 or 1, never more."""
    boots: int = 0
    """A counter that goes up each time a guest of this server starts or is reset (power on, reboot,
    resume), as the host saw it; compared before and after a verb, never read as an absolute."""
    disk_marker: str | None = None
    """The marker :meth:`HypervisorBackend.mark_disk` wrote on the server's current disk, read back
    from that disk; None when the disk has none (a new disk) or there is no disk."""
    vcpu: int | None = None
    """The domain's vCPUs as its definition on the host says (None: not known, or no domain).

    .. versionadded:: 1.1"""
    memory_mib: int | None = None
    """The domain's memory in MiB as its definition on the host says (None: not known)."""
    disk_gib: int | None = None
    """The capacity of the server's disk in whole GiB, as the host's volume says (None: not known)."""
    firewall: tuple[FirewallRule, ...] | None = None
    """The inbound rules in force for the server, read back from the host's filter (capability
    ``"firewall"``), in any order; None when the backend cannot read them back or there is no
    filter.

    .. versionadded:: 1.1"""
    anti_spoofing: bool | None = None
    """Whether the host's filter drops what the guest sends from an address not its own (capability
    ``"firewall"``); None when the backend cannot tell.

    .. versionadded:: 1.1"""
    snapshots: tuple[str, ...] | None = None
    """The names of the server's snapshots the host holds (capability ``"snapshots"``), in any
    order; None when the backend cannot read them back.

    .. versionadded:: 1.1"""


HOST_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
"""The SSH host key types a :class:`HostKey` may have (what OpenSSH's ``sshd`` serves)."""
_BASE64 = re.compile(r"^[A-Za-z0-9+/]{16,2000}={0,2}$")


@dataclass(frozen=True)
class HostKey:
    """One SSH host key of a guest, public part only: ``type`` and ``key`` as in a ``known_hosts``
    line (``ssh-ed25519`` and its base64 blob).

    Made by :meth:`parse`, which refuses anything that is not a well-formed public key of a type in
    :data:`HOST_KEY_TYPES` whose blob names that same type: a guest's report is the customer's to
    write, so it is checked like any input.

    .. versionadded:: 1.1
    """

    type: str
    key: str

    @classmethod
    def parse(cls, line: str) -> HostKey:
        """A key from ``"<type> <base64>"`` (a ``.pub`` file's line, or ``ssh-keyscan``'s output with
        its host name removed); a trailing comment is ignored.

        :raises ValueError: not a public host key (the message says why).
        """
        parts = line.split()
        if len(parts) < 2:
            raise ValueError("a host key is '<type> <base64>'")
        kind, blob = parts[0], parts[1]
        if kind not in HOST_KEY_TYPES:
            raise ValueError(f"host key type {kind[:40]!r} is not one of {', '.join(sorted(HOST_KEY_TYPES))}")
        if not _BASE64.match(blob):
            raise ValueError("a host key's blob must be base64 (16 to 2000 characters)")
        try:
            raw = base64.b64decode(blob, validate=True)
        except binascii.Error:
            raise ValueError("a host key's blob must be base64") from None
        named = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else -1
        if raw[4 : 4 + named] != kind.encode():
            raise ValueError(f"the host key's blob is not a {kind} key")
        return cls(kind, blob)

    @property
    def fingerprint(self) -> str:
        """``SHA256:<unpadded base64>``, as ``ssh-keygen -l`` and an SSH client's first-connection prompt show it."""
        digest = hashlib.sha256(base64.b64decode(self.key)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    def known_hosts_line(self, host: str) -> str:
        """``<host> <type> <key>``: a line for ``~/.ssh/known_hosts``."""
        return f"{host} {self.type} {self.key}"


@dataclass(frozen=True)
class GuestReport:
    """What a server's guest reported about its boot, through the hypervisor (never over the network),
    as :meth:`HypervisorBackend.guest_report` returns it.

    Core makes a server ``active`` (or ends a reinstall) when the report arrives: with ``ready_at``
    set when ``errors`` is empty, else with the errors in ``status_reason`` and a
    ``server.boot_failed`` event instead of ``server.active``. ``host_keys`` are shown to the
    customer as the server's SSH host keys.

    .. versionadded:: 1.1
    """

    host_keys: tuple[HostKey, ...] = ()
    """The guest's SSH host keys as its SSH daemon serves them (public parts only: the shop never
    holds a guest's private host key)."""
    ssh: bool = True
    """Whether the SSH daemon answered. False when the customer's own first-boot data turned it off:
    the server is ready all the same (it booted as asked); the status reason says SSH is off."""
    errors: tuple[str, ...] = ()
    """What went wrong during the first boot's configuration (cloud-init's errors), empty when it
    completed cleanly."""


CAPABILITY_REINSTALL = "reinstall"
CAPABILITY_CONSOLE = "console"
CAPABILITY_GUEST_REPORT = "guest_report"
CAPABILITY_IMAGES = "images"
CAPABILITY_IPV6 = "ipv6"
CAPABILITY_RESIZE = "resize"
CAPABILITY_MIGRATE = "migrate"
CAPABILITY_TRAFFIC = "traffic"
CAPABILITY_KERNEL_BOOT = "kernel_boot"


@dataclass(frozen=True)
class InterfaceCounters:
    """A domain's network interface counters, as :meth:`HypervisorBackend.interface_counters` reads
    them: bytes the guest received (``in_bytes``) and sent (``out_bytes``) on all its interfaces,
    since the domain's current QEMU process started.

    The counters fall back to zero whenever the domain is powered off and on again, migrated or
    its host rebooted; core keeps the running total (``vpsshop/servers/traffic.py``) and counts a
    counter lower than the last sample as a reset (everything read after it is new traffic).

    .. versionadded:: 1.1
    """

    in_bytes: int
    out_bytes: int


CAPABILITY_FIREWALL = "firewall"
CAPABILITY_SNAPSHOTS = "snapshots"

FIREWALL_PROTOCOLS = ("tcp", "udp", "icmp")


@dataclass(frozen=True)
class FirewallRule:
    """One inbound rule of a server's firewall, as :meth:`HypervisorBackend.set_firewall` applies it:
    new connections (or ICMP packets) of ``protocol`` to ports ``port_start``..``port_end`` from
    ``source`` are let in.

    Made by :meth:`parse` from what a customer sends; the constructor checks the fields too.

    .. versionadded:: 1.1
    """

    protocol: str
    """``"tcp"``, ``"udp"`` or ``"icmp"`` (ICMP and ICMPv6 echo and the like; no ports)."""
    port_start: int | None = None
    """First port of the range (None: every port; always None for ``"icmp"``)."""
    port_end: int | None = None
    """Last port, inclusive (equal to ``port_start`` for one port)."""
    source: str | None = None
    """The prefix the packets come from (``"198.51.100.0/24"``, ``"2001:db8::/48"``; an address is a
    /32 or /128), normalised; None: anywhere, IPv4 and IPv6."""

    def __post_init__(self) -> None:
        if self.protocol not in FIREWALL_PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(FIREWALL_PROTOCOLS)}")
        if self.protocol == "icmp" and (self.port_start is not None or self.port_end is not None):
            raise ValueError("an icmp rule has no ports")
        if (self.port_start is None) != (self.port_end is None):
            raise ValueError("a port range needs its first and its last port")
        if (
            self.port_start is not None
            and self.port_end is not None
            and not 1 <= self.port_start <= self.port_end <= 65535
        ):
            raise ValueError("ports run from 1 to 65535, the first no higher than the last")
        if self.source is not None:
            network = ipaddress.ip_network(self.source, strict=False)
            if str(network) != self.source:
                raise ValueError(f"source {self.source!r} is not normalised (parse() does it)")

    @classmethod
    def parse(cls, protocol: str, ports: str | int | None = None, source: str | None = None) -> FirewallRule:
        """A rule from a customer's input: ``ports`` as ``22``, ``"22"`` or ``"8000-8100"`` (None or
        ``""``: every port), ``source`` as a prefix or an address (None, ``""``: anywhere).

        :raises ValueError: naming what is wrong.
        """
        start: int | None = None
        end: int | None = None
        if isinstance(ports, bool):
            raise ValueError("ports is a port (22) or a range ('8000-8100')")
        if isinstance(ports, int):
            start = end = ports
        elif ports is not None and ports.strip():
            first, sep, last = ports.strip().partition("-")
            if not first.strip().isdigit() or (sep and not last.strip().isdigit()):
                raise ValueError("ports is a port (22) or a range ('8000-8100')")
            start = int(first)
            end = int(last) if sep else start
        prefix: str | None = None
        if source is not None and source.strip():
            try:
                network = ipaddress.ip_network(source.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"source {source[:60]!r} is not an address or a prefix such as 198.51.100.0/24"
                ) from None
            prefix = str(network)
        return cls(protocol.strip().lower() if isinstance(protocol, str) else protocol, start, end, prefix)

    @property
    def ports(self) -> str | None:
        """``"22"``, ``"8000-8100"`` or None (every port)."""
        if self.port_start is None:
            return None
        return str(self.port_start) if self.port_start == self.port_end else f"{self.port_start}-{self.port_end}"

    def as_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "ports": self.ports, "source": self.source}


@dataclass(frozen=True)
class HostImages:
    """The base images one host holds, as :meth:`HypervisorBackend.image_versions` finds them.

    .. versionadded:: 1.1
    """

    host: str
    images: dict[str, str | None] = field(default_factory=dict)
    """Image file name -> the version recorded beside it (``"sha256:<hex>"``), None when the file is
    there without a record (put there by hand)."""
    error: str | None = None
    """Why the host could not be asked (it did not answer); ``images`` is then empty."""
    kernel_boot: dict[str, str] = field(default_factory=dict)
    """Image file name -> the :attr:`KernelBootFiles.version` of the kernel boot files held complete
    beside it (capability ``"kernel_boot"``); an image without them is not listed here.

    .. versionadded:: 1.1"""


def kernel_boot_version(kernel_checksum: str, initrd_checksum: str | None, cmdline: str) -> str:
    """What :attr:`KernelBootFiles.version` is for these checksums and command line.

    .. versionadded:: 1.1
    """
    return f"kernel={kernel_checksum} initrd={initrd_checksum or '-'} cmdline={cmdline}"


@dataclass(frozen=True)
class KernelBootFiles:
    """The verified kernel and initrd an image boots with by direct kernel boot (a catalog image
    source's ``kernel_boot``), as ``vpsshop images sync`` hands them to
    :meth:`HypervisorBackend.install_image`.

    .. versionadded:: 1.1
    """

    kernel: str
    """Local path of the verified kernel file."""
    kernel_checksum: str
    """``"sha256:<hex>"`` or ``"sha512:<hex>"``: what ``kernel`` was verified against."""
    cmdline: str
    """The kernel command line the image's servers boot with."""
    initrd: str | None = None
    """Local path of the verified initrd, None when the kernel needs none."""
    initrd_checksum: str | None = None

    @property
    def version(self) -> str:
        """One string naming the files and command line (:func:`kernel_boot_version`): what a
        backend records beside the image and reports in :attr:`HostImages.kernel_boot`."""
        return kernel_boot_version(self.kernel_checksum, self.initrd_checksum, self.cmdline)


class HypervisorBackend(Component[Any]):  # not generic: a backend declares its own `config: MyConfig`
    """Runs virtual machines. Every verb must be overridden and must be idempotent: core retries
    a verb after a crash, so starting a running domain or destroying a missing one succeeds.

    ``kind`` names the backend in the ``hypervisor.backend`` setting (``"libvirt"``).

    Optional verbs (:meth:`reinstall`, :meth:`open_console`) are offered by naming them in
    ``capabilities``; core answers the customer ``409 not_supported`` for a verb the configured
    backend does not list, and never calls it.
    """

    kind: ClassVar[str]
    capabilities: frozenset[str] = frozenset()  # not a ClassVar: a backend may narrow its own (vpsshop_libvirt)
    """Optional verbs this backend implements: ``"reinstall"``, ``"console"``, ``"guest_report"``,
    ``"images"``, ``"ipv6"`` (:meth:`ipv6_pool`; the guest gets ``spec.ipv6``), ``"resize"``, ``"migrate"``
    (:meth:`hosts` and :meth:`migrate`), ``"traffic"`` (:meth:`interface_counters` and :meth:`limit_bandwidth`),
    ``"firewall"`` (:meth:`set_firewall`, and anti-spoofing on every guest from :meth:`create` on),
    ``"snapshots"`` (:meth:`create_snapshot`, :meth:`restore_snapshot`, :meth:`delete_snapshot`),
    ``"kernel_boot"`` (with ``"images"``: :meth:`install_image` takes ``kernel_boot`` files and the
    servers of such an image boot with them).

    .. versionadded:: 1.1
    .. versionadded:: 1.1 ``"kernel_boot"``"""

    def serves(self, location: str) -> bool:
        """Whether this backend can place servers in catalog location ``location``.

        Core asks before it takes an order (and prices a quote): a location the backend does not
        serve is refused with ``409 location_unavailable`` before anything is charged, it is left
        out of the location ids the API description lists as orderable, and a production shop does
        not start while a catalog location is served by none (the sandbox's banner says so). Must
        be cheap (no network calls) and not change while the process runs. Default: True (every
        location).

        .. versionadded:: 1.1
        """
        return True

    def offers(self, location: str, os_image: str) -> bool:
        """Whether some host of ``location`` holds the base image ``os_image`` (a catalog OS's
        ``image``), as last seen.

        Core asks before it takes an order: an OS no host of the location holds is refused with
        ``409 os_unavailable`` before anything is charged, and left out where the location's
        orderable systems are listed. Must be cheap (no network calls: answer from what
        :meth:`image_versions`, :meth:`preflight` or :meth:`check_ready` last saw); a host not seen
        yet counts as holding every image. Default: True.

        .. versionadded:: 1.1
        """
        return True

    async def image_versions(self, location: str) -> list[HostImages]:
        """Optional (capability ``"images"``): the base images each host of ``location`` holds, read
        from the hosts themselves. Refreshes what :meth:`offers` answers from.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

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
        """Optional (capability ``"images"``): put the verified file at ``path`` (format ``fmt``) on
        every host of ``location`` as base image ``image``, through the hypervisor's own API (no SSH),
        and record ``version`` beside it. Hosts holding ``version`` already are skipped; an upload
        that fails part-way leaves no record, so the next call sends it again. Returns the hosts
        written to. ``progress`` is called with the bytes sent so far.

        ``kernel_boot``: the image boots by direct kernel boot with these verified files; put them
        beside the image on each host too (before the image counts as held there), record their
        :attr:`~KernelBootFiles.version`, and boot the servers made from ``image`` with them. Core
        passes it only to a backend with capability ``"kernel_boot"`` and only for an image whose
        source has ``kernel_boot``, so an implementation without the parameter keeps working.

        :raises PluginError: a host did not answer or refused the upload (hosts done before stay done).

        .. versionadded:: 1.1
        .. versionadded:: 1.1 ``kernel_boot``
        """
        raise NotImplementedError

    def location_setting(self, location: str) -> str:
        """The setting an operator adds so that :meth:`serves` says yes for ``location``; the start-up
        refusal of an unserved catalog location names it (once, however many locations share it:
        a backend with one list-valued setting returns that setting for every location). Default:
        ``hypervisor.<kind>``.

        .. versionadded:: 1.1
        """
        return f"hypervisor.{self.kind}"

    def address_pool(self, location: str) -> AddressPool | None:
        """The address pool of ``location``, or None when the backend assigns addresses itself.

        Called by core in the provisioning job before :meth:`create`; core picks a free address
        and passes it as ``spec.ip``. Must be cheap (no network calls). Default: None.
        """
        return None

    def ipv6_pool(self, location: str) -> Ipv6Pool | None:
        """The IPv6 pool of ``location``, or None when its servers get no IPv6 address.

        Asked only of a backend listing ``"ipv6"`` in ``capabilities``. Core leases from it in the
        provisioning job and passes the guest's address as ``spec.ipv6`` (with
        ``ipv6_prefix_length`` and ``ipv6_gateway``); the backend configures it in the guest. Must
        be cheap (no network calls). Default: None.

        .. versionadded:: 1.1
        """
        return None

    async def create(self, spec: ServerSpec) -> ServerHandle:
        """Define the domain with its disk and first-boot data and start it.

        Called once per provisioning attempt. If a domain named ``spec.name`` exists already (an
        earlier attempt got that far) return its handle. Return the host it was placed on, the
        domain name and the address the server answers on.
        """
        raise NotImplementedError

    async def start(self, handle: ServerHandle) -> None:
        """Power the domain on (customer's power action). Running already: nothing to do."""
        raise NotImplementedError

    async def stop(self, handle: ServerHandle) -> None:
        """Power the domain off (customer's power action). Stopped already: nothing to do."""
        raise NotImplementedError

    async def reboot(self, handle: ServerHandle) -> None:
        """Restart the domain (customer's power action); start it if it is off."""
        raise NotImplementedError

    async def suspend(self, handle: ServerHandle) -> None:
        """Stop the domain for non-payment, keeping its disk. Called when a server is suspended."""
        raise NotImplementedError

    async def resume(self, handle: ServerHandle) -> None:
        """Undo :meth:`suspend`: start the domain again. Called after a suspended server is renewed."""
        raise NotImplementedError

    async def destroy(self, handle: ServerHandle) -> None:
        """Remove the domain, its disks and its first-boot data. Called once a server is terminated
        (and to clean up after a failed provisioning). Core frees the address lease afterwards."""
        raise NotImplementedError

    async def state(self, handle: ServerHandle) -> DomainState:
        """What the domain is doing now. ``MISSING`` when it does not exist. Never raises for a
        missing domain. ``STARTING`` while a guest powered on by :meth:`create`, :meth:`start`,
        :meth:`reboot` or :meth:`resume` is still booting (a backend that cannot tell reports
        ``RUNNING`` at once)."""
        raise NotImplementedError

    async def reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        """Optional (capability ``"reinstall"``): wipe the server's disk and boot it fresh.

        Called from a ``reinstall`` job for an active server. Power the domain off, replace its disk
        with a new one made from ``spec.os_image`` (the OS may differ from the first one), write new
        first-boot data from ``spec`` (new password, keys, user data; same name, address and
        hostname) and start it. Idempotent: a retried job does all of it again. Return the handle.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def resize(self, handle: ServerHandle, spec: ServerSpec) -> None:
        """Optional (capability ``"resize"``): give the server the memory, vCPUs and disk of ``spec``.

        Called from a ``resize`` job for an active server whose plan changed. Power the domain off
        (cleanly, as :meth:`stop`), set its memory and vCPUs (maxima included) to ``spec.memory_mib``
        and ``spec.vcpu``, grow its disk to ``spec.disk_gib`` (never shrink it: core refuses a plan
        with a smaller disk) and start it; the guest grows its file system at that boot (cloud-init's
        growpart and resizefs run on every boot). Keep the disk's data, address and first-boot data.
        Idempotent: a retried job finds some of it done. :raises PluginError: the host has no room.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def set_firewall(self, handle: ServerHandle, rules: tuple[FirewallRule, ...]) -> None:
        """Optional (capability ``"firewall"``): make ``rules`` the server's inbound firewall, in
        place of the ones before, on a running guest within seconds and on every later boot.

        With rules, the hypervisor lets in new connections they allow and drops every other new
        inbound one (answers to the guest's own connections, and ARP, DHCP and IPv6 neighbour
        discovery, still pass); with none, every inbound connection is let in. Whatever the rules,
        a backend with this capability applies anti-spoofing to every guest from :meth:`create` on
        (and after :meth:`reinstall`): the guest's frames leave only with its own MAC address and
        its packets only from its own addresses (``spec.ip``, ``spec.ipv6`` or the routed /64,
        IPv6 link-local). The customer cannot turn that off. :meth:`destroy` removes the filter.

        Called from a ``firewall`` job; idempotent (a retried job applies the same rules again).

        :raises PluginError: the domain does not exist, or the host refused the filter.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def create_snapshot(self, handle: ServerHandle, name: str) -> None:
        """Optional (capability ``"snapshots"``): take a restore point of the server named ``name``
        (letters, digits, ``-``; core names them ``snap-<id>``): its disk as it is now, and its
        memory too when the backend can (the guest then goes on where it was at :meth:`restore_snapshot`).
        A running guest goes on running (it may be paused for the seconds the snapshot takes); a
        stopped one stays stopped.

        Called from a ``snapshot`` job; idempotent: a snapshot of that name that exists already is kept
        (a retried job). :meth:`destroy` and :meth:`reinstall` remove every snapshot of the server.

        :raises PluginError: the domain does not exist, or the host refused the snapshot.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def restore_snapshot(self, handle: ServerHandle, name: str) -> None:
        """Optional (capability ``"snapshots"``): put the server back to snapshot ``name``: its disk
        (a file written or deleted since is as it was then) and, where the snapshot holds it, its
        memory. The domain runs afterwards. The snapshot stays (it can be restored again); later
        snapshots stay too.

        Called from a ``restore`` job; idempotent (a retried job restores the same point again).

        :raises PluginError: the domain or the snapshot does not exist, or the host refused.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def delete_snapshot(self, handle: ServerHandle, name: str) -> None:
        """Optional (capability ``"snapshots"``): remove snapshot ``name`` and the space it holds.
        The server's disk as it is now is untouched. A snapshot (or a domain) that does not exist is
        not an error (a retried job).

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def open_console(self, handle: ServerHandle) -> ConsoleStream:
        """Optional (capability ``"console"``): attach to the domain's serial console.

        Called when a customer opens the console WebSocket. A second attach may take the console
        over from the first. :raises PluginError: the domain is missing or not running.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def guest_report(self, handle: ServerHandle, wait_seconds: float) -> GuestReport | None:
        """Optional (capability ``"guest_report"``): the report of the guest's first boot since the
        last :meth:`create` or :meth:`reinstall`, waiting up to ``wait_seconds`` for it.

        Called by the provisioning and reinstall jobs once :meth:`state` says ``RUNNING``; None when
        the guest has not reported yet (core calls again until ``servers.boot_timeout_seconds`` after
        the order or the reinstall request, then counts a failed attempt). The report must come from
        the guest through the hypervisor (a virtio-serial channel, the guest agent, the console), so
        a guest never needs to reach the shop's network; return it as soon as it arrives, since the
        time to ``active`` is what a customer waits for. A backend without it makes servers ``active``
        as soon as they run, without host keys.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    def hosts(self, location: str) -> list[str]:
        """Optional (capability ``"migrate"``): the names of the hosts of ``location``, as
        :attr:`ServerHandle.host` gives them. Must be cheap (no network calls: from settings).

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def migrate(self, handle: ServerHandle, host: str, *, start: bool) -> ServerHandle:
        """Optional (capability ``"migrate"``): move the server to ``host`` (another host of its
        location), keeping its disk, its first-boot data (the guest must not take itself for a new
        instance) and its address, without shared storage.

        Power the domain off, copy its disk and seed to ``host`` through the hypervisor's own API,
        define the domain there and start it when ``start`` (core passes whether the server was powered
        on); only once it runs (or is defined, for a server left off) on ``host`` remove it and its
        volumes from the old host.
        Idempotent and resumable: a call interrupted at any point and called again finishes the
        move (a copy cut short is made again); a server on ``host`` already only has the old host
        cleaned. Returns the new handle (``host`` set to ``host``).

        :raises PluginError: ``host`` is not a host of the server's location, or the copy failed
            (the server then still runs from the old host's disk, which is left in place).

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def interface_counters(self, handle: ServerHandle) -> InterfaceCounters | None:
        """Optional (capability ``"traffic"``): the domain's interface counters now (from the host,
        never from the guest), summed over its interfaces; None when the domain is not running (a
        stopped domain has no counters).

        Called by the ``servers-traffic`` task every ``traffic.sample_seconds`` for each active
        server. Must be cheap: one call to the host per server.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def limit_bandwidth(self, handle: ServerHandle, kib_per_second: int | None) -> None:
        """Optional (capability ``"traffic"``): cap the domain's network rate at ``kib_per_second``
        (KiB/s, each way: what the guest sends and what it receives), or lift the cap (None).

        Called by the ``servers-traffic`` task when a server passes its allowance under the
        ``throttle`` policy, and with None once a renewal starts a new traffic period. Apply it to
        the running domain and to its definition, so the cap outlives a reboot; a stopped domain
        gets it in its definition. Idempotent: setting the cap it has already succeeds.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def inspect(self, handle: ServerHandle) -> HostInspection:
        """Optional, for the contract kit only: what exists on the host for ``handle`` now
        (:class:`HostInspection`), found by looking at the host (its domains, volumes, files,
        processes), not at the backend's own records. ``handle.host`` may be empty: look on every
        host of ``handle.location``. A backend that does not override it gets the kit's weaker
        checks, which only ask :meth:`state`.

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    async def mark_disk(self, handle: ServerHandle, marker: str) -> None:
        """Optional, with :meth:`inspect`: write ``marker`` (a short ASCII string) on the server's
        current disk, where :meth:`inspect` reads it back as ``disk_marker``; a disk made anew
        (reinstall, or a broken verb that re-provisions) must come without it. The kit calls it with
        the domain stopped. Write it where the guest does not look (the libvirt backend names a
        qcow2 bitmap after it).

        .. versionadded:: 1.1
        """
        raise NotImplementedError

    @property
    def inspectable(self) -> bool:
        """Whether this backend offers :meth:`inspect` and :meth:`mark_disk` to its kit."""
        cls = type(self)
        return cls.inspect is not HypervisorBackend.inspect and cls.mark_disk is not HypervisorBackend.mark_disk
