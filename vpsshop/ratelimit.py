"""Rate limits: how many attempts one key (a client address, an account) may make per window.

A :class:`Rule` says "``limit`` attempts per ``window_seconds``"; a limiter counts attempts per
``(rule name, key)`` in a **sliding window**: counts are kept per fixed window (starting at multiples
of the window length) and an attempt is weighed against the current window's count plus the part of
the previous window's count that the sliding window still covers (``previous * (1 - elapsed /
window)``, the previous window's attempts taken as spread evenly). Fixed windows alone let twice the
limit through around a boundary (the limit just before it, the limit again just after); the sliding
window lets through the limit and what the previous window's attempts have slid out of it. Every
attempt counts, refused ones too (a client that keeps trying while refused waits longer), but a
window's count stops at ``limit + 1``, so a storm of refused attempts weighs no more than one over
the limit. Two limiters share one interface (:class:`RateLimiter`):

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
from vpsshop.models import RateLimitCounter, table_of

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
    """Attempts counted in the sliding window (including this one, for :meth:`RateLimiter.hit`),
    rounded up: the current window's and the previous window's share."""
    retry_after: int
    """Seconds until another attempt is allowed (when no more are made meanwhile)."""


@dataclass(frozen=True)
class _Windows:
    """Where ``now`` falls: the current fixed window's start, the previous one's, and the share of the
    previous window the sliding window still covers."""

    start: int
    previous: int
    left: float
    """Seconds until the current window ends."""
    weight: float
    """Share of the previous window's count that still counts."""

    @classmethod
    def at(cls, rule: Rule, now: float) -> _Windows:
        size = rule.window_seconds
        start = int(now // size) * size
        left = start + size - now
        return cls(start, start - size, left, left / size)


def _decide(rule: Rule, windows: _Windows, previous: int, current: int, hit: bool) -> Decision:
    """The decision for a key whose previous and current windows hold these counts (``current``
    including the attempt when ``hit``)."""
    weighed = previous * windows.weight + current
    allowed = weighed <= rule.limit if hit else weighed + 1 <= rule.limit
    return Decision(allowed, math.ceil(weighed - 1e-9), _retry_after(rule, windows, previous, current))


def _retry_after(rule: Rule, windows: _Windows, previous: int, current: int) -> int:
    """Whole seconds until one more attempt fits (``previous * weight + current + 1 <= limit``)."""
    room = rule.limit - 1 - current
    size = rule.window_seconds
    if room >= 0:  # within this window, once enough of the previous one has slid out
        wait = 0.0 if previous == 0 else max(0.0, windows.left - size * room / previous)
    else:  # after this window ends, once enough of this one has slid out
        wait = windows.left + size * (1 - (rule.limit - 1) / current)
    return max(1, math.ceil(wait))


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


class MemoryRateLimiter:
    """Counts in this process (thread-safe). Keys not seen for a day are dropped now and then."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._counts: dict[tuple[str, str], tuple[int, int, int]] = {}
        """(rule, key) -> (current window's start, previous window's count, current window's count)"""
        self._lock = threading.Lock()

    def _current(self, rule: Rule, key: str, add: int) -> Decision:
        windows = _Windows.at(rule, self.clock())
        with self._lock:
            if len(self._counts) > 100_000:
                self._prune()
            previous, current = self._counts_at(rule, key, windows)
            current = min(current + add, rule.limit + 1)
            self._counts[(rule.name, key)] = (windows.start, previous, current)
        return _decide(rule, windows, previous, current, hit=add > 0)

    def _counts_at(self, rule: Rule, key: str, windows: _Windows) -> tuple[int, int]:
        start, previous, current = self._counts.get((rule.name, key), (windows.start, 0, 0))
        if start == windows.start:
            return previous, current
        return (current if start == windows.previous else 0), 0

    def _prune(self) -> None:
        now = int(self.clock())
        self._counts = {k: v for k, v in self._counts.items() if v[0] + 86_400 > now}

    def check(self, rule: Rule, key: str) -> Decision:
        return self._current(rule, key, 0)

    def hit(self, rule: Rule, key: str) -> Decision:
        return self._current(rule, key, 1)

    def refund(self, rule: Rule, key: str) -> None:
        windows = _Windows.at(rule, self.clock())
        with self._lock:
            previous, current = self._counts_at(rule, key, windows)
            self._counts[(rule.name, key)] = (windows.start, previous, max(0, current - 1))

    def reset(self, rule: Rule, key: str) -> None:
        with self._lock:
            self._counts.pop((rule.name, key), None)


class DatabaseRateLimiter:
    """Counts in the database: one statement per attempt (an upsert of the current window's row that
    also returns the previous window's count), shared by every process of the shop.

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
        windows = _Windows.at(rule, self.clock())
        with self.db.engine.connect() as conn:
            rows = dict(
                conn.execute(
                    sa.select(col(RateLimitCounter.window_start), col(RateLimitCounter.count)).where(
                        col(RateLimitCounter.key) == self._key(rule, key),
                        col(RateLimitCounter.window_start).in_([windows.previous, windows.start]),
                    )
                ).all()
            )
        return _decide(rule, windows, int(rows.get(windows.previous, 0)), int(rows.get(windows.start, 0)), hit=False)

    def hit(self, rule: Rule, key: str) -> Decision:
        now = self.clock()
        windows = _Windows.at(rule, now)
        name = self._key(rule, key)
        earlier = sa.alias(table_of(RateLimitCounter))
        previous = (
            sa.select(earlier.c.count)
            .where(earlier.c.key == name, earlier.c.window_start == windows.previous)
            .scalar_subquery()
        )
        insert = self._insert(RateLimitCounter).values(key=name, window_start=windows.start, count=1)
        count = col(RateLimitCounter.count)
        counted = sa.case((count <= rule.limit, count + 1), else_=count)
        stmt = insert.on_conflict_do_update(index_elements=["key", "window_start"], set_={"count": counted}).returning(
            count, previous
        )
        with self.db.engine.begin() as conn:
            current, before = conn.execute(stmt).one()
            if random.random() < 0.01:
                conn.execute(
                    sa.delete(RateLimitCounter).where(
                        col(RateLimitCounter.window_start) < int(now) - self.PURGE_AFTER_SECONDS
                    )
                )
        return _decide(rule, windows, int(before or 0), int(current), hit=True)

    def refund(self, rule: Rule, key: str) -> None:
        windows = _Windows.at(rule, self.clock())
        with self.db.engine.begin() as conn:
            conn.execute(
                sa.update(RateLimitCounter)
                .where(
                    col(RateLimitCounter.key) == self._key(rule, key),
                    col(RateLimitCounter.window_start) == windows.start,
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
