"""Renewing a server by hand: a quote that writes nothing, and the renewal itself, paid from the
balance or by x402 in the same call, for one or more billing cycles.

Automatic renewals are the lifecycle's (:mod:`vpsshop.servers.lifecycle`, whose :func:`renew` both
use). A renewal under an idempotency key (an ``Idempotency-Key``, or the x402 payment that pays it)
is made once: the same key with the same input answers the first renewal again, with another input
it is a 409 ``idempotency_key_reused`` (:mod:`vpsshop.idempotency`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from anyio import to_thread
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError

from vpsshop import idempotency, limits
from vpsshop.accounts import read_summary
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict
from vpsshop.inputs import Input, JsonInt
from vpsshop.ledger import InsufficientBalance
from vpsshop.models import Server
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.servers.lifecycle import RenewalRaced, check_not_admin_suspended, max_periods, policy, renew, renewal_terms
from vpsshop.servers.orders import QuoteOut, quote
from vpsshop.servers.resource import ServerOut, owned, server_out
from vpsshop.x402 import purchases
from vpsshop.x402.offers import SettledPayment, SignedPayment

__all__ = ["RENEWAL_DESCRIPTION", "RenewInput", "RenewOut", "Renewed", "quote_renewal", "renew_server"]

RENEWAL_DESCRIPTION = "Pays what the balance lacks for renewing this server; it is renewed with the paid re-send."
OPERATION = "renewal"


class RenewInput(Input):
    """Optional body of ``POST /servers/{id}/renew`` and ``POST /servers/{id}/renew/quote``."""

    periods: JsonInt = Field(
        1,
        ge=1,
        le=120,
        description="Billing cycles to pay for at once, default 1; a JSON integer (not a string or a boolean), "
        "capped by the prepay horizon (servers.max_prepay_days, default 1100 days) (invalid_periods).",
    )


class RenewOut(BaseModel):
    server: ServerOut
    charged_usd: UsdAmount = Field(description="What this renewal charged from the balance.")


@dataclass(frozen=True)
class Renewed:
    """What :func:`renew_server` did: the renewal, whether it is the answer of an earlier one under the
    same key or payment, and the x402 settlement that paid it."""

    renewal: RenewOut
    replayed: bool = False
    settled: SettledPayment | None = None


def _renewable(ctx: AppContext, server: Server, periods: int, now: datetime) -> int:
    """Check the server can be renewed for ``periods`` now; return the most periods allowed."""
    if server.status not in ("active", "suspended"):
        raise Conflict(
            "server_not_renewable", f"A {server.status} server cannot be renewed (only active or suspended ones)."
        )
    check_not_admin_suspended(server)
    pol = policy(ctx)
    most = max_periods(pol, server, now)
    if periods > most:
        raise BadRequest(
            "invalid_periods",
            f"At most {most} period(s) can be paid now: a renewal may not move "
            f"expires_at more than {pol.max_prepay_days} days past now (the prepay horizon).",
            max_periods=most,
        )
    return most


async def quote_renewal(ctx: AppContext, customer: Customer, server_id: int, data: RenewInput) -> QuoteOut:
    """What :func:`renew_server` would charge now: the same :func:`renewal_terms`, nothing written."""

    def run() -> QuoteOut:
        limits.count_write(ctx, customer.account_id)
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id)
            now = ctx.clock.now()
            most = _renewable(ctx, server, data.periods, now)
            price, expires_at = renewal_terms(server, now, data.periods)
            balance = read_summary(session, customer.account_id).balance_micros
            return quote(price, data.periods, price // data.periods, balance, expires_at, most)

    return await to_thread.run_sync(run)


def _digest(server_id: int, data: RenewInput) -> str:
    return idempotency.digest({"server_id": server_id, "periods": data.periods})


def _recall(ctx: AppContext, account_id: int, key: str, digest: str) -> RenewOut | None:
    with ctx.db.session() as session:
        stored = idempotency.recall(session, account_id, OPERATION, key, digest)
    return RenewOut.model_validate_json(stored) if stored is not None else None


def _renew(
    ctx: AppContext,
    account_id: int,
    server_id: int,
    periods: int,
    *,
    key: str | None = None,
    digest: str = "",
    paid_by: int | None = None,
) -> tuple[RenewOut, bool]:
    """Renew ``periods`` cycles from the balance; (the renewal, whether it replays an earlier one).
    ``key``: remembered with the answer in the same transaction. ``paid_by``: the x402 record that paid
    for it, marked done in the same transaction."""
    for _ in range(3):
        try:
            with ctx.db.session() as session:
                server = owned(session, account_id, server_id, lock=True)
                now = ctx.clock.now()
                _renewable(ctx, server, periods, now)
                result = renew(session, server, now, by="customer", periods=periods)
                if paid_by is not None:
                    purchases.mark_done(session, paid_by)
                out = RenewOut(server=server_out(result.server), charged_usd=micros_to_usd(result.charged_micros))
                if key is not None:
                    idempotency.remember(session, account_id, OPERATION, key, digest, out, now)
                return out, False
        except RenewalRaced:
            continue
        except IntegrityError:
            if key is None:
                raise
            replay = _recall(ctx, account_id, key, digest)  # the same key won a race a moment ago
            if replay is None:
                raise
            return replay, True
    raise Conflict("server_busy", "The server changed while renewing; retry.")


def _terms(ctx: AppContext, account_id: int, server_id: int, periods: int) -> tuple[int, int]:
    """(price of ``periods`` cycles, balance) of a renewable server. :raises ApiError: 404, 409, 400 as _renew."""
    with ctx.db.session() as session:
        server = owned(session, account_id, server_id)
        now = ctx.clock.now()
        _renewable(ctx, server, periods, now)
        price, _ = renewal_terms(server, now, periods)
        return price, read_summary(session, account_id).balance_micros


async def renew_server(
    ctx: AppContext,
    customer: Customer,
    server_id: int,
    data: RenewInput,
    *,
    idempotency_key: str | None = None,
    payment: SignedPayment | None = None,
) -> Renewed:
    """Charge ``data.periods`` billing cycles now and move ``expires_at`` as many cycles on; a server
    suspended for non-payment becomes active again (its VM is started).

    :raises InsufficientBalance: 402, nothing charged; with the x402 requirements for the deficit
        (``exc.offer``) when the shop takes x402.
    :raises BadRequest: invalid_periods (past the prepay horizon; ``max_periods``).
    :raises Conflict: server_not_renewable, server_admin_suspended, idempotency_key_reused.
    :raises NotFound: not the account's server.
    """
    account_id = customer.account_id
    digest = _digest(server_id, data)
    if payment is not None:
        return await _paid_renewal(ctx, customer, server_id, data, idempotency_key, payment, digest)
    if idempotency_key is not None:
        replay = await to_thread.run_sync(_recall, ctx, account_id, idempotency_key, digest)
        if replay is not None:
            return Renewed(replay, True)

    def run() -> tuple[RenewOut, bool]:
        limits.count_write(ctx, account_id)
        return _renew(ctx, account_id, server_id, data.periods, key=idempotency_key, digest=digest)

    try:
        out, replayed = await to_thread.run_sync(run)
    except InsufficientBalance as exc:
        raise purchases.offer_deficit(
            ctx, exc, f"/servers/{server_id}/renew", RENEWAL_DESCRIPTION, "/servers/{id}/renew"
        ) from None
    return Renewed(out, replayed)


async def _paid_renewal(
    ctx: AppContext,
    customer: Customer,
    server_id: int,
    data: RenewInput,
    idempotency_key: str | None,
    payment: SignedPayment,
    digest: str,
) -> Renewed:
    """A renewal sent with an x402 payment: settle and credit it, then renew, once per payment."""
    account_id = customer.account_id
    coin, decoded = purchases.decode(ctx, payment)
    key = purchases.payment_key(idempotency_key, decoded)
    purpose = f"renew:{server_id}"

    def replayed_settlement() -> SettledPayment | None:
        return purchases.replayed_settlement(
            ctx, coin, decoded, payment.version, account_id=account_id, purpose=purpose
        )

    replay = await to_thread.run_sync(_recall, ctx, account_id, key, digest)
    if replay is not None:
        return Renewed(replay, True, await to_thread.run_sync(replayed_settlement))
    earlier = await to_thread.run_sync(purchases.recorded, ctx, coin, decoded)
    if earlier is not None and earlier.purpose == purpose and earlier.outcome == "done" and earlier.status == "settled":
        # paid a renewal before answers were kept under their key: answer with the server as it is now
        current = await to_thread.run_sync(_current, ctx, account_id, server_id)
        return Renewed(
            RenewOut(server=current, charged_usd=current.price_usd),
            True,
            await to_thread.run_sync(replayed_settlement),
        )
    await to_thread.run_sync(limits.count_write, ctx, account_id)
    price, balance = await to_thread.run_sync(_terms, ctx, account_id, server_id, data.periods)
    paid = await purchases.settle_for(
        ctx,
        coin,
        decoded,
        payment,
        account_id=account_id,
        price_micros=price,
        balance_micros=balance,
        path=f"/servers/{server_id}/renew",
        description=RENEWAL_DESCRIPTION,
        purpose=purpose,
    )
    out, replayed = await purchases.fulfil(
        paid,
        "the renewal",
        lambda: _renew(ctx, account_id, server_id, data.periods, key=key, digest=digest, paid_by=paid.record_id),
    )
    return Renewed(out, replayed, paid.settled)


def _current(ctx: AppContext, account_id: int, server_id: int) -> ServerOut:
    with ctx.db.session() as session:
        return server_out(owned(session, account_id, server_id))
