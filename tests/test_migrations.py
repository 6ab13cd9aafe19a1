"""Schema migrations keep the data, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from importlib.resources import files

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
            conn.execute(sa.text(
                "INSERT INTO accounts (id, balance_micros, totp_enabled, login_selector, login_hash, created_at) "
                "VALUES (7, 1500000, false, 'sel', 'hash', '2026-01-01 00:00:00')"))
            conn.execute(sa.text(
                "INSERT INTO ledger_entries (account_id, amount_micros, balance_after_micros, reason, created_at) "
                "VALUES (7, 1500000, 1500000, 'admin_credit', '2026-01-01 00:00:00')"))
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
        with pytest.raises(IntegrityError):
            with db.engine.begin() as conn:
                conn.execute(sa.text(
                    "INSERT INTO accounts (balance_micros, totp_enabled, login_selector, login_hash, created_at) "
                    "VALUES (-1, false, 'neg', 'hash', '2026-01-01 00:00:00')"))
    finally:
        db.dispose()
