"""The hypervisor contract: what core relies on, as tests any backend runs against itself.

Exposed through ``vpsshop.testing`` (the pytest plugin vpsshop installs; ``pip install
'vpsshop[testing]'``). Two ways to use it:

1. **The test class.** Subclass :class:`HypervisorContract` in a test module whose name starts
   with ``Test``, and give it the backend (built against a real or test host) as the
   ``hypervisor_backend`` fixture. Every contract test then runs against it, one test per rule,
   so a failure names the rule that broke::

       import pytest
       from vpsshop.testing import HypervisorContract

       from my_backend import MyBackend


       class TestMyBackend(HypervisorContract):
           @pytest.fixture
           def hypervisor_backend(self, vpsshop_context, hypervisor_run):
               backend = MyBackend.from_settings({...}, sandbox=False, where="hypervisor.mine")
               backend.bind(vpsshop_context)
               yield backend
               hypervisor_run(backend.close())

   Each test runs all its verbs on **one event loop** that lives for the test (a thread the
   ``hypervisor_run`` fixture starts): a backend may keep an asyncio connection from one verb
   to the next, and closes it in ``close()`` on that same loop, as above.

   Optional fixtures: ``hypervisor_location`` (a location the backend serves, default ``"nl"``),
   ``hypervisor_unserved_location`` (a location your configuration does not serve, default None:
   not checked), ``hypervisor_spec_overrides`` (fields of the :class:`~vpsshop.ServerSpec`, e.g.
   the OS image your test host has) and ``hypervisor_boot_timeout`` (seconds a domain may report
   ``starting``, default 60) and ``hypervisor_guest_reports`` (whether the test host's guests boot
   and report, default True: a host whose base image boots nothing sets it False, and
   ``guest_report`` must then return None after its wait instead of a report).

2. **One walk.** :func:`check_hypervisor` takes one server through every verb in the order core
   uses them, twice where core may retry, and raises ``AssertionError`` naming the verb that broke
   the contract. It always destroys what it created.

**Inspection.** A kit that only asks the backend's own ``state()`` believes what the backend says.
A backend that also offers :meth:`~vpsshop.HypervisorBackend.inspect` (what exists on the host for
a server: domains or processes, volumes and files, running guests, a boot counter) and
:meth:`~vpsshop.HypervisorBackend.mark_disk` (a marker on the server's disk that ``inspect``
reads back) is checked on what it did: ``destroy`` leaves nothing (with ``handle.host`` empty
too), a repeated ``create``, ``start``, ``suspend`` and ``resume`` keep the disk and run one
guest, ``reinstall`` replaces the disk, ``reboot`` restarts the guest, and no test leaves anything
behind. Without them those checks are skipped, and say so.

What the contract says (``docs/plugins.md``, "Hypervisor backends"):

* ``serves`` answers a bool, True for the location the server is made in; for a location the
  configuration does not serve it is False, and ``create`` there raises :class:`vpsshop.PluginError`;
* ``create`` returns a handle whose ``domain`` is ``spec.name`` and whose ``host`` is set; the
  domain is powered on: ``state`` reports ``starting`` and then ``running`` within the boot time;
* ``create`` again with the same spec returns the same host and domain (a retried job) and keeps
  the disk;
* ``start``/``resume`` of a running domain, ``stop``/``suspend`` of a stopped one, and ``stop``,
  ``suspend`` and ``destroy`` of a missing one do nothing and do not raise; ``reboot`` of a
  stopped domain starts it, of a running one restarts the guest;
* with capability ``"firewall"``: the guest is filtered against spoofing from ``create`` on (as
  ``inspect`` reads it), ``set_firewall`` puts its rules in force (twice: a retried job), a
  ``reinstall`` keeps them, no rules clears them, a missing domain raises ``PluginError``, and
  ``destroy`` removes the filter;
* with capability ``"snapshots"``: ``create_snapshot`` (twice: a retried job) of a running domain
  leaves it running on the same disk and ``inspect`` lists the snapshot; ``restore_snapshot`` (twice)
  leaves the domain running on its disk (not a new one), with every snapshot kept; a snapshot of a
  stopped domain restores too and starts it; an unknown snapshot or a missing domain raises
  ``PluginError``; ``delete_snapshot`` (twice, and of a missing domain) does not raise and the
  snapshot is gone; ``reinstall`` and ``destroy`` leave none; with ``"migrate"`` too, a snapshot
  moves with the server and restores on its new host;
* ``suspend`` and ``resume`` keep the disk;
* ``destroy`` removes the domain, its disk and its first-boot data, also when ``handle.host`` is
  empty (look on every host of ``handle.location``);
* ``state`` of a domain that never existed is ``missing``, without raising;
* ``start`` or ``reboot`` of a missing domain raises :class:`vpsshop.PluginError`;
* ``address_pool`` is None or an :class:`~vpsshop.AddressPool` of distinct address strings;
* ``capabilities`` names only known optional verbs (``reinstall``, ``console``, ``guest_report``,
  ``images``: not exercised by the kit yet; the libvirt plugin's tests/test_images.py checks it on two
  real hosts); for each one named:
* ``guest_report`` of a running domain whose guest booted returns a :class:`~vpsshop.GuestReport`
  (host keys as :class:`~vpsshop.HostKey`) within the boot time; of a guest that cannot report, None
  once its wait is over (it neither hangs nor raises); after ``reinstall``, the new guest's report,
  with new host keys;
* ``reinstall`` of a running domain returns a handle on the same host and domain, the domain is
  running again within the boot time, on a new disk; reinstalling again (a retried job) does the same;
* ``resize`` of a running domain to a larger ``spec`` (memory, vCPUs, disk) leaves it running again
  within the boot time on the same disk (its marker kept), with the new memory, vCPUs and disk size
  as the host's definition and volume say (when inspected); resizing again (a retried job) does the
  same;
* ``migrate`` (with ``hosts``): the server's host is one of ``hosts(location)``; moved to another
  host of its location it returns a handle on that host, runs there once (one guest in all) on the
  same disk (its marker kept), and nothing of it is left on the old host; moved there again (a
  retried job) nothing changes; moved to the host it is on, nothing changes either. A spec whose
  ``avoid_hosts`` names every host but one is placed on that one;
* ``open_console`` of a running domain returns a :class:`~vpsshop.ConsoleStream` whose ``close``
  is idempotent and after which ``read`` comes to ``b""`` (after what was read before); of a missing domain it raises
  :class:`vpsshop.PluginError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from anyio.from_thread import start_blocking_portal

from vpsshop.errors import PluginError
from vpsshop.hypervisor import (
    CAPABILITY_CONSOLE,
    CAPABILITY_FIREWALL,
    CAPABILITY_GUEST_REPORT,
    CAPABILITY_IMAGES,
    CAPABILITY_IPV6,
    CAPABILITY_KERNEL_BOOT,
    CAPABILITY_MIGRATE,
    CAPABILITY_REINSTALL,
    CAPABILITY_RESIZE,
    CAPABILITY_SNAPSHOTS,
    CAPABILITY_TRAFFIC,
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
    ServerHandle,
    ServerSpec,
)

KNOWN_CAPABILITIES = frozenset(
    {
        CAPABILITY_REINSTALL,
        CAPABILITY_CONSOLE,
        CAPABILITY_GUEST_REPORT,
        CAPABILITY_IMAGES,
        CAPABILITY_IPV6,
        CAPABILITY_RESIZE,
        CAPABILITY_SNAPSHOTS,
        CAPABILITY_MIGRATE,
        CAPABILITY_TRAFFIC,
        CAPABILITY_FIREWALL,
        CAPABILITY_KERNEL_BOOT,
    }
)
CONTRACT_FIREWALL = (
    FirewallRule.parse("tcp", 22),
    FirewallRule.parse("tcp", "8000-8100", "198.51.100.0/24"),
    FirewallRule.parse("udp", "53", "2001:db8::/48"),
    FirewallRule.parse("icmp"),
)
"""The rules the kit applies with ``set_firewall``: every protocol, a port, a range, both families."""
NO_REPORT_WAIT = 2.0
"""How long the kit lets ``guest_report`` wait on a guest that cannot report (a test host whose image
boots nothing); the call must return None within a few seconds of that."""

DEFAULT_BOOT_TIMEOUT = 60.0
_POLL_SECONDS = 0.1

_T = TypeVar("_T")
Run = Callable[[Awaitable[_T]], _T]
"""Runs a coroutine on the test's event loop and returns its result (the ``hypervisor_run`` fixture)."""


