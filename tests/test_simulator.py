"""The hypervisor simulator (default plugin ``vpsshop_simulator``) and the PluginState it keeps its
domains in: the hypervisor contract, state shared by processes, booting, and the shipped commands."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from served import serve, shop_env, worker

from vpsshop import DomainState, PluginState, ServerHandle
from vpsshop.assembly import build_context
from vpsshop.context import AppContext
from vpsshop.servers.jobs import run_jobs
from vpsshop.servers.models import ServerJob
from vpsshop.settings import load_settings
from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, HypervisorContract, contract_spec

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def _context(database_url: str, **simulator: Any) -> AppContext:
    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": database_url,
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "hypervisor": {"simulator": simulator},
        },
    )
    ctx = build_context(settings)
    ctx.db.migrate()
    return ctx


@pytest.fixture
def sim_ctx(vpsshop_database_url: str) -> Iterator[AppContext]:
    ctx = _context(vpsshop_database_url, boot_seconds=0.3)
    yield ctx
    ctx.db.dispose()


class TestSimulatorContract(HypervisorContract):
    """The contract kit of vpsshop.testing, run against the simulator on SQLite and PostgreSQL."""

    @pytest.fixture
    def hypervisor_backend(self, sim_ctx: AppContext) -> Any:
        assert sim_ctx.hypervisor is not None and sim_ctx.hypervisor.kind == "simulator"
        return sim_ctx.hypervisor

    @pytest.fixture
    def hypervisor_boot_timeout(self) -> float:
        return 10


def test_the_sandbox_picks_the_simulator_and_says_so(vpsshop_client):
    components = vpsshop_client.get("/v1/health").json()["components"]
    hypervisor = next(c for c in components if c["kind"] == "hypervisor")
    assert hypervisor["id"] == "simulator" and hypervisor["plugin"] == "simulator" and hypervisor["ready"]
    assert "simulated" in hypervisor["detail"]


def test_a_powered_on_domain_boots_then_runs(sim_ctx):
    backend = sim_ctx.hypervisor
    spec = contract_spec()
    handle = asyncio.run(backend.create(spec))
    assert asyncio.run(backend.state(handle)) == DomainState.STARTING
    time.sleep(0.35)
    assert asyncio.run(backend.state(handle)) == DomainState.RUNNING
    asyncio.run(backend.create(spec))  # a retried create does not boot it again
    assert asyncio.run(backend.state(handle)) == DomainState.RUNNING
    asyncio.run(backend.reboot(handle))
    assert asyncio.run(backend.state(handle)) == DomainState.STARTING
    asyncio.run(backend.destroy(handle))


def test_domains_are_shared_by_processes_and_survive_a_restart(vpsshop_database_url):
    """Two contexts on one database stand for two processes (serve workers, vpsshop worker)."""
    first = _context(vpsshop_database_url, boot_seconds=0)
    second = _context(vpsshop_database_url, boot_seconds=0)
    try:
        spec = contract_spec()
        handle = asyncio.run(first.hypervisor.create(spec))
        assert asyncio.run(second.hypervisor.state(handle)) == DomainState.RUNNING
        asyncio.run(second.hypervisor.stop(handle))
        assert asyncio.run(first.hypervisor.state(handle)) == DomainState.STOPPED
        first.db.dispose()
        restarted = _context(vpsshop_database_url, boot_seconds=0)
        assert asyncio.run(restarted.hypervisor.state(handle)) == DomainState.STOPPED
        asyncio.run(restarted.hypervisor.destroy(handle))
        assert asyncio.run(second.hypervisor.state(handle)) == DomainState.MISSING
        restarted.db.dispose()
    finally:
        second.db.dispose()


# ---- PluginState ---------------------------------------------------------------------------------


def test_plugin_state_compare_and_set(sim_ctx):
    state = PluginState(sim_ctx, "test-plugin")
    other = PluginState(sim_ctx, "other-plugin")
    record = asyncio.run(state.create("a", {"n": 1}))
    assert record is not None and record.version == 1 and record.data == {"n": 1}
    assert asyncio.run(state.create("a", {"n": 2})) is None  # the first creator wins
    assert asyncio.run(other.get("a")) is None  # namespaces do not see each other
    newer = asyncio.run(state.replace(record, {"n": 2}))
    assert newer is not None and newer.version == 2
    assert asyncio.run(state.replace(record, {"n": 3})) is None  # stale version: refused
    assert asyncio.run(state.get("a")).data == {"n": 2}
    assert not asyncio.run(state.delete(record))  # stale version: not deleted
    asyncio.run(state.create("a_b", {}))
    asyncio.run(state.create("a%", {}))
    assert [r.key for r in asyncio.run(state.list("a_"))] == ["a_b"]  # LIKE wildcards are escaped
    assert [r.key for r in asyncio.run(state.list("a"))] == ["a", "a%", "a_b"]
    assert asyncio.run(state.delete(newer))
    assert asyncio.run(state.delete("a_b")) and not asyncio.run(state.delete("a_b"))
    with pytest.raises(ValueError):
        asyncio.run(state.create("big", {"x": "y" * 70_000}))


def test_plugin_state_modify_never_loses_an_update(vpsshop_database_url):
    """Four 'processes' (contexts with their own engines) increment one counter 25 times each."""
    contexts = [_context(vpsshop_database_url) for _ in range(4)]
    errors: list[BaseException] = []

    def bump(ctx: AppContext) -> None:
        state = PluginState(ctx, "counter")
        try:
            for _ in range(25):
                asyncio.run(state.modify("n", lambda data: {"n": (data or {"n": 0})["n"] + 1}, attempts=200))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=bump, args=(ctx,)) for ctx in contexts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert not errors, errors
        record = asyncio.run(PluginState(contexts[0], "counter").get("n"))
        assert record.data == {"n": 100} and record.version == 100
    finally:
        for ctx in contexts:
            ctx.db.dispose()


# ---- provisioning waits for the boot -------------------------------------------------------------


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"boot_seconds": 30}}, "servers": {"boot_timeout_seconds": 120}}


def _job(ctx: AppContext) -> ServerJob:
    with ctx.db.session() as session:
        return session.execute(sa.select(ServerJob).order_by(ServerJob.id.desc())).scalars().first()


def test_provisioning_waits_for_the_boot_without_spending_attempts(vpsshop_client, vpsshop_account, vpsshop_clock):
    ctx = vpsshop_client.app.state.ctx
    vpsshop_account.credit("5")
    sid = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER).json()["server"]["id"]
    for _ in range(3):  # booting: the job comes back soon, and no attempt is counted
        assert asyncio.run(run_jobs(ctx)) == {"done": 0, "retry": 1, "failed": 0}
        job = _job(ctx)
        assert (job.status, job.attempts) == ("queued", 0) and "booting" in job.last_error
        vpsshop_clock.advance(seconds=1)
    vpsshop_clock.advance(seconds=28)
    assert asyncio.run(run_jobs(ctx)) == {"done": 1, "retry": 0, "failed": 0}
    server = vpsshop_client.get(f"/v1/servers/{sid}", headers=vpsshop_account.headers).json()
    assert server["status"] == "active" and server["ip"].startswith("10.99.") and server["ip"] != "10.99.0.1"


def test_a_domain_that_never_boots_counts_as_a_failed_attempt(vpsshop_client, vpsshop_account, vpsshop_clock):
    ctx = vpsshop_client.app.state.ctx
    ctx.hypervisor.config.boot_seconds = 3600
    vpsshop_account.credit("5")
    vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER)
    assert asyncio.run(run_jobs(ctx))["retry"] == 1
    assert _job(ctx).attempts == 0
    vpsshop_clock.advance(seconds=121)
    assert asyncio.run(run_jobs(ctx))["retry"] == 1
    job = _job(ctx)
    assert job.attempts == 1 and "still starting" in job.last_error and "boot_timeout_seconds" in job.last_error


# ---- the shipped commands: two API processes and a separate worker ------------------------------


def test_two_serve_processes_and_a_worker_share_the_simulated_servers(vpsshop_database_url, tmp_path: Path):
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="1",
    )
    with serve(tmp_path, env, "--no-worker", name="a") as a, serve(tmp_path, env, "--no-worker", name="b") as b:
        created = httpx.post(f"{a.base}/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        with AppContextOn(vpsshop_database_url) as ctx, ctx.db.session() as session:
            from vpsshop import ledger

            ledger.post(session, created["user_id"], 10_000_000, "admin_credit", memo="test")
        sid = httpx.post(f"{a.base}/servers", headers=headers, json=ORDER).json()["server"]["id"]
        time.sleep(1)
        assert httpx.get(f"{b.base}/servers/{sid}", headers=headers).json()["status"] == "provisioning"  # no worker yet
        with worker(tmp_path, env) as w:
            server = _wait(
                lambda: httpx.get(f"{b.base}/servers/{sid}", headers=headers).json(),
                lambda s: s["status"] == "active",
                30,
                w,
            )
            assert server["ip"].startswith("10.99.")
            assert httpx.post(f"{b.base}/servers/{sid}/stop", headers=headers).status_code == 202
            with AppContextOn(vpsshop_database_url) as ctx:
                handle = ServerHandle("simulator", _domain(ctx, sid))
                _wait(lambda: asyncio.run(ctx.hypervisor.state(handle)), lambda s: s == DomainState.STOPPED, 30, w)
            assert "running servers-jobs" in w.output() or "servers-jobs" in w.output()


class AppContextOn:
    def __init__(self, url: str) -> None:
        self.ctx = _context(url)

    def __enter__(self) -> AppContext:
        return self.ctx

    def __exit__(self, *exc: object) -> None:
        self.ctx.db.dispose()


def _domain(ctx: AppContext, sid: int) -> str:
    from vpsshop.models import Server

    with ctx.db.session() as session:
        return session.get(Server, sid).domain


def _wait(read: Any, done: Any, timeout: float, proc: Any) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"still {value!r} after {timeout} s\n{proc.output()}"
        time.sleep(0.2)
