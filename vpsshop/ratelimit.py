"""Rate limits: how many attempts one key (a client address, an account) may make per window.

A :class:`Rule` says "``limit`` attempts per ``window_seconds``"; a limiter counts attempts per
``(rule name, key)`` in fixed windows that start at multiples of the window length. Two limiters
share one interface (:class:`RateLimiter`):

* :class:`MemoryRateLimiter` counts in this process. Cheap enough for any request path, but each
  worker process counts on its own.
* :class:`DatabaseRateLimiter` counts in the ``rate_limit_counters`` table with one upsert per
  attempt, so every worker and every ``vpsshop serve`` process of a shop shares the count (on
  PostgreSQL and on SQLite). Sign-in uses it: an attempt costs a database write anyway.

Callers that limit every attempt call :meth:`RateLimiter.hit`. Callers that limit *failures*
(sign-in) also ``hit`` before the attempt, so that concurrent attempts cannot slip past the limit
together, and :meth:`RateLimiter.refund` the attempt when it succeeds. :func:`limiter_for` gives
the shop's shared limiter.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import sqlalchemy as sa
from sqlmodel import col

from vpsshop.context import AppContext, StateKey
from vpsshop.errors import ApiError
from vpsshop.models import RateLimitCounter

if TYPE_CHECKING:  # pragma: no cover
    from sqlalchemy.dialects import postgresql, sqlite

    from vpsshop.db import Database


@dataclass(frozen=True)
class Rule:
    """``limit`` attempts per ``window_seconds`` for each key, counted under ``name``."""

    name: str
    limit: int
    window_seconds: int


@dataclass(frozen=True)
class Decision:
    allowed: bool
    """False once the key has used up the window's attempts."""
    count: int
    """Attempts counted in the current window (including this one, for :meth:`RateLimiter.hit`)."""
    retry_after: int
    """Seconds until the window ends and the count starts again."""


class RateLimited(ApiError):
    """Too many attempts: rendered as 429 ``rate_limited`` with ``Retry-After``."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(
            429, "rate_limited", f"{message} Try again in {_wait_text(retry_after)}.", retry_after=retry_after
        )
        self.retry_after = retry_after
        self.headers["Retry-After"] = str(retry_after)


def _wait_text(seconds: int) -> str:
    if seconds < 90:
        return f"{seconds} seconds"
    return f"{math.ceil(seconds / 60)} minutes"


class RateLimiter(Protocol):
    def check(self, rule: Rule, key: str) -> Decision:
        """Whether ``key`` may make another attempt under ``rule`` (counts nothing)."""

    def hit(self, rule: Rule, key: str) -> Decision:
        """Count one attempt of ``key``; ``allowed`` is False when it went over the limit."""

    def refund(self, rule: Rule, key: str) -> None:
        """Take back one attempt of ``key`` in the current window (it succeeded)."""

    def reset(self, rule: Rule, key: str) -> None:
        """Forget ``key``'s attempts in the current window."""


def _window(rule: Rule, now: float) -> tuple[int, int]:
    """The current window's start and the seconds left in it."""
    start = int(now) - int(now) % rule.window_seconds
    return start, max(1, start + rule.window_seconds - int(now))


class MemoryRateLimiter:
    """Counts in this process (thread-safe). Windows that have ended are dropped as they are met."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._counts: dict[tuple[str, str], tuple[int, int]] = {}
        self._lock = threading.Lock()

    def _current(self, rule: Rule, key: str, add: int) -> Decision:
        start, left = _window(rule, self.clock())
        with self._lock:
            if len(self._counts) > 100_000:
                self._prune()
            window, count = self._counts.get((rule.name, key), (start, 0))
            if window != start:
                count = 0
            count += add
            self._counts[(rule.name, key)] = (start, count)
        allowed = count <= rule.limit if add else count < rule.limit
        return Decision(allowed, count, left)

    def _prune(self) -> None:
        now = int(self.clock())
        self._counts = {k: v for k, v in self._counts.items() if v[0] + 86_400 > now}

    def check(self, rule: Rule, key: str) -> Decision:
        return self._current(rule, key, 0)

    def hit(self, rule: Rule, key: str) -> Decision:
        return self._current(rule, key, 1)

    def refund(self, rule: Rule, key: str) -> None:
        start, _ = _window(rule, self.clock())
        with self._lock:
            window, count = self._counts.get((rule.name, key), (start, 0))
            if window == start and count > 0:
                self._counts[(rule.name, key)] = (start, count - 1)

    def reset(self, rule: Rule, key: str) -> None:
        with self._lock:
            self._counts.pop((rule.name, key), None)


class DatabaseRateLimiter:
    """Counts in the database: one upsert per attempt, shared by every process of the shop.

    Rows of windows that ended more than a day ago are deleted now and then (about one ``hit`` in
    a hundred), so the table stays small without a background task.
    """

    PURGE_AFTER_SECONDS = 86_400

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        self._insert: Callable[[type[RateLimitCounter]], postgresql.Insert | sqlite.Insert]
        if db.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as postgresql_insert

            self._insert = postgresql_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            self._insert = sqlite_insert

    @staticmethod
    def _key(rule: Rule, key: str) -> str:
        return f"{rule.name}:{key}"[:200]

    def check(self, rule: Rule, key: str) -> Decision:
        start, left = _window(rule, self.clock())
        with self.db.engine.connect() as conn:
            count = conn.execute(
                sa.select(col(RateLimitCounter.count)).where(
                    col(RateLimitCounter.key) == self._key(rule, key), col(RateLimitCounter.window_start) == start
                )
            ).scalar()
        count = int(count or 0)
        return Decision(count < rule.limit, count, left)

    def hit(self, rule: Rule, key: str) -> Decision:
        now = self.clock()
        start, left = _window(rule, now)
        insert = self._insert(RateLimitCounter).values(key=self._key(rule, key), window_start=start, count=1)
        stmt = insert.on_conflict_do_update(
            index_elements=["key", "window_start"], set_={"count": col(RateLimitCounter.count) + 1}
        ).returning(col(RateLimitCounter.count))
        with self.db.engine.begin() as conn:
            count = int(conn.execute(stmt).scalar_one())
            if random.random() < 0.01:
                conn.execute(
                    sa.delete(RateLimitCounter).where(
                        col(RateLimitCounter.window_start) < int(now) - self.PURGE_AFTER_SECONDS
                    )
                )
        return Decision(count <= rule.limit, count, left)

    def refund(self, rule: Rule, key: str) -> None:
        start, _ = _window(rule, self.clock())
        with self.db.engine.begin() as conn:
            conn.execute(
                sa.update(RateLimitCounter)
                .where(
                    col(RateLimitCounter.key) == self._key(rule, key),
                    col(RateLimitCounter.window_start) == start,
                    col(RateLimitCounter.count) > 0,
                )
                .values(count=col(RateLimitCounter.count) - 1)
            )

    def reset(self, rule: Rule, key: str) -> None:
        with self.db.engine.begin() as conn:
            conn.execute(sa.delete(RateLimitCounter).where(col(RateLimitCounter.key) == self._key(rule, key)))


def limiter_for(ctx: AppContext) -> RateLimiter:
    """The shop's shared limiter (a :class:`DatabaseRateLimiter`, built once per context)."""
    return ctx.state(_SHARED, _database_limiter)


def _database_limiter(ctx: AppContext) -> RateLimiter:
    return DatabaseRateLimiter(ctx.db, clock=lambda: ctx.clock.now().timestamp())


_SHARED = StateKey[RateLimiter]("shared-limiter")