def contract_spec(location: str = "nl", **overrides: Any) -> ServerSpec:
    """A small server (1 vCPU, 256 MiB, 5 GiB, Debian 12) with a unique name."""
    values: dict[str, Any] = dict(
        name=f"vps-contract-{secrets.token_hex(4)}",
        hostname="contract",
        location=location,
        vcpu=1,
        memory_mib=256,
        disk_gib=5,
        os_id="debian-12",
        os_image="debian-12-genericcloud-amd64.qcow2",
        root_password="contract-Pass-1234",
    )
    values.update(overrides)
    return ServerSpec(**values)


async def wait_running(
    backend: HypervisorBackend, handle: ServerHandle, after: str, boot_timeout: float = DEFAULT_BOOT_TIMEOUT
) -> None:
    """Wait while the domain reports ``starting``; it must then report ``running``."""
    deadline = time.monotonic() + boot_timeout
    while True:
        state = await backend.state(handle)
        if state != DomainState.STARTING:
            break
        assert time.monotonic() < deadline, f"after {after} the domain is still starting after {boot_timeout:g} s"
        await asyncio.sleep(_POLL_SECONDS)
    assert state == DomainState.RUNNING, f"after {after} the domain is {state.value}, expected running"


async def expect_state(backend: HypervisorBackend, handle: ServerHandle, wanted: DomainState, after: str) -> None:
    state = await backend.state(handle)
    assert state == wanted, f"after {after} the domain is {state.value}, expected {wanted.value}"


# ---- inspection: what is on the host, not what the backend says ---------------------------------


