"""Settling an x402 authorization and crediting it once: the database side of x402.

Flow of ``POST /topups`` for an :class:`vpsshop.X402Coin` (orders and renewals use the same steps,
see :mod:`vpsshop.x402.purchases`):

1. without ``X-PAYMENT``: ``402 {"x402Version": 1, "error": ..., "accepts": [requirements]}``;
2. with ``X-PAYMENT``: the coin decodes it (no network), core records (payer, nonce) in
   ``x402_payments`` *before* settling (unique: one authorization, one record), then the coin
   settles. Success credits the ledger once under the key ``x402:<coin>:<payer>:<nonce>`` and
   answers 201 with the top-up (completed) and ``X-PAYMENT-RESPONSE``.
3. :class:`X402Rejected`: the record is closed as rejected, nothing is credited, the answer is the
   rejection's status with ``{"error", "message"}``. A rejection with a 5xx status (``settlement_unavailable``:
   the facilitator's ``/verify`` or the node could not be asked, nothing was sent) removes the record
   instead and cancels its top-up: nothing is left open, and the same payment may be re-sent.
4. :class:`PluginError` (outcome unknown: something may have been sent): the record stays ``settling``
   (marked ``outcome_unknown``), the answer is 503; a retry of the same header, or the
   ``x402-settlements`` background task, asks :meth:`X402Coin.settlement_status` and credits once if
   the authorization was used. An order's authorization held until the server was ready (``[x402]
   settle = "on_ready"``) whose settlement at readiness ended so and that the chain never settles ends
   the server and takes back its credit (:data:`ON_HELD_NOT_SETTLED`).

A re-send that arrives while the first request is still settling the same payment (clients retry,
or send twice at once) waits for that settlement, up to :data:`RESEND_WAIT`, and then answers with
its result: the completed top-up (the order, the renewal), or the refusal. Any process of the shop
sees it, since the wait watches the record. A record the
   chain does not show is closed as rejected only once the authorization can no longer be used: ``valid_before`` (plus
   :data:`SETTLE_GRACE` for blocks still arriving) has passed. Until then anyone holding the
   signed authorization (the shop's stuck transaction, a front-runner) may still get it mined,
   and the USDC would reach ``payTo``: closing the record earlier would lose that payment.

USDC is valued at par: ``maxAmountRequired`` is the USD amount in USDC base units, so the amount a
client signs never depends on a rate that could move between the 402 and the re-send.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from anyio import sleep, to_thread
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

import vpsshop.events as events
import vpsshop.ledger as ledger
from vpsshop.coins import X402Coin, X402Payment, X402Rejected, X402Settlement
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.errors import ApiError, PluginError
from vpsshop.models import saved_id
from vpsshop.money import MICROS_PER_USD
from vpsshop.payments.models import Topup, X402Record, new_ref
from vpsshop.payments.resource import topup_event, x402_payment_event
from vpsshop.x402.messages import HOLD_MARGIN_SECONDS, decode, decode_recorded, hold_seconds, requirements

log = logging.getLogger("vpsshop.x402")

ABANDON_AFTER = timedelta(minutes=30)
"""For a coin that does not report ``valid_before`` (0): an open settlement the chain still does not
show after this long is closed as rejected."""
SETTLE_GRACE = timedelta(minutes=2)
"""How long after ``valid_before`` a transaction may still show up: block timestamps that trail
the shop's clock, an RPC node a few blocks behind."""
RESEND_WAIT = timedelta(seconds=45)
"""How long a re-send waits for the first request's settlement of the same payment, counted from
when the payment was recorded: longer than a settlement takes (USDCBASE: its RPC and receipt
time-outs, 10 s and 30 s by default). Past it, the re-send asks the chain as after an unknown outcome."""
ON_HELD_NOT_SETTLED: list[Callable[[AppContext, Session, X402Record, str], bool]] = []
"""Called in the transaction that closes a held authorization the chain never settled (its outcome at
the server's readiness was unknown, and ``valid_before`` passed with its nonce unused), before its credit
is taken back: ``(ctx, session, record, code)`` ends what it paid for (:mod:`vpsshop.servers.held`
terminates the server and refunds it) and returns True, or False to leave the record open for a later
pass (the server changed meanwhile)."""
OUTCOME_UNKNOWN = "outcome_unknown"
"""``X402Record.error`` of a record whose settling request ended without knowing the outcome: no
request is settling it any more, so re-sends do not wait for one."""


