"""Time as the service sees it. Tests replace it to run lifecycles without waiting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class Clock:
    """The wall clock in aware UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FrozenClock(Clock):
    """A clock that moves only when told to: ``clock.advance(days=30)``."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, **delta: float) -> datetime:
        self._now += timedelta(**delta)
        return self._now

    def set(self, when: datetime) -> None:
        self._now = when
