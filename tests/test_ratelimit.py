"""vpsshop.ratelimit: fixed windows, in memory and shared through the database (SQLite, PostgreSQL)."""

from __future__ import annotations

import sqlalchemy as sa

from vpsshop.db import Database
from vpsshop.ratelimit import DatabaseRateLimiter, MemoryRateLimiter, RateLimited, Rule

RULE = Rule("test", limit=3, window_seconds=60)


class Clock:
    def __init__(self, now: float = 1_000_040.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _exercise(make_limiter) -> None:
    clock = Clock()
    limiter = make_limiter(clock)
    assert limiter.check(RULE, "a").allowed
    decisions = [limiter.hit(RULE, "a") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.count for d in decisions] == [1, 2, 3, 4]
    assert not limiter.check(RULE, "a").allowed
    assert limiter.check(RULE, "a").retry_after == 40  # the window of 1_000_020 to 1_000_080 ends in 40 s
    assert limiter.check(RULE, "b").allowed  # keys are counted apart
    assert limiter.check(Rule("other", 3, 60), "a").allowed  # and rules too
    clock.now += 40
    assert limiter.check(RULE, "a").allowed and limiter.hit(RULE, "a").count == 1  # a new window
    limiter.hit(RULE, "a")
    limiter.refund(RULE, "a")  # a counted attempt that succeeded is given back
    assert limiter.check(RULE, "a").count == 1
    limiter.reset(RULE, "a")
    limiter.refund(RULE, "a")  # never below zero
    assert limiter.check(RULE, "a").count == 0


def test_memory_limiter():
    _exercise(lambda clock: MemoryRateLimiter(clock=clock))


def test_database_limiter_is_shared_by_every_process(vpsshop_database_url, monkeypatch):
    db = Database(vpsshop_database_url)
    db.migrate()
    other = Database(vpsshop_database_url)
    try:
        _exercise(lambda clock: DatabaseRateLimiter(db, clock=clock))
        clock = Clock(2_000_000.0)
        one, two = DatabaseRateLimiter(db, clock=clock), DatabaseRateLimiter(other, clock=clock)
        one.hit(RULE, "shared")
        two.hit(RULE, "shared")
        assert one.hit(RULE, "shared").count == 3 and not two.hit(RULE, "shared").allowed
        # windows that ended more than a day ago are purged by a later hit (one in a hundred)
        clock.now += 2 * 86_400
        monkeypatch.setattr("vpsshop.ratelimit.random.random", lambda: 0.0)
        one.hit(RULE, "later")
        with db.engine.connect() as conn:
            keys = [r[0] for r in conn.execute(sa.text("SELECT key FROM rate_limit_counters"))]
        assert keys == ["test:later"]
    finally:
        other.dispose()
        db.dispose()


def test_rate_limited_is_a_429_with_retry_after():
    error = RateLimited("Too many tries.", 125)
    assert error.status == 429 and error.headers == {"Retry-After": "125"}
    assert error.body() == {
        "error": "rate_limited",
        "message": "Too many tries. Try again in 3 minutes.",
        "retry_after": 125,
    }
