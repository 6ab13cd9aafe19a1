"""The chain watcher: one pass scans each scan group's new blocks once against its watched keys.

A pass, for every scan group (coins sharing one scan: see :attr:`DepositCoin.scan_group`):

1. call :meth:`DepositCoin.scan` from the stored cursor until it stops moving, recording every
   payment it reports (unique per coin and chain identity); before each call, refresh the in-memory
   :class:`KeySet` of watched keys with the top-ups committed since (only new rows are read, so a
   pass costs the same with 10 or 100,000 top-ups);
2. store the new cursor (compare-and-set: two workers never move it backwards);
3. :meth:`DepositCoin.recheck` every payment seen but not credited, drop those that left the chain,
   credit those with enough confirmations (:meth:`PaymentEngine.credit_confirmed`);
4. register addresses the node does not know yet (first, before scanning).

x402 settlements left open are resolved by their own background task (:mod:`vpsshop.x402.hooks`).

Then pending top-ups past their expiry with nothing waiting are expired. Several workers may run
passes at once against one database: every write is idempotent or guarded by a constraint.

**Push.** A scan group whose first coin has a wake channel (:meth:`DepositCoin.wake_channel`) is
followed by :meth:`Watcher.follow`: a pass runs when the channel connects and at every wake, and
the periodic pass leaves the group alone while the channel is up (its *mode* is ``push``). When the
channel is down the group is polled every ``watch_interval_seconds`` again (mode ``poll``) and the
channel is reopened after 1, 2, 4 ... :data:`PUSH_RETRY_MAX_SECONDS` seconds; the pass that runs
when it reconnects reads whatever happened meanwhile from the cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa
from anyio import to_thread
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from vpsshop import metrics
from vpsshop.chains import check_distinct_keys
from vpsshop.coins import DepositCoin
from vpsshop.coins import DetectedPayment as Found  # the coin's report
from vpsshop.errors import PluginError
from vpsshop.payments.models import ScanCursor, Topup, TopupPayment
from vpsshop.push import IDLE

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.coins import PaymentCheck
    from vpsshop.context import AppContext
    from vpsshop.settings import TopupSettings


class PaymentEngine(Protocol):
    """What the watcher asks of the payment engine (:class:`vpsshop.payments.engine.PaymentEngine`, which
    owns the watcher): the coins to scan, and recording and crediting what the scans found."""

    ctx: AppContext
    settings: TopupSettings

    def deposit_coins(self) -> list[DepositCoin[Any]]: ...

    def record_payments(
        self, found: list[tuple[str, Found]], topups: dict[tuple[str, str], int], any_coin: dict[str, int] | None = None
    ) -> list[int]: ...

    def seen_payments(self, coins: list[str]) -> list[TopupPayment]: ...

    def apply_checks(self, checks: list[PaymentCheck], coin: str) -> None: ...

    async def credit_confirmed(self, coin: DepositCoin[Any]) -> int: ...

    async def register(self, coin: DepositCoin[Any], topup: Topup) -> None: ...


log = logging.getLogger("vpsshop.watcher")

MAX_SCAN_CALLS_PER_PASS = 50
GAP_GIVE_UP_SECONDS = 600.0
PUSH_RETRY_FIRST_SECONDS = 1.0
PENDING_CHECK_SECONDS = 1.0
"""How often a scan group with :attr:`DepositCoin.pending_poll_seconds` looks for open top-ups."""
PUSH_RETRY_MAX_SECONDS = 60.0


class KeySet:
    """The watched keys of one scan group: a set for the scan, a map to top-up ids for the engine.

    Refreshed incrementally by id. On PostgreSQL two transactions can commit out of id order (id
    101 after 102), so ids missing below the highest one seen are kept as *gaps* and read again on
    every refresh until they appear or are older than :data:`GAP_GIVE_UP_SECONDS` (a rolled-back
    insert leaves a permanent gap). A top-up is never shown to a customer before it commits, so no
    payment to it can be in a block scanned before this set holds its key.
    """

    def __init__(self, coins: list[str]) -> None:
        self.coins = set(coins)
        self.by_key: dict[tuple[str, str], int] = {}
        self.any_coin: dict[str, int] = {}
        """watch key -> top-up id, whatever the coin (see PaymentEngine.record_payments)."""
        self.keys: set[str] = set()
        self.last_id = 0
        self.gaps: dict[int, float] = {}
        """id -> monotonic time it was first missed."""

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def load_new(self, engine: PaymentEngine) -> int:
        """Read the top-ups committed since the last call (and late commits of older ids)."""
        now = time.monotonic()
        self.gaps = {i: t for i, t in self.gaps.items() if now - t < GAP_GIVE_UP_SECONDS}
        low = min([self.last_id, *(i - 1 for i in self.gaps)])
        with engine.ctx.db.session() as session:
            rows = session.execute(
                sa.select(col(Topup.id), col(Topup.coin), col(Topup.watch_key))
                .where(col(Topup.id) > low)
                .order_by(col(Topup.id))
            ).all()
        added = 0
        seen_ids = set()
        for topup_id, coin, key in rows:
            seen_ids.add(topup_id)
            self.gaps.pop(topup_id, None)
            if coin in self.coins and key is not None and (coin, key) not in self.by_key:
                self.by_key[(coin, key)] = topup_id
                self.any_coin.setdefault(key, topup_id)
                self.keys.add(key)
                added += 1
        if rows:
            top = rows[-1][0]
            for missing in range(self.last_id + 1, top):
                if missing not in seen_ids:
                    self.gaps.setdefault(missing, now)
            self.last_id = max(self.last_id, top)
        return added


class Watcher:
    """Runs watcher passes for one engine; also the rate-limited check behind a GET."""

    def __init__(self, engine: PaymentEngine) -> None:
        self.engine = engine
        self.groups: dict[str, list[DepositCoin[Any]]] = {}
        for coin in engine.deposit_coins():
            if coin.can_scan:
                self.groups.setdefault(coin.scan_group, []).append(coin)
        for members in self.groups.values():
            check_distinct_keys(members)
        self.keysets = {g: KeySet([c.code for c in coins]) for g, coins in self.groups.items()}
        self.locks = {g: asyncio.Lock() for g in self.groups}
        self.last_pass: dict[str, float] = {}
        self.modes: dict[str, str] = {}
        """Scan group -> ``push`` (its wake channel is up) or ``poll``; set by :meth:`follow`."""
        for group in self.groups:
            self._set_mode(group, "poll")

    async def run_pass(self) -> dict[str, int]:
        """One pass over every scan group. Returns counters. (Expiry is a task of its own,
        ``topup-expiry``: a slow or failing node never holds it up.)"""
        totals = {"payments": 0, "credited": 0}
        for group in self.groups:
            if self.modes[group] == "push" and self.groups[group][0].wake_sees_everything:
                continue  # its node wakes the watcher (follow)
            try:
                found, credited = await self.pass_group(group)
            except PluginError as exc:
                metrics.node_error(group)
                log.warning("watching %s failed this pass: %s", group, exc)
                continue
            except Exception:
                metrics.node_error(group)
                log.exception("watching %s failed this pass", group)
                continue
            totals["payments"] += found
            totals["credited"] += credited
        return totals

    def _set_mode(self, group: str, mode: str) -> None:
        self.modes[group] = mode
        metrics.watcher_mode(group, push=mode == "push")
        for coin in self.groups[group]:
            coin.watch_mode = mode

    async def follow(self) -> None:
        """Follow the wake channel of every scan group that has one, until cancelled (the
        background task ``topup-push``)."""
        tasks = [asyncio.create_task(self.follow_group(g), name=f"push:{g}") for g in self.groups]
        try:
            await asyncio.gather(*tasks)
            await asyncio.Event().wait()  # no group has a channel: nothing to do, ever
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def follow_group(self, group: str) -> None:
        """Run a pass of ``group`` at every wake of its first coin's channel; poll while it is down."""
        coin = self.groups[group][0]
        wake = asyncio.Event()
        passes = asyncio.create_task(self._pass_on_wake(group, wake))
        pending = asyncio.create_task(self._pending_poll(group, wake)) if coin.pending_poll_seconds else None
        delay = PUSH_RETRY_FIRST_SECONDS
        try:
            while True:
                channel = coin.wake_channel()
                if channel is None:
                    if pending is not None:
                        await pending  # runs until cancelled
                    return
                try:
                    async for what in channel:
                        if self.modes[group] != "push":
                            log.info("watching %s: push channel up, no more polling", group)
                            self._set_mode(group, "push")
                        delay = PUSH_RETRY_FIRST_SECONDS
                        if what == IDLE:  # the node answered, nothing is new: as good as an empty pass
                            metrics.watcher_pass(group)
                            continue
                        wake.set()
                        log.debug("watching %s: woken (%s)", group, what)
                    why = "the channel ended"
                except PluginError as exc:
                    why = str(exc)
                except Exception as exc:  # noqa: BLE001 - any failure of the channel: poll and retry
                    why = f"{type(exc).__name__}: {exc}"
                finally:
                    aclose = getattr(channel, "aclose", None)
                    if aclose is not None:
                        with contextlib.suppress(Exception):
                            await aclose()
                if self.modes[group] == "push":
                    wake.set()  # a last look: what happened while it went down
                self._set_mode(group, "poll")
                log.warning(
                    "watching %s: push channel down (%s); polling every %ss, reconnecting in %ss",
                    group,
                    why,
                    self.engine.settings.watch_interval_seconds,
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, PUSH_RETRY_MAX_SECONDS)
        finally:
            for task in (passes, pending):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _pending_poll(self, group: str, wake: asyncio.Event) -> None:
        """Wake ``group`` every :attr:`DepositCoin.pending_poll_seconds` while one of its top-ups
        is open (looked up every :data:`PENDING_CHECK_SECONDS`)."""
        interval = self.groups[group][0].pending_poll_seconds
        assert interval
        codes = [c.code for c in self.groups[group]]
        while True:
            try:
                any_open = await to_thread.run_sync(self._has_open_topups, codes)
            except Exception:  # the database is away: the periodic pass goes on
                log.exception("watching %s: looking for open top-ups failed", group)
                any_open = False
            if not any_open:
                await asyncio.sleep(PENDING_CHECK_SECONDS)
                continue
            checked = time.monotonic()
            while time.monotonic() - checked < PENDING_CHECK_SECONDS:
                wake.set()
                await asyncio.sleep(interval)

    def _has_open_topups(self, codes: list[str]) -> bool:
        with self.engine.ctx.db.session() as session:
            row = session.execute(
                sa.select(col(Topup.id)).where(col(Topup.coin).in_(codes), col(Topup.status) == "pending").limit(1)
            ).first()
        return row is not None

    async def _pass_on_wake(self, group: str, wake: asyncio.Event) -> None:
        while True:
            await wake.wait()
            wake.clear()
            try:
                await self.pass_group(group)
            except PluginError as exc:
                metrics.node_error(group)
                log.warning("watching %s failed this pass: %s", group, exc)
            except Exception:
                metrics.node_error(group)
                log.exception("watching %s failed this pass", group)

    async def poke(self, group: str) -> bool:
        """A GET's chain check: a pass of ``group`` unless one ran within ``poll_min_seconds``.

        Waits at most ``poll_timeout_seconds``; a slower pass goes on in the background. Returns
        True when a pass ran to its end (the caller re-reads the top-up).
        """
        settings = self.engine.settings
        if group not in self.groups:
            return False
        last = self.last_pass.get(group)
        if last is not None and time.monotonic() - last < settings.poll_min_seconds:
            return False
        if self.locks[group].locked():
            return False
        self.last_pass[group] = time.monotonic()
        task = asyncio.ensure_future(self.pass_group(group))
        task.add_done_callback(_log_failure)
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=settings.poll_timeout_seconds)
        except TimeoutError:
            return False
        except PluginError as exc:
            log.warning("chain check of %s on GET failed: %s", group, exc)
            return False
        except Exception:
            log.exception("chain check of %s on GET failed", group)
            return False
        return True

    async def pass_group(self, group: str) -> tuple[int, int]:
        """Scan, record, recheck and credit one scan group. Returns (payments found, credited)."""
        engine = self.engine
        coins = self.groups[group]
        scanner, members = coins[0], tuple(coins)
        keyset = self.keysets[group]
        async with self.locks[group]:
            self.last_pass[group] = time.monotonic()
            await self._register_pending(coins)
            cursor = await to_thread.run_sync(self._load_cursor, group)
            found = 0
            for _ in range(MAX_SCAN_CALLS_PER_PASS):
                # Keys are read right before each scan, and the scan reads the chain's tip first: a
                # top-up committed after this read can only be paid in a block past that tip, which
                # the next scan call (with its key loaded) covers.
                await to_thread.run_sync(keyset.load_new, engine)
                result = await scanner.scan(cursor, keyset, members)
                if result.payments:
                    found += len(result.payments)
                    await to_thread.run_sync(engine.record_payments, result.payments, keyset.by_key, keyset.any_coin)
                if result.cursor == cursor:
                    break
                await to_thread.run_sync(self._store_cursor, group, cursor, result.cursor)
                cursor = result.cursor
            metrics.watcher_pass(group, tip=result.tip_height, scanned=result.scanned_height)
            credited = 0
            for coin in coins:
                seen = await to_thread.run_sync(engine.seen_payments, [coin.code])
                if seen:
                    checks = await coin.recheck([_as_found(p) for p in seen])
                    await to_thread.run_sync(engine.apply_checks, checks, coin.code)
                credited += await engine.credit_confirmed(coin)
        return found, credited

    async def _register_pending(self, coins: list[DepositCoin[Any]]) -> None:
        for coin in coins:
            rows = await to_thread.run_sync(self._unregistered, coin.code)
            for topup in rows:
                await self.engine.register(coin, topup)

    def _unregistered(self, code: str) -> list[Topup]:
        with self.engine.ctx.db.session() as session:
            return list(
                session.exec(
                    select(Topup).where(col(Topup.coin) == code, col(Topup.registered).is_(False)).limit(100)
                ).all()
            )

    def _load_cursor(self, group: str) -> str | None:
        with self.engine.ctx.db.session() as session:
            row = session.get(ScanCursor, group)
            return row.cursor if row is not None else None

    def _store_cursor(self, group: str, old: str | None, new: str | None) -> None:
        """Move the cursor from ``old`` to ``new`` unless another worker moved it meanwhile."""
        now = self.engine.ctx.clock.now()
        with self.engine.ctx.db.session() as session:
            row = session.get(ScanCursor, group)
            if row is None:
                savepoint = session.begin_nested()
                try:
                    session.add(ScanCursor(scan_group=group, cursor=new, updated_at=now))
                    session.flush()
                    savepoint.commit()
                except IntegrityError:
                    savepoint.rollback()
                return
            same = col(ScanCursor.cursor).is_(None) if old is None else col(ScanCursor.cursor) == old
            session.execute(
                sa.update(ScanCursor)
                .where(col(ScanCursor.scan_group) == group, same)
                .values(cursor=new, updated_at=now)
            )


def _as_found(row: TopupPayment) -> Found:
    return Found(
        identity=row.identity,
        watch_key="",
        amount_atomic=int(row.amount_atomic),
        txid=row.txid,
        confirmations=row.confirmations,
        block_height=row.block_height,
        block_hash=row.block_hash,
    )


def _log_failure(task: asyncio.Future[tuple[int, int]]) -> None:
    """A GET's pass that outlived the GET: log its failure instead of losing it."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("chain check started by a GET failed: %s", task.exception())
