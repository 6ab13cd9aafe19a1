"""Base class of hypervisor backends: the verbs core uses to run a customer's server."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar

from vpsshop.component import Component


class DomainState(str, enum.Enum):
    """What the hypervisor reports about a server's virtual machine."""

    RUNNING = "running"
    STOPPED = "stopped"
    PAUSED = "paused"
    MISSING = "missing"


@dataclass(frozen=True)
class ServerSpec:
    """Everything a backend needs to create a server, resolved by core from the catalog."""

    name: str
    """Unique name for the domain on its host (core uses ``vps-<server id>``)."""
    hostname: str
    location: str
    vcpu: int
    memory_mib: int
    disk_gib: int
    os_id: str
    os_image: str
    """Base image file name of the operating system, as the catalog gives it."""
    root_password: str
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerHandle:
    """Where a created server lives: returned by :meth:`HypervisorBackend.create`, stored by core."""

    host: str
    domain: str
    ip: str | None = None


class HypervisorBackend(Component):
    """Runs virtual machines. Every verb must be overridden and must be idempotent: core retries
    a verb after a crash, so starting a running domain or destroying a missing one succeeds.

    ``kind`` names the backend in the ``hypervisor.backend`` setting (``"libvirt"``).
    """

    kind: ClassVar[str]

    async def create(self, spec: ServerSpec) -> ServerHandle:
        """Define the domain with its disk and first-boot data and start it."""
        raise NotImplementedError

    async def start(self, handle: ServerHandle) -> None:
        raise NotImplementedError

    async def stop(self, handle: ServerHandle) -> None:
        """Power the domain off (hard stop after a grace period)."""
        raise NotImplementedError

    async def reboot(self, handle: ServerHandle) -> None:
        raise NotImplementedError

    async def suspend(self, handle: ServerHandle) -> None:
        """Stop the domain for non-payment, keeping its disk."""
        raise NotImplementedError

    async def resume(self, handle: ServerHandle) -> None:
        """Undo :meth:`suspend`."""
        raise NotImplementedError

    async def destroy(self, handle: ServerHandle) -> None:
        """Remove the domain, its disks and its first-boot data, and free its address."""
        raise NotImplementedError

    async def state(self, handle: ServerHandle) -> DomainState:
        raise NotImplementedError
