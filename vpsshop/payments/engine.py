"""The payment engine: creates top-ups, reads them, cancels and expires them, and credits payments.

Every balance change goes through :func:`vpsshop.ledger.post` with the dedupe key
``topup:<coin>:<identity>`` (the chain's identity of the payment: ``txid:vout`` ...), so a payment
is credited once whatever number of workers, retries or rescans report it. The row of the payment
is locked (PostgreSQL ``FOR UPDATE``; SQLite serialises writers with ``BEGIN IMMEDIATE``) while it
is credited, and the ledger's unique dedupe key backs that up.

Valuation: a payment first seen while its top-up is pending is valued at the top-up's locked rate;
one first seen after the top-up expired or was cancelled (``late``) at the rate of the moment it is
credited. Under- and over-payments are credited for what arrived, to the micro-dollar (rounded down).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import ROUND_CEILING, ROUND_DOWN, Decimal
from typing import Any

import sqlalchemy as sa
from anyio import to_thread
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from vpsshop import events, ledger
from vpsshop.coins import DepositCoin, PaymentCheck, PaymentCoin, X402Coin
from vpsshop.coins import DetectedPayment as Found  # the coin's report
from vpsshop.context import AppContext, StateKey
from vpsshop.errors import ApiError, BadRequest, ConfigError, NotFound, PluginError
from vpsshop.models import saved_id
from vpsshop.money import MICROS_PER_USD
from vpsshop.payments import standing
from vpsshop.payments.models import AddressCounter, Topup, TopupPayment, X402Record, new_ref
from vpsshop.payments.rates import RateService
from vpsshop.payments.resource import TopupView, emit_payment_credited, make_view, read_view, topup_event
from vpsshop.settings import TopupSettings

log = logging.getLogger("vpsshop.payments")


def usd_value_micros(amount_atomic: int, decimals: int, rate: Decimal) -> int:
    """Micro-dollars an amount of coin is worth at ``rate`` USD per unit, rounded down."""
    value = Decimal(amount_atomic) * rate * MICROS_PER_USD / (Decimal(10) ** decimals)
    return int(value.to_integral_value(rounding=ROUND_DOWN))


def coin_amount_atomic(amount_micros: int, decimals: int, rate: Decimal) -> int:
    """Atomic units of coin needed to cover ``amount_micros`` at ``rate``, rounded up."""
    value = Decimal(amount_micros) * (Decimal(10) ** decimals) / (rate * MICROS_PER_USD)
    return int(value.to_integral_value(rounding=ROUND_CEILING))


class PaymentEngine:
    """The top-up engine of one app or worker. Built by :func:`vpsshop.payments.engine_for`."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.settings: TopupSettings = ctx.settings.topups
        self.rates = RateService(ctx)
        self.default_coin = self._pick_default_coin()
        from vpsshop.payments.watcher import Watcher

        self.watcher = Watcher(self)

    # ---- coins ----------------------------------------------------------------------------------

    def _pick_default_coin(self) -> str | None:
        wanted = self.settings.default_coin
        if wanted is not None:
            if wanted not in self.ctx.coins:
                raise ConfigError(f"setting 'topups.default_coin' names coin {wanted!r}, which is not enabled")
            return wanted
        ranked = [
            (coin.default_priority, -i, code)
            for i, (code, coin) in enumerate(self.ctx.coins.items())
            if isinstance(coin, DepositCoin) and coin.default_priority is not None
        ]
        if ranked:
            return max(ranked)[2]
        return next(iter(self.ctx.coins), None)

    def coin(self, code: str | None) -> PaymentCoin[Any]:
        """The enabled coin ``code`` (the default when None). :raises BadRequest: invalid_coin."""
        if code is None:
            code = self.default_coin
        coin = self.ctx.coins.get(code.upper()) if code else None
        if coin is None:
            offered = ", ".join(self.ctx.coins) or "none"
            raise BadRequest("invalid_coin", f"Coin {code!r} is not offered by this shop (offered: {offered}).")
        return coin

    def x402_coin(self) -> X402Coin:
        for coin in self.ctx.coins.values():
            if isinstance(coin, X402Coin):
                return coin
        raise BadRequest("invalid_coin", "x402 payments are not offered by this shop.")

    def deposit_coins(self) -> list[DepositCoin[Any]]:
        return [c for c in self.ctx.coins.values() if isinstance(c, DepositCoin)]

    # ---- creating ---------------------------------------------------------------------------------

    async def create_topup(
        self, account_id: int, amount_micros: int, coin: DepositCoin[Any], idempotency_key: str | None
    ) -> Topup:
        """A new pending top-up with its own deposit address, or the earlier one for this key."""
        if idempotency_key is not None:
            earlier = await to_thread.run_sync(self._by_idempotency_key, account_id, idempotency_key)
            if earlier is not None:
                return self._check_same_request(earlier, amount_micros, coin.code)
        quote = await self.rates.price(coin.rate_symbol)
        amount_atomic = coin_amount_atomic(amount_micros, coin.decimals, quote.usd)
        try:
            topup = await to_thread.run_sync(
                self._insert_deposit_topup, account_id, amount_micros, coin, quote.usd, amount_atomic, idempotency_key
            )
        except IntegrityError:
            # Two requests with one Idempotency-Key raced: the first one's row wins.
            earlier = await to_thread.run_sync(self._by_idempotency_key, account_id, idempotency_key)
            if earlier is None:
                raise
            return self._check_same_request(earlier, amount_micros, coin.code)
        await self.register(coin, topup)
        return topup

    def _check_same_request(self, earlier: Topup, amount_micros: int, coin: str) -> Topup:
        if earlier.amount_micros != amount_micros or earlier.coin != coin:
            raise ApiError(
                409,
                "idempotency_key_reused",
                f"This Idempotency-Key was used for top-up {earlier.ref} with a different amount or coin.",
            )
        return earlier

    def _by_idempotency_key(self, account_id: int, key: str | None) -> Topup | None:
        with self.ctx.db.session() as session:
            return session.exec(
                select(Topup).where(Topup.account_id == account_id, Topup.idempotency_key == key)
            ).first()

    def allocate_index(self, session: Session, coin: DepositCoin[Any], *, key_id: str | None = None) -> int:
        """The next unused address index of ``coin``'s key (1, 2, 3 ...), atomically; ``key_id``
        names another counter (``standing:<key id>`` numbers standing addresses)."""
        key_id = coin.key_id() if key_id is None else key_id
        for _ in range(3):
            row = session.execute(
                sa.update(AddressCounter)
                .where(col(AddressCounter.coin) == coin.code, col(AddressCounter.key_id) == key_id)
                .values(last_index=col(AddressCounter.last_index) + 1)
                .returning(col(AddressCounter.last_index))
            ).first()
            if row is not None:
                return int(row[0])
            savepoint = session.begin_nested()
            try:
                session.add(AddressCounter(coin=coin.code, key_id=key_id, last_index=1))
                session.flush()
                savepoint.commit()
                return 1
            except IntegrityError:
                savepoint.rollback()
        raise RuntimeError("could not allocate a deposit address index")  # pragma: no cover

    def _insert_deposit_topup(
        self,
        account_id: int,
        amount_micros: int,
        coin: DepositCoin[Any],
        rate: Decimal,
        amount_atomic: int,
        idempotency_key: str | None,
    ) -> Topup:
        now = self.ctx.clock.now()
        with self.ctx.db.session() as session:
            index = self.allocate_index(session, coin)
            address = coin.derive_address(index)
            topup = Topup(
                ref=new_ref(),
                account_id=account_id,
                coin=coin.code,
                status="pending",
                amount_micros=amount_micros,
                rate=str(rate),
                deposit_address=address.address,
                deposit_amount_atomic=str(amount_atomic),
                deposit_network=coin.network,
                address_index=index,
                watch_key=address.watch_key,
                idempotency_key=idempotency_key,
                registered=not coin.can_scan or type(coin).register_address is DepositCoin.register_address,
                created_at=now,
                expires_at=now + timedelta(minutes=self.settings.expiry_minutes),
            )
            session.add(topup)
            session.flush()
            events.emit(session, "topup.created", account_id, topup_event(self.ctx, session, topup), now=now)
            return topup

    async def register(self, coin: DepositCoin[Any], topup: Topup) -> None:
        """Tell the coin's node about the address; on failure the watcher retries later."""
        if topup.registered or topup.address_index is None:
            return
        try:
            await coin.register_address(coin.derive_address(topup.address_index))
        except PluginError as exc:
            log.warning("could not register %s address of top-up %s yet: %s", coin.code, topup.ref, exc)
            return
        await to_thread.run_sync(self._mark_registered, saved_id(topup))
        topup.registered = True

    def _mark_registered(self, topup_id: int) -> None:
        with self.ctx.db.session() as session:
            session.execute(sa.update(Topup).where(col(Topup.id) == topup_id).values(registered=True))

    # ---- reading ----------------------------------------------------------------------------------

    async def get_topup(self, account_id: int, ref: str) -> TopupView:
        """The caller's top-up ``ref``; expires it if due and, rate-limited, checks its chain first."""
        view = await to_thread.run_sync(self._read, account_id, ref)
        topup = view.topup
        if topup.status != "pending":
            return view
        coin = self.ctx.coins.get(topup.coin)
        if isinstance(coin, DepositCoin) and coin.can_scan and await self.watcher.poke(coin.scan_group):
            view = await to_thread.run_sync(self._read, account_id, ref)
        if view.topup.status == "pending" and view.topup.expires_at <= self.ctx.clock.now():
            await to_thread.run_sync(self.expire_due, view.topup.id)
            view = await to_thread.run_sync(self._read, account_id, ref)
        return view

    def _read(self, account_id: int, ref: str) -> TopupView:
        with self.ctx.db.session() as session:
            topup = session.exec(select(Topup).where(Topup.ref == ref, Topup.account_id == account_id)).first()
            if topup is None:
                raise NotFound("top-up")
            return read_view(session, topup)

    def recent_topups(self, account_id: int, limit: int = 10) -> list[Topup]:
        """The account's newest top-ups, newest first (as stored; :meth:`get_topup` refreshes one)."""
        with self.ctx.db.session() as session:
            return list(
                session.exec(
                    select(Topup).where(col(Topup.account_id) == account_id).order_by(col(Topup.id).desc()).limit(limit)
                ).all()
            )

    # ---- cancelling and expiring --------------------------------------------------------------------

    async def cancel_topup(self, account_id: int, ref: str) -> TopupView:
        return await to_thread.run_sync(self._cancel, account_id, ref)

    def _cancel(self, account_id: int, ref: str) -> TopupView:
        now = self.ctx.clock.now()
        with self.ctx.db.session() as session:
            topup = _lock(session, select(Topup).where(Topup.ref == ref, Topup.account_id == account_id))
            if topup is None:
                raise NotFound("top-up")
            payments = list(session.exec(select(TopupPayment).where(TopupPayment.topup_id == topup.id)).all())
            if topup.status == "pending":
                settling = (
                    topup.watch_key is None
                    and session.exec(
                        select(X402Record).where(X402Record.topup_id == topup.id, X402Record.status == "settling")
                    ).first()
                    is not None
                )
                if settling or any(p.status == "seen" for p in payments):
                    raise ApiError(
                        409,
                        "payment_in_progress",
                        "A payment to this top-up is waiting for confirmations; it will be credited, so the "
                        "top-up cannot be cancelled.",
                    )
                topup.status = "cancelled"
                topup.cancelled_at = now
                session.add(topup)
                events.emit(session, "topup.cancelled", account_id, topup_event(self.ctx, session, topup), now=now)
            elif topup.status == "completed":
                raise ApiError(409, "topup_completed", "This top-up is completed and its payment credited.")
            return make_view(topup, payments)

    def expire_due(self, topup_id: int | None = None) -> int:
        """Expire pending top-ups past ``expires_at`` that have no payment waiting for confirmations.

        Runs from the watcher (all top-ups) and from a GET (that one). Returns how many expired.
        """
        now = self.ctx.clock.now()
        waiting = sa.exists().where(col(TopupPayment.topup_id) == col(Topup.id), col(TopupPayment.status) == "seen")
        # an x402 authorization whose settlement outcome is unknown may still be mined until its
        # validBefore: the top-up stays pending until the record is settled or closed
        settling = sa.exists().where(col(X402Record.topup_id) == col(Topup.id), col(X402Record.status) == "settling")
        stmt = sa.update(Topup).where(col(Topup.status) == "pending", col(Topup.expires_at) <= now, ~waiting, ~settling)
        if topup_id is not None:
            stmt = stmt.where(col(Topup.id) == topup_id)
        with self.ctx.db.session() as session:
            expired = (
                session.execute(
                    stmt.values(status="expired").returning(col(Topup.id)).execution_options(synchronize_session=False)
                )
                .scalars()
                .all()
            )
            for topup in session.exec(select(Topup).where(col(Topup.id).in_(expired))).all():
                events.emit(session, "topup.expired", topup.account_id, topup_event(self.ctx, session, topup), now=now)
            return len(expired)

    # ---- recording and crediting payments ----------------------------------------------------------

    def record_payments(
        self,
        found: list[tuple[str, Found]],
        topups: dict[tuple[str, str], int],
        any_coin: dict[str, int] | None = None,
        standing: dict[tuple[str, str], tuple[int, int]] | None = None,
    ) -> list[int]:
        """Insert or refresh detected payments; returns the ids of those still to be credited.

        ``standing`` maps (coin, watch key) to (standing address id, account id): a payment there is
        recorded without a top-up (:mod:`vpsshop.payments.standing` makes one when it credits it).

        ``topups`` maps (coin, watch key) to a top-up id. A payment in one coin to the address of a
        top-up in another coin of the same scan group (USDT sent to an ETH top-up's address) is
        found through ``any_coin`` (watch key -> top-up id) and credited to that top-up's account
        too, valued as a late payment at the current rate of the coin that arrived.
        """
        now = self.ctx.clock.now()
        ids: list[int] = []
        for code, payment in found:
            topup_id = topups.get((code, payment.watch_key))
            address = standing.get((code, payment.watch_key)) if standing is not None else None
            if topup_id is None and address is None and any_coin is not None:
                topup_id = any_coin.get(payment.watch_key)
            if address is None and standing is not None and topup_id is None:
                # another coin of the chain sent to a standing address (USDT to the ETH one): credited too.
                # Only such a payment gets here (its key is watched and matched nothing else).
                address = next((v for (_, key), v in standing.items() if key == payment.watch_key), None)
            if topup_id is None and address is not None:
                self._record_standing(code, payment, address, now, ids)
                continue
            if topup_id is None:
                log.warning(
                    "payment %s in %s to watched key %s matches no top-up", payment.identity, code, payment.watch_key
                )
                continue
            with self.ctx.db.session() as session:
                row = session.exec(
                    select(TopupPayment).where(TopupPayment.coin == code, TopupPayment.identity == payment.identity)
                ).first()
                if row is None:
                    topup = session.get(Topup, topup_id)
                    assert topup is not None
                    row = TopupPayment(
                        coin=code,
                        identity=payment.identity,
                        topup_id=topup_id,
                        account_id=topup.account_id,
                        txid=payment.txid,
                        amount_atomic=str(payment.amount_atomic),
                        status="seen",
                        confirmations=payment.confirmations,
                        block_height=payment.block_height,
                        block_hash=payment.block_hash,
                        first_seen_at=now,
                        late=topup.status in ("expired", "cancelled") or topup.expires_at <= now or topup.coin != code,
                    )
                    savepoint = session.begin_nested()
                    try:
                        session.add(row)
                        session.flush()
                        savepoint.commit()
                    except IntegrityError:  # another worker recorded it first
                        savepoint.rollback()
                        continue
                    events.emit(
                        session,
                        "topup.payment_seen",
                        topup.account_id,
                        topup_event(self.ctx, session, topup, row),
                        now=now,
                    )
                elif row.status != "credited":
                    if row.status == "dropped" and row.topup_id is not None:  # back on chain after a reorg
                        paid = session.get(Topup, row.topup_id)
                        assert paid is not None
                        events.emit(
                            session,
                            "topup.payment_seen",
                            row.account_id,
                            topup_event(self.ctx, session, paid, row),
                            now=now,
                        )
                    row.status = "seen"
                    row.confirmations = payment.confirmations
                    row.block_height = payment.block_height
                    row.block_hash = payment.block_hash
                    session.add(row)
                if row.status == "seen":
                    ids.append(saved_id(row))
        return ids

    def _record_standing(self, code: str, payment: Found, address: tuple[int, int], now: Any, ids: list[int]) -> None:
        """Record (or refresh) a payment to a standing address: no top-up until it is credited."""
        with self.ctx.db.session() as session:
            row = session.exec(
                select(TopupPayment).where(TopupPayment.coin == code, TopupPayment.identity == payment.identity)
            ).first()
            if row is None:
                row = TopupPayment(
                    coin=code,
                    identity=payment.identity,
                    deposit_address_id=address[0],
                    account_id=address[1],
                    txid=payment.txid,
                    amount_atomic=str(payment.amount_atomic),
                    status="seen",
                    confirmations=payment.confirmations,
                    block_height=payment.block_height,
                    block_hash=payment.block_hash,
                    first_seen_at=now,
                )
                savepoint = session.begin_nested()
                try:
                    session.add(row)
                    session.flush()
                    savepoint.commit()
                except IntegrityError:  # another worker recorded it first
                    savepoint.rollback()
                    return
                standing.emit_receipt_event(self.ctx, session, "seen", row, now)
            elif row.status in ("seen", "dropped"):
                if row.status == "dropped":  # back on chain after a reorg
                    standing.emit_receipt_event(self.ctx, session, "seen", row, now)
                row.status = "seen"
                row.confirmations = payment.confirmations
                row.block_height = payment.block_height
                row.block_hash = payment.block_hash
                session.add(row)
            if row.status == "seen":
                ids.append(saved_id(row))

    def seen_payments(self, coins: list[str]) -> list[TopupPayment]:
        with self.ctx.db.session() as session:
            return list(
                session.exec(
                    select(TopupPayment).where(col(TopupPayment.status) == "seen", col(TopupPayment.coin).in_(coins))
                ).all()
            )

    def apply_checks(self, checks: list[PaymentCheck], coin: str) -> None:
        """Store what :meth:`DepositCoin.recheck` said; a vanished payment becomes ``dropped``."""
        with self.ctx.db.session() as session:
            for check in checks:
                values: dict[str, Any]
                if check.present:
                    values = {
                        "confirmations": check.confirmations,
                        "block_height": check.block_height,
                        "block_hash": check.block_hash,
                    }
                else:
                    values = {"status": "dropped", "confirmations": 0}
                    log.warning("%s payment %s left the chain before its confirmations", coin, check.identity)
                    gone = session.exec(
                        select(TopupPayment).where(
                            TopupPayment.coin == coin,
                            TopupPayment.identity == check.identity,
                            TopupPayment.status == "seen",
                        )
                    ).first()
                    if gone is not None and gone.deposit_address_id is not None and gone.topup_id is None:
                        gone.status = "dropped"
                        gone.confirmations = 0
                        standing.emit_receipt_event(self.ctx, session, "dropped", gone, self.ctx.clock.now())
                    if gone is not None and gone.topup_id is not None:
                        paid = session.get(Topup, gone.topup_id)
                        assert paid is not None
                        events.emit(
                            session,
                            "topup.payment_dropped",
                            gone.account_id,
                            topup_event(self.ctx, session, paid, gone),
                            now=self.ctx.clock.now(),
                        )
                session.execute(
                    sa.update(TopupPayment)
                    .where(
                        col(TopupPayment.coin) == coin,
                        col(TopupPayment.identity) == check.identity,
                        col(TopupPayment.status) == "seen",
                    )
                    .values(**values)
                )

    async def credit_confirmed(self, coin: DepositCoin[Any]) -> int:
        """Credit every seen payment of ``coin`` with enough confirmations. Returns how many."""
        ready = [
            p
            for p in await to_thread.run_sync(self.seen_payments, [coin.code])
            if p.confirmations >= coin.confirmations
        ]
        credited = 0
        for payment in ready:
            rate: Decimal | None = None
            if payment.deposit_address_id is not None:  # a standing address: the rate of now
                try:
                    rate = (await self.rates.price(coin.rate_symbol)).usd
                except ApiError as exc:
                    log.warning("%s payment %s waits for a rate: %s", coin.code, payment.identity, exc.message)
                    continue
                if await to_thread.run_sync(
                    standing.credit_standing,
                    self.ctx,
                    saved_id(payment),
                    coin.decimals,
                    rate,
                    standing.minimum_micros(self.ctx),
                    usd_value_micros,
                ):
                    credited += 1
                continue
            if payment.late:
                try:
                    rate = (await self.rates.price(coin.rate_symbol)).usd
                except ApiError as exc:
                    log.warning("late %s payment %s waits for a rate: %s", coin.code, payment.identity, exc.message)
                    continue
            if await to_thread.run_sync(self._credit, saved_id(payment), coin.decimals, rate):
                credited += 1
        return credited

    def _credit(self, payment_id: int, decimals: int, late_rate: Decimal | None) -> bool:
        now = self.ctx.clock.now()
        with self.ctx.db.session() as session:
            payment = _lock(session, select(TopupPayment).where(TopupPayment.id == payment_id))
            if payment is None or payment.status != "seen" or payment.topup_id is None:
                return False
            topup = session.get(Topup, payment.topup_id)
            assert topup is not None
            rate = late_rate if (payment.late and late_rate is not None) else Decimal(topup.rate)
            micros = usd_value_micros(int(payment.amount_atomic), decimals, rate)
            entry_id = None
            if micros > 0:
                posting = ledger.post(
                    session,
                    payment.account_id,
                    micros,
                    "topup",
                    ref=topup.ref,
                    dedupe_key=f"topup:{payment.coin}:{payment.identity}",
                    memo=f"{payment.amount_atomic} atomic {payment.coin} at {rate} USD (tx {payment.txid})"[:500],
                    now=now,
                )
                entry_id = posting.entry.id
                micros = posting.entry.amount_micros
            payment.status = "credited"
            payment.rate = str(rate)
            payment.credited_micros = micros
            payment.ledger_entry_id = entry_id
            payment.credited_at = now
            session.add(payment)
            completes = topup.status != "completed" and micros > 0
            if completes:  # dust worth no micro-dollar completes nothing
                topup.status = "completed"
                topup.completed_at = now
                session.add(topup)
            emit_payment_credited(session, self.ctx, topup, payment, completes, now)
            log.info(
                "credited %s micro-USD to account %s for %s payment %s (top-up %s)",
                micros,
                payment.account_id,
                payment.coin,
                payment.identity,
                topup.ref,
            )
        return True


def _lock(session: Session, stmt: Any) -> Any:
    """The first row of ``stmt``, locked for this transaction on PostgreSQL."""
    if session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update()
    return session.exec(stmt).first()


ENGINE = StateKey[PaymentEngine]("payments")
"""The payment engine of one shop (:func:`vpsshop.payments.engine_for`)."""