class HostCheck:
    """The checks on what a backend's :meth:`~vpsshop.HypervisorBackend.inspect` finds on the host;
    each does nothing for a backend that offers no inspection (``enabled`` is False)."""

    def __init__(self, backend: HypervisorBackend) -> None:
        self.backend = backend
        self.enabled = backend.inspectable
        self.marker: str | None = None

    async def look(self, handle: ServerHandle) -> HostInspection:
        found = await self.backend.inspect(handle)
        assert isinstance(found, HostInspection), "inspect must return a vpsshop.HostInspection"
        assert found.running in (0, 1), f"{found.running} guests of one server are running: {found.resources}"
        return found

    async def running_once(self, handle: ServerHandle, after: str) -> HostInspection | None:
        """Exactly one guest runs, on the disk marked before (if one was)."""
        if not self.enabled:
            return None
        found = await self.look(handle)
        assert found.running == 1, f"after {after} {found.running} guests run on the host, expected 1"
        self._same_disk(found, after)
        return found

    async def stopped(self, handle: ServerHandle, after: str) -> None:
        if not self.enabled:
            return
        found = await self.look(handle)
        assert found.running == 0, f"after {after} a guest still runs on the host ({found.resources})"
        self._same_disk(found, after)

    def _same_disk(self, found: HostInspection, after: str) -> None:
        if self.marker is not None:
            now = "gone" if found.disk_marker is None else f"now {found.disk_marker!r}"
            assert found.disk_marker == self.marker, (
                f"after {after} the server's disk is not the one it had (its marker {self.marker!r} is {now}): "
                "the verb replaced or wiped it"
            )

    async def mark(self, handle: ServerHandle, boot_timeout: float) -> None:
        """Stop the domain, write a fresh marker on its disk, start it again."""
        if not self.enabled:
            return
        await self.backend.stop(handle)
        await expect_state(self.backend, handle, DomainState.STOPPED, "stop (before marking the disk)")
        marker = f"vpsshop-kit-{secrets.token_hex(6)}"
        await self.backend.mark_disk(handle, marker)
        found = await self.look(handle)
        assert found.disk_marker == marker, (
            f"inspect reads disk marker {found.disk_marker!r}, mark_disk wrote {marker!r}"
        )
        self.marker = marker
        await self.backend.start(handle)
        await wait_running(self.backend, handle, "start (after marking the disk)", boot_timeout)

    async def boots(self, handle: ServerHandle) -> int | None:
        return (await self.look(handle)).boots if self.enabled else None

    async def booted_since(self, handle: ServerHandle, before: int | None, after: str) -> None:
        if before is None:
            return
        now = (await self.look(handle)).boots
        assert now > before, f"after {after} the host saw no guest start or reset (boots {before} -> {now})"

    async def new_disk(self, handle: ServerHandle, after: str) -> None:
        if not self.enabled:
            return
        found = await self.look(handle)
        assert found.disk_marker is None, (
            f"after {after} the disk still carries marker {found.disk_marker!r}: not a new disk"
        )
        self.marker = None

    async def firewall(self, handle: ServerHandle, rules: tuple[FirewallRule, ...], after: str) -> None:
        """The host filters the guest: anti-spoofing on, and ``rules`` (in any order) in force."""
        if not self.enabled:
            return
        found = await self.look(handle)
        assert found.anti_spoofing is not False, f"after {after} the guest may send from any address"
        if found.firewall is not None:
            assert sorted(map(repr, found.firewall)) == sorted(map(repr, rules)), (
                f"after {after} the host's firewall holds {list(found.firewall)}, not {list(rules)}"
            )

    async def snapshots(self, handle: ServerHandle, names: tuple[str, ...], after: str) -> None:
        """The host holds exactly the snapshots ``names`` of the server (when it can tell)."""
        if not self.enabled:
            return
        found = (await self.look(handle)).snapshots
        if found is not None:
            assert sorted(found) == sorted(names), (
                f"after {after} the host holds snapshots {sorted(found)}, not {sorted(names)}"
            )

    async def nothing_left(self, handle: ServerHandle, after: str) -> None:
        if not self.enabled:
            return
        for where in (handle, dataclasses.replace(handle, host="")):
            found = await self.look(where)
            assert not found.resources and found.running == 0, (
                f"after {after} the host still holds {list(found.resources)} "
                f"({found.running} running) for {handle.domain}"
            )


# ---- the walk -------------------------------------------------------------------------------------


async def check_hypervisor(
    backend: HypervisorBackend,
    spec: ServerSpec,
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT,
    guest_reports: bool = True,
) -> ServerHandle:
    """Create, re-create, start, stop, reboot, suspend, resume, (reinstall,) and destroy one server,
    checking the states and the idempotency core relies on, and (for a backend that offers
    inspection) what is on the host after each verb.

    :return: the handle ``create`` returned (the domain is gone by then).
    """
    check_serves(backend, spec.location)
    host = HostCheck(backend)
    handle = await backend.create(spec)
    try:
        assert handle.domain == spec.name, f"create returned domain {handle.domain!r}, not spec.name {spec.name!r}"
        assert handle.host, "create must say which host the domain is on"
        await wait_running(backend, handle, "create", boot_timeout)
        handle = ServerHandle(handle.host, handle.domain, handle.ip, spec.location)
        created = await host.running_once(handle, "create")
        assert created is None or created.resources, "inspect finds nothing on the host for a created server"
        await host.mark(handle, boot_timeout)
        again = await backend.create(spec)
        assert (again.host, again.domain) == (handle.host, handle.domain), "create is not idempotent"
        await expect_state(backend, handle, DomainState.RUNNING, "create of an existing running domain")
        await host.running_once(handle, "create of an existing running domain")
        await backend.start(handle)
        await expect_state(backend, handle, DomainState.RUNNING, "start of a running domain")
        await host.running_once(handle, "start of a running domain")
        await backend.stop(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "stop")
        await host.stopped(handle, "stop")
        await backend.stop(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "stop of a stopped domain")
        await backend.reboot(handle)
        await wait_running(backend, handle, "reboot of a stopped domain", boot_timeout)
        await host.running_once(handle, "reboot of a stopped domain")
        before = await host.boots(handle)
        await backend.reboot(handle)
        await wait_running(backend, handle, "reboot", boot_timeout)
        await host.booted_since(handle, before, "reboot of a running domain")
        await host.running_once(handle, "reboot of a running domain")
        await backend.suspend(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "suspend")
        await host.stopped(handle, "suspend")
        await backend.suspend(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "suspend of a suspended domain")
        await backend.resume(handle)
        await wait_running(backend, handle, "resume", boot_timeout)
        await host.running_once(handle, "resume")
        await backend.resume(handle)
        await expect_state(backend, handle, DomainState.RUNNING, "resume of a running domain")
        await host.running_once(handle, "resume of a running domain")
        await check_optional_verbs(backend, handle, spec, boot_timeout, host, guest_reports)
    finally:
        await backend.destroy(handle)
    await expect_state(backend, handle, DomainState.MISSING, "destroy")
    await host.nothing_left(handle, "destroy")
    await backend.destroy(handle)
    await expect_state(backend, handle, DomainState.MISSING, "destroy of a missing domain")
    for verb in ("stop", "suspend"):
        await getattr(backend, verb)(handle)  # of a missing domain: nothing to do, no error
    return handle


