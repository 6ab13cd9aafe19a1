"""The hypervisor contract: what core relies on, as tests any backend runs against itself.

Exposed through ``vpsshop.testing`` (the pytest plugin vpsshop installs). Two ways to use it:

1. **The test class.** Subclass :class:`HypervisorContract` in a test module whose name starts
   with ``Test``, and give it the backend (built against a real or test daemon) as the
   ``hypervisor_backend`` fixture. Every contract test then runs against it, one test per rule,
   so a failure names the rule that broke::

       import pytest
       from vpsshop.testing import HypervisorContract

       class TestMyBackend(HypervisorContract):
           @pytest.fixture
           def hypervisor_backend(self):
               backend = MyBackend.from_settings({...}, sandbox=False, where="hypervisor.mine")
               yield backend
               asyncio.run(backend.close())

   Optional fixtures: ``hypervisor_location`` (a location the backend serves, default ``"nl"``),
   ``hypervisor_unserved_location`` (a location your configuration does not serve, default None:
   not checked), ``hypervisor_spec_overrides`` (fields of the :class:`~vpsshop.ServerSpec`, e.g.
   the OS image your test host has) and ``hypervisor_boot_timeout`` (seconds a domain may report
   ``starting``, default 60).

2. **One walk.** :func:`check_hypervisor` takes one server through every verb in the order core
   uses them, twice where core may retry, and raises ``AssertionError`` naming the verb that broke
   the contract. It always destroys what it created.

What the contract says (``docs/plugins.md``, "Hypervisor backends"):

* ``serves`` answers a bool, True for the location the server is made in; for a location the
  configuration does not serve it is False, and ``create`` there raises :class:`vpsshop.PluginError`;
* ``create`` returns a handle whose ``domain`` is ``spec.name`` and whose ``host`` is set; the
  domain is powered on: ``state`` reports ``starting`` and then ``running`` within the boot time;
* ``create`` again with the same spec returns the same host and domain (a retried job);
* ``start``/``resume`` of a running domain, ``stop``/``suspend`` of a stopped one, ``destroy`` of a
  missing one do nothing and do not raise; ``reboot`` of a stopped domain starts it;
* ``state`` of a domain that never existed is ``missing``, without raising;
* ``start`` or ``reboot`` of a missing domain raises :class:`vpsshop.PluginError`;
* ``address_pool`` is None or an :class:`~vpsshop.AddressPool` of distinct address strings;
* ``capabilities`` names only known optional verbs (``reinstall``, ``console``); for each one named:
* ``reinstall`` of a running domain returns a handle on the same host and domain, and the domain
  is running again within the boot time; reinstalling again (a retried job) does the same;
* ``open_console`` of a running domain returns a :class:`~vpsshop.ConsoleStream` whose ``close``
  is idempotent and after which ``read`` comes to ``b""`` (after what was read before); of a missing domain it raises
  :class:`vpsshop.PluginError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from vpsshop.errors import PluginError
from vpsshop.hypervisor import (
    CAPABILITY_CONSOLE,
    CAPABILITY_REINSTALL,
    AddressPool,
    ConsoleStream,
    DomainState,
    HypervisorBackend,
    ServerHandle,
    ServerSpec,
)

KNOWN_CAPABILITIES = frozenset({CAPABILITY_REINSTALL, CAPABILITY_CONSOLE})

DEFAULT_BOOT_TIMEOUT = 60.0
_POLL_SECONDS = 0.1


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


async def check_hypervisor(
    backend: HypervisorBackend, spec: ServerSpec, boot_timeout: float = DEFAULT_BOOT_TIMEOUT
) -> ServerHandle:
    """Create, re-create, start, stop, reboot, suspend, resume and destroy one server, checking the
    states and the idempotency core relies on.

    :return: the handle ``create`` returned (the domain is gone by then).
    """
    check_serves(backend, spec.location)
    handle = await backend.create(spec)
    try:
        assert handle.domain == spec.name, f"create returned domain {handle.domain!r}, not spec.name {spec.name!r}"
        assert handle.host, "create must say which host the domain is on"
        await wait_running(backend, handle, "create", boot_timeout)
        again = await backend.create(spec)
        assert (again.host, again.domain) == (handle.host, handle.domain), "create is not idempotent"
        await expect_state(backend, handle, DomainState.RUNNING, "create of an existing running domain")
        handle = ServerHandle(handle.host, handle.domain, handle.ip, spec.location)
        await backend.start(handle)
        await expect_state(backend, handle, DomainState.RUNNING, "start of a running domain")
        await backend.stop(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "stop")
        await backend.stop(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "stop of a stopped domain")
        await backend.reboot(handle)
        await wait_running(backend, handle, "reboot of a stopped domain", boot_timeout)
        await backend.reboot(handle)
        await wait_running(backend, handle, "reboot", boot_timeout)
        await backend.suspend(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "suspend")
        await backend.suspend(handle)
        await expect_state(backend, handle, DomainState.STOPPED, "suspend of a suspended domain")
        await backend.resume(handle)
        await wait_running(backend, handle, "resume", boot_timeout)
        await backend.resume(handle)
        await expect_state(backend, handle, DomainState.RUNNING, "resume of a running domain")
        await check_optional_verbs(backend, handle, spec, boot_timeout)
    finally:
        await backend.destroy(handle)
    await expect_state(backend, handle, DomainState.MISSING, "destroy")
    await backend.destroy(handle)
    await expect_state(backend, handle, DomainState.MISSING, "destroy of a missing domain")
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
        return
    await backend.destroy(handle)
    raise AssertionError(f"create in location {spec.location!r}, which serves() says is not served, did not raise")


async def check_optional_verbs(
    backend: HypervisorBackend, handle: ServerHandle, spec: ServerSpec, boot_timeout: float = DEFAULT_BOOT_TIMEOUT
) -> None:
    """Check the optional verbs the backend's ``capabilities`` name, on a running domain."""
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
    if CAPABILITY_REINSTALL in backend.capabilities:
        fresh = dataclasses.replace(spec, root_password=spec.root_password + "-new")
        for attempt in ("reinstall", "reinstall again (a retried job)"):
            again = await backend.reinstall(handle, fresh)
            assert (again.host, again.domain) == (handle.host, handle.domain), f"{attempt} moved the domain"
            await wait_running(backend, handle, attempt, boot_timeout)


