"""State a plugin keeps in the shop's database: small JSON records with compare-and-set updates.

A plugin that must remember something across restarts and across processes (several ``vpsshop
serve`` workers and a ``vpsshop worker`` share one database) keeps it here instead of in memory
or in a table of its own::

    from vpsshop import PluginState

    class MyBackend(HypervisorBackend):
        def bind(self, ctx):
            self.state = PluginState(ctx, "my_plugin")

        async def create(self, spec):
            record = await self.state.create(spec.name, {"power": "on"})
            if record is None:          # an earlier attempt created it: keep what it made
                record = await self.state.get(spec.name)
            ...

Each record is ``(namespace, key) -> data`` with a ``version`` that grows by one on every write.
:meth:`PluginState.replace` writes only if the version is still the one read (compare-and-set),
so two processes changing one record never overwrite each other silently;
:meth:`PluginState.modify` wraps the read-change-write loop. Every method runs its statement in a
worker thread, so the event loop never waits on the database, and commits before it returns.

Records live in the core table ``plugin_records`` (migration ``0004``). They are meant for a
plugin's own bookkeeping (simulated domains, cursors, leases of its own): keep each record small
(at most 64 KiB of JSON) and never put a secret in one unencrypted.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from anyio import to_thread
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel

from vpsshop.db import rowcount
from vpsshop.models import _ts, table_of

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.component import ShopContext

MAX_DATA_BYTES = 64 * 1024
MAX_KEY_LENGTH = 200
MAX_NAMESPACE_LENGTH = 64


class PluginRecordRow(SQLModel, table=True):
    """One record of one plugin. Unique per (namespace, key)."""

    __tablename__ = "plugin_records"
    __table_args__ = (sa.UniqueConstraint("namespace", "key", name="uq_plugin_records_namespace_key"),)

    id: int | None = Field(default=None, primary_key=True)
    namespace: str = Field(max_length=MAX_NAMESPACE_LENGTH, nullable=False)
    key: str = Field(max_length=MAX_KEY_LENGTH, nullable=False)
    version: int = Field(default=1, nullable=False)
    data: str = Field(sa_type=sa.Text, nullable=False)
    created_at: datetime = _ts()
    updated_at: datetime = _ts()


_TABLE = table_of(PluginRecordRow)


@dataclass(frozen=True)
class PluginRecord:
    """A record as read: pass it back to :meth:`PluginState.replace` or :meth:`PluginState.delete`."""

    key: str
    data: dict[str, Any]
    version: int
    """1 when created, +1 on every write: the compare-and-set token."""
    updated_at: datetime


class PluginState:
    """The records of one plugin (``namespace``, usually the plugin's name) in the shop's database.

    :param ctx: the application context (:meth:`vpsshop.Component.bind` receives it).
    :param namespace: 1 to 64 characters; two plugins must not share one.
    """

    def __init__(self, ctx: ShopContext, namespace: str) -> None:
        if not namespace or len(namespace) > MAX_NAMESPACE_LENGTH:
            raise ValueError(f"namespace must be 1 to {MAX_NAMESPACE_LENGTH} characters")
        self.namespace = namespace
        self._db = ctx.db
        self._clock = ctx.clock

    # ---- reading ---------------------------------------------------------------------------------

    async def get(self, key: str) -> PluginRecord | None:
        """The record ``key``, or None."""
        return await to_thread.run_sync(self._get, key)

    async def list(self, prefix: str = "", *, limit: int = 1000) -> list[PluginRecord]:
        """Records whose key starts with ``prefix``, in key order, at most ``limit``."""
        return await to_thread.run_sync(self._list, prefix, limit)

    # ---- writing ---------------------------------------------------------------------------------

    async def create(self, key: str, data: dict[str, Any]) -> PluginRecord | None:
        """Insert ``key`` with ``data`` (version 1). None when the key exists already: whoever
        created it first wins, and nothing is overwritten."""
        return await to_thread.run_sync(self._create, key, _encode(data))

    async def replace(self, record: PluginRecord, data: dict[str, Any]) -> PluginRecord | None:
        """Write ``data`` if the record still has ``record.version``; None when another writer
        changed or deleted it since it was read (read it again and decide again)."""
        return await to_thread.run_sync(self._replace, record, _encode(data))

    async def delete(self, record: PluginRecord | str) -> bool:
        """Delete a record: given as read, only if unchanged since; given by key, whatever it
        holds. False when there was nothing (or something newer) to delete."""
        return await to_thread.run_sync(self._delete, record)

    async def modify(
        self, key: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None], *, attempts: int = 20
    ) -> PluginRecord | None:
        """Read ``key``, call ``change(data or None)``, write what it returns, and start again if
        another writer got there in between. ``change`` returning None deletes the record (or
        leaves it absent); returning the data unchanged writes nothing. ``change`` may run several
        times, so it must not have side effects. Returns the record as it is afterwards.

        :raises RuntimeError: still conflicting after ``attempts`` tries.
        """
        for _ in range(attempts):
            current = await self.get(key)
            wanted = change(dict(current.data) if current is not None else None)
            if current is None:
                if wanted is None:
                    return None
                created = await self.create(key, wanted)
                if created is not None:
                    return created
                continue
            if wanted is None:
                if await self.delete(current):
                    return None
                continue
            if wanted == current.data:
                return current
            replaced = await self.replace(current, wanted)
            if replaced is not None:
                return replaced
        raise RuntimeError(f"plugin record {self.namespace}/{key} kept changing under {attempts} attempts")

    # ---- the statements ---------------------------------------------------------------------------

    def _get(self, key: str) -> PluginRecord | None:
        t = _TABLE
        with self._db.session() as session:
            row = session.execute(
                sa.select(t.c.key, t.c.data, t.c.version, t.c.updated_at).where(
                    t.c.namespace == self.namespace, t.c.key == key
                )
            ).first()
        return _record(row) if row is not None else None

    def _list(self, prefix: str, limit: int) -> builtins.list[PluginRecord]:
        t = _TABLE
        query = sa.select(t.c.key, t.c.data, t.c.version, t.c.updated_at).where(t.c.namespace == self.namespace)
        if prefix:
            escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(t.c.key.like(escaped + "%", escape="\\"))
        with self._db.session() as session:
            rows = session.execute(query.order_by(t.c.key).limit(limit)).all()
        return [_record(row) for row in rows]

    def _create(self, key: str, data: str) -> PluginRecord | None:
        _check_key(key)
        now = self._clock.now()
        t = _TABLE
        try:
            with self._db.session() as session:
                session.execute(
                    sa.insert(t).values(
                        namespace=self.namespace, key=key, version=1, data=data, created_at=now, updated_at=now
                    )
                )
        except IntegrityError:
            return None
        return PluginRecord(key, json.loads(data), 1, now)

    def _replace(self, record: PluginRecord, data: str) -> PluginRecord | None:
        now = self._clock.now()
        t = _TABLE
        with self._db.session() as session:
            moved = rowcount(
                session.execute(
                    sa.update(t)
                    .where(t.c.namespace == self.namespace, t.c.key == record.key, t.c.version == record.version)
                    .values(data=data, version=record.version + 1, updated_at=now)
                )
            )
        if moved != 1:
            return None
        return PluginRecord(record.key, json.loads(data), record.version + 1, now)

    def _delete(self, record: PluginRecord | str) -> bool:
        t = _TABLE
        where = [t.c.namespace == self.namespace]
        if isinstance(record, PluginRecord):
            where += [t.c.key == record.key, t.c.version == record.version]
        else:
            where.append(t.c.key == record)
        with self._db.session() as session:
            return rowcount(session.execute(sa.delete(t).where(*where))) == 1


def _encode(data: dict[str, Any]) -> str:
    if not isinstance(data, dict):
        raise TypeError("plugin record data must be a dict of JSON values")
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_DATA_BYTES:
        raise ValueError(f"plugin record data is larger than {MAX_DATA_BYTES} bytes of JSON")
    return text


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"plugin record keys are 1 to {MAX_KEY_LENGTH} characters")


def _record(row: Any) -> PluginRecord:
    # updated_at is a UTCDateTime column: always aware UTC, on SQLite too.
    return PluginRecord(row[0], json.loads(row[1]), int(row[2]), row[3])
