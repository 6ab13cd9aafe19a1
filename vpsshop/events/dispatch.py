"""Calling plugins' ``vpsshop_event`` hook: after commit, from the outbox, each plugin on its own cursor.

For each plugin that implements the hook, the ``event-hooks`` background task:

* takes the lease of the plugin's cursor (``hook:<plugin name>`` in ``event_cursors``), so one
  worker at a time calls a plugin; a worker that dies loses the lease after ``lease_seconds``;
* calls the hook with each visible event after the cursor, in order, and moves the cursor past
  it once the call returned. A plugin therefore sees every event **at least once**: a worker that
  dies between the call and the cursor update calls it again for that event;
* when the hook raises, logs it and tries the same event again after ``hook_retry_seconds``
  (doubling); after ``hook_max_attempts`` failed calls it logs an error and moves on. A plugin's
  failure holds back only that plugin: webhooks and the other plugins do not wait for it.

A plugin seen for the first time starts at the newest event (it is not flooded with history).
Synchronous hook implementations run in a worker thread, so a blocking call (SMTP, a chat API) does
not stall the worker's other tasks; coroutine functions are awaited.
"""

from __future__ import annotations

import inspect
import logging
from datetime import timedelta
from functools import partial
from typing import Any

from anyio import to_thread
from sqlmodel import col, select

from vpsshop.context import AppContext
from vpsshop.events import Event, outbox
from vpsshop.events.delivery import WORKER_ID
from vpsshop.events.models import StoredEvent
from vpsshop.events.settings import event_settings

log = logging.getLogger("vpsshop.events")

CURSOR_PREFIX = "hook:"


def implementations(ctx: AppContext) -> list[Any]:
    return list(ctx.pm.hook.vpsshop_event.get_hookimpls())


def ensure_cursors(ctx: AppContext) -> None:
    """Give every plugin implementing ``vpsshop_event`` a cursor at the newest event (start-up)."""
    impls = implementations(ctx)
    if not impls:
        return
    now = ctx.clock.now()
    outbox.publish_pending(ctx.db)
    with ctx.db.session() as session:
        start = outbox.head(session)
        for impl in impls:
            outbox.ensure_cursor(session, CURSOR_PREFIX + impl.plugin_name, start, now)


def _take(ctx: AppContext, name: str, worker: str, limit: int) -> tuple[Any, list[Event]] | None:
    settings = event_settings(ctx)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        outbox.ensure_cursor(session, name, outbox.head(session), now)
        cursor = outbox.lease(session, name, worker, now, settings.lease_seconds)
        if cursor is None:
            return None
        if cursor.retry_at is not None and cursor.retry_at > now:
            outbox.store(session, name, worker, now, locked_by=None, locked_until=None)
            return None
        rows = session.exec(
            outbox.visible(
                select(StoredEvent)
                .where(col(StoredEvent.seq) > cursor.last_id)
                .order_by(col(StoredEvent.seq))
                .limit(limit)
            )
        ).all()
        return cursor, [Event.from_row(row) for row in rows]


def _store(ctx: AppContext, name: str, worker: str, **values: Any) -> bool:
    settings = event_settings(ctx)
    now = ctx.clock.now()
    values.setdefault("locked_until", now + timedelta(seconds=settings.lease_seconds))
    with ctx.db.session() as session:
        return outbox.store(session, name, worker, now, **values)


async def _call(ctx: AppContext, impl: Any, event: Event) -> None:
    args = {"ctx": ctx, "event": event}
    kwargs = {name: args[name] for name in impl.argnames}
    if inspect.iscoroutinefunction(impl.function):
        await impl.function(**kwargs)
        return
    result = await to_thread.run_sync(lambda: impl.function(**kwargs))
    if inspect.isawaitable(result):
        await result


async def run_plugin(ctx: AppContext, impl: Any, worker: str = WORKER_ID) -> int:
    """Feed one plugin the events after its cursor. Returns how many calls returned normally."""
    settings = event_settings(ctx)
    name = CURSOR_PREFIX + impl.plugin_name
    taken = await to_thread.run_sync(_take, ctx, name, worker, settings.batch_size)
    if taken is None:
        return 0
    cursor, batch = taken
    failures = cursor.failures
    done = 0
    try:
        for event in batch:
            try:
                await _call(ctx, impl, event)
            except Exception as exc:  # noqa: BLE001 - a plugin's failure must not stop the outbox
                failures += 1
                error = f"{type(exc).__name__}: {exc}"[:500]
                if failures >= settings.hook_max_attempts:
                    log.error(
                        "vpsshop_event of plugin %s failed %s times on event %s (%s); skipping it: %s",
                        impl.plugin_name,
                        failures,
                        event.id,
                        event.type,
                        error,
                    )
                    if not await to_thread.run_sync(
                        partial(
                            _store, ctx, name, worker, last_id=event.seq, failures=0, retry_at=None, last_error=error
                        )
                    ):
                        return done
                    failures = 0
                    continue
                delay = settings.hook_retry_seconds * 2 ** (failures - 1)
                log.warning(
                    "vpsshop_event of plugin %s failed on event %s (%s), attempt %s; again in %.1f s: %s",
                    impl.plugin_name,
                    event.id,
                    event.type,
                    failures,
                    delay,
                    error,
                )
                await to_thread.run_sync(
                    partial(
                        _store,
                        ctx,
                        name,
                        worker,
                        failures=failures,
                        last_error=error,
                        retry_at=ctx.clock.now() + timedelta(seconds=delay),
                    )
                )
                return done
            done += 1
            if not await to_thread.run_sync(
                partial(_store, ctx, name, worker, last_id=event.seq, failures=0, retry_at=None, last_error=None)
            ):
                return done  # the lease was lost to another worker: it goes on from the cursor
            failures = 0
    finally:
        await to_thread.run_sync(lambda: _store(ctx, name, worker, locked_by=None, locked_until=None))
    return done


async def run_hooks(ctx: AppContext, worker: str = WORKER_ID) -> int:
    """One pass of the ``event-hooks`` task over every plugin implementing ``vpsshop_event``."""
    total = 0
    if implementations(ctx):
        await to_thread.run_sync(outbox.publish_pending, ctx.db)
    for impl in implementations(ctx):
        try:
            total += await run_plugin(ctx, impl, worker)
        except Exception:
            log.exception("feeding events to plugin %s failed", impl.plugin_name)
    return total
