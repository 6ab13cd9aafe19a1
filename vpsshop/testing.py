"""Pytest fixtures for vpsshop and its plugins (loaded through the ``pytest11`` entry point).

A plugin's test suite gets a running app on a fresh database with::

    def test_my_coin_is_offered(vpsshop_client):
        catalog = vpsshop_client.get("/v1/catalog").json()
        assert "MYC" in [o["coin"] for o in catalog["payment_options"]]

Fixtures:

``vpsshop_database_url``
    A fresh, empty database per test: SQLite in ``tmp_path`` by default. Override it (or
    parametrize it) to run on PostgreSQL; :func:`postgres_test_url` and
    :func:`reset_postgres` do the work.
``vpsshop_overrides``
    A dict of settings applied last; override to configure your plugin.
``vpsshop_settings``, ``vpsshop_clock``, ``vpsshop_app``, ``vpsshop_client``
    Sandbox settings, a :class:`~vpsshop.clock.FrozenClock`, the app (background tasks off), and a
    Starlette ``TestClient`` with the lifespan running.
``vpsshop_context``
    The shop's :class:`~vpsshop.AppContext` on a migrated database, without an app and on the real
    clock: call a component's ``bind(ctx)`` with it, as core does before the first verb.
``vpsshop_account``
    A new account: ``.user_id``, ``.api_key``, ``.login_token``, ``.headers``, and
    ``.credit(usd)`` to fund it through the ledger.

The deposit coin contract kit (``vpsshop/payments/contract.py``): subclass
:class:`DepositCoinContract` as ``TestMyCoin`` and give it ``coin_settings``, ``pay`` and ``mine``
fixtures (docs/chain-kit.md).

The hypervisor contract kit (``vpsshop/servers/contract.py``): subclass
:class:`HypervisorContract` as ``TestMyBackend`` and override its ``hypervisor_backend`` fixture,
or call :func:`check_hypervisor` on a backend and a :func:`contract_spec`.

The public API check (``vpsshop/importcheck.py``): :func:`check_public_imports` lists every import
of a plugin package (a module, a module name or a directory) that reaches past vpsshop's public
API, each as ``path:line: message``; :func:`assert_public_imports` fails a test with that list::

    import vpsshop_mine
    from vpsshop.testing import assert_public_imports

    def test_imports_only_the_public_api():
        assert_public_imports(vpsshop_mine)

Everything here comes with ``pip install 'vpsshop[testing]'`` (pytest and what the kits need;
nothing that compiles).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from vpsshop.importcheck import ImportViolation, assert_public_imports, check_public_imports
from vpsshop.payments.contract import DepositCoinContract, scan_until_idle
from vpsshop.servers.contract import HypervisorContract, check_hypervisor, check_optional_verbs, contract_spec

__all__ = [
    "DepositCoinContract",
    "HypervisorContract",
    "ImportViolation",
    "assert_public_imports",
    "check_hypervisor",
    "check_optional_verbs",
    "check_public_imports",
    "contract_spec",
    "create_test_account",
    "postgres_test_url",
    "reset_postgres",
    "scan_until_idle",
]

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
PG_URL_ENV = "VPSSHOP_TEST_PG_URL"
TEST_SECRET_KEY = "test-secret-key-not-for-production"
TEST_ENCRYPTION_KEY = "3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="

_migrated: set[str] = set()


def postgres_test_url() -> str:
    return os.environ.get(PG_URL_ENV, DEFAULT_PG_URL)


def reset_postgres(url: str) -> None:
    """Give the test a clean PostgreSQL database at ``url``.

    The first call in a process drops and recreates the schema (whatever another checkout left
    there) and migrates it; every call then empties the tables and restarts their ids. Never point
    it at a database that holds anything you want to keep.
    """
    import sqlalchemy as sa

    from vpsshop.db import Database

    db = Database(url)
    try:
        if url not in _migrated:
            with db.engine.begin() as conn:
                conn.execute(sa.text("DROP SCHEMA IF EXISTS public CASCADE"))
                conn.execute(sa.text("CREATE SCHEMA public"))
            db.migrate()
            _migrated.add(url)
        with db.engine.begin() as conn:
            tables = [
                row[0]
                for row in conn.execute(
                    sa.text(
                        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                        "AND tablename != 'alembic_version'"
                    )
                )
            ]
            if tables:
                conn.execute(sa.text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
    finally:
        db.dispose()


@pytest.fixture
def vpsshop_database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'vpsshop.db'}"


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {}


@pytest.fixture
def vpsshop_settings(vpsshop_database_url: str, vpsshop_overrides: dict[str, Any]) -> Any:
    from vpsshop.settings import _merge, load_settings

    base = {
        "mode": "sandbox",
        "database_url": vpsshop_database_url,
        "secret_key": TEST_SECRET_KEY,
        "encryption_key": TEST_ENCRYPTION_KEY,
        "server": {"background": False, "access_log": False},
    }
    return load_settings(None, environ={}, overrides=_merge(base, vpsshop_overrides))


@pytest.fixture
def vpsshop_clock() -> Any:
    from vpsshop.clock import FrozenClock

    return FrozenClock()


@pytest.fixture
def vpsshop_context(vpsshop_settings: Any) -> Iterator[Any]:
    """The shop's :class:`~vpsshop.AppContext` on a migrated database, with no app around it: what
    core hands a component's ``bind(ctx)`` (a backend keeping its state in
    :class:`~vpsshop.PluginState`, as the simulator does, needs it before its first verb). Its
    clock is the real one: the contract kits wait in real time."""
    from vpsshop.assembly import build_context

    ctx = build_context(vpsshop_settings)
    ctx.db.migrate()
    yield ctx
    ctx.db.dispose()


@pytest.fixture
def vpsshop_app(vpsshop_settings: Any, vpsshop_clock: Any) -> Any:
    from vpsshop.app import create_app

    return create_app(vpsshop_settings, clock=vpsshop_clock, background=False)


@pytest.fixture
def vpsshop_client(vpsshop_app: Any) -> Iterator[Any]:
    from starlette.testclient import TestClient

    with TestClient(vpsshop_app, raise_server_exceptions=False) as client:
        yield client


@dataclass
class TestAccount:
    """An account made through ``POST /v1/account``."""

    __test__ = False  # not a test class

    user_id: int
    api_key: str
    login_token: str
    key_id: int
    app: Any

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def credit(self, usd: str | int | Decimal, memo: str = "test funding") -> int:
        """Credit the balance through the ledger; returns the new balance in micros."""
        from vpsshop import ledger
        from vpsshop.money import usd_to_micros

        with self.app.state.ctx.db.session() as session:
            posting = ledger.post(session, self.user_id, usd_to_micros(Decimal(str(usd))), "admin_credit", memo=memo)
        return posting.entry.balance_after_micros


def create_test_account(client: Any) -> TestAccount:
    response = client.post("/v1/account")
    assert response.status_code == 201, response.text
    body = response.json()
    return TestAccount(body["user_id"], body["api_key"], body["login_token"], body["key_id"], client.app)


@pytest.fixture
def vpsshop_account(vpsshop_client: Any) -> TestAccount:
    return create_test_account(vpsshop_client)
