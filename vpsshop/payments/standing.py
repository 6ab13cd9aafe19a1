"""Standing deposit addresses: one address per account and coin that never expires.

Anything received there is credited at the rate of the moment it is confirmed, as a completed
top-up of its own (its ledger entry, its ``topup.*`` events and webhooks). A confirmed receipt worth
less than ``topups.standing_minimum_usd`` is *held* (status ``held``, not lost) until the receipts
held at the address add up to the minimum; then they are credited together, in one top-up.

Each receipt is a :class:`~vpsshop.payments.models.TopupPayment` keyed on the chain's identity
(``txid:vout`` ...) and posted to the ledger under ``topup:<coin>:<identity>``, like any top-up
payment: a rescan, a second worker or a restart never credits it twice.

Addresses derive from the coin's watch-only key in a range of their own
(:meth:`vpsshop.coins.DepositCoin.derive_standing_address`), numbered per coin and key by the
counter ``standing:<key id>``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from vpsshop import events, ledger
from vpsshop.coins import DepositCoin, format_atomic
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, PluginError
from vpsshop.models import saved_id
from vpsshop.money import MICROS_PER_USD, micros_to_usd
from vpsshop.payments.models import DepositAddressRow, Topup, TopupPayment, new_ref
from vpsshop.payments.resource import DepositAddressOut, emit_payment_credited, payment_out, topup_event

log = logging.getLogger("vpsshop.payments")

__all__ = [
    "address_out",
    "credit_standing",
    "emit_receipt_event",
    "minimum_micros",
    "standing_address",
    "standing_addresses",
]


def minimum_micros(ctx: AppContext) -> int:
    """``topups.standing_minimum_usd`` in micro-dollars."""
    return int(Decimal(ctx.settings.topups.standing_minimum_usd) * MICROS_PER_USD)


def _existing(session: Session, account_id: int, code: str) -> DepositAddressRow | None:
    return session.exec(
        select(DepositAddressRow).where(DepositAddressRow.account_id == account_id, DepositAddressRow.coin == code)
    ).first()


Allocate = Callable[..., int]
"""The payment engine's ``allocate_index(session, coin, key_id=...)``: the next number of a counter."""


def _insert(ctx: AppContext, account_id: int, coin: DepositCoin[Any], allocate: Allocate) -> DepositAddressRow:
    with ctx.db.session() as session:
        found = _existing(session, account_id, coin.code)
        if found is not None:
            return found
        number = allocate(session, coin, key_id=f"standing:{coin.key_id()}")
        address = coin.derive_standing_address(number)
        row = DepositAddressRow(
            account_id=account_id,
            coin=coin.code,
            address=address.address,
            network=coin.network,
            key_id=coin.key_id(),
            number=number,
            watch_key=address.watch_key,
            registered=not coin.can_scan or type(coin).register_address is DepositCoin.register_address,
            created_at=ctx.clock.now(),
        )
        session.add(row)
        session.flush()
        return row


def standing_address(
    ctx: AppContext, account_id: int, coin: DepositCoin[Any], allocate: Allocate
) -> tuple[DepositAddressRow, bool]:
    """The account's standing address in ``coin``, made the first time (idempotent: one per account
    and coin, whatever number of requests race), numbered by ``allocate`` (the payment engine's
    ``allocate_index``). Returns (row, registered with the node).

    :raises BadRequest: invalid_coin (a coin without standing addresses).
    """
    if not coin.standing_addresses:
        raise BadRequest("invalid_coin", f"Coin {coin.code} has no standing deposit addresses.")
    try:
        row = _insert(ctx, account_id, coin, allocate)
    except IntegrityError:  # the same account asked twice at once: the first row wins
        with ctx.db.session() as session:
            found = _existing(session, account_id, coin.code)
        if found is None:
            raise
        row = found
    return row, row.registered


async def register(ctx: AppContext, coin: DepositCoin[Any], row: DepositAddressRow) -> None:
    """Tell the coin's node about the address; on failure the watcher retries later."""
    if row.registered:
        return
    try:
        await coin.register_address(coin.derive_standing_address(row.number))
    except PluginError as exc:
        log.warning("could not register %s standing address %s yet: %s", coin.code, row.address, exc)
        return

    def mark() -> None:
        with ctx.db.session() as session:
            session.execute(
                sa.update(DepositAddressRow).where(col(DepositAddressRow.id) == row.id).values(registered=True)
            )

    from anyio import to_thread

    await to_thread.run_sync(mark)
    row.registered = True


def unregistered(ctx: AppContext, code: str) -> list[DepositAddressRow]:
    with ctx.db.session() as session:
        return list(
            session.exec(
                select(DepositAddressRow)
                .where(col(DepositAddressRow.coin) == code, col(DepositAddressRow.registered).is_(False))
                .limit(100)
            ).all()
        )


def standing_addresses(ctx: AppContext, account_id: int) -> list[DepositAddressRow]:
    """The account's standing addresses, oldest first."""
    with ctx.db.session() as session:
        return list(
            session.exec(
                select(DepositAddressRow)
                .where(DepositAddressRow.account_id == account_id)
                .order_by(col(DepositAddressRow.id))
            ).all()
        )