def check_serves(backend: HypervisorBackend, location: str, unserved: str | None = None) -> None:
    """``serves`` is a bool, True for ``location`` and (when given) False for ``unserved``."""
    answer = backend.serves(location)
    assert answer is True, f"serves({location!r}) is {answer!r}: the contract's location must be served"
    if unserved is not None:
        answer = backend.serves(unserved)
        assert answer is False, f"serves({unserved!r}) is {answer!r}, expected False for a location not configured"


async def check_unserved_location(backend: HypervisorBackend, spec: ServerSpec) -> None:
    """A spec in a location the backend does not serve: ``create`` raises PluginError (and makes nothing)."""
    try:
        handle = await backend.create(spec)
    except PluginError:
        if backend.inspectable:
            await HostCheck(backend).nothing_left(
                ServerHandle("", spec.name, location=spec.location), "a refused create"
            )
        return
    await backend.destroy(handle)
    raise AssertionError(f"create in location {spec.location!r}, which serves() says is not served, did not raise")


async def check_destroy_without_host(backend: HypervisorBackend, handle: ServerHandle) -> None:
    """``destroy`` of a handle whose ``host`` is empty (placement did not finish, as core stored
    it) finds the domain on the hosts of its location and removes it."""
    await backend.destroy(ServerHandle("", handle.domain, handle.ip, handle.location))
    await expect_state(backend, handle, DomainState.MISSING, "destroy with an empty handle.host")
    await HostCheck(backend).nothing_left(handle, "destroy with an empty handle.host")


async def check_optional_verbs(
    backend: HypervisorBackend,
    handle: ServerHandle,
    spec: ServerSpec,
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT,
    host: HostCheck | None = None,
    guest_reports: bool = True,
) -> None:
    """Check the optional verbs the backend's ``capabilities`` name, on a running domain."""
    host = host or HostCheck(backend)
    unknown = set(backend.capabilities) - KNOWN_CAPABILITIES
    assert not unknown, f"capabilities names unknown verbs {sorted(unknown)}; known: {sorted(KNOWN_CAPABILITIES)}"
    if CAPABILITY_CONSOLE in backend.capabilities:
        stream = await backend.open_console(handle)
        assert isinstance(stream, ConsoleStream), "open_console must return a vpsshop.ConsoleStream"
        await stream.close()
        await stream.close()
        for _ in range(10_000):  # bytes read before the close may still come, then the end
            if await asyncio.wait_for(stream.read(), 10) == b"":
                break
        else:
            raise AssertionError("read after close must come to b''")
        missing = ServerHandle(handle.host, f"{handle.domain}-never", location=handle.location)
        try:
            await backend.open_console(missing)
        except PluginError:
            pass
        else:
            raise AssertionError("open_console of a missing domain must raise PluginError")
    snapshots = CAPABILITY_SNAPSHOTS in backend.capabilities
    if snapshots:
        await check_snapshots(backend, handle, boot_timeout, host)
    firewalled = CAPABILITY_FIREWALL in backend.capabilities
    if firewalled:
        await check_firewall(backend, handle, host)
    if CAPABILITY_TRAFFIC in backend.capabilities:
        await check_traffic(backend, handle)
    if CAPABILITY_RESIZE in backend.capabilities:
        await check_resize(backend, handle, spec, boot_timeout, host)
    reporting = CAPABILITY_GUEST_REPORT in backend.capabilities
    first = await check_guest_report(backend, handle, "create", boot_timeout, guest_reports) if reporting else None
    if CAPABILITY_REINSTALL in backend.capabilities:
        fresh = dataclasses.replace(spec, root_password=spec.root_password + "-new")
        if host.enabled and host.marker is None:
            await host.mark(handle, boot_timeout)
        for attempt in ("reinstall", "reinstall again (a retried job)"):
            again = await backend.reinstall(handle, fresh)
            assert (again.host, again.domain) == (handle.host, handle.domain), f"{attempt} moved the domain"
            await wait_running(backend, handle, attempt, boot_timeout)
            await host.new_disk(handle, attempt)
            await host.running_once(handle, attempt)
            if attempt == "reinstall":
                if reporting:
                    report = await check_guest_report(backend, handle, attempt, boot_timeout, guest_reports)
                    if first is not None and report is not None and first.host_keys and report.host_keys:
                        assert set(first.host_keys).isdisjoint(report.host_keys), (
                            "after reinstall the guest reports the host keys of the system it replaced"
                        )
                await host.mark(handle, boot_timeout)  # the retried job must replace this disk too
        if snapshots:
            await host.snapshots(handle, (), "reinstall (a new disk has no snapshots)")
        if firewalled:
            await host.firewall(handle, CONTRACT_FIREWALL, "reinstall (the customer's firewall stays)")
            await backend.set_firewall(handle, ())
            await host.firewall(handle, (), "set_firewall with no rules")