def may_still_settle(payment: X402Payment, created_at: datetime, now: datetime) -> bool:
    """True while an authorization the chain does not show may still be mined (keep its record open)."""
    if payment.valid_before > 0:
        return now <= datetime.fromtimestamp(payment.valid_before, UTC) + SETTLE_GRACE
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    return now - created_at <= ABANDON_AFTER


async def pay(
    ctx: AppContext,
    coin: X402Coin,
    account_id: int,
    amount_micros: int,
    header: str,
    version: int = 1,
    *,
    path: str = "/topups",
    description: str | None = None,
    purpose: str | None = None,
) -> tuple[Topup, X402Settlement]:
    """Settle the payment header (``X-PAYMENT`` v1, ``PAYMENT-SIGNATURE`` v2) for a top-up of
    ``amount_micros``. See the module docs.

    ``path`` and ``description`` name the resource of the requirements the payment is checked
    against; ``purpose`` is what the payment is for besides the top-up (``order:<key>``,
    ``renew:<id>``, see :class:`X402Record`): an authorization recorded for another purpose is a 409
    ``nonce_used``.
    """
    # refused before anything is recorded: a record holds only what this request could settle
    payment, reqs = _exact_payment(ctx, coin, amount_micros, header, version, path, description)
    record, topup, fresh = await to_thread.run_sync(
        _record_before_settling, ctx, coin, account_id, amount_micros, payment, header, reqs, purpose
    )
    if not fresh:
        if topup.account_id != account_id or record.purpose != purpose:
            raise ApiError(409, "nonce_used", "This authorization was already used for another request.")
        if record.status == "settling" and record.error is None:  # another request is settling it now
            found = await _first_settlement(ctx, record)
            if found is None:  # it could not have the payment checked: nothing was sent, nothing kept
                raise ApiError(
                    503,
                    "settlement_unavailable",
                    "The payment could not be checked now; nothing was sent or kept. Send it again later.",
                )
            record, topup = found
        if record.status == "settled":
            # the payer as the coin writes it (checksummed for USDCBASE), as in the first answer
            settlement = X402Settlement(
                payment.payer, record.nonce, record.transaction or "", record.network or "", int(record.amount_atomic)
            )
            return topup, settlement
        if record.status == "rejected":
            raise ApiError(
                402, "nonce_used", f"This authorization was refused before ({record.error}); sign a new one."
            )
        try:
            settled = await coin.settlement_status(payment)
        except PluginError as exc:
            log.warning("x402 record %s: the settlement status is unknown for now: %s", record.id, exc)
            raise _pending() from None
        if settled is None and not may_still_settle(payment, record.created_at, ctx.clock.now()):
            await to_thread.run_sync(_reject, ctx, record.id, "not_settled")
            raise ApiError(
                402,
                "authorization_expired",
                "This authorization expired before it was settled; nothing moved. Sign a new one.",
            )
        if settled is None:
            raise _pending()
        return await _credited(ctx, coin, record.id, settled), settled
    try:
        settled = await coin.settle(payment, reqs)
    except X402Rejected as exc:
        if exc.status >= 500:  # nothing was sent and nothing can be pending: keep nothing open
            await to_thread.run_sync(_withdraw, ctx, record.id)
        else:
            await to_thread.run_sync(_reject, ctx, record.id, exc.code)
        raise ApiError(exc.status, exc.code, exc.message) from None
    except PluginError as exc:
        log.warning("x402 settlement of %s/%s has an unknown outcome: %s", payment.payer, payment.nonce, exc)
        await to_thread.run_sync(_note_outcome_unknown, ctx, record.id)
        raise ApiError(
            503,
            "settlement_pending",
            "The settlement outcome is not known yet; retry the same request shortly. "
            "The authorization is recorded and will be credited once if it settles.",
        ) from None
    return await _credited(ctx, coin, record.id, settled), settled


