"""Paying an order or a renewal by x402 in the same call: the 402 is the price list.

``POST /servers`` and ``POST /servers/{id}/renew`` answer a short balance with the seed's 402
``insufficient_balance`` body (``error``, ``message``, ``price``, ``balance``, ``deficit``); when the
shop offers an x402 coin the same answer also carries the x402 payment requirements for the deficit:
``x402Version`` and ``accepts`` in the body (v1) and the ``PAYMENT-REQUIRED`` header (v2). An
unmodified x402 client signs and re-sends the request with ``X-PAYMENT`` or ``PAYMENT-SIGNATURE``;
the re-send settles the authorization, credits it to the balance as a completed top-up and then
makes the order or the renewal, in that order:

* the authorization must pay at least the deficit of the moment and at most the price (anything else
  is a 402 ``wrong_amount`` and nothing moves);
* the payment is recorded under (payer, nonce) with its purpose before it is settled (see
  :func:`vpsshop.x402.settlement.pay`), so it is credited once whatever is re-sent;
* the same payment never buys twice: an order's idempotency key is the ``Idempotency-Key`` header,
  else the id of the v2 ``payment-identifier`` extension, else the authorization itself
  (``x402:<payer>:<nonce>``); a renewal paid by an authorization is marked done in the renewal's own
  transaction;
* when the order or renewal cannot be made after the payment settled, the answer is its own error
  (status and code) with a ``payment`` object and a message saying that the money was credited to
  the balance, where it stays.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from anyio import to_thread
from sqlmodel import Session, col, select

from vpsshop.coins import X402Coin, X402Payment, X402Rejected, X402Settlement
from vpsshop.context import AppContext
from vpsshop.errors import ApiError, BadRequest
from vpsshop.ledger import InsufficientBalance
from vpsshop.money import MICROS_PER_USD, micros_to_usd
from vpsshop.payments.models import Topup, X402Record
from vpsshop.x402 import messages, settlement
from vpsshop.x402.offers import PaidButFailed, SettledPayment, ShortBalance, SignedPayment, offer_in

T = TypeVar("T")

ORDER_DESCRIPTION = "Pays what the balance lacks for this server order; the order is placed with the paid re-send."
RENEWAL_DESCRIPTION = "Pays what the balance lacks for renewing this server; it is renewed with the paid re-send."


def offered_coins(ctx: AppContext) -> list[X402Coin]:
    """The shop's x402 coins in the catalog's coin order (empty when it takes no x402 payments):
    a 402 of an order, a renewal or a sign-up lists one ``accepts`` entry per coin."""
    return [coin for coin in ctx.coins.values() if isinstance(coin, X402Coin)]


def offered_coin(ctx: AppContext) -> X402Coin | None:
    """The shop's first x402 coin, or None when it takes no x402 payments."""
    coins = offered_coins(ctx)
    return coins[0] if coins else None


def _networks(ctx: AppContext, coin: X402Coin) -> set[str]:
    """The network names ``coin``'s requirements state: the v1 name and the v2 (CAIP-2) one."""
    accepts = coin.payment_requirements(1, ctx.settings.public_url, "-")
    names = {str(accepts.get("network"))}
    try:
        names.add(str(coin.payment_requirements_v2(accepts).get("network")))
    except NotImplementedError:
        pass
    return names


def paying_coin(ctx: AppContext, signed: SignedPayment) -> X402Coin | None:
    """The x402 coin a signed payment pays in: the one whose network it names (v1 ``network``, v2
    ``accepted.network``); the first coin when none matches, whose reading then refuses it."""
    coins = offered_coins(ctx)
    if len(coins) < 2:
        return coins[0] if coins else None
    network = messages.payment_network(signed.value)
    for coin in coins:
        if network is not None and network in _networks(ctx, coin):
            return coin
    return coins[0]


def offer_deficit(
    ctx: AppContext, exc: InsufficientBalance, path: str, description: str, operation_path: str | None = None
) -> InsufficientBalance:
    """``exc`` (an order's or a renewal's short balance), with the x402 requirements for the deficit when
    the shop takes x402 (a :class:`~vpsshop.x402.offers.ShortBalance`). ``path`` is the paid resource
    (``/servers/7/renew``), ``operation_path`` its path as the API describes it when it differs."""
    coins = offered_coins(ctx)
    if not coins:
        return exc
    deficit = exc.price_micros - exc.balance_micros
    return ShortBalance(
        exc.price_micros, exc.balance_micros, offer_in(ctx, coins, deficit, path, description, operation_path)
    )