async def check_snapshots(
    backend: HypervisorBackend, handle: ServerHandle, boot_timeout: float, host: HostCheck
) -> None:
    """Snapshots of a running and of a stopped domain, restored (twice: a retried job) and deleted;
    ``kit-snap-1`` is left for ``reinstall`` or ``destroy`` to remove."""
    first, second, offline = "kit-snap-1", "kit-snap-2", "kit-snap-3"
    if host.enabled and host.marker is None:
        await host.mark(handle, boot_timeout)  # a restore must go back to this disk, not make another
    for attempt in ("create_snapshot", "create_snapshot again (a retried job)"):
        await backend.create_snapshot(handle, first)
        await expect_state(backend, handle, DomainState.RUNNING, attempt)
        await host.running_once(handle, attempt)
        await host.snapshots(handle, (first,), attempt)
    await backend.create_snapshot(handle, second)
    await host.snapshots(handle, (first, second), "a second create_snapshot")
    for attempt in ("restore_snapshot", "restore_snapshot again (a retried job)"):
        await backend.restore_snapshot(handle, first)
        await wait_running(backend, handle, attempt, boot_timeout)
        await host.running_once(handle, attempt)
        await host.snapshots(handle, (first, second), attempt)
    await backend.stop(handle)
    await expect_state(backend, handle, DomainState.STOPPED, "stop (before a snapshot of a stopped domain)")
    await backend.create_snapshot(handle, offline)
    await expect_state(backend, handle, DomainState.STOPPED, "create_snapshot of a stopped domain")
    await backend.restore_snapshot(handle, offline)
    await wait_running(backend, handle, "restore_snapshot of a stopped domain's snapshot", boot_timeout)
    await host.running_once(handle, "restore_snapshot of a stopped domain's snapshot")
    missing = ServerHandle(handle.host, f"{handle.domain}-never", location=handle.location)
    refused: tuple[tuple[str, Callable[[], Awaitable[None]]], ...] = (
        ("restore_snapshot of an unknown snapshot", lambda: backend.restore_snapshot(handle, "kit-snap-never")),
        ("restore_snapshot of a missing domain", lambda: backend.restore_snapshot(missing, first)),
        ("create_snapshot of a missing domain", lambda: backend.create_snapshot(missing, first)),
    )
    for what, call in refused:
        try:
            await call()
        except PluginError:
            pass
        else:
            raise AssertionError(f"{what} must raise PluginError")
    for name in (second, second, offline):
        await backend.delete_snapshot(handle, name)
    await backend.delete_snapshot(missing, first)
    await host.snapshots(handle, (first,), "delete_snapshot")
    await expect_state(backend, handle, DomainState.RUNNING, "delete_snapshot")


async def check_firewall(backend: HypervisorBackend, handle: ServerHandle, host: HostCheck) -> None:
    """``set_firewall`` on a running domain: anti-spoofing from create on, the rules in force after
    each call (applied twice: a retried job), and a missing domain refused."""
    await host.firewall(handle, (), "create (anti-spoofing, no rules yet)")
    for attempt in ("set_firewall", "set_firewall again (a retried job)"):
        await backend.set_firewall(handle, CONTRACT_FIREWALL)
        await host.firewall(handle, CONTRACT_FIREWALL, attempt)
    await expect_state(backend, handle, DomainState.RUNNING, "set_firewall")
    missing = ServerHandle(handle.host, f"{handle.domain}-never", location=handle.location)
    try:
        await backend.set_firewall(missing, CONTRACT_FIREWALL)
    except PluginError:
        pass
    else:
        raise AssertionError("set_firewall of a missing domain must raise PluginError")


def resized_spec(spec: ServerSpec) -> ServerSpec:
    """``spec`` one size up: a vCPU, 512 MiB and 1 GiB of disk more."""
    return dataclasses.replace(spec, vcpu=spec.vcpu + 1, memory_mib=spec.memory_mib + 512, disk_gib=spec.disk_gib + 1)


async def check_resize(
    backend: HypervisorBackend,
    handle: ServerHandle,
    spec: ServerSpec,
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT,
    host: HostCheck | None = None,
) -> None:
    """``resize`` to a larger spec, twice (a retried job): running again, same disk, new sizes."""
    host = host or HostCheck(backend)
    if host.enabled and host.marker is None:
        await host.mark(handle, boot_timeout)
    bigger = resized_spec(spec)
    for attempt in ("resize", "resize again (a retried job)"):
        before = await host.boots(handle)
        await backend.resize(handle, bigger)
        await wait_running(backend, handle, attempt, boot_timeout)
        await host.booted_since(handle, before, attempt)
        found = await host.running_once(handle, attempt)
        if found is not None:
            sizes = (found.vcpu, found.memory_mib, found.disk_gib)
            wanted = (bigger.vcpu, bigger.memory_mib, bigger.disk_gib)
            assert all(got in (None, want) for got, want in zip(sizes, wanted, strict=True)), (
                f"after {attempt} the host has vcpu, memory_mib, disk_gib {sizes}, the spec asked {wanted}"
            )


