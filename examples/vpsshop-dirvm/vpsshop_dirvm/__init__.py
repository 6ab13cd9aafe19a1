"""dirvm: an example hypervisor backend whose "hosts" are directories and whose servers are files.

Written from docs/plugins.md alone, with only vpsshop's public API, to show what a backend does
without any hypervisor to learn first: where each host of a location is, how a server is placed,
what every verb does for a server that is missing or half-made, how ``destroy`` finds a server
whose host is unknown, and how blocking work stays off the event loop. Nothing boots: a "server"
is a directory on a "host" (``<state_dir>/<host>/<domain>/``) holding

* ``disk.img``, its disk: a header naming the image, written once at create and replaced by
  reinstall, never by any other verb;
* ``seed.json``, its first-boot data: hostname, address, SSH keys, user data and a *hash* of the
  root password (the password itself is never written on a host);
* ``power.json``, written last: whether the guest is on, since when, and how many times it has
  been powered on or reset. A directory without it is a **half-made** server (a ``create`` that
  crashed): ``state`` calls it missing, ``create`` finishes it, ``destroy`` removes it.

Every file is written to a temporary name and renamed, so a reader never sees half a file, and
every directory operation runs in a thread (``asyncio.to_thread``): the event loop that serves the
API never waits on a disk. The directories are the only state, so every process of a shop
(``vpsshop serve`` workers and ``vpsshop worker``, with the same ``state_dir``) sees the same
servers, and they survive a restart. Production refuses it: its servers are not real.

Settings (``[hypervisor] backend = "dirvm"``)::

    [hypervisor.dirvm]
    state_dir = "/var/lib/vpsshop/dirvm"   # shared by `vpsshop serve` and `vpsshop worker`
    hosts = ["host-a", "host-b"]           # directories under state_dir, in every location
    locations = ["nl", "de"]               # the catalog locations served; ["*"]: all of them
    addresses = "10.98.0.0/24"             # optional: the pool core leases addresses from
    gateway = "10.98.0.1"
    boot_seconds = 0                       # how long a powered-on guest reports "starting"
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vpsshop import (
    AddressPool,
    Clock,
    DomainState,
    HostInspection,
    HypervisorBackend,
    PluginError,
    Readiness,
    ServerHandle,
    ServerSpec,
    StartupError,
    check_address_range,
    hookimpl,
)

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop import ShopContext

POWER = "power.json"


class DirVmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state_dir: Path = Field(description="Where the hosts' directories are; shared by serve and worker.")
    hosts: list[str] = Field(min_length=1, description="The hosts: directories under state_dir.")
    locations: list[str] = Field(min_length=1, description='Catalog locations served; ["*"] for all.')
    addresses: str | None = Field(None, description="CIDR or first-last range core leases addresses from.")
    gateway: str | None = None
    boot_seconds: float = Field(0, ge=0, le=600)

    @field_validator("hosts")
    @classmethod
    def _plain_names(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not host or host.startswith(".") or "/" in host:
                raise ValueError(f"host {host!r} is not a plain directory name")
        return hosts

    @field_validator("addresses")
    @classmethod
    def _range(cls, value: str | None) -> str | None:
        if value is not None:
            check_address_range(value)
        return value


class DirVmBackend(HypervisorBackend):
    """Servers as directories on directory "hosts"; see the module docstring."""

    kind = "dirvm"
    Config = DirVmConfig
    capabilities = frozenset({"reinstall"})

    config: DirVmConfig
    clock: Clock | None = None

    def bind(self, ctx: ShopContext) -> None:
        self.clock = ctx.clock  # core calls bind before any verb, in every process

    async def preflight(self) -> None:
        if not self.sandbox:
            raise StartupError('dirvm makes no real servers: use it with mode = "sandbox", or configure a real backend')
        try:
            await asyncio.to_thread(self._check_state_dir)
        except OSError as exc:
            raise StartupError(
                f"dirvm cannot write its hosts under {self.config.state_dir} (setting hypervisor.dirvm.state_dir): "
                f"{exc.strerror or exc}. Create the directory for the user vpsshop runs as."
            ) from None

    async def check_ready(self) -> Readiness:
        count = await asyncio.to_thread(lambda: sum(1 for _ in self._all_servers()))
        return Readiness(True, f"{len(self.config.hosts)} hosts, {count} servers")

    async def close(self) -> None:
        """Nothing to release: no client, no connection (a backend with one closes it here)."""

    # ---- configuration: cheap, no I/O ----------------------------------------------------------

    def serves(self, location: str) -> bool:
        return location in self.config.locations or "*" in self.config.locations

    def location_setting(self, location: str) -> str:
        return "hypervisor.dirvm.locations"  # one list serves every location

    def address_pool(self, location: str) -> AddressPool | None:
        if self.config.addresses is None:
            return None
        return AddressPool.from_range("dirvm", self.config.addresses, gateway=self.config.gateway)

    # ---- the verbs -------------------------------------------------------------------------------

    async def create(self, spec: ServerSpec) -> ServerHandle:
        if not self.serves(spec.location):
            raise PluginError(f"dirvm does not serve location {spec.location!r} (hypervisor.dirvm.locations)")
        host = await asyncio.to_thread(self._create, spec)
        return ServerHandle(host, spec.name, spec.ip, spec.location)

    async def start(self, handle: ServerHandle) -> None:
        await asyncio.to_thread(self._power_on, handle, reset=False)

    async def reboot(self, handle: ServerHandle) -> None:
        await asyncio.to_thread(self._power_on, handle, reset=True)

    async def resume(self, handle: ServerHandle) -> None:
        await asyncio.to_thread(self._power_on, handle, reset=False)

    async def stop(self, handle: ServerHandle) -> None:
        await asyncio.to_thread(self._power_off, handle)

    async def suspend(self, handle: ServerHandle) -> None:
        await asyncio.to_thread(self._power_off, handle)  # off, disk kept: the same as stop here

    async def destroy(self, handle: ServerHandle) -> None:
        await asyncio.to_thread(self._destroy, handle)

    async def state(self, handle: ServerHandle) -> DomainState:
        return await asyncio.to_thread(self._state, handle)

    async def reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        host = await asyncio.to_thread(self._reinstall, handle, spec)
        return ServerHandle(host, handle.domain, handle.ip, handle.location)

    # ---- for the contract kit: what is on the host, read from the host ---------------------------

    async def inspect(self, handle: ServerHandle) -> HostInspection:
        return await asyncio.to_thread(self._inspect, handle)

    async def mark_disk(self, handle: ServerHandle, marker: str) -> None:
        path = await asyncio.to_thread(self._existing, handle, "mark the disk of")
        await asyncio.to_thread(_append, path / "disk.img", f"marker {marker}\n")

    # ---- blocking work, run in a thread -----------------------------------------------------------

    def _inspect(self, handle: ServerHandle) -> HostInspection:
        path = self._find(handle)
        if path is None:
            return HostInspection()
        resources = (f"directory {path}", *(f"file {p}" for p in sorted(path.iterdir())))
        power = json.loads((path / POWER).read_text()) if (path / POWER).is_file() else {"on": False, "boots": 0}
        disk = path / "disk.img"
        lines = disk.read_text().splitlines() if disk.is_file() else []
        markers = [line.removeprefix("marker ") for line in lines if line.startswith("marker ")]
        return HostInspection(
            resources=resources,
            running=1 if power["on"] else 0,
            boots=power["boots"],
            disk_marker=markers[-1] if markers else None,
        )

    def _check_state_dir(self) -> None:
        for host in self.config.hosts:
            (self.config.state_dir / host).mkdir(parents=True, exist_ok=True)
            probe = self.config.state_dir / host / f".probe-{secrets.token_hex(4)}"
            probe.write_text("")
            probe.unlink()

    def _all_servers(self) -> Iterable[Path]:
        for host in self.config.hosts:
            directory = self.config.state_dir / host
            if directory.is_dir():
                yield from (path for path in directory.iterdir() if (path / POWER).is_file())

    def _find(self, handle: ServerHandle) -> Path | None:
        """The directory of the domain, made or half-made: on ``handle.host`` when it is set, else
        on every host (what ``destroy`` gets after a create that failed before placement)."""
        hosts = [handle.host] if handle.host else self.config.hosts
        for host in hosts:
            if host not in self.config.hosts:
                raise PluginError(f"host {host!r} is no longer in hypervisor.dirvm.hosts; add it back")
            path = self.config.state_dir / host / handle.domain
            if path.is_dir():
                return path
        return None

    def _existing(self, handle: ServerHandle, verb: str) -> Path:
        """The directory of a domain that exists (not half-made), for the verbs that need one."""
        path = self._find(handle)
        if path is None or not (path / POWER).is_file():
            raise PluginError(f"cannot {verb} {handle.domain}: no such server on host {handle.host or '(any)'}")
        return path

    def _create(self, spec: ServerSpec) -> str:
        path = self._find(ServerHandle("", spec.name, location=spec.location))
        if path is not None and (path / POWER).is_file():
            return path.parent.name  # an earlier attempt made it: keep it (and its disk) as it is
        if path is None:  # place it on the host with the fewest servers
            host = min(self.config.hosts, key=lambda h: sum(1 for _ in (self.config.state_dir / h).glob("*/")))
            path = self.config.state_dir / host / spec.name
            path.mkdir(parents=True, exist_ok=True)
        if not (path / "disk.img").is_file():  # half-made: finish it, keeping a disk already written
            _write(path / "disk.img", _disk(spec))
        _write(path / "seed.json", _seed(spec))
        _write(path / POWER, json.dumps({"on": True, "since": self._now().isoformat(), "boots": 1}))
        return path.parent.name

    def _power_on(self, handle: ServerHandle, *, reset: bool) -> None:
        path = self._existing(handle, "reboot" if reset else "start")
        power = json.loads((path / POWER).read_text())
        if power["on"] and not reset:
            return  # running already: nothing to do
        power.update(on=True, since=self._now().isoformat(), boots=power["boots"] + 1)
        _write(path / POWER, json.dumps(power))

    def _power_off(self, handle: ServerHandle) -> None:
        path = self._find(handle)
        if path is None or not (path / POWER).is_file():
            return  # missing or half-made: nothing runs, nothing to stop
        power = json.loads((path / POWER).read_text())
        if power["on"]:
            power["on"] = False
            _write(path / POWER, json.dumps(power))

    def _destroy(self, handle: ServerHandle) -> None:
        while (path := self._find(handle)) is not None:  # on every host when handle.host is empty
            shutil.rmtree(path)
            if handle.host:
                break

    def _state(self, handle: ServerHandle) -> DomainState:
        path = self._find(handle)
        if path is None or not (path / POWER).is_file():
            return DomainState.MISSING
        power = json.loads((path / POWER).read_text())
        if not power["on"]:
            return DomainState.STOPPED
        booted = (self._now() - datetime.fromisoformat(power["since"])).total_seconds()
        return DomainState.RUNNING if booted >= self.config.boot_seconds else DomainState.STARTING

    def _reinstall(self, handle: ServerHandle, spec: ServerSpec) -> str:
        path = self._existing(handle, "reinstall")
        self._power_off(handle)
        _write(path / "disk.img", _disk(spec))  # a new disk from spec.os_image
        _write(path / "seed.json", _seed(spec))  # new first-boot data: new password, keys, user data
        self._power_on(handle, reset=True)
        return path.parent.name

    def _now(self) -> datetime:
        if self.clock is None:
            raise PluginError("dirvm was not bound to a shop (core calls bind(ctx) before any verb)")
        return self.clock.now()


def _disk(spec: ServerSpec) -> str:
    return f"dirvm disk {secrets.token_hex(8)}: {spec.os_image}, {spec.disk_gib} GiB\n"


def _seed(spec: ServerSpec) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(spec.root_password.encode(), salt=salt, n=2**14, r=8, p=1)
    seed: dict[str, Any] = {
        "hostname": spec.hostname,
        "ip": spec.ip,
        "ssh_keys": list(spec.ssh_keys),
        "user_data": spec.user_data,
        "root_password_scrypt": f"{salt.hex()}${digest.hex()}",
    }
    return json.dumps(seed)


def _append(path: Path, text: str) -> None:
    _write(path, path.read_text() + text)


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: never half a file."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    temporary.write_text(text)
    os.replace(temporary, path)


@hookimpl
def vpsshop_register_hypervisors() -> Iterable[type[HypervisorBackend]]:
    return [DirVmBackend]
