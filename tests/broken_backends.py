"""Hypervisor backends broken on purpose, one way each: the contract kit must fail every one.

Each is the simulator (plugins/vpsshop_simulator) with one verb doing what a real backend got
wrong when it was written from the docs (issue 23's table, and a few more). The simulator's record
of a domain is its simulated host (defined or not, a disk with an identity, a seed, how many
guests run, how often one booted), so what a broken verb leaves there is what ``inspect`` finds,
as it would on a real host. Used by tests/test_hypervisor_kit_catches.py.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from vpsshop import DomainState, GuestReport, PluginError, PluginState, ServerHandle, ServerSpec
from vpsshop_simulator import SimulatedBackend


def _records(backend: SimulatedBackend) -> PluginState:
    assert backend.records is not None, "bind(ctx) first"
    return backend.records


async def _change(backend: SimulatedBackend, domain: str, **fields: Any) -> None:
    await _records(backend).modify(domain, lambda data: None if data is None else {**data, **fields})


def _wiped() -> dict[str, Any]:
    return {"disk": secrets.token_hex(8), "disk_marker": None}


class StopDoesNothing(SimulatedBackend):
    async def stop(self, handle: ServerHandle) -> None:
        return None


class StartLaunchesASecondGuest(SimulatedBackend):
    """``start`` of a running domain launches the VM again beside the first one."""

    async def start(self, handle: ServerHandle) -> None:
        record = await _records(self).get(handle.domain)
        if record is not None and record.data["power"] == "on":
            await _change(self, handle.domain, guests=record.data.get("guests", 1) + 1)
            return
        await super().start(handle)


class StateRaisesForAnUnknownDomain(SimulatedBackend):
    async def state(self, handle: ServerHandle) -> DomainState:
        if await _records(self).get(handle.domain) is None:
            raise PluginError(f"no domain {handle.domain}")
        return await super().state(handle)


class DestroyLeavesDiskAndSeed(SimulatedBackend):
    """``destroy`` undefines the domain and stops its guest, but leaves its disk and its seed (which
    holds the first-boot data) on the host."""

    async def destroy(self, handle: ServerHandle) -> None:
        await _change(self, handle.domain, defined=False, power="off", booted_at=None, guests=0)


class CreateAgainReprovisions(SimulatedBackend):
    """A retried ``create`` provisions again over the server that got made: its disk is wiped."""

    async def create(self, spec: ServerSpec) -> ServerHandle:
        await _change(self, spec.name, **_wiped())
        return await super().create(spec)


class SuspendWipesTheDisk(SimulatedBackend):
    async def suspend(self, handle: ServerHandle) -> None:
        await super().suspend(handle)
        await _change(self, handle.domain, **_wiped())


class RebootOfARunningDomainDoesNothing(SimulatedBackend):
    async def reboot(self, handle: ServerHandle) -> None:
        if await self.state(handle) == DomainState.RUNNING:
            return
        await super().reboot(handle)


class ReinstallKeepsTheOldDisk(SimulatedBackend):
    """``reinstall`` boots the domain again without replacing its disk."""

    async def reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        await self.reboot(handle)
        return handle


class DestroyNeedsAHost(SimulatedBackend):
    """``destroy`` of a handle with an empty ``host`` (placement did not finish) does nothing."""

    async def destroy(self, handle: ServerHandle) -> None:
        if handle.host:
            await super().destroy(handle)


class ReinstallKeepsTheOldHostKeys(SimulatedBackend):
    """``reinstall`` makes a new disk, but the new guest reports the host key of the system it
    replaced (a backend that cached the first report)."""

    async def reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        record = await _records(self).get(handle.domain)
        old_key = record.data.get("host_key") if record is not None else None
        made = await super().reinstall(handle, spec)
        await _change(self, handle.domain, host_key=old_key)
        return made


class GuestReportHangs(SimulatedBackend):
    """``guest_report`` of a guest that cannot report waits forever instead of ``wait_seconds``."""

    async def guest_report(self, handle: ServerHandle, wait_seconds: float) -> GuestReport | None:
        await asyncio.sleep(wait_seconds + 12)  # the kit allows 10 s over
        return None


class ResizeReprovisions(SimulatedBackend):
    """``resize`` makes the server anew at the new size instead of resizing it: its disk is wiped."""

    async def resize(self, handle: ServerHandle, spec: ServerSpec) -> None:
        await super().resize(handle, spec)
        await _change(self, handle.domain, **_wiped())


class ResizeLeavesTheMemory(SimulatedBackend):
    """``resize`` grows the disk and vCPUs but the domain keeps its old memory (a maximum not raised)."""

    async def resize(self, handle: ServerHandle, spec: ServerSpec) -> None:
        record = await _records(self).get(handle.domain)
        memory = record.data.get("memory_mib") if record is not None else None
        await super().resize(handle, spec)
        await _change(self, handle.domain, memory_mib=memory)


class RestoreMakesANewDisk(SimulatedBackend):
    """``restore_snapshot`` provisions a fresh disk instead of going back to the snapshot's."""

    async def restore_snapshot(self, handle: ServerHandle, name: str) -> None:
        await super().restore_snapshot(handle, name)
        await _change(self, handle.domain, **_wiped())


class ReinstallKeepsTheSnapshots(SimulatedBackend):
    """``reinstall`` makes a new disk but leaves the old disk's snapshots listed on the host."""

    async def reinstall(self, handle: ServerHandle, spec: ServerSpec) -> ServerHandle:
        record = await _records(self).get(handle.domain)
        kept = record.data.get("snapshots", {}) if record is not None else {}
        done = await super().reinstall(handle, spec)
        await _change(self, handle.domain, snapshots=kept)
        return done


BROKEN = {
    # backend: (the kit test that must fail, words its failure must contain)
    StopDoesNothing: ("test_power_verbs_are_idempotent", "the domain is running, expected stopped"),
    StartLaunchesASecondGuest: ("test_power_verbs_are_idempotent", "2 guests of one server are running"),
    StateRaisesForAnUnknownDomain: ("test_missing_domain", "PluginError: no domain"),
    DestroyLeavesDiskAndSeed: ("test_destroy_removes_and_is_idempotent", "after destroy the host still holds"),
    CreateAgainReprovisions: ("test_create_again_keeps_the_disk", "after a second create the server's disk is not"),
    SuspendWipesTheDisk: ("test_suspend_and_resume_keep_the_disk", "after suspend the server's disk is not"),
    RebootOfARunningDomainDoesNothing: (
        "test_reboot_restarts_a_running_guest",
        "after reboot of a running domain the host saw no guest start or reset",
    ),
    ReinstallKeepsTheOldDisk: ("test_optional_verbs", "after reinstall the disk still carries marker"),
    DestroyNeedsAHost: ("test_destroy_without_a_host", "after destroy with an empty handle.host the domain is"),
    ReinstallKeepsTheOldHostKeys: (
        "test_optional_verbs",
        "after reinstall the guest reports the host keys of the system it replaced",
    ),
    GuestReportHangs: ("test_optional_verbs", "guest_report after create took"),
    ResizeReprovisions: ("test_optional_verbs", "after resize the server's disk is not the one it had"),
    ResizeLeavesTheMemory: ("test_optional_verbs", "after resize the host has vcpu, memory_mib, disk_gib"),
    RestoreMakesANewDisk: ("test_optional_verbs", "after restore_snapshot the server's disk is not the one it had"),
    ReinstallKeepsTheSnapshots: ("test_optional_verbs", "after reinstall (a new disk has no snapshots) the host holds"),
}