def _exact_payment(
    ctx: AppContext,
    coin: X402Coin,
    amount_micros: int,
    header: str,
    version: int,
    path: str,
    description: str | None,
) -> tuple[X402Payment, dict[str, Any]]:
    """The coin's reading of ``header`` and the requirements it must meet, when it pays them exactly.

    :raises ApiError: 400 invalid_payment; 402 wrong_amount (nothing moved)."""
    payment = decode(coin, header, version)
    reqs = requirements(ctx, coin, amount_micros, path, description)
    if payment.value_atomic != int(reqs["maxAmountRequired"]):
        raise ApiError(
            402,
            "wrong_amount",
            f"The authorization's value ({payment.value_atomic}) must equal maxAmountRequired "
            f"({reqs['maxAmountRequired']}) exactly. Nothing moved; ask again without a payment for the "
            "current requirements.",
        )
    return payment, reqs


async def _first_settlement(ctx: AppContext, record: X402Record) -> tuple[X402Record, Topup] | None:
    """The record (and its top-up) once the request settling it is done with it, or as it stands after
    :data:`RESEND_WAIT` from its recording; None when that request withdrew it."""
    created = record.created_at if record.created_at.tzinfo else record.created_at.replace(tzinfo=UTC)
    left = (created + RESEND_WAIT - ctx.clock.now()).total_seconds()
    deadline = time.monotonic() + min(max(left, 0.0), RESEND_WAIT.total_seconds())
    pause = 0.05
    while time.monotonic() < deadline:
        # a read-only, indexed read (no write lock on SQLite): has the settling request let go of it?
        row = await ctx.db.fetch_one(_RECORD_STATE_SQL, {"id": record.id})
        if row is None or row[0] != "settling" or row[1] is not None:
            break
        await sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.5)
    return await to_thread.run_sync(_reload, ctx, record.id)


_RECORD_STATE_SQL = "SELECT status, error FROM x402_payments WHERE id = :id"


def _reload(ctx: AppContext, record_id: int | None) -> tuple[X402Record, Topup] | None:
    with ctx.db.session() as session:
        record = session.get(X402Record, record_id)
        if record is None:
            return None
        topup = session.get(Topup, record.topup_id)
        assert topup is not None
        return record, topup


def _note_outcome_unknown(ctx: AppContext, record_id: int | None) -> None:
    with ctx.db.session() as session:
        record = session.get(X402Record, record_id)
        if record is not None and record.status == "settling":
            record.error = OUTCOME_UNKNOWN
            session.add(record)


def _pending() -> ApiError:
    return ApiError(
        503,
        "settlement_pending",
        "The settlement of this authorization is not confirmed yet; retry the same request shortly.",
    )


async def _credited(ctx: AppContext, coin: X402Coin, record_id: int | None, settled: X402Settlement) -> Topup:
    """:func:`_credit`, or 503 settlement_pending when the record was withdrawn meanwhile (a re-send finds
    the record that replaced it)."""
    topup = await to_thread.run_sync(_credit, ctx, coin, record_id, settled)
    if topup is None:
        raise _pending()
    return topup


def _record_before_settling(
    ctx: AppContext,
    coin: X402Coin,
    account_id: int,
    amount_micros: int,
    payment: X402Payment,
    header: str,
    reqs: dict[str, Any],
    purpose: str | None = None,
    status: str = "settling",
) -> tuple[X402Record, Topup, bool]:
    """Insert the top-up and the (payer, nonce) record, or return the existing record. ``status``
    ``held``: an order's authorization verified and held until the server is ready (:func:`hold`), its
    amount credited now under the settlement's own ledger key."""
    now = ctx.clock.now()
    payer, nonce = payment.payer.lower(), payment.nonce.lower()
    try:
        with ctx.db.session() as session:
            topup = Topup(
                ref=new_ref(),
                account_id=account_id,
                coin=coin.code,
                status="pending",
                amount_micros=amount_micros,
                rate="1",
                deposit_address=str(reqs.get("payTo", "")),
                deposit_amount_atomic=str(payment.value_atomic),
                deposit_network=coin.network,
                registered=True,
                created_at=now,
                expires_at=now + timedelta(seconds=int(reqs.get("maxTimeoutSeconds", 60))),
            )
            session.add(topup)
            session.flush()
            events.emit(session, "topup.created", account_id, topup_event(ctx, session, topup), now=now)
            record = X402Record(
                coin=coin.code,
                payer=payer,
                nonce=nonce,
                topup_id=saved_id(topup),
                status=status,
                amount_atomic=str(payment.value_atomic),
                header=header,
                requirements=json.dumps(reqs),
                created_at=now,
                purpose=purpose,
            )
            session.add(record)
            session.flush()
            if status == "held":
                ledger.post(
                    session,
                    account_id,
                    amount_micros,
                    "topup",
                    ref=topup.ref,
                    dedupe_key=f"x402:{coin.code}:{payer}:{nonce}",
                    memo=f"x402 {coin.code} authorization held until the server is ready"[:500],
                    now=now,
                )
            return record, topup, True
    except IntegrityError:
        with ctx.db.session() as session:
            record = session.exec(
                select(X402Record).where(
                    X402Record.coin == coin.code, X402Record.payer == payer, X402Record.nonce == nonce
                )
            ).one()
            paid = session.get(Topup, record.topup_id)
            assert paid is not None
            return record, paid, False


