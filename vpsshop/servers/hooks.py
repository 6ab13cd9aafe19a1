"""Servers register their background work through the same hook as any plugin.

Listed in ``vpsshop.plugins.DEFAULT_PLUGINS`` as ``servers``, so ``vpsshop plugins`` shows it and
``VPSSHOP_BLOCK_PLUGINS=servers`` keeps a process from running provisioning and lifecycle passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vpsshop.markers import hookimpl
from vpsshop.servers import background_tasks

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext
    from vpsshop.tasks import BackgroundTask


@hookimpl
def vpsshop_background_tasks(ctx: AppContext) -> list[BackgroundTask]:
    return background_tasks(ctx)
