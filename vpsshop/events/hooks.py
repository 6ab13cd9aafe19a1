"""Core's own plugin for events: the webhook and plugin-hook background tasks.

Registered as the default plugin ``events``; ``VPSSHOP_BLOCK_PLUGINS=events`` keeps a process from
delivering webhooks or calling ``vpsshop_event`` (events are still recorded, and delivered by any
other worker).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from vpsshop.markers import hookimpl
from vpsshop.tasks import BackgroundTask

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext


@hookimpl
def vpsshop_startup(ctx: AppContext) -> None:
    """Validate ``[events]`` at start-up and give new ``vpsshop_event`` plugins their cursor."""
    from vpsshop.events.dispatch import ensure_cursors
    from vpsshop.events.settings import event_settings

    event_settings(ctx)
    ensure_cursors(ctx)


@hookimpl
def vpsshop_background_tasks(ctx: AppContext) -> Iterable[BackgroundTask]:
    from vpsshop.events import delivery, dispatch
    from vpsshop.events.settings import event_settings

    interval = event_settings(ctx).interval_seconds
    tasks = [BackgroundTask("webhooks", interval, lambda: delivery.run_pass(ctx))]
    if dispatch.implementations(ctx):
        tasks.append(BackgroundTask("event-hooks", interval, lambda: dispatch.run_hooks(ctx)))
    return tasks