def lock_record(session: Session, record_id: int | None) -> X402Record | None:
    """The record, locked until the caller's transaction ends (``SELECT ... FOR UPDATE`` on
    PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already lets one writer in at a time): of several workers
    closing or crediting it, one at a time reads its status."""
    stmt = select(X402Record).where(X402Record.id == record_id)
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return session.exec(stmt).first()


def was_held(session: Session, record: X402Record) -> bool:
    """Whether ``record``'s amount is on the balance although it is not settled: an order's authorization
    held until the server is ready (:func:`hold` credits it under the key its settlement uses)."""
    if record.status == "settled":
        return False
    return ledger.by_dedupe_key(session, f"x402:{record.coin}:{record.payer}:{record.nonce}") is not None


def _reject(ctx: AppContext, record_id: int | None, code: str) -> None:
    """Close an open record the chain never settled: rejected, its top-up cancelled. A record whose
    amount was credited before it settled (an order's authorization held until the server was ready,
    :func:`hold`) ends what it paid for first (:data:`ON_HELD_NOT_SETTLED`), then its credit is taken
    back (:func:`release`), in one transaction; a record another worker closed or credited is left alone."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        record = lock_record(session, record_id)
        if record is None or record.status != "settling":
            return
        if was_held(session, record):
            if not all(end(ctx, session, record, code) for end in ON_HELD_NOT_SETTLED):
                return  # what it paid for changed meanwhile: a later pass decides again
            release(ctx, session, record, code)
            return
        record.status, record.error = "rejected", code[:200]
        topup = session.get(Topup, record.topup_id)
        if topup is not None and topup.status == "pending":
            topup.status, topup.cancelled_at = "cancelled", now
            session.add(topup)
            events.emit(session, "topup.cancelled", topup.account_id, topup_event(ctx, session, topup), now=now)
        session.add(record)


def _withdraw(ctx: AppContext, record_id: int | None) -> None:
    """Remove a record whose payment could not be checked (nothing was sent) and cancel its top-up, so
    that nothing stays open and the same payment can be recorded again by a re-send."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        record = session.get(X402Record, record_id)
        if record is None or record.status != "settling":
            return
        topup = session.get(Topup, record.topup_id)
        session.delete(record)
        if topup is not None and topup.status == "pending":
            topup.status, topup.cancelled_at = "cancelled", now
            session.add(topup)
            events.emit(session, "topup.cancelled", topup.account_id, topup_event(ctx, session, topup), now=now)


