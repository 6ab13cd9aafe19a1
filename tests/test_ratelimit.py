"""vpsshop.ratelimit: sliding windows, in memory and shared through the database (SQLite, PostgreSQL)."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
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
    clock = Clock()  # 20 s into the window 1_000_020 to 1_000_080
    limiter = make_limiter(clock)
    assert limiter.check(RULE, "a").allowed
    decisions = [limiter.hit(RULE, "a") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.count for d in decisions] == [1, 2, 3, 4]
    assert not limiter.check(RULE, "a").allowed
    # 4 attempts in this window: one more fits once half of them have slid out, 30 s into the next
    assert limiter.check(RULE, "a").retry_after == 40 + 30
    assert limiter.check(RULE, "b").allowed  # keys are counted apart
    assert limiter.check(Rule("other", 3, 60), "a").allowed  # and rules too
    clock.now += 40  # the next window: the previous one's 4 still count in full
    assert not limiter.check(RULE, "a").allowed and limiter.check(RULE, "a").retry_after == 30
    clock.now += 30  # half of them now
    assert limiter.check(RULE, "a").allowed and limiter.hit(RULE, "a").count == 3
    assert not limiter.hit(RULE, "a").allowed
    limiter.refund(RULE, "a")  # a counted attempt that succeeded is given back
    assert limiter.check(RULE, "a").count == 3
    limiter.reset(RULE, "a")
    limiter.refund(RULE, "a")  # never below zero
    assert limiter.check(RULE, "a").count == 0
    clock.now += 3600  # windows long gone count nothing
    assert limiter.hit(RULE, "a").count == 1


def _no_double_burst_at_a_boundary(make_limiter) -> None:
    """The limit just before a window's end, then as many just after: fixed windows let both through."""
    rule = Rule("burst", limit=10, window_seconds=60)
    clock = Clock(1_500_000 - 0.5)  # half a second before a boundary
    limiter = make_limiter(clock)
    assert sum(limiter.hit(rule, "k").allowed for _ in range(10)) == 10
    clock.now += 1.0  # half a second after it
    refused = limiter.hit(rule, "k")
    # 10 * (59.5 - t)/60 + 1 + 1 <= 10 from t = 11.5 s: Retry-After is never early, and at most a second late
    assert not refused.allowed and refused.retry_after == 12
    clock.now += 11
    assert not limiter.check(rule, "k").allowed
    clock.now += 1
    assert sum(limiter.hit(rule, "k").allowed for _ in range(10)) == 1
    # a storm of refused attempts counts as one over the limit, not as the storm
    clock.now = 1_600_020.0  # a window starts
    assert sum(limiter.hit(rule, "storm").allowed for _ in range(1000)) == 10
    clock.now += 60  # the next one starts
    assert limiter.check(rule, "storm").retry_after == 11  # 11 * (60 - t)/60 + 1 <= 10 from t = 10.9 s


def test_memory_limiter():
    _exercise(lambda clock: MemoryRateLimiter(clock=clock))
    _no_double_burst_at_a_boundary(lambda clock: MemoryRateLimiter(clock=clock))


def test_database_limiter_is_shared_by_every_process(vpsshop_database_url, monkeypatch):
    db = Database(vpsshop_database_url)
    db.migrate()
    other = Database(vpsshop_database_url)
    try:
        _exercise(lambda clock: DatabaseRateLimiter(db, clock=clock))
        _no_double_burst_at_a_boundary(lambda clock: DatabaseRateLimiter(db, clock=clock))
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
        # one statement per counted attempt: the upsert returns the previous window's count too
        monkeypatch.setattr("vpsshop.ratelimit.random.random", lambda: 1.0)
        statements: list[str] = []
        sa.event.listen(db.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
        one.hit(RULE, "counted")
        assert len([s for s in statements if not s.startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE"))]) == 1
    finally:
        other.dispose()
        db.dispose()


def test_sliding_windows_agree_in_memory_and_in_the_database(vpsshop_database_url):
    """Any sequence of attempts over time gets the same decisions from both limiters, and no burst
    (any stretch of a tenth of the window) lets through more than the limit."""
    db = Database(vpsshop_database_url)
    db.migrate()
    rule = Rule("same", limit=5, window_seconds=100)
    try:

        @hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
        @hypothesis.given(
            steps=st.lists(st.tuples(st.floats(0, 60), st.sampled_from(["hit", "check", "refund"])), max_size=40)
        )
        def one(steps) -> None:
            clock = Clock(7_000_000.0)
            memory, shared = MemoryRateLimiter(clock=clock), DatabaseRateLimiter(db, clock=clock)
            shared.reset(rule, "k")
            allowed_at: list[float] = []
            for pause, action in steps:
                clock.now += pause
                if action == "refund":
                    memory.refund(rule, "k")
                    shared.refund(rule, "k")
                    continue
                got = getattr(memory, action)(rule, "k")
                assert got == getattr(shared, action)(rule, "k"), (clock.now, action)
                if action == "hit" and got.allowed:
                    allowed_at.append(clock.now)
            burst = [t for t in allowed_at if any(0 <= t - u < 10 for u in allowed_at)]
            assert all(sum(1 for u in allowed_at if 0 <= t - u < 10) <= rule.limit for t in burst)

        one()
    finally:
        db.dispose()


def test_rate_limited_is_a_429_with_retry_after():
    error = RateLimited("Too many tries.", 125)
    assert error.status == 429 and error.headers == {"Retry-After": "125"}
    assert error.body() == {
        "error": "rate_limited",
        "message": "Too many tries. Try again in 3 minutes.",
        "retry_after": 125,
    }
