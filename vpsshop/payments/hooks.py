"""Core's own plugin for payments: the chain watcher and top-up expiry, each a background task.

Registered as the default plugin ``payments``; blocking it (``VPSSHOP_BLOCK_PLUGINS=payments``) runs
an API process that never watches chains, for shops that run ``vpsshop worker`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from anyio import to_thread

from vpsshop.markers import hookimpl
from vpsshop.tasks import BackgroundTask

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext


@hookimpl
def vpsshop_background_tasks(ctx: AppContext) -> Iterable[BackgroundTask]:
    from vpsshop.payments import engine_for

    engine = engine_for(ctx)
    interval = engine.settings.watch_interval_seconds

    async def expire() -> int:
        return await to_thread.run_sync(engine.expire_due)

    tasks = [
        BackgroundTask("topup-watcher", interval, engine.watcher.run_pass),
        BackgroundTask("topup-expiry", interval, expire),
    ]
    if engine.settings.push:
        tasks.append(BackgroundTask("topup-push", interval, engine.watcher.follow))
    return tasks


@hookimpl
def vpsshop_startup(ctx: AppContext) -> None:
    """Build the engine at start-up so a bad ``[topups]`` setting stops the service at once."""
    from vpsshop.payments import engine_for

    engine_for(ctx)
