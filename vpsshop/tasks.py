"""Background tasks: periodic work declared by plugins and run by ``serve`` and ``worker``."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vpsshop.tasks")


class Nudge:
    """Runs the background tasks that listen to it at once instead of at their next interval.

    Callable from any thread (a request handler's worker thread, a transaction's commit hook): it
    wakes every task of this process that was given it, on that task's own event loop. A process
    without such a task (an API process under ``--no-worker``) is not woken: its worker runs the
    work at its interval, as before.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def __call__(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop has closed
                pass

    def listen(self) -> asyncio.Event:
        event = asyncio.Event()
        with self._lock:
            self._waiters.append((asyncio.get_running_loop(), event))
        return event

    def forget(self, event: asyncio.Event) -> None:
        with self._lock:
            self._waiters = [(loop, e) for loop, e in self._waiters if e is not event]


@dataclass(frozen=True)
class BackgroundTask:
    """Work that runs every ``interval`` seconds, and at once when its ``nudge`` (if any) is called.

    ``run`` takes no arguments and may be a coroutine function. An exception is logged and the
    task runs again at its next interval; it never stops the other tasks.
    """

    name: str
    interval: float
    run: Callable[[], Any | Awaitable[Any]]
    nudge: Nudge | None = None


async def run_forever(task: BackgroundTask, stop: asyncio.Event) -> None:
    woken = task.nudge.listen() if task.nudge is not None else None
    try:
        await _run_forever(task, stop, woken)
    finally:
        if task.nudge is not None and woken is not None:
            task.nudge.forget(woken)


async def _wait(stop: asyncio.Event, woken: asyncio.Event | None, timeout: float) -> None:
    """Until ``stop`` or ``woken`` is set, or ``timeout`` seconds."""
    waits = [asyncio.ensure_future(stop.wait())]
    if woken is not None:
        waits.append(asyncio.ensure_future(woken.wait()))
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    if woken is not None:
        woken.clear()


async def _run_forever(task: BackgroundTask, stop: asyncio.Event, woken: asyncio.Event | None) -> None:
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
        await _wait(stop, woken, task.interval)


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
