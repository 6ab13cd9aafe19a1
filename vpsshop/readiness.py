"""The components' readiness, checked on demand: ``GET /v1/health``, ``GET /metrics`` and the
sandbox banner ask here, and share one round of checks for a few seconds."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from vpsshop.component import Component, Readiness
from vpsshop.context import AppContext, LoadedComponent, StateKey

log = logging.getLogger("vpsshop.health")

CHECK_TIMEOUT = 3.0
"""Seconds each component's ``check_ready`` may take; a slower one counts as not ready."""
SHARED_SECONDS = 2.0
"""Checks this recent are answered again instead of asking every node once more."""


class _LastChecks:
    """The last round of checks of one shop and when it ran."""

    def __init__(self, _ctx: AppContext) -> None:
        self.at = 0.0
        self.checked: list[tuple[LoadedComponent, Readiness]] | None = None


_LAST = StateKey[_LastChecks]("readiness")


async def _readiness(component: Component[Any] | None) -> Readiness:
    if component is None:
        return Readiness(False, "no plugin loaded for this")
    try:
        return await asyncio.wait_for(component.check_ready(), CHECK_TIMEOUT)
    except TimeoutError:
        return Readiness(False, f"no answer within {CHECK_TIMEOUT:g}s")
    except Exception as exc:  # noqa: BLE001 - a failing check is reported, never raised
        return Readiness(False, f"check failed: {type(exc).__name__}")


async def component_readiness(ctx: AppContext) -> list[tuple[LoadedComponent, Readiness]]:
    """Every loaded component with its readiness, checked concurrently, each within the time limit.
    Checks made less than ``SHARED_SECONDS`` ago are answered again (health and /metrics share
    them, so a scrape beside a health probe does not ask every node twice). In production, each
    component not ready is logged with the reason at every fresh check."""
    last = ctx.state(_LAST, _LastChecks)
    if last.checked is not None and time.monotonic() - last.at < SHARED_SECONDS:
        return last.checked
    items = list(ctx.components())
    readiness = await asyncio.gather(*(_readiness(item.component) for item in items))
    readiness = [_with_images(ctx, item, ready) for item, ready in zip(items, readiness, strict=True)]
    checked = list(zip(items, readiness, strict=False))
    last.at, last.checked = time.monotonic(), checked
    if not ctx.settings.sandbox:  # health and /metrics show only ready or not: the reason goes to the log
        for item, ready in checked:
            if not ready.ok:
                log.warning("health: %s %s (plugin %s) not ready: %s", item.kind, item.key, item.plugin, ready.detail)
    return checked


def _with_images(ctx: AppContext, item: LoadedComponent, ready: Readiness) -> Readiness:
    """The hypervisor's readiness, naming the systems a location cannot offer (still ready: the
    other systems and locations sell; ``vpsshop images status`` names the hosts), with their count
    as the figure ``unoffered_systems_total`` (on ``/metrics`` in production too, where the health
    body carries no detail)."""
    if item.component is None or item.component is not ctx.hypervisor:
        return ready
    missing = ctx.unoffered_systems()
    figures = {**ready.figures, "unoffered_systems_total": float(sum(len(ids) for ids in missing.values()))}
    if not missing:
        return replace(ready, figures=figures)
    lacking = "; ".join(f"{loc} lacks {', '.join(ids)}" for loc, ids in missing.items())
    return replace(ready, detail=f"{ready.detail}; images: {lacking}"[:500], figures=figures)


def ready_in_mode(readiness: Readiness, sandbox: bool) -> bool:
    """Ready for what this mode promises: real use in production; in the sandbox, what a sandbox
    does (a component may say so with ``Readiness.sandbox_ok`` while not ready for real use)."""
    return readiness.ok or (sandbox and bool(readiness.sandbox_ok))