async def check_migrate(
    backend: HypervisorBackend,
    handle: ServerHandle,
    spec: ServerSpec,
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT,
    host: HostCheck | None = None,
) -> ServerHandle:
    """``migrate`` of a running domain to each other host of its location in turn and, with one
    host, to its own. Returns the handle where the server ends up (the caller destroys that one)."""
    host = host or HostCheck(backend)
    hosts = backend.hosts(spec.location)
    assert isinstance(hosts, list) and all(isinstance(h, str) for h in hosts), "hosts must return a list of str"
    assert handle.host in hosts, f"the server was placed on {handle.host!r}, not one of hosts(): {hosts}"
    if host.enabled and host.marker is None:
        await host.mark(handle, boot_timeout)
    snapshot = "kit-snap-moved" if CAPABILITY_SNAPSHOTS in backend.capabilities else None
    if snapshot is not None:  # a server's snapshots move with it, and restore on the new host
        await backend.create_snapshot(handle, snapshot)
    others = [h for h in hosts if h != handle.host] or [handle.host]
    for target in others:
        old = handle
        for attempt in (f"migrate to {target}", f"migrate to {target} again (a retried job)"):
            moved = await backend.migrate(handle, target, start=True)
            assert isinstance(moved, ServerHandle), "migrate must return a vpsshop.ServerHandle"
            assert (moved.host, moved.domain) == (target, handle.domain), f"{attempt} returned {moved}"
            handle = dataclasses.replace(moved, location=spec.location)
            await wait_running(backend, handle, attempt, boot_timeout)
            await host.running_once(handle, attempt)
            if snapshot is not None:
                await host.snapshots(handle, (snapshot,), attempt)
            if old.host != target and host.enabled:
                left = await host.look(old)
                assert not left.resources and left.running == 0, (
                    f"after {attempt} the old host {old.host} still holds {list(left.resources)}"
                )
    if snapshot is not None:
        await backend.restore_snapshot(handle, snapshot)
        await wait_running(backend, handle, "restore_snapshot after migrate", boot_timeout)
        await host.running_once(handle, "restore_snapshot after migrate")
        await backend.delete_snapshot(handle, snapshot)
        await host.snapshots(handle, (), "delete_snapshot after migrate")
    return handle


async def check_avoid_hosts(backend: HypervisorBackend, spec: ServerSpec, boot_timeout: float) -> None:
    """A spec avoiding every host but the last is placed on the last (a drained host gets no order)."""
    hosts = backend.hosts(spec.location)
    avoided = dataclasses.replace(spec, name=spec.name + "-d", avoid_hosts=tuple(hosts[:-1]))
    handle = await backend.create(avoided)
    try:
        assert handle.host == hosts[-1], f"avoid_hosts={hosts[:-1]} yet the server was placed on {handle.host}"
    finally:
        await backend.destroy(dataclasses.replace(handle, location=spec.location))


async def check_traffic(backend: HypervisorBackend, handle: ServerHandle) -> None:
    """``interface_counters`` and ``limit_bandwidth`` on a running domain: counters are whole,
    non-negative and never fall while the domain runs; a cap and its lifting are idempotent; a
    missing domain has no counters."""
    first = await backend.interface_counters(handle)
    assert isinstance(first, InterfaceCounters), "interface_counters of a running domain must be InterfaceCounters"
    for kib in (512, 512, None, None):
        await backend.limit_bandwidth(handle, kib)
    later = await backend.interface_counters(handle)
    assert isinstance(later, InterfaceCounters)
    for name in ("in_bytes", "out_bytes"):
        before, after = getattr(first, name), getattr(later, name)
        assert isinstance(after, int) and after >= 0, f"{name} must be a non-negative int, not {after!r}"
        assert after >= before, f"{name} fell from {before} to {after} while the domain ran (limit_bandwidth reset it?)"
    missing = ServerHandle(handle.host, f"{handle.domain}-never", location=handle.location)
    assert await backend.interface_counters(missing) is None, "a missing domain has no interface counters (None)"


async def check_guest_report(
    backend: HypervisorBackend, handle: ServerHandle, after: str, boot_timeout: float, expected: bool = True
) -> GuestReport | None:
    """``guest_report`` of a running domain: its guest's report within ``boot_timeout`` when
    ``expected``; else None once a short wait is over."""
    wait = boot_timeout if expected else NO_REPORT_WAIT
    started = time.monotonic()
    report = await backend.guest_report(handle, wait)
    took = time.monotonic() - started
    assert took < wait + 10, f"guest_report after {after} took {took:.1f} s with wait_seconds={wait:g}"
    if not expected:
        assert report is None, f"guest_report after {after} returned {report!r} for a guest that boots nothing"
        return None
    assert report is not None, f"after {after} the guest did not report within {boot_timeout:g} s"
    assert isinstance(report, GuestReport), "guest_report must return a vpsshop.GuestReport or None"
    assert all(isinstance(k, HostKey) for k in report.host_keys), "host_keys must be vpsshop.HostKey values"
    assert isinstance(report.errors, tuple) and all(isinstance(e, str) for e in report.errors)
    return report


check_backend = check_hypervisor
"""The name this walk had before ``vpsshop.testing`` exposed it."""


def _skip_without_inspection(backend: HypervisorBackend) -> None:
    if not backend.inspectable:
        pytest.skip(f"{type(backend).__name__} offers no inspect()/mark_disk(): the kit cannot look at the host")


