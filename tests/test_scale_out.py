"""bench/scale_out.py's after-run checks, run against a real shop's database (PostgreSQL, as the bench).

A check that counts rows of a kind nobody writes passes without checking anything (the bench once
counted ``create`` jobs, while provisioning jobs are ``provision``). Here three servers are ordered
and provisioned by the real job runner on the hypervisor simulator; the checks pass on that, and
each way a server can end up provisioned other than once (a second provision job, a missing
``provisioned`` event, a second domain, no job at all) makes them fail.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from vpsshop.app import create_app
from vpsshop.clock import FrozenClock
from vpsshop.servers.jobs import run_jobs
from vpsshop.settings import load_settings
from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, create_test_account, postgres_test_url, reset_postgres

BENCH = Path(__file__).resolve().parent.parent / "bench" / "scale_out.py"
ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("scale_out", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def provisioned() -> Iterator[psycopg.Connection[Any]]:
    """Three servers ordered and provisioned on PostgreSQL; a connection to that database."""
    url = postgres_test_url()
    reset_postgres(url)
    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": url,
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
        },
    )
    clock = FrozenClock()
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        for _ in range(3):
            account = create_test_account(client)
            account.credit("10")
            assert client.post("/v1/servers", headers=account.headers, json=ORDER).status_code == 201
        ctx = client.app.state.ctx
        done = asyncio.run(run_jobs(ctx))["done"]
        clock.advance(seconds=30)  # the simulated guests have booted
        done += asyncio.run(run_jobs(ctx))["done"]
        assert done == 3
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        yield conn


def test_checks_pass_when_each_server_was_provisioned_once(provisioned: psycopg.Connection[Any]) -> None:
    bench = load_bench()
    assert bench.provisioning_checks(provisioned, 3) == []
    assert bench.provisioning_checks(provisioned, 4) == ["3 servers for 4 orders"]


def test_a_second_provision_job_fails_the_checks(provisioned: psycopg.Connection[Any]) -> None:
    provisioned.execute(
        "INSERT INTO server_jobs (server_id, kind, status, attempts, run_after, created_at, finished_at) "
        "SELECT server_id, kind, status, 1, run_after, created_at, finished_at FROM server_jobs "
        "WHERE kind = 'provision' ORDER BY id LIMIT 1"
    )
    failed = load_bench().provisioning_checks(provisioned, 3)
    assert len(failed) == 1 and "without exactly one provision job, done" in failed[0], failed


def test_a_server_without_its_job_or_event_fails_the_checks(provisioned: psycopg.Connection[Any]) -> None:
    first, second = (sid for (sid,) in provisioned.execute("SELECT id FROM servers ORDER BY id LIMIT 2"))
    provisioned.execute("DELETE FROM server_jobs WHERE server_id = %s", (first,))
    provisioned.execute("DELETE FROM server_events WHERE server_id = %s AND kind = 'provisioned'", (second,))
    failed = load_bench().provisioning_checks(provisioned, 3)
    assert any(f"({first}, 0, 0)" in line for line in failed), failed
    assert any(f"({second}, 0)" in line and "'provisioned' event" in line for line in failed), failed


def test_a_second_domain_fails_the_checks(provisioned: psycopg.Connection[Any]) -> None:
    provisioned.execute(
        "INSERT INTO plugin_records (namespace, key, version, data, created_at, updated_at) "
        "SELECT namespace, key || '-again', 1, data, created_at, updated_at FROM plugin_records "
        "WHERE namespace = 'simulator' ORDER BY id LIMIT 1"
    )
    assert load_bench().provisioning_checks(provisioned, 3) == ["4 simulated domains for 3 servers (one each expected)"]


def test_a_kind_name_vpsshop_does_not_write_stops_the_checks(provisioned: psycopg.Connection[Any]) -> None:
    bench = load_bench()
    bench.PROVISION_JOB = "create"
    with pytest.raises(SystemExit, match="'create' is not among vpsshop's JOB_KINDS"):
        bench.provisioning_checks(provisioned, 3)
    bench = load_bench()
    bench.PROVISIONED_EVENT = "created"
    with pytest.raises(SystemExit, match="no server has a 'created' event"):
        bench.provisioning_checks(provisioned, 3)
