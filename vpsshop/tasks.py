"""Background tasks: periodic work declared by plugins and run by ``serve`` and ``worker``."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vpsshop.tasks")


@dataclass(frozen=True)
class BackgroundTask:
    """Work that runs every ``interval`` seconds.

    ``run`` takes no arguments and may be a coroutine function. An exception is logged and the
    task runs again at its next interval; it never stops the other tasks.
    """

    name: str
    interval: float
    run: Callable[[], Any | Awaitable[Any]]


async def run_forever(task: BackgroundTask, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            result = task.run()
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            from vpsshop.db import unavailable

            why = unavailable(exc)
            if why is not None:  # an outage: one line per pass, /health says the rest
                log.warning(
                    "background task %s: the database did not answer (%s); again in %ss", task.name, why, task.interval
                )
            else:
                log.exception("background task %s failed; it runs again in %ss", task.name, task.interval)
        try:
            await asyncio.wait_for(stop.wait(), timeout=task.interval)
        except TimeoutError:
            pass


class TaskRunner:
    """Runs a set of background tasks until :meth:`stop`."""

    def __init__(self, tasks: list[BackgroundTask]) -> None:
        names = [t.name for t in tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            from vpsshop.errors import StartupError

            raise StartupError(f"background task names declared twice: {', '.join(dupes)}")
        self.tasks = tasks
        self._stop = asyncio.Event()
        self._running: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._running = [asyncio.create_task(run_forever(t, self._stop), name=t.name) for t in self.tasks]

    async def stop(self) -> None:
        self._stop.set()
        for running in self._running:
            running.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        self._running = []
