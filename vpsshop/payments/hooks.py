"""Core's own plugin for payments: runs the chain watcher as a background task.

Registered as the default plugin ``payments``; blocking it (``VPSSHOP_BLOCK_PLUGINS=payments``) runs
an API process that never watches chains, for shops that run ``vpsshop worker`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from vpsshop.hookspecs import hookimpl
from vpsshop.tasks import BackgroundTask

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext


@hookimpl
def vpsshop_background_tasks(ctx: AppContext) -> Iterable[BackgroundTask]:
    from vpsshop.payments import engine_for

    engine = engine_for(ctx)
    return [BackgroundTask("topup-watcher", engine.settings.watch_interval_seconds, engine.watcher.run_pass)]


@hookimpl
def vpsshop_startup(ctx: AppContext) -> None:
    """Build the engine at start-up so a bad ``[topups]`` setting stops the service at once."""
    from vpsshop.payments import engine_for

    engine_for(ctx)