def _held_atomic(session: Session, address_id: int) -> int:
    """What the address holds below the minimum, in atomic units (read in ``session``)."""
    session.flush()
    rows = session.exec(
        select(TopupPayment.amount_atomic).where(
            TopupPayment.deposit_address_id == address_id, TopupPayment.status == "held"
        )
    ).all()
    return sum(int(a) for a in rows)


def address_out(
    ctx: AppContext, session: Session, row: DepositAddressRow, payment: TopupPayment | None = None
) -> DepositAddressOut:
    """The standing address as the API shows it (no QR code), read in ``session``; ``payment``: the
    receipt a ``deposit_address.*`` event is about."""
    coin = ctx.coins.get(row.coin)
    decimals = coin.decimals if coin is not None else 0
    return DepositAddressOut(
        coin=row.coin,
        address=row.address,
        network=row.network,
        minimum_usd=micros_to_usd(minimum_micros(ctx)),
        held_amount=format_atomic(_held_atomic(session, row.id or 0), decimals),
        confirmations_required=coin.confirmations if isinstance(coin, DepositCoin) else 0,
        qr_data_uri=None,
        created_at=row.created_at,
        payment=payment_out(ctx, payment) if payment is not None else None,
    )


def emit_receipt_event(ctx: AppContext, session: Session, kind: str, payment: TopupPayment, now: Any) -> None:
    """``deposit_address.payment_<kind>`` (seen, held, dropped) for a receipt at a standing address."""
    address = session.get(DepositAddressRow, payment.deposit_address_id)
    if address is None:
        return
    name = {
        "seen": "deposit_address.payment_seen",
        "held": "deposit_address.payment_held",
        "dropped": "deposit_address.payment_dropped",
    }[kind]
    events.emit(session, name, address.account_id, address_out(ctx, session, address, payment), now=now)


def credit_standing(
    ctx: AppContext, payment_id: int, decimals: int, rate: Decimal, minimum: int, usd_value: Any
) -> bool:
    """Credit (or hold) one confirmed receipt of a standing address at ``rate``.

    Below ``minimum`` micro-dollars together with the receipts already held there it is held;
    otherwise it and the held ones become one completed top-up, each receipt its own ledger entry.
    Returns whether the receipt changed state (False: another worker got there first).
    """
    now = ctx.clock.now()
    with ctx.db.session() as session:
        locking = session.get_bind().dialect.name == "postgresql"
        stmt = select(TopupPayment).where(TopupPayment.id == payment_id)
        payment = session.exec(stmt.with_for_update() if locking else stmt).first()
        if payment is None or payment.status != "seen" or payment.deposit_address_id is None:
            return False
        addr_stmt = select(DepositAddressRow).where(DepositAddressRow.id == payment.deposit_address_id)
        address = session.exec(addr_stmt.with_for_update() if locking else addr_stmt).first()
        assert address is not None
        held = list(
            session.exec(
                select(TopupPayment)
                .where(
                    TopupPayment.deposit_address_id == address.id,
                    TopupPayment.status == "held",
                    TopupPayment.coin == payment.coin,
                )
                .order_by(col(TopupPayment.id))
            ).all()
        )
        batch = [*held, payment]
        values = [usd_value(int(p.amount_atomic), decimals, rate) for p in batch]
        if sum(values) < minimum:
            payment.status = "held"
            payment.rate = str(rate)
            session.add(payment)
            emit_receipt_event(ctx, session, "held", payment, now)
            log.info(
                "held %s payment %s to standing address %s: %s micro-USD with the held ones, below %s",
                payment.coin,
                payment.identity,
                address.address,
                sum(values),
                minimum,
            )
            return True
        topup = Topup(
            ref=new_ref(),
            account_id=address.account_id,
            coin=payment.coin,  # the coin that arrived (USDT sent to the ETH address: a USDT top-up)
            status="completed",
            amount_micros=sum(values),
            rate=str(rate),
            deposit_address=address.address,
            deposit_amount_atomic=str(sum(int(p.amount_atomic) for p in batch)),
            deposit_network=address.network,
            deposit_address_id=address.id,
            registered=True,
            created_at=now,
            expires_at=now,
            completed_at=now,
        )
        session.add(topup)
        session.flush()
        for row, micros in zip(batch, values, strict=True):
            entry_id = None
            if micros > 0:
                posting = ledger.post(
                    session,
                    row.account_id,
                    micros,
                    "topup",
                    ref=topup.ref,
                    dedupe_key=f"topup:{row.coin}:{row.identity}",
                    memo=f"{row.amount_atomic} atomic {row.coin} at {rate} USD (tx {row.txid}, standing address)"[:500],
                    now=now,
                )
                entry_id = posting.entry.id
                micros = posting.entry.amount_micros
            row.topup_id = saved_id(topup)
            row.status = "credited"
            row.rate = str(rate)
            row.credited_micros = micros
            row.ledger_entry_id = entry_id
            row.credited_at = now
            session.add(row)
        session.flush()
        events.emit(session, "topup.created", topup.account_id, topup_event(ctx, session, topup), now=now)
        for i, row in enumerate(batch):
            emit_payment_credited(session, ctx, topup, row, i == len(batch) - 1, now)
        log.info(
            "credited %s micro-USD to account %s for %s receipt(s) at standing %s address %s (top-up %s)",
            topup.amount_micros,
            topup.account_id,
            len(batch),
            topup.coin,
            address.address,
            topup.ref,
        )
    return True