def _credit(ctx: AppContext, coin: X402Coin, record_id: int | None, settled: X402Settlement) -> Topup | None:
    """Credit a settled authorization once (ledger key ``x402:<coin>:<payer>:<nonce>``). None: the
    record is gone (withdrawn by :func:`_withdraw`; nothing is credited under its id)."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        record = lock_record(session, record_id)
        if record is None:
            return None
        topup = session.get(Topup, record.topup_id)
        assert topup is not None
        if record.status == "settled":
            return topup
        micros = int(settled.amount_atomic) * MICROS_PER_USD // 10**coin.decimals
        if micros > 0:
            ledger.post(
                session,
                topup.account_id,
                micros,
                "topup",
                ref=topup.ref,
                dedupe_key=f"x402:{coin.code}:{record.payer}:{record.nonce}",
                memo=f"x402 {coin.code} tx {settled.transaction}"[:500],
                now=now,
            )
        record.status, record.transaction, record.network, record.settled_at = (
            "settled",
            settled.transaction,
            settled.network,
            now,
        )
        topup.status, topup.completed_at = "completed", now
        session.add(record)
        session.add(topup)
        events.emit(
            session,
            "topup.payment_confirmed",
            topup.account_id,
            x402_payment_event(ctx, topup, settled.transaction, settled.amount_atomic, micros),
            now=now,
        )
        events.emit(session, "topup.completed", topup.account_id, topup_event(ctx, session, topup), now=now)
        return topup


async def resolve_open_settlements(ctx: AppContext) -> int:
    """Ask the coin about records left ``settling``; credit or close them. Returns how many were credited.

    Run by the ``x402-settlements`` background task (:mod:`vpsshop.x402.hooks`) and by a re-sent header."""
    coins = {code: c for code, c in ctx.coins.items() if isinstance(c, X402Coin)}
    if not coins:
        return 0
    records = await to_thread.run_sync(_open_records, ctx, list(coins))
    credited = 0
    for record in records:
        coin = coins[record.coin]
        try:
            payment = decode_recorded(coin, record.header)
            settled = await coin.settlement_status(payment)
        except (PluginError, X402Rejected) as exc:
            log.warning("x402 record %s still unresolved: %s", record.id, exc)
            continue
        if settled is not None:
            if await to_thread.run_sync(_credit, ctx, coin, record.id, settled) is not None:
                credited += 1
        elif not may_still_settle(payment, record.created_at, ctx.clock.now()):
            await to_thread.run_sync(_reject, ctx, record.id, "not_settled")
    return credited


def _open_records(ctx: AppContext, coins: list[str]) -> list[X402Record]:
    with ctx.db.session() as session:
        return list(
            session.exec(
                select(X402Record)
                .where(col(X402Record.status) == "settling", col(X402Record.coin).in_(coins))
                .limit(100)
            ).all()
        )


# ---- settle on readiness (``[x402] settle = "on_ready"``) -------------------------------------------


async def hold(
    ctx: AppContext,
    coin: X402Coin,
    account_id: int,
    amount_micros: int,
    header: str,
    version: int,
    *,
    path: str,
    description: str,
    purpose: str,
) -> tuple[Topup, X402Payment]:
    """Verify an order's payment without settling it and hold it: the record ``held``, its top-up
    pending, its amount credited (ledger key ``x402:<coin>:<payer>:<nonce>``, the one its settlement
    credits under, so it is never credited twice) for the order to be charged. The server's readiness
    settles it (:func:`settle_held`); a server that never gets ready releases it (:func:`release`).

    :raises ApiError: 402 wrong_amount, authorization_expired (valid for less than
        :func:`~vpsshop.x402.messages.hold_seconds`), the coin's refusals; 409 nonce_used (recorded for
        another purpose); 503 settlement_unavailable (the coin cannot verify now).
    """
    payment, reqs = _exact_payment(ctx, coin, amount_micros, header, version, path, description)
    needed = hold_seconds(ctx) - HOLD_MARGIN_SECONDS // 2
    if payment.valid_before and payment.valid_before < time.time() + needed:
        raise ApiError(
            402,
            "authorization_expired",
            f"This shop settles an order's payment once the server is ready: the authorization must stay valid "
            f"at least {needed} s (validBefore), as maxTimeoutSeconds says. Nothing moved; sign a new one.",
        )
    try:
        await coin.verify(payment, reqs)
    except X402Rejected as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None
    except NotImplementedError:
        raise ApiError(
            503, "settlement_unavailable", f"{coin.code} cannot verify a payment apart from settling it."
        ) from None
    record, topup, fresh = await to_thread.run_sync(
        lambda: _record_before_settling(
            ctx, coin, account_id, amount_micros, payment, header, reqs, purpose, status="held"
        )
    )
    if not fresh and (topup.account_id != account_id or record.purpose != purpose or record.status == "rejected"):
        raise ApiError(409, "nonce_used", "This authorization was already used for another request.")
    return topup, payment


def held_record(session: Session, account_id: int, purpose: str) -> X402Record | None:
    """The authorization held for ``purpose`` (``order:<key>``) of ``account_id``, if one is."""
    return session.exec(
        select(X402Record)
        .join(Topup, col(Topup.id) == col(X402Record.topup_id))
        .where(X402Record.purpose == purpose, X402Record.status == "held", Topup.account_id == account_id)
    ).first()


def release(ctx: AppContext, session: Session, record: X402Record, code: str) -> None:
    """In the caller's transaction: drop a held (or claimed) authorization that will not be settled.
    The record is closed ``rejected`` with ``code``, its top-up cancelled, and the credit :func:`hold`
    made taken back (ledger ``reversal``, once: key ``x402-reversal:<coin>:<payer>:<nonce>``). Nothing
    was sent: the payer's USDC never moved."""
    if record.status not in ("held", "settling"):
        return
    now = ctx.clock.now()
    record.status, record.error = "rejected", code[:200]
    session.add(record)
    topup = session.get(Topup, record.topup_id)
    if topup is None:
        return
    held = ledger.by_dedupe_key(session, f"x402:{record.coin}:{record.payer}:{record.nonce}")
    amount = held.amount_micros if held is not None else 0
    while amount > 0:
        try:
            ledger.post(
                session,
                topup.account_id,
                -amount,
                "reversal",
                ref=topup.ref,
                dedupe_key=f"x402-reversal:{record.coin}:{record.payer}:{record.nonce}",
                memo=f"x402 {record.coin} authorization not settled: {code}"[:500],
                now=now,
            )
            break
        except ledger.InsufficientBalance as short:  # spent meanwhile (a race with the order): never below zero
            log.warning("x402 record %s: only %s of the held credit can be taken back", record.id, short.balance_micros)
            amount = min(short.balance_micros, amount - 1)
    if topup.status == "pending":
        topup.status, topup.cancelled_at = "cancelled", now
        session.add(topup)
        events.emit(session, "topup.cancelled", topup.account_id, topup_event(ctx, session, topup), now=now)


