"""The database: engine set-up for SQLite and PostgreSQL, sessions, migrations, fast reads."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from typing import Any, cast

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlmodel import Session

from vpsshop.authcache import MISS
from vpsshop.errors import ConfigError, StartupError

_PG_MIGRATION_LOCK = 0x7670_7373  # "vpss": serialises concurrent `upgrade head` on PostgreSQL
_TOUCHED = "vpsshop.touched_accounts"
SQLITE_RECHECK_SECONDS = 0.01
"""How often a SQLite hot-path reader asks whether another process committed: the longest another
process's revocation or credit can go unseen by this one."""


def create_private_file(path: str) -> None:
    """Create the SQLite database file readable by its owner only (0600) when it does not exist yet.

    SQLite would create it with the umask's mode (usually 0644); it gives its journal and WAL files
    the database file's mode, so those are private too. An existing file is left as it is.
    """
    if path.startswith("file:"):
        return  # a URI filename: the operator chose how it is opened
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    except OSError:
        return  # a missing directory and the like: SQLite's own error on first use says it better
    os.close(fd)


def touch_account(session: Session, account_id: int) -> None:
    """Mark ``account_id`` as changed by ``session``'s transaction (its balance, its keys, its
    servers): after the commit, :meth:`Database.session` drops it from this process's
    authentication cache, so the writer's next request never sees the old state. Other processes
    learn it from the database's ``NOTIFY`` (``vpsshop/authcache.py``)."""
    session.info.setdefault(_TOUCHED, set()).add(account_id)


def rowcount(result: sa.Result[*tuple[Any, ...]]) -> int:
    """How many rows the UPDATE or DELETE that made ``result`` matched.

    ``Session.execute`` is typed to return a :class:`sqlalchemy.Result` whatever it runs; for an UPDATE or
    DELETE without RETURNING, SQLAlchemy returns a :class:`sqlalchemy.CursorResult`, which counts them."""
    return cast("sa.CursorResult[*tuple[Any, ...]]", result).rowcount


_SQLITE_UNAVAILABLE = ("database is locked", "unable to open", "disk i/o error", "database or disk is full")


UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    psycopg.OperationalError,
    sqlite3.OperationalError,
)
"""What a database that does not answer (stopped, restarting, unreachable, locked) may raise;
:func:`unavailable` tells an outage from a bug among them."""


def unavailable(exc: BaseException) -> str | None:
    """One line saying why the database did not answer, when ``exc`` means just that (stopped,
    restarting, unreachable, locked); None for any other error (a bug keeps its traceback)."""
    cause = getattr(exc, "orig", None) or exc
    if not isinstance(exc, UNAVAILABLE_ERRORS) and not isinstance(cause, sqlite3.OperationalError):
        return None
    text = str(cause).strip()
    if isinstance(cause, sqlite3.OperationalError) and not any(s in text.lower() for s in _SQLITE_UNAVAILABLE):
        return None  # "no such column" and the like
    return f"{type(cause).__name__}: {(text.splitlines() or [''])[0][:200]}"


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
            create_private_file(self.url.database)
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
        self.generation = 0
        """Changes after each commit of this process's sessions (SQLite hot-path reads start afresh)."""
        self.sqlite_readers: list[_SqliteReader] = []
        """The SQLite hot-path readers of this process (one per thread that read)."""

    # ---- ordinary work -------------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on an exception.

        After the commit, the accounts the transaction marked with :func:`touch_account` are
        dropped from this process's authentication cache (PostgreSQL), and this process's SQLite
        hot-path answers are forgotten, before the caller answers.
        """
        with Session(self.engine, expire_on_commit=False) as session:
            with session.begin():
                yield session
            touched = session.info.get(_TOUCHED)
        self.generation += 1  # after the commit: a read that starts now sees it (SQLite reads)
        if touched:
            for reader in list(self.__dict__.get("_pg_readers", {}).values()):
                for account_id in touched:
                    reader.cache.evict(account_id)

    def wait_until_it_answers(self, seconds: float) -> None:
        """Return once the database takes a connection; meanwhile say so in the log every few seconds.

        A service started before its database (a host booting, PostgreSQL restarting) waits instead
        of exiting. :raises StartupError: still no answer after ``seconds``."""
        deadline = time.monotonic() + seconds
        delay = 0.5
        while True:
            try:
                with self.engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return
            except Exception as exc:
                why = unavailable(exc)
                if why is None:
                    raise
                left = deadline - time.monotonic()
                shown = self.url.render_as_string(hide_password=True)
                if left <= 0:
                    raise StartupError(
                        f"the database at {shown} did not answer within {seconds:g} s ({why}); is it running, and "
                        "is database_url right?"
                    ) from None
                logging.getLogger("vpsshop").warning(
                    "waiting for the database at %s (%s); %.0f s left", shown, why, left
                )
                time.sleep(min(delay, max(left, 0.1)))
                delay = min(delay * 2, 5.0)

    def migrate_when_it_answers(self, seconds: float) -> None:
        """:meth:`wait_until_it_answers`, then :meth:`migrate`, within one budget of ``seconds``: a
        database that goes away between the two (PostgreSQL shutting down just as the service starts)
        is waited for again, not a crash. A migration is one transaction, so a cut one is run again.

        :raises StartupError: no answer within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            self.wait_until_it_answers(max(0.0, deadline - time.monotonic()))
            try:
                self.migrate()
                return
            except Exception as exc:
                why = unavailable(exc)
                if why is None or time.monotonic() >= deadline:
                    raise
                logging.getLogger("vpsshop").warning("the database went away while migrating (%s); waiting again", why)

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

    async def close_readers(self) -> None:
        """Close the hot-path connections this event loop opened (called at shutdown)."""
        readers: dict[Any, _PgReader] = self.__dict__.get("_pg_readers", {})
        reader = readers.pop(asyncio.get_running_loop(), None)
        if reader is not None:
            await reader.close()

    def auth_caches(self) -> list[Any]:
        """The authentication caches of this process (one per event loop; PostgreSQL only)."""
        return [reader.cache for reader in self.__dict__.get("_pg_readers", {}).values()]

    def dispose(self) -> None:
        readers, self.sqlite_readers = self.sqlite_readers, []
        for reader in readers:
            reader.close()
        self._local = threading.local()
        self.engine.dispose()

    # ---- hot-path reads ------------------------------------------------------------------------

    async def fetch_one(
        self, sql: str, params: dict[str, Any], *, cache_key: str | None = None, owner_column: int = 1
    ) -> tuple[Any, ...] | None:
        """Run a read-only ``sql`` (``:name`` parameters) and return its first row.

        SQLite answers an indexed read in microseconds, so it runs inline on a connection of this
        thread in autocommit mode (WAL readers never wait for writers). Its answers are remembered
        until this process commits anything at all (a revoked key is refused by the revoking
        process on its very next request), and until SQLite's ``PRAGMA data_version``, asked at
        most every :data:`SQLITE_RECHECK_SECONDS`, says another process did (another process's
        revocation or credit is seen within that time). Asking on every request cost a third of
        the hot path's throughput (``docs/performance.md``). PostgreSQL needs a network
        round trip, so it runs on a few asynchronous psycopg connections of this event loop with
        prepared statements; with ``cache_key`` (the authentication read) a row that names an
        account in ``owner_column`` is kept in :class:`vpsshop.authcache.AuthCache`, which
        ``NOTIFY`` invalidates (see that module for the rules).
        """
        if self.dialect != "sqlite":
            return await self._pg_reader().fetch_one(sql, params, cache_key, owner_column)
        reader: _SqliteReader | None = getattr(self._local, "sqlite", None)
        if reader is None:
            reader = self._local.sqlite = _SqliteReader(self.url.database or "")
            self.sqlite_readers.append(reader)
        return reader.fetch_one(sql, params, self.generation)

    def _pg_reader(self) -> _PgReader:
        loop = asyncio.get_running_loop()
        readers: dict[Any, _PgReader] = self.__dict__.setdefault("_pg_readers", {})
        reader = readers.get(loop)
        if reader is None:
            conninfo = self.url.set(drivername="postgresql").render_as_string(hide_password=False)
            reader = readers[loop] = _PgReader(conninfo)
        return reader