class HypervisorContract:
    """Contract tests for a hypervisor backend: subclass it as ``TestSomething`` (module docstring)."""

    @pytest.fixture
    def hypervisor_run(self) -> Iterator[Run[Any]]:
        """Run a coroutine on this test's one event loop: ``hypervisor_run(backend.close())``."""
        with start_blocking_portal() as portal:

            async def wait(awaitable: Awaitable[Any]) -> Any:
                return await awaitable

            yield lambda awaitable: portal.call(wait, awaitable)

    @pytest.fixture
    def hypervisor_backend(self) -> HypervisorBackend:  # pragma: no cover - overridden by the subclass
        raise NotImplementedError("override the hypervisor_backend fixture with your configured backend")

    @pytest.fixture
    def hypervisor_location(self) -> str:
        return "nl"

    @pytest.fixture
    def hypervisor_unserved_location(self) -> str | None:
        return None

    @pytest.fixture
    def hypervisor_spec_overrides(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def hypervisor_boot_timeout(self) -> float:
        return DEFAULT_BOOT_TIMEOUT

    @pytest.fixture
    def hypervisor_guest_reports(self) -> bool:
        return True

    @pytest.fixture
    def hypervisor_spec(self, hypervisor_location: str, hypervisor_spec_overrides: dict[str, Any]) -> ServerSpec:
        return contract_spec(hypervisor_location, **hypervisor_spec_overrides)

    @pytest.fixture
    def created(
        self,
        hypervisor_backend: HypervisorBackend,
        hypervisor_spec: ServerSpec,
        hypervisor_boot_timeout: float,
        hypervisor_run: Run[Any],
    ) -> Iterator[ServerHandle]:
        """A running domain; destroyed afterwards, and then nothing of it may be left on the host."""
        run, backend = hypervisor_run, hypervisor_backend
        handle = run(backend.create(hypervisor_spec))
        handle = ServerHandle(handle.host, handle.domain, handle.ip, hypervisor_spec.location)
        try:
            run(wait_running(backend, handle, "create", hypervisor_boot_timeout))
            yield handle
        finally:
            run(backend.destroy(handle))
        run(HostCheck(backend).nothing_left(handle, "the test (destroy at its end)"))

    def test_whole_life_of_a_server(
        self,
        hypervisor_backend: HypervisorBackend,
        hypervisor_spec: ServerSpec,
        hypervisor_boot_timeout: float,
        hypervisor_guest_reports: bool,
        hypervisor_run: Run[Any],
    ) -> None:
        hypervisor_run(
            check_hypervisor(hypervisor_backend, hypervisor_spec, hypervisor_boot_timeout, hypervisor_guest_reports)
        )

    def test_create_names_the_domain_and_its_host(self, created: ServerHandle, hypervisor_spec: ServerSpec) -> None:
        assert created.domain == hypervisor_spec.name
        assert created.host, "create must say which host the domain is on"

    def test_create_again_returns_the_same_domain(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_spec: ServerSpec,
        hypervisor_run: Run[Any],
    ) -> None:
        again = hypervisor_run(hypervisor_backend.create(hypervisor_spec))
        assert (again.host, again.domain) == (created.host, created.domain)
        hypervisor_run(expect_state(hypervisor_backend, created, DomainState.RUNNING, "a second create"))

    def test_create_again_keeps_the_disk(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_spec: ServerSpec,
        hypervisor_boot_timeout: float,
        hypervisor_run: Run[Any],
    ) -> None:
        """A retried provisioning job must not provision again over a server that got made."""
        _skip_without_inspection(hypervisor_backend)
        host = HostCheck(hypervisor_backend)
        hypervisor_run(host.mark(created, hypervisor_boot_timeout))
        hypervisor_run(hypervisor_backend.create(hypervisor_spec))
        hypervisor_run(wait_running(hypervisor_backend, created, "a second create", hypervisor_boot_timeout))
        hypervisor_run(host.running_once(created, "a second create"))

    def test_power_verbs_are_idempotent(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_boot_timeout: float,
        hypervisor_run: Run[Any],
    ) -> None:
        backend = hypervisor_backend
        host = HostCheck(backend)

        async def walk() -> None:
            await host.mark(created, hypervisor_boot_timeout)
            for verb in ("stop", "stop", "suspend", "suspend"):
                await getattr(backend, verb)(created)
                await expect_state(backend, created, DomainState.STOPPED, verb)
                await host.stopped(created, verb)
            for verb in ("start", "start", "resume", "resume"):
                await getattr(backend, verb)(created)
                await wait_running(backend, created, verb, hypervisor_boot_timeout)
                await host.running_once(created, f"{verb} (of a running domain the second time)")

        hypervisor_run(walk())

    def test_suspend_and_resume_keep_the_disk(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_boot_timeout: float,
        hypervisor_run: Run[Any],
    ) -> None:
        """Suspension for non-payment keeps the customer's data until termination."""
        _skip_without_inspection(hypervisor_backend)
        backend, host = hypervisor_backend, HostCheck(hypervisor_backend)

        async def walk() -> None:
            await host.mark(created, hypervisor_boot_timeout)
            await backend.suspend(created)
            await host.stopped(created, "suspend")
            await backend.resume(created)
            await wait_running(backend, created, "resume", hypervisor_boot_timeout)
            await host.running_once(created, "resume")

        hypervisor_run(walk())

    def test_reboot_starts_a_stopped_domain(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_boot_timeout: float,
        hypervisor_run: Run[Any],
    ) -> None:
        hypervisor_run(hypervisor_backend.stop(created))
        hypervisor_run(hypervisor_backend.reboot(created))
        hypervisor_run(wait_running(hypervisor_backend, created, "reboot of a stopped domain", hypervisor_boot_timeout))
        hypervisor_run(HostCheck(hypervisor_backend).running_once(created, "reboot of a stopped domain"))

    def test_reboot_restarts_a_running_guest(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_boot_timeout: float,
        hypervisor_run: Run[Any],
    ) -> None:
        _skip_without_inspection(hypervisor_backend)
        host = HostCheck(hypervisor_backend)

        async def walk() -> None:
            before = await host.boots(created)
            await hypervisor_backend.reboot(created)
            await wait_running(hypervisor_backend, created, "reboot", hypervisor_boot_timeout)
            await host.booted_since(created, before, "reboot of a running domain")
            await host.running_once(created, "reboot of a running domain")

        hypervisor_run(walk())

    def test_destroy_removes_and_is_idempotent(
        self, hypervisor_backend: HypervisorBackend, created: ServerHandle, hypervisor_run: Run[Any]
    ) -> None:
        hypervisor_run(hypervisor_backend.destroy(created))
        hypervisor_run(expect_state(hypervisor_backend, created, DomainState.MISSING, "destroy"))
        hypervisor_run(HostCheck(hypervisor_backend).nothing_left(created, "destroy"))
        hypervisor_run(hypervisor_backend.destroy(created))
        for verb in ("stop", "suspend"):  # of a missing domain: nothing to do
            hypervisor_run(getattr(hypervisor_backend, verb)(created))

    def test_destroy_without_a_host(
        self, hypervisor_backend: HypervisorBackend, created: ServerHandle, hypervisor_run: Run[Any]
    ) -> None:
        hypervisor_run(check_destroy_without_host(hypervisor_backend, created))

    def test_missing_domain(
        self, hypervisor_backend: HypervisorBackend, created: ServerHandle, hypervisor_run: Run[Any]
    ) -> None:
        handle = ServerHandle(host=created.host, domain=f"{created.domain}-never", location=created.location)
        hypervisor_run(expect_state(hypervisor_backend, handle, DomainState.MISSING, "nothing"))
        for verb in ("start", "reboot"):
            with pytest.raises(PluginError):
                hypervisor_run(getattr(hypervisor_backend, verb)(handle))
        for verb in ("stop", "suspend", "destroy"):
            hypervisor_run(getattr(hypervisor_backend, verb)(handle))
        hypervisor_run(HostCheck(hypervisor_backend).nothing_left(handle, "verbs on a domain that never existed"))

    def test_serves_its_locations(
        self,
        hypervisor_backend: HypervisorBackend,
        hypervisor_location: str,
        hypervisor_unserved_location: str | None,
        hypervisor_spec_overrides: dict[str, Any],
        hypervisor_run: Run[Any],
    ) -> None:
        """serves() is True where servers are made; where it is False, create refuses."""
        check_serves(hypervisor_backend, hypervisor_location, hypervisor_unserved_location)
        if hypervisor_unserved_location is not None:
            spec = contract_spec(hypervisor_unserved_location, **hypervisor_spec_overrides)
            hypervisor_run(check_unserved_location(hypervisor_backend, spec))

    def test_capabilities_are_known(self, hypervisor_backend: HypervisorBackend) -> None:
        assert set(hypervisor_backend.capabilities) <= KNOWN_CAPABILITIES

    def test_optional_verbs(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_spec: ServerSpec,
        hypervisor_boot_timeout: float,
        hypervisor_guest_reports: bool,
        hypervisor_run: Run[Any],
    ) -> None:
        """reinstall (on a new disk), open_console and guest_report, for the backends whose capabilities name them."""
        hypervisor_run(
            check_optional_verbs(
                hypervisor_backend,
                created,
                hypervisor_spec,
                hypervisor_boot_timeout,
                guest_reports=hypervisor_guest_reports,
            )
        )

    def test_migrate(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_spec: ServerSpec,
        hypervisor_boot_timeout: float,
        hypervisor_run: Run[Any],
    ) -> None:
        """migrate moves a running server to each other host of its location, disk kept, the old host
        left empty; with avoid_hosts, placement skips the hosts named (for backends naming "migrate")."""
        backend = hypervisor_backend
        if CAPABILITY_MIGRATE not in backend.capabilities:
            assert "migrate" not in backend.capabilities
            return
        end = created
        try:
            end = hypervisor_run(check_migrate(backend, created, hypervisor_spec, hypervisor_boot_timeout))
        finally:
            hypervisor_run(backend.destroy(end))
        if len(backend.hosts(hypervisor_spec.location)) > 1:
            hypervisor_run(check_avoid_hosts(backend, hypervisor_spec, hypervisor_boot_timeout))

    def test_address_pool(self, hypervisor_backend: HypervisorBackend, hypervisor_location: str) -> None:
        pool = hypervisor_backend.address_pool(hypervisor_location)
        if pool is None:
            return  # the backend assigns addresses itself
        assert isinstance(pool, AddressPool) and pool.pool
        first = list(itertools.islice(iter(pool.addresses), 64))
        assert first and all(isinstance(a, str) for a in first)
        assert len(set(first)) == len(first), "an address pool lists an address twice"
        assert pool.gateway not in first, "the gateway is not an address to hand out"

    def test_ipv6_pool(self, hypervisor_backend: HypervisorBackend, hypervisor_location: str) -> None:
        if CAPABILITY_IPV6 not in hypervisor_backend.capabilities:
            return
        pool = hypervisor_backend.ipv6_pool(hypervisor_location)
        if pool is None:
            return  # this location has no IPv6
        assert isinstance(pool, Ipv6Pool) and pool.pool, "ipv6_pool must return a vpsshop.Ipv6Pool"
        v4 = hypervisor_backend.address_pool(hypervisor_location)
        assert v4 is None or v4.pool != pool.pool, "the IPv6 pool needs a name of its own (leases are per pool)"
        network = ipaddress.IPv6Network(pool.prefix, strict=False)
        leases = list(itertools.islice(pool.leases(), 64))
        assert leases and len(set(leases)) == len(leases), "an IPv6 pool lists a lease twice"
        for lease in leases:
            address, length = pool.guest_address(lease)
            assert ipaddress.IPv6Address(address) in network, f"{address} is outside {pool.prefix}"
            assert address != pool.gateway, "the gateway is not an address to hand out"
            assert 64 <= length <= 128
