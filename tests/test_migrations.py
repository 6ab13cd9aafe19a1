"""Schema migrations keep the data, on SQLite and PostgreSQL."""

from __future__ import annotations

from importlib.resources import files

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from vpsshop.db import Database


def _alembic(conn) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("vpsshop") / "migrations"))
    config.attributes["connection"] = conn
    return config


def test_upgrade_from_first_revision_keeps_accounts_and_ledger(vpsshop_database_url):
    db = Database(vpsshop_database_url)
    try:
        with db.engine.connect() as conn:
            command.downgrade(_alembic(conn), "base")
            conn.commit()
            command.upgrade(_alembic(conn), "0001")
            conn.commit()
            conn.execute(
                sa.text(
                    "INSERT INTO accounts (id, balance_micros, totp_enabled, login_selector, login_hash, created_at) "
                    "VALUES (7, 1500000, false, 'sel', 'hash', '2026-01-01 00:00:00')"
                )
            )
            conn.execute(
                sa.text(
                    "INSERT INTO ledger_entries (account_id, amount_micros, balance_after_micros, reason, created_at) "
                    "VALUES (7, 1500000, 1500000, 'admin_credit', '2026-01-01 00:00:00')"
                )
            )
            conn.commit()
        db.migrate()  # to every head
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT balance_micros FROM accounts WHERE id = 7")).scalar() == 1500000
            assert conn.execute(sa.text("SELECT count(*) FROM ledger_entries")).scalar() == 1
        db.migrate()  # idempotent
    finally:
        db.dispose()


def test_balance_cannot_go_negative_even_bypassing_the_ledger(vpsshop_database_url):
    import pytest
    from sqlalchemy.exc import IntegrityError

    db = Database(vpsshop_database_url)
    db.migrate()
    try:
        with pytest.raises(IntegrityError), db.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO accounts (balance_micros, totp_enabled, login_selector, login_hash, created_at) "
                    "VALUES (-1, false, 'neg', 'hash', '2026-01-01 00:00:00')"
                )
            )
    finally:
        db.dispose()


def test_dashboard_migration_0008_adds_and_removes_its_tables_keeping_accounts(vpsshop_database_url):
    db = Database(vpsshop_database_url)
    try:
        db.migrate()
        with db.engine.connect() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO accounts (id, balance_micros, totp_enabled, login_selector, login_hash, created_at, "
                    "totp_secret_enc) VALUES (9, 5, true, 'sel9', 'hash', '2026-01-01 00:00:00', 'gAAAA-enc')"
                )
            )
            conn.commit()
            command.downgrade(_alembic(conn), "0003")  # below the dashboard revision
            conn.commit()
            tables = sa.inspect(conn).get_table_names()
            assert "dashboard_sessions" not in tables and "recovery_codes" not in tables
            assert "totp_secret_enc" not in {c["name"] for c in sa.inspect(conn).get_columns("accounts")}
        db.migrate()
        with db.engine.connect() as conn:
            row = conn.execute(
                sa.text("SELECT balance_micros, totp_secret_enc, totp_enabled FROM accounts WHERE id = 9")
            ).one()
            assert tuple(row) == (5, None, False)  # no secret left, so two-factor is off, not unpassable
            assert {"dashboard_sessions", "recovery_codes", "rate_limit_counters"} <= set(
                sa.inspect(conn).get_table_names()
            )
    finally:
        db.dispose()


def test_power_migration_0013_derives_the_power_of_existing_servers(vpsshop_database_url):
    db = Database(vpsshop_database_url)
    try:
        db.migrate()
        with db.engine.connect() as conn:
            command.downgrade(_alembic(conn), "0009")
            conn.commit()
            conn.execute(
                sa.text(
                    "INSERT INTO accounts (id, balance_micros, totp_enabled, login_selector, login_hash, created_at) "
                    "VALUES (5, 0, false, 'sel5', 'hash', '2026-01-01 00:00:00')"
                )
            )
            for sid, status in ((1, "provisioning"), (2, "active"), (3, "active"), (4, "suspended"), (5, "terminated")):
                conn.execute(
                    sa.text(
                        "INSERT INTO servers (id, account_id, plan, location, os, hostname, cycle, price_micros, "
                        "status, username, created_at, expires_at, auto_renew) VALUES (:id, 5, 'pup', 'nl', "
                        "'debian-12', 'h', 'monthly', 1, :status, 'root', '2026-01-01 00:00:00', "
                        "'2026-02-01 00:00:00', true)"
                    ),
                    {"id": sid, "status": status},
                )
            for sid, kind in ((2, "power_stop"), (2, "power_start"), (3, "power_start"), (3, "power_stop")):
                conn.execute(
                    sa.text(
                        "INSERT INTO server_events (server_id, kind, created_at) "
                        "VALUES (:sid, :kind, '2026-01-02 00:00:00')"
                    ),
                    {"sid": sid, "kind": kind},
                )
            conn.commit()
        db.migrate()
        with db.engine.connect() as conn:
            power = dict(conn.execute(sa.text("SELECT id, power FROM servers ORDER BY id")).all())
        assert power == {1: None, 2: "running", 3: "stopped", 4: "stopped", 5: None}
    finally:
        db.dispose()


def test_a_database_that_goes_away_between_the_wait_and_the_migration_is_waited_for_again(
    vpsshop_database_url, monkeypatch, caplog
):
    """Start-up waits for the database and then migrates; PostgreSQL shutting down between the two (the
    drill's worker met it) is waited for again within the same budget, not a crash. The error is a
    real one: a connection to a port nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    gone = Database(f"postgresql+psycopg://postgres@127.0.0.1:{closed}/none")
    db = Database(vpsshop_database_url)
    real = Database.migrate
    calls = []

    def going_away_once(self: Database) -> None:
        calls.append(1)
        if len(calls) == 1:
            with gone.engine.connect():  # raises OperationalError: connection refused
                pass
        real(self)

    monkeypatch.setattr(Database, "migrate", going_away_once)
    try:
        with caplog.at_level("WARNING", logger="vpsshop"):
            db.migrate_when_it_answers(30)
        assert len(calls) == 2
        assert "the database went away while migrating" in caplog.text
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM accounts")).scalar() is not None
        with pytest.raises(sa.exc.OperationalError):  # no budget left: the error, as before
            calls.clear()
            db.migrate_when_it_answers(0)
    finally:
        db.engine.dispose()
        gone.engine.dispose()
