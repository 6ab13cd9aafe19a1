"""The hypervisor simulator: servers that exist only as records in the shop's database.

It needs nothing native and nothing outside Python, so it is what the sandbox runs when no
``[hypervisor] backend`` is set (it has the highest ``sandbox_priority``). Servers go through the
whole hypervisor contract (create, start, stop, reboot, suspend, resume, destroy, state, and the
optional reinstall and open_console, whose console is a fake that says so): a
powered-on domain reports ``starting`` for ``boot_seconds``, then ``running``; addresses come from
``addresses`` and are leased by core exactly as libvirt's are. Nothing boots for real and nobody
can log in to a simulated server.

Each domain is one record of :class:`vpsshop.PluginState` (namespace ``simulator``, key = domain
name), written with compare-and-set, so several ``vpsshop serve`` processes and a ``vpsshop
worker`` see and change the same domains, and they survive a restart. The record is the
simulated host's view of the server: whether the domain is defined, its volumes (a disk, whose
identity changes when it is made anew, and a seed), how many guests run and how often one
started; :meth:`SimulatedBackend.inspect` reads it for the contract kit.

It is also the shortest complete hypervisor plugin: it imports only ``vpsshop``'s public API.

Settings (``[hypervisor] backend = "simulator"``)::

    [hypervisor.simulator]
    boot_seconds = 3                   # how long a powered-on domain reports "starting"
    addresses = "10.99.0.0/16"         # CIDR or "10.99.0.10-10.99.0.60"
    gateway = "10.99.0.1"
    nameservers = ["1.1.1.1", "9.9.9.9"]
    ipv6 = "fd00:99::/64"              # one address per server from ::100 ("" for no IPv6); ipv6_mode =
    ipv6_gateway = "fd00:99::1"        # "routed" hands out a /64 each from a /40-/63 block
    hosts = ["simulator"]              # simulated hosts of every location: drain one, move servers between them
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vpsshop import (
    AddressPool,
    ConsoleStream,
    DomainState,
    FirewallRule,
    GuestReport,
    HostInspection,
    HostKey,
    HypervisorBackend,
    InterfaceCounters,
    Ipv6Pool,
    PluginError,
    PluginState,
    Readiness,
    ServerHandle,
    ServerSpec,
    StartupError,
    check_address_range,
    check_ipv6_prefix,
    hookimpl,
)

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop import ShopContext

HOST = "simulator"


class SimulatorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    boot_seconds: float = Field(3, ge=0, le=3600, description="How long a powered-on domain reports starting.")
    addresses: str = Field("10.99.0.0/16", description="CIDR or first-last range of the addresses to hand out.")
    gateway: str | None = "10.99.0.1"
    nameservers: list[str] = Field(default_factory=lambda: ["1.1.1.1", "9.9.9.9"])
    ipv6: str | None = Field(
        "fd00:99::/64", description="IPv6 prefix (address mode) or block (routed mode) to hand out; none: no IPv6."
    )
    ipv6_mode: Literal["address", "routed"] = "address"
    ipv6_gateway: str | None = "fd00:99::1"
    hosts: list[str] = Field(
        default_factory=lambda: [HOST],
        min_length=1,
        description="Names of the simulated hosts of every location (a server is placed on the first one not "
        "drained; vpsshop admin migrate moves it to another).",
    )

    @field_validator("addresses")
    @classmethod
    def _parse(cls, value: str) -> str:
        check_address_range(value)
        return value

    @field_validator("ipv6")
    @classmethod
    def _no_ipv6(cls, value: str | None) -> str | None:
        return value or None  # TOML has no null: "" turns IPv6 off

    @model_validator(mode="after")
    def _check_ipv6(self) -> SimulatorConfig:
        if self.ipv6 is not None:
            check_ipv6_prefix(self.ipv6, self.ipv6_mode)
        return self


class SimulatedBackend(HypervisorBackend):
    """Domains as database records; see the module docstring."""

    kind = "simulator"
    Config = SimulatorConfig
    sandbox_priority = 100
    capabilities = frozenset(
        {"reinstall", "console", "guest_report", "ipv6", "resize", "migrate", "traffic", "firewall", "snapshots"}
    )

    config: SimulatorConfig
    records: PluginState | None = None
    """The domains' records, from :meth:`bind`."""

    def bind(self, ctx: ShopContext) -> None:
        self.records = PluginState(ctx, "simulator")
        self.clock = ctx.clock

    def address_pool(self, location: str) -> AddressPool | None:
        cfg = self.config
        return AddressPool.from_range("simulator", cfg.addresses, gateway=cfg.gateway, nameservers=cfg.nameservers)

    def ipv6_pool(self, location: str) -> Ipv6Pool | None:
        cfg = self.config
        if cfg.ipv6 is None:
            return None
        return Ipv6Pool("simulator:v6", cfg.ipv6, mode=cfg.ipv6_mode, gateway=cfg.ipv6_gateway)

    # ---- the record of a domain -----------------------------------------------------------------

    def _state(self) -> PluginState:
        if self.records is None:
            raise PluginError("the simulator is not bound to a shop: core calls bind(ctx) before any verb")
        return self.records

    def _powered_on(self, data: dict[str, Any]) -> dict[str, Any]:
        """A guest starts (or is reset): one guest runs, and it has booted once more."""
        booted = self.clock.now() + timedelta(seconds=self.config.boot_seconds)
        return {
            **data,
            "power": "on",
            "booted_at": booted.isoformat(),
            "guests": 1,
            "boots": data.get("boots", 0) + 1,
            "in_bytes": 0,  # a new guest process: its interface counters start again, as QEMU's do
            "out_bytes": 0,
        }

    @staticmethod
    def _new_disk(data: dict[str, Any]) -> dict[str, Any]:
        """The server's disk and seed made anew (create, reinstall): a new identity, no marker, and a
        new SSH host key, as a real first boot makes one (its private half is thrown away at once:
        nobody logs in to a simulated server)."""
        host_key = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
        return {
            **data,
            "defined": True,
            "disk": secrets.token_hex(8),
            "disk_marker": None,
            "seed": True,
            "host_key": host_key.decode(),
            "snapshots": {},  # a new disk has no snapshots
        }

    async def _power(self, handle: ServerHandle, change: Any, *, must_exist: bool) -> None:
        missing = False

        def apply(data: dict[str, Any] | None) -> dict[str, Any] | None:
            nonlocal missing
            missing = data is None
            return None if data is None else change(data)

        await self._state().modify(handle.domain, apply)
        if missing and must_exist:
            raise PluginError(f"domain {handle.domain} does not exist on {HOST}")

    # ---- the verbs ------------------------------------------------------------------------------

    def hosts(self, location: str) -> list[str]:
        return list(self.config.hosts)

    async def _host_of(self, domain: str) -> str:
        record = await self._state().get(domain)
        return str(record.data.get("host", HOST)) if record is not None else HOST

    async def create(self, spec: ServerSpec) -> ServerHandle:
        placed = next((h for h in self.config.hosts if h not in spec.avoid_hosts), None)
        if placed is None:
            raise PluginError(f"every host of location {spec.location} is drained")
        data = self._powered_on(
            self._new_disk(
                {
                    "hostname": spec.hostname,
                    "location": spec.location,
                    "ip": spec.ip,
                    "vcpu": spec.vcpu,
                    "memory_mib": spec.memory_mib,
                    "disk_gib": spec.disk_gib,
                    "os": spec.os_id,
                    "created_at": self.clock.now().isoformat(),
                    "host": placed,
                }
            )
        )
        if await self._state().create(spec.name, data) is None:  # an earlier attempt made it
            await self._power(ServerHandle(HOST, spec.name), self._start_data, must_exist=True)
            placed = await self._host_of(spec.name)
        return ServerHandle(host=placed, domain=spec.name, ip=spec.ip, location=spec.location)

    def _start_data(self, data: dict[str, Any]) -> dict[str, Any]:
        return data if data["power"] == "on" else self._powered_on(data)

    async def start(self, handle: ServerHandle) -> None:
        await self._power(handle, self._start_data, must_exist=True)

    async def stop(self, handle: ServerHandle) -> None:
        await self._power(handle, self._stopped_data, must_exist=False)

    @staticmethod
    def _stopped_data(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "power": "off", "booted_at": None, "guests": 0}

    async def reboot(self, handle: ServerHandle) -> None:
        await self._power(handle, self._powered_on, must_exist=True)

    async def suspend(self, handle: ServerHandle) -> None:
        """Non-payment: powered off; the (simulated) disk stays."""
        await self.stop(handle)

    async def resume(self, handle: ServerHandle) -> None:
        await self.start(handle)

    async def destroy(self, handle: ServerHandle) -> None:
        await self._state().delete(handle.domain)

    async def reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        """A new (simulated) disk: the record's OS changes and the domain boots again."""

        def change(data: dict[str, Any]) -> dict[str, Any]:
            return self._powered_on(
                self._new_disk(
                    {
                        **data,
                        "os": spec.os_id,
                        "ssh_keys": len(spec.ssh_keys),
                        "reinstalled_at": self.clock.now().isoformat(),
                    }
                )
            )

        await self._power(handle, change, must_exist=True)
        host = await self._host_of(handle.domain)
        return ServerHandle(host=host, domain=handle.domain, ip=spec.ip or handle.ip, location=spec.location)

    async def migrate(self, handle: ServerHandle, host: str, *, start: bool) -> ServerHandle:
        """The record moves to ``host`` with its disk (same identity and marker) and seed; the guest
        is powered off for the copy and on again when ``start``."""
        if host not in self.config.hosts:
            raise PluginError(f"host {host!r} is not one of the simulator's hosts ({', '.join(self.config.hosts)})")

        def move(data: dict[str, Any]) -> dict[str, Any]:
            if data.get("host", HOST) == host:
                return self._start_data(data) if start else data
            stopped = {**self._stopped_data(data), "host": host}
            return self._powered_on(stopped) if start else stopped

        await self._power(handle, move, must_exist=True)
        return ServerHandle(host=host, domain=handle.domain, ip=handle.ip, location=handle.location)

    async def resize(self, handle: ServerHandle, spec: ServerSpec) -> None:
        """The plan's memory and vCPUs, the disk grown (never shrunk, its data and marker kept), and
        the domain booted again, as a real resize powers it off and on."""

        def change(data: dict[str, Any]) -> dict[str, Any]:
            sized = {
                **data,
                "vcpu": spec.vcpu,
                "memory_mib": spec.memory_mib,
                "disk_gib": max(spec.disk_gib, data.get("disk_gib", 0)),
            }
            return self._powered_on(self._stopped_data(sized))

        await self._power(handle, change, must_exist=True)

    async def set_firewall(self, handle: ServerHandle, rules: tuple[FirewallRule, ...]) -> None:
        """The rules go in the domain's record (its simulated filter, anti-spoofing always on)."""
        firewall = [rule.as_dict() for rule in rules]
        await self._power(handle, lambda data: {**data, "firewall": firewall}, must_exist=True)

    async def create_snapshot(self, handle: ServerHandle, name: str) -> None:
        """The disk's identity and marker noted under ``name`` in the record (an existing one is kept)."""

        def take(data: dict[str, Any]) -> dict[str, Any]:
            taken = dict(data.get("snapshots", {}))
            taken.setdefault(name, {"disk": data.get("disk"), "disk_marker": data.get("disk_marker")})
            return {**data, "snapshots": taken}

        await self._power(handle, take, must_exist=True)

    async def restore_snapshot(self, handle: ServerHandle, name: str) -> None:
        """The disk's identity and marker as the snapshot noted them; the domain runs (booted anew)."""
        record = await self._state().get(handle.domain)
        if record is None or name not in record.data.get("snapshots", {}):
            raise PluginError(f"domain {handle.domain} has no snapshot {name!r} on {HOST}")

        def restore(data: dict[str, Any]) -> dict[str, Any]:
            taken = data.get("snapshots", {})[name]
            return self._powered_on(self._stopped_data({**data, **taken}))

        await self._power(handle, restore, must_exist=True)

    async def delete_snapshot(self, handle: ServerHandle, name: str) -> None:
        def drop(data: dict[str, Any]) -> dict[str, Any]:
            return {**data, "snapshots": {k: v for k, v in data.get("snapshots", {}).items() if k != name}}

        await self._power(handle, drop, must_exist=False)

    async def open_console(self, handle: ServerHandle) -> ConsoleStream:
        record = await self._state().get(handle.domain)
        if record is None or record.data["power"] != "on":
            raise PluginError(f"domain {handle.domain} is not running on {HOST}")
        return SimulatedConsole(record.data.get("hostname", handle.domain), record.data.get("os", "linux"))

    async def state(self, handle: ServerHandle) -> DomainState:
        record = await self._state().get(handle.domain)
        if record is None or not record.data.get("defined", True):
            return DomainState.MISSING
        if record.data["power"] == "off":
            return DomainState.STOPPED
        if self.clock.now() < datetime.fromisoformat(record.data["booted_at"]):
            return DomainState.STARTING
        return DomainState.RUNNING

    async def guest_report(self, handle: ServerHandle, wait_seconds: float) -> GuestReport | None:
        """A simulated guest reports as soon as it has booted (``boot_seconds`` after power-on): a clean
        first boot, SSH on, the host key its disk was made with."""
        for _ in range(2):
            record = await self._state().get(handle.domain)
            if record is None or record.data["power"] != "on":
                return None
            left = (datetime.fromisoformat(record.data["booted_at"]) - self.clock.now()).total_seconds()
            if left <= 0:
                key = record.data.get("host_key")
                return GuestReport(host_keys=(HostKey.parse(key),) if key else ())
            await asyncio.sleep(min(left, wait_seconds))
        return None

    async def interface_counters(self, handle: ServerHandle) -> InterfaceCounters | None:
        """The simulated interface counters: what :meth:`simulate_traffic` added since power-on."""
        record = await self._state().get(handle.domain)
        if record is None or record.data["power"] != "on":
            return None
        return InterfaceCounters(int(record.data.get("in_bytes", 0)), int(record.data.get("out_bytes", 0)))

    async def limit_bandwidth(self, handle: ServerHandle, kib_per_second: int | None) -> None:
        """Note the cap on the record (``bandwidth_kib``); traffic added later is not slowed by it."""
        await self._power(handle, lambda data: {**data, "bandwidth_kib": kib_per_second}, must_exist=True)

    async def simulate_traffic(self, handle: ServerHandle, in_bytes: int, out_bytes: int) -> None:
        """Count ``in_bytes`` received and ``out_bytes`` sent by a running simulated guest (nothing
        moves: the sandbox and tests use it to give a server usage)."""

        def add(data: dict[str, Any]) -> dict[str, Any]:
            if data["power"] != "on":
                raise PluginError(f"domain {handle.domain} is not running on {HOST}")
            return {
                **data,
                "in_bytes": data.get("in_bytes", 0) + in_bytes,
                "out_bytes": data.get("out_bytes", 0) + out_bytes,
            }

        await self._power(handle, add, must_exist=True)

    async def inspect(self, handle: ServerHandle) -> HostInspection:
        """What the simulated host holds for the server: its domain, disk and seed volumes."""
        record = await self._state().get(handle.domain)
        if record is None or (handle.host and handle.host != record.data.get("host", HOST)):
            return HostInspection()  # nothing of it on the host asked about
        data = record.data
        resources = [f"domain {handle.domain}"] if data.get("defined", True) else []
        if data.get("disk", "legacy"):
            resources.append(f"volume {handle.domain}.qcow2")
        if data.get("seed", True):
            resources.append(f"volume {handle.domain}-seed.iso")
        return HostInspection(
            resources=tuple(resources),
            running=data.get("guests", 1 if data.get("power") == "on" else 0),
            boots=data.get("boots", 0),
            disk_marker=data.get("disk_marker"),
            vcpu=data.get("vcpu"),
            memory_mib=data.get("memory_mib"),
            disk_gib=data.get("disk_gib"),
            firewall=tuple(FirewallRule.parse(**rule) for rule in data.get("firewall", [])),
            anti_spoofing=data.get("defined", True),
            snapshots=tuple(data.get("snapshots", {})),
        )

    async def mark_disk(self, handle: ServerHandle, marker: str) -> None:
        """Note ``marker`` on the server's current (simulated) disk; a new disk comes without it."""
        await self._power(handle, lambda data: {**data, "disk_marker": marker}, must_exist=True)

    async def preflight(self) -> None:
        if not self.sandbox:
            raise StartupError(
                "the simulator makes no real servers, so a production shop cannot sell them: set "
                'hypervisor.backend to a real backend ("libvirt"), or run this config as a sandbox '
                '(mode = "sandbox")'
            )

    async def check_ready(self) -> Readiness:
        boot = self.config.boot_seconds
        return Readiness(True, f"simulated servers (records in the database), booting in {boot:g} s")


class SimulatedConsole(ConsoleStream):
    """A fake serial console for the sandbox: a few boot lines, a login prompt, and an echo of what
    is typed (there is no guest to log in to). Named for what it is in every line it prints."""

    def __init__(self, hostname: str, os_id: str) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        lines = [
            f"[    0.000000] Linux version 6.1.0 (vpsshop simulator: {os_id}, no real guest)",
            "[    0.512000] Run /init as init process",
            "[  OK  ] Reached target Multi-User System (simulated).",
            "",
        ]
        self._queue.put_nowait(("\r\n".join(lines) + f"\r\n{hostname} login: ").encode())
        self._closed = False

    async def read(self) -> bytes:
        if self._closed and self._queue.empty():
            return b""
        return await self._queue.get()

    async def write(self, data: bytes) -> None:
        if not self._closed:
            self._queue.put_nowait(data.replace(b"\r", b"\r\n"))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(b"")


@hookimpl(trylast=True)
def vpsshop_register_hypervisors() -> Iterable[type[HypervisorBackend]]:
    return [SimulatedBackend]