def offer_signup(ctx: AppContext, price_micros: int, path: str, description: str) -> InsufficientBalance:
    """The 402 of an operation sent without an API key that x402 may pay in full (pay as sign-up): the
    short balance of an account yet to be made, whose ``error`` is ``payment_required``."""
    coins = offered_coins(ctx)
    assert coins
    short = ShortBalance(price_micros, 0, offer_in(ctx, coins, price_micros, path, description))
    short.error = "payment_required"
    short.message = (
        f"No API key: pay {micros_to_usd(price_micros)} USD by x402 (accepts, or PAYMENT-REQUIRED) and re-send this "
        "request with the payment. The paying wallet owns the account the order goes to, created by its first "
        "payment; the answer shows that account's API key and login token once (account)."
    )
    return short


@dataclass(frozen=True)
class Paid:
    """A settled and credited authorization."""

    coin: X402Coin
    topup: Topup
    settlement: X402Settlement
    record_id: int
    version: int
    held: bool = False
    """Verified and held until the server is ready (:func:`hold_for`), not settled yet."""

    @property
    def settled(self) -> SettledPayment:
        return SettledPayment(self.coin, self.settlement, self.version, "server_ready" if self.held else None)

    def summary(self) -> dict[str, Any]:
        return {
            "topup": self.topup.ref,
            "credited_usd": micros_to_usd(self.topup.amount_micros),
            "transaction": self.settlement.transaction,
        }


def replayed_settlement(
    ctx: AppContext, coin: X402Coin, payment: X402Payment, version: int, *, account_id: int, purpose: str
) -> SettledPayment | None:
    """What the answer of a replayed order or renewal reports, as a replayed top-up does: the settlement
    that paid for ``purpose`` on this account (this very authorization if it did, else the latest one; the
    re-sent authorization itself then moved nothing). An order's authorization still held until its
    server is ready (``[x402] settle = "on_ready"``, or sent at readiness and not seen on chain yet) is
    reported held, as the first answer reported it. None when no x402 payment paid it (the balance did,
    or the held one was dropped)."""
    found = paid_for(ctx, coin, payment, account_id, purpose)
    if found is None:
        return None
    settled, held = found
    return SettledPayment(coin, settled, version, "server_ready" if held else None)


def paid_for(
    ctx: AppContext, coin: X402Coin, payment: X402Payment, account_id: int, purpose: str
) -> tuple[X402Settlement, bool] | None:
    """The authorization that paid for ``purpose`` (see :func:`replayed_settlement`) and whether it is
    held (credited, not settled yet: its ``transaction`` is empty)."""
    with ctx.db.session() as session:
        paid = (
            select(X402Record)
            .join(Topup, col(Topup.id) == col(X402Record.topup_id))
            .where(
                X402Record.coin == coin.code,
                X402Record.purpose == purpose,
                col(X402Record.status).in_(("settled", "held", "settling")),
                Topup.account_id == account_id,
            )
        )
        candidates = [
            *session.exec(
                paid.where(X402Record.payer == payment.payer.lower(), X402Record.nonce == payment.nonce.lower())
            ).all(),
            *session.exec(paid.order_by(col(X402Record.id).desc())).all(),
        ]
        # a record settling without a held credit is a settlement in flight, not (yet) a payment
        found = next(
            (
                (r, r.status != "settled")
                for r in candidates
                if r.status == "settled" or settlement.was_held(session, r)
            ),
            None,
        )
    if found is None:
        return None
    record, held = found
    own = record.payer == payment.payer.lower() and record.nonce == payment.nonce.lower()
    try:  # the payer as the coin writes it (checksummed for USDCBASE), as in the first answer
        payer = payment.payer if own else messages.decode_recorded(coin, record.header).payer
    except X402Rejected:
        payer = record.payer
    if held:
        nonce = payment.nonce if own else record.nonce  # as the first answer (:func:`hold_for`) wrote it
        return X402Settlement(payer, nonce, "", coin.network, int(record.amount_atomic)), True
    return X402Settlement(
        payer, record.nonce, record.transaction or "", record.network or "", int(record.amount_atomic)
    ), False


def decode(ctx: AppContext, signed: SignedPayment) -> tuple[X402Coin, X402Payment]:
    """The shop's x402 coin and its reading of the payment.

    :raises ApiError: 400 invalid_coin (no x402 coin), 400 invalid_payment (malformed payment).
    """
    coin = paying_coin(ctx, signed)
    if coin is None:
        raise BadRequest("invalid_coin", "x402 payments are not offered by this shop.")
    return coin, messages.decode(coin, signed.value, signed.version)


def payment_key(idempotency_key: str | None, payment: X402Payment) -> str:
    """The idempotency key of an operation paid by ``payment`` (see the module docs)."""
    if idempotency_key is not None:
        return idempotency_key
    identifier = messages.payment_identifier(payment)
    if identifier is not None:
        return f"x402-id:{identifier}"
    return f"x402:{payment.payer.lower()}:{payment.nonce.lower()}"