async def settle_held(ctx: AppContext, record_id: int) -> X402Rejected | None:
    """Settle a held authorization now (its server is ready). Only the caller that moves the record
    from ``held`` to ``settling`` sends it (a conditional update: one worker of several, once).

    :returns: None when it settled and was credited (or another caller has it, or its outcome is
        unknown: the ``x402-settlements`` task resolves it as any other, and when the chain never settles
        it ends what it paid for through :data:`ON_HELD_NOT_SETTLED` before taking the credit back); the
        coin's refusal when it
        cannot be settled (the payer moved the funds, the authorization expired or its nonce was used):
        the caller releases it (:func:`release`) and ends what it paid for.
    """
    if not await to_thread.run_sync(_move, ctx, record_id, "held", "settling"):
        return None
    found = await to_thread.run_sync(_reload, ctx, record_id)
    assert found is not None
    record, _topup = found
    coin = ctx.coins.get(record.coin)
    if not isinstance(coin, X402Coin):
        await to_thread.run_sync(_move, ctx, record_id, "settling", "held")
        return None
    payment = decode_recorded(coin, record.header)
    try:
        settled = await coin.settle(payment, json.loads(record.requirements))
    except X402Rejected as exc:
        if exc.status >= 500:  # nothing was sent: held again, for the next pass
            await to_thread.run_sync(_move, ctx, record_id, "settling", "held")
            return None
        return exc
    except PluginError as exc:
        log.warning("x402 held record %s: settlement outcome unknown: %s", record_id, exc)
        await to_thread.run_sync(_note_outcome_unknown, ctx, record_id)
        return None
    await to_thread.run_sync(_credit, ctx, coin, record_id, settled)
    return None


def _move(ctx: AppContext, record_id: int, before: str, after: str) -> bool:
    """Move the record from ``before`` to ``after`` if it still is ``before`` (one caller wins)."""
    with ctx.db.session() as session:
        moved = session.execute(
            sa.update(X402Record)
            .where(col(X402Record.id) == record_id, col(X402Record.status) == before)
            .values(status=after)
        )
        return rowcount(moved) == 1