class _SqliteReader:
    """One thread's read-only connection and the answers it gave since the last commit anywhere
    (this process's commits at once, other processes' within :data:`SQLITE_RECHECK_SECONDS`)."""

    MAX_CACHED = 4096

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA query_only = ON")
        self.version = -1
        self.generation = -1
        self.recheck_at = 0.0
        self.cache: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}

    def fetch_one(self, sql: str, params: dict[str, Any], generation: int) -> tuple[Any, ...] | None:
        now = time.monotonic()
        if generation != self.generation or now >= self.recheck_at:
            version = self.conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self.version or generation != self.generation or len(self.cache) >= self.MAX_CACHED:
                self.cache.clear()
                self.version = version
                self.generation = generation  # as seen before the read below: a later commit clears again
            self.recheck_at = now + SQLITE_RECHECK_SECONDS
        key = (sql, *params.values())
        try:
            return self.cache[key]
        except KeyError:
            row: tuple[Any, ...] | None = self.conn.execute(sql, params).fetchone()
            self.cache[key] = row
            return row

    def close(self) -> None:
        self.conn.close()


class _PgReader:
    """A handful of autocommit async connections of one event loop, for hot-path reads."""

    SIZE = 16  # enough concurrent round trips to keep one worker busy; more only adds backends
    _PARAM = re.compile(r"(?<!:):([a-z_][a-z0-9_]*)")

    def __init__(self, conninfo: str) -> None:
        from vpsshop.authcache import AuthCache

        self.conninfo = conninfo
        self.idle: list[Any] = []
        self.opened = 0
        self.available = asyncio.Semaphore(self.SIZE)
        self.statements: dict[str, str] = {}
        self.cache = AuthCache(conninfo)

    async def fetch_one(
        self, sql: str, params: dict[str, Any], cache_key: str | None = None, owner_column: int = 1
    ) -> tuple[Any, ...] | None:
        if cache_key is None:
            return await self._query(sql, params)
        cache = self.cache
        cached = cache.get(cache_key)
        if cached is not MISS:
            return cached
        if cache.task is None:
            cache.start()
        generation = cache.generation
        row = await self._query(sql, params)
        if row is not None:
            cache.put(cache_key, row, row[owner_column], generation)
        return row

    async def _query(self, sql: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        import psycopg

        statement = self.statements.get(sql)
        if statement is None:
            statement = self.statements[sql] = self._PARAM.sub(r"%(\1)s", sql)
        async with self.available:
            conn = (
                self.idle.pop() if self.idle else await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
            )
            try:
                cursor = await conn.execute(statement, params, prepare=True)
                row = await cursor.fetchone()
            except BaseException:
                await conn.close()
                raise
            self.idle.append(conn)
            return row

    async def close(self) -> None:
        await self.cache.stop()
        idle, self.idle = self.idle, []
        for conn in idle:
            await conn.close()


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