def recorded(ctx: AppContext, coin: X402Coin, payment: X402Payment) -> X402Record | None:
    """The record of this authorization, if it was sent before."""
    with ctx.db.session() as session:
        return session.exec(
            select(X402Record).where(
                X402Record.coin == coin.code,
                X402Record.payer == payment.payer.lower(),
                X402Record.nonce == payment.nonce.lower(),
            )
        ).first()


async def settle_for(
    ctx: AppContext,
    coin: X402Coin,
    payment: X402Payment,
    signed: SignedPayment,
    *,
    account_id: int,
    price_micros: int,
    balance_micros: int,
    path: str,
    description: str,
    purpose: str,
) -> Paid:
    """Settle ``payment`` for what an order or renewal of ``price_micros`` lacks, and credit it.

    :raises ApiError: 402 wrong_amount (less than the deficit or more than the price, nothing moved),
        the refusals and 503 of :func:`vpsshop.x402.settlement.pay`.
    """
    earlier = await to_thread.run_sync(recorded, ctx, coin, payment)
    if earlier is None:
        micros = _order_amount(ctx, coin, payment, price_micros, balance_micros)
    else:
        micros = int(earlier.amount_atomic) * MICROS_PER_USD // 10**coin.decimals
    topup, settled = await settlement.pay(
        ctx,
        coin,
        account_id,
        micros,
        signed.value,
        signed.version,
        path=path,
        description=description,
        purpose=purpose,
    )
    record = await to_thread.run_sync(recorded, ctx, coin, payment)
    assert record is not None and record.id is not None
    return Paid(coin, topup, settled, record.id, signed.version)


async def fulfil(paid: Paid, what: str, run: Callable[[], T]) -> T:
    """Make the purchase ``paid`` (:func:`settle_for`) paid for: ``run()`` in a worker thread. When it
    refuses (an :class:`ApiError`), the answer is that error, same status and code, plus ``payment``
    (top-up ref, USD credited, transaction; ``what`` names the purchase in the message): the money stays
    credited to the balance, and the settlement is reported.
    """
    try:
        return await to_thread.run_sync(run)
    except ApiError as exc:
        raise PaidButFailed(exc, paid.settled, paid.summary(), what) from None


def _order_amount(ctx: AppContext, coin: X402Coin, payment: X402Payment, price_micros: int, balance_micros: int) -> int:
    """The USD ``payment`` pays, when it pays at least the deficit and at most the price.

    :raises ApiError: 402 wrong_amount (nothing moved).
    """
    micros: int = payment.value_atomic * MICROS_PER_USD // 10**coin.decimals  # int ** int is Any to typeshed
    deficit = max(0, price_micros - balance_micros)
    if not (0 < micros <= price_micros and micros >= deficit):
        raise ApiError(
            402,
            "wrong_amount",
            f"The authorization pays {micros_to_usd(micros)} USD; this request needs at least "
            f"{micros_to_usd(deficit)} USD (the deficit) and at most {micros_to_usd(price_micros)} USD (the price). "
            "Nothing moved; ask again without a payment for the current requirements.",
            price=micros_to_usd(price_micros),
            balance=micros_to_usd(balance_micros),
            deficit=micros_to_usd(deficit),
        )
    return micros


async def hold_for(
    ctx: AppContext,
    coin: X402Coin,
    payment: X402Payment,
    signed: SignedPayment,
    *,
    account_id: int,
    price_micros: int,
    balance_micros: int,
    purpose: str,
) -> Paid:
    """An order's payment with ``[x402] settle = "on_ready"``: checked as :func:`settle_for` checks it,
    then verified and held (:func:`vpsshop.x402.settlement.hold`); the server's readiness settles it."""
    micros = _order_amount(ctx, coin, payment, price_micros, balance_micros)
    topup, _payment = await settlement.hold(
        ctx,
        coin,
        account_id,
        micros,
        signed.value,
        signed.version,
        path="/servers",
        description=ORDER_DESCRIPTION,
        purpose=purpose,
    )
    record = await to_thread.run_sync(recorded, ctx, coin, payment)
    assert record is not None and record.id is not None
    held = X402Settlement(payment.payer, payment.nonce, "", coin.network, payment.value_atomic)
    return Paid(coin, topup, held, record.id, signed.version, held=True)


def release_held(ctx: AppContext, account_id: int, purpose: str, code: str) -> None:
    """Drop the authorization held for ``purpose`` (the order it was to pay was not made)."""
    with ctx.db.session() as session:
        record = settlement.held_record(session, account_id, purpose)
        if record is not None:
            settlement.release(ctx, session, record, code)


def mark_done(session: Session, record_id: int) -> None:
    """Inside the renewal's transaction: the authorization's purpose was fulfilled."""
    record = session.get(X402Record, record_id)
    if record is not None:
        record.outcome = "done"
        session.add(record)