check_backend = check_hypervisor
"""The name this walk had before ``vpsshop.testing`` exposed it."""


class HypervisorContract:
    """Contract tests for a hypervisor backend: subclass it as ``TestSomething`` (module docstring)."""

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
    def hypervisor_spec(self, hypervisor_location: str, hypervisor_spec_overrides: dict[str, Any]) -> ServerSpec:
        return contract_spec(hypervisor_location, **hypervisor_spec_overrides)

    @pytest.fixture
    def created(
        self, hypervisor_backend: HypervisorBackend, hypervisor_spec: ServerSpec, hypervisor_boot_timeout: float
    ) -> Iterator[ServerHandle]:
        """A running domain, destroyed afterwards."""
        handle = asyncio.run(hypervisor_backend.create(hypervisor_spec))
        handle = ServerHandle(handle.host, handle.domain, handle.ip, hypervisor_spec.location)
        try:
            asyncio.run(wait_running(hypervisor_backend, handle, "create", hypervisor_boot_timeout))
            yield handle
        finally:
            asyncio.run(hypervisor_backend.destroy(handle))

    def test_whole_life_of_a_server(
        self, hypervisor_backend: HypervisorBackend, hypervisor_spec: ServerSpec, hypervisor_boot_timeout: float
    ) -> None:
        asyncio.run(check_hypervisor(hypervisor_backend, hypervisor_spec, hypervisor_boot_timeout))

    def test_create_names_the_domain_and_its_host(self, created: ServerHandle, hypervisor_spec: ServerSpec) -> None:
        assert created.domain == hypervisor_spec.name
        assert created.host, "create must say which host the domain is on"

    def test_create_again_returns_the_same_domain(
        self, hypervisor_backend: HypervisorBackend, created: ServerHandle, hypervisor_spec: ServerSpec
    ) -> None:
        again = asyncio.run(hypervisor_backend.create(hypervisor_spec))
        assert (again.host, again.domain) == (created.host, created.domain)
        asyncio.run(expect_state(hypervisor_backend, created, DomainState.RUNNING, "a second create"))

    def test_power_verbs_are_idempotent(
        self, hypervisor_backend: HypervisorBackend, created: ServerHandle, hypervisor_boot_timeout: float
    ) -> None:
        async def walk() -> None:
            for verb in ("stop", "stop", "suspend"):
                await getattr(hypervisor_backend, verb)(created)
                await expect_state(hypervisor_backend, created, DomainState.STOPPED, verb)
            for verb in ("start", "start", "resume"):
                await getattr(hypervisor_backend, verb)(created)
                await wait_running(hypervisor_backend, created, verb, hypervisor_boot_timeout)

        asyncio.run(walk())

    def test_reboot_starts_a_stopped_domain(
        self, hypervisor_backend: HypervisorBackend, created: ServerHandle, hypervisor_boot_timeout: float
    ) -> None:
        asyncio.run(hypervisor_backend.stop(created))
        asyncio.run(hypervisor_backend.reboot(created))
        asyncio.run(wait_running(hypervisor_backend, created, "reboot of a stopped domain", hypervisor_boot_timeout))

    def test_destroy_removes_and_is_idempotent(
        self, hypervisor_backend: HypervisorBackend, created: ServerHandle
    ) -> None:
        asyncio.run(hypervisor_backend.destroy(created))
        asyncio.run(expect_state(hypervisor_backend, created, DomainState.MISSING, "destroy"))
        asyncio.run(hypervisor_backend.destroy(created))
        asyncio.run(hypervisor_backend.stop(created))  # stopping a missing domain: nothing to do

    def test_missing_domain(self, hypervisor_backend: HypervisorBackend, created: ServerHandle) -> None:
        handle = ServerHandle(host=created.host, domain=f"{created.domain}-never", location=created.location)
        asyncio.run(expect_state(hypervisor_backend, handle, DomainState.MISSING, "nothing"))
        for verb in ("start", "reboot"):
            with pytest.raises(PluginError):
                asyncio.run(getattr(hypervisor_backend, verb)(handle))

    def test_serves_its_locations(
        self,
        hypervisor_backend: HypervisorBackend,
        hypervisor_location: str,
        hypervisor_unserved_location: str | None,
        hypervisor_spec_overrides: dict[str, Any],
    ) -> None:
        """serves() is True where servers are made; where it is False, create refuses."""
        check_serves(hypervisor_backend, hypervisor_location, hypervisor_unserved_location)
        if hypervisor_unserved_location is not None:
            spec = contract_spec(hypervisor_unserved_location, **hypervisor_spec_overrides)
            asyncio.run(check_unserved_location(hypervisor_backend, spec))

    def test_capabilities_are_known(self, hypervisor_backend: HypervisorBackend) -> None:
        assert set(hypervisor_backend.capabilities) <= KNOWN_CAPABILITIES

    def test_optional_verbs(
        self,
        hypervisor_backend: HypervisorBackend,
        created: ServerHandle,
        hypervisor_spec: ServerSpec,
        hypervisor_boot_timeout: float,
    ) -> None:
        """reinstall and open_console, for the backends whose capabilities name them."""
        asyncio.run(check_optional_verbs(hypervisor_backend, created, hypervisor_spec, hypervisor_boot_timeout))

    def test_address_pool(self, hypervisor_backend: HypervisorBackend, hypervisor_location: str) -> None:
        pool = hypervisor_backend.address_pool(hypervisor_location)
        if pool is None:
            return  # the backend assigns addresses itself
        assert isinstance(pool, AddressPool) and pool.pool
        first = list(itertools.islice(iter(pool.addresses), 64))
        assert first and all(isinstance(a, str) for a in first)
        assert len(set(first)) == len(first), "an address pool lists an address twice"
        assert pool.gateway not in first, "the gateway is not an address to hand out"
