"""The database: engine set-up for SQLite and PostgreSQL, sessions, migrations, fast reads."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from importlib.resources import files
from typing import Any, Iterator

import sqlalchemy as sa
from anyio import to_thread
from sqlalchemy.engine import make_url
from sqlmodel import Session

from vpsshop.errors import ConfigError

_PG_MIGRATION_LOCK = 0x7670_7373  # "vpss": serialises concurrent `upgrade head` on PostgreSQL


class Database:
    """One shop's database.

    * :meth:`session` gives an ORM session for ordinary work. On SQLite every transaction begins
      with ``BEGIN IMMEDIATE`` so that two writers queue instead of failing on a lock upgrade.
    * :meth:`fetch_one` runs a read-only statement on the request hot path, outside the ORM,
      on a connection kept for the purpose (see ``docs/performance.md``).
    """

    def __init__(self, url: str) -> None:
        self.url = make_url(url)
        self.dialect = self.url.get_backend_name()
        if self.dialect == "sqlite":
            if self.url.database in (None, "", ":memory:"):
                raise ConfigError("database_url: an in-memory SQLite database cannot be shared; use a file")
            self.engine = sa.create_engine(
                self.url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=8, max_overflow=16
            )
            sa.event.listen(self.engine, "connect", _sqlite_on_connect)
            sa.event.listen(self.engine, "begin", _sqlite_on_begin)
        elif self.dialect == "postgresql":
            self.engine = sa.create_engine(self.url, pool_size=10, max_overflow=20, pool_pre_ping=True)
        else:
            raise ConfigError(f"database_url: unsupported database {self.dialect!r} (use sqlite or postgresql+psycopg)")
        self._local = threading.local()

    # ---- ordinary work -------------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on an exception."""
        with Session(self.engine, expire_on_commit=False) as session:
            with session.begin():
                yield session

    def migrate(self) -> None:
        """Bring the schema to the newest migration. Safe to call from several processes at once."""
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(files("vpsshop") / "migrations"))
        with self.engine.connect() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
                conn.commit()
            try:
                config.attributes["connection"] = conn
                command.upgrade(config, "heads")
                conn.commit()
            finally:
                if self.dialect == "postgresql":
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_MIGRATION_LOCK})
                    conn.commit()

    def check(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - health reports any failure as "not ok"
            return False

    def dispose(self) -> None:
        conn = getattr(self._local, "sqlite", None)
        if conn is not None:
            conn.close()
            self._local.sqlite = None
        self.engine.dispose()

    # ---- hot-path reads ------------------------------------------------------------------------

    async def fetch_one(self, sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        """Run a read-only ``sql`` (``:name`` parameters) and return its first row.

        SQLite answers an indexed read in microseconds, so it runs inline on a connection of this
        thread in autocommit mode (each read sees the newest commit; WAL readers never wait for
        writers). PostgreSQL needs a network round trip, so it runs in the thread pool.
        """
        if self.dialect == "sqlite":
            conn = getattr(self._local, "sqlite", None)
            if conn is None:
                conn = self._local.sqlite = _open_sqlite_reader(self.url.database or "")
            return conn.execute(sql, params).fetchone()
        return await to_thread.run_sync(self._fetch_one_pg, sql, params)

    def _fetch_one_pg(self, sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.text(sql), params).first()
            conn.rollback()
            return tuple(row) if row is not None else None


def _open_sqlite_reader(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    conn.execute("PRAGMA query_only = ON")
    return conn


def _sqlite_on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" listener emits BEGIN itself
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = NORMAL")
    cur.execute("PRAGMA foreign_keys = ON")
    cur.execute("PRAGMA busy_timeout = 30000")
    cur.close()


def _sqlite_on_begin(conn: sa.Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")
