"""PostgreSQL: the authentication read of each request, cached while ``LISTEN vpsshop_auth`` works.

Every authenticated request reads one row: the key's account, its balance, its flags and its
server count (``vpsshop.routing._AUTH_SQL``). On PostgreSQL that read is a network round trip to
a server process competing for the same CPUs, which is most of the cost of ``GET /v1/account``.
This cache answers it from memory, under rules that keep it safe:

* **Every writer invalidates.** Triggers (migration ``0004``) on ``accounts``, ``api_keys`` and
  ``servers`` send ``NOTIFY vpsshop_auth, '<account id>'`` in the writing transaction, whoever
  writes: the API, ``vpsshop worker``, ``vpsshop admin credit``, psql. PostgreSQL delivers it at
  commit to every listening process, which drops that account's entries. ``TRUNCATE`` sends ``*``.
* **The writer itself does not wait for the notification.** A request that changes what a key
  sees (a revocation, an order, a credit) drops the account's entries in its own process after
  its commit and before it answers (:meth:`Database.session` calls :meth:`AuthCache.evict` for
  the accounts the transaction marked with :func:`vpsshop.db.touch_account`).
* **No listener, no cache.** The cache is used only while the listening connection has proved,
  within the last :data:`LIVE_SECONDS`, that notifications arrive: it sends itself a
  ``ping`` every :data:`HEARTBEAT_SECONDS` and any notification counts. A dropped connection
  empties the cache at once; a connection cut silently stops the cache within LIVE_SECONDS.
  After reconnecting it starts empty (notifications sent meanwhile were missed).
* **No stale refill.** A read that started before an invalidation is not stored
  (a generation counter), so an answer read just before a revocation cannot outlive it.
* **Only what the database said.** Entries are keyed by the key's digest and hold the row the
  database returned for it: a key never sees another account's row. Unknown or revoked keys are
  never cached (a new key works at once). Money never moves on a cached balance: every write is
  a conditional statement in the database (``vpsshop.ledger``); the cache only serves reads.

So the window in which another process still accepts a revoked key is the time PostgreSQL takes
to deliver a notification to a listening connection (measured in ``tests/test_auth_cache.py`` and
``docs/performance.md``), bounded by LIVE_SECONDS if the connection is cut without a sign.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import threading
import time
from typing import Any, Final, Literal

log = logging.getLogger("vpsshop.authcache")

CHANNEL = "vpsshop_auth"
HEARTBEAT_SECONDS = 0.5
LIVE_SECONDS = 1.5
MAX_ENTRIES = 65536
RECONNECT_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
APPLICATION_NAME = "vpsshop-auth-listener"


class _Miss(enum.Enum):
    """The type of :data:`MISS`: a one-member enum, so a check ``is not MISS`` narrows the row's type."""

    MISS = enum.auto()


MISS: Final = _Miss.MISS
"""What :meth:`AuthCache.get` answers for a key it holds no row for (or while no listener runs)."""


class AuthCache:
    """The cache of one event loop's reader (see the module docstring)."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.entries: dict[str, tuple[Any, ...]] = {}
        self.by_account: dict[int, set[str]] = {}
        self.generation = 0
        self.live_until = 0.0
        self.lock = threading.Lock()
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        self.hits = 0
        self._ping = f"ping:{os.getpid()}:{id(self):x}"

    # ---- the request path ------------------------------------------------------------------------

    def get(self, key: str) -> tuple[Any, ...] | Literal[_Miss.MISS]:
        if time.monotonic() >= self.live_until:
            return MISS
        row = self.entries.get(key, MISS)
        if row is not MISS:
            self.hits += 1
        return row

    def put(self, key: str, row: tuple[Any, ...], account_id: int, generation: int) -> None:
        with self.lock:
            if generation != self.generation or time.monotonic() >= self.live_until:
                return  # an invalidation happened while this row was being read, or no listener
            if len(self.entries) >= MAX_ENTRIES:
                self.entries.clear()
                self.by_account.clear()
            self.entries[key] = row
            self.by_account.setdefault(account_id, set()).add(key)

    def evict(self, account_id: int | None) -> None:
        """Forget ``account_id``'s entries (None: everything); reads in flight are not stored."""
        with self.lock:
            self.generation += 1
            if account_id is None:
                self.entries.clear()
                self.by_account.clear()
                return
            for key in self.by_account.pop(account_id, ()):
                self.entries.pop(key, None)

    # ---- the listener ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._listen(), name="vpsshop-auth-listener")

    async def stop(self) -> None:
        task, self.task = self.task, None
        self._off()
        if task is not None:
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled, or it had failed already
                pass

    def _off(self) -> None:
        self.live_until = 0.0
        self.connected = False
        self.evict(None)

    async def _listen(self) -> None:
        import psycopg

        failures = 0
        while True:
            conn = None
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True, application_name=APPLICATION_NAME
                )
                await conn.execute(f"LISTEN {CHANNEL}")
                self.evict(None)  # whatever changed while nobody listened
                self.connected = True
                failures = 0
                await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self._ping))
                while True:
                    async for note in conn.notifies(timeout=HEARTBEAT_SECONDS):
                        self._received(note.payload)
                    await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, self._ping))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any failure: cache off, reconnect
                if self.connected:
                    log.warning("auth cache off: its LISTEN connection failed (%s); reconnecting", type(exc).__name__)
                self._off()
                failures += 1
            finally:
                if conn is not None:
                    try:
                        await conn.close()
                    except Exception:  # noqa: BLE001
                        pass
            await asyncio.sleep(RECONNECT_SECONDS[min(failures, len(RECONNECT_SECONDS)) - 1])

    def _received(self, payload: str) -> None:
        if payload.startswith("ping:"):
            pass
        elif payload == "*":
            self.evict(None)
        else:
            try:
                self.evict(int(payload))
            except ValueError:
                self.evict(None)
        # Any notification proves that this connection still receives them.
        self.live_until = time.monotonic() + LIVE_SECONDS
