"""A contract every hypervisor backend must meet, runnable against any backend and daemon.

A plugin's test suite calls :func:`check_backend` with its backend (configured against a real or
test daemon) and a spec; it walks one server through the verbs core uses, in the order core uses
them, and checks the idempotency core relies on when it retries a job::

    from vpsshop.servers.contract import check_backend

    def test_my_backend_meets_the_contract(my_backend):
        asyncio.run(check_backend(my_backend, ServerSpec(name="vps-contract-1", ...)))

It raises ``AssertionError`` naming the verb that broke the contract, and always destroys what it
created.
"""

from __future__ import annotations

from vpsshop.hypervisor import DomainState, HypervisorBackend, ServerHandle, ServerSpec


async def _expect(backend: HypervisorBackend, handle: ServerHandle, wanted: DomainState, after: str) -> None:
    state = await backend.state(handle)
    assert state == wanted, f"after {after} the domain is {state.value}, expected {wanted.value}"


async def check_backend(backend: HypervisorBackend, spec: ServerSpec) -> ServerHandle:
    """Create, re-create, stop, start, reboot, suspend, resume and destroy one server.

    :return: the handle ``create`` returned (the domain is gone by then).
    """
    handle = await backend.create(spec)
    try:
        assert handle.domain == spec.name, f"create returned domain {handle.domain!r}, not spec.name {spec.name!r}"
        assert handle.host, "create must say which host the domain is on"
        await _expect(backend, handle, DomainState.RUNNING, "create")
        again = await backend.create(spec)
        assert (again.host, again.domain) == (handle.host, handle.domain), "create is not idempotent"
        handle = ServerHandle(handle.host, handle.domain, handle.ip, spec.location)
        await backend.start(handle)
        await _expect(backend, handle, DomainState.RUNNING, "start of a running domain")
        await backend.stop(handle)
        await _expect(backend, handle, DomainState.STOPPED, "stop")
        await backend.stop(handle)
        await _expect(backend, handle, DomainState.STOPPED, "stop of a stopped domain")
        await backend.reboot(handle)
        await _expect(backend, handle, DomainState.RUNNING, "reboot of a stopped domain")
        await backend.reboot(handle)
        await _expect(backend, handle, DomainState.RUNNING, "reboot")
        await backend.suspend(handle)
        await _expect(backend, handle, DomainState.STOPPED, "suspend")
        await backend.suspend(handle)
        await backend.resume(handle)
        await _expect(backend, handle, DomainState.RUNNING, "resume")
        await backend.resume(handle)
        await _expect(backend, handle, DomainState.RUNNING, "resume of a running domain")
    finally:
        await backend.destroy(handle)
    await _expect(backend, handle, DomainState.MISSING, "destroy")
    await backend.destroy(handle)
    await _expect(backend, handle, DomainState.MISSING, "destroy of a missing domain")
    return handle
