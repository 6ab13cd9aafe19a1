"""Core's plugin ``x402-settlements``: resolves x402 settlements whose outcome was unknown.

A settlement that timed out leaves its record ``settling`` (see :mod:`vpsshop.x402.settlement`).
This background task asks the coin about each such record every ``[topups] watch_interval_seconds``
and credits it once, or closes it once the authorization can no longer be used. It runs only when
an x402 coin is loaded, apart from the chain watcher (a deposit coin's node being slow never delays
it, and the other way round). Blocking the plugin (``VPSSHOP_BLOCK_PLUGINS=x402-settlements``) leaves
the resolution to re-sent headers and to another process that runs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from vpsshop.coins import X402Coin
from vpsshop.markers import hookimpl
from vpsshop.tasks import BackgroundTask

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext

TASK_NAME = "x402-settlements"


class SettlementTask:
    """One pass over the open settlements of ``ctx``; returns ``{"credited": n}``."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    async def __call__(self) -> dict[str, int]:
        from vpsshop.x402.settlement import resolve_open_settlements

        return {"credited": await resolve_open_settlements(self.ctx)}


def settlement_task(ctx: AppContext) -> BackgroundTask | None:
    """The background task for ``ctx``, or None when no x402 coin is loaded."""
    if not any(isinstance(coin, X402Coin) for coin in ctx.coins.values()):
        return None
    from vpsshop.payments import engine_for

    return BackgroundTask(TASK_NAME, engine_for(ctx).settings.watch_interval_seconds, SettlementTask(ctx))


@hookimpl
def vpsshop_background_tasks(ctx: AppContext) -> Iterable[BackgroundTask]:
    task = settlement_task(ctx)
    return [task] if task is not None else []
