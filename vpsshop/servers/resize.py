"""Resizing a server to another plan: a quote that writes nothing, and the resize itself.

The price difference for the rest of the paid period (:func:`resize_terms`, prorated to the second:
what the paid time still to come is worth at the new plan's price less what it is worth at the old
one) is charged from the balance in the same transaction that changes the server's plan and price
and queues a ``resize`` job; a balance that does not cover it is a 402 and nothing changes. A plan
that costs less charges nothing (and credits nothing). Renewals then bill the new plan.

The job (:func:`vpsshop.servers.jobs._resize`) asks the hypervisor to power the VM off, give it the
new plan's memory and vCPUs, grow its disk and start it; the guest grows its file system at that
boot. A plan with a smaller disk is refused (``disk_would_shrink``): a disk is never shrunk.
From the request until the job is done the server's ``status_reason`` says it is resizing
(``server.resizing``); the job clears it and emits ``server.resized``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from anyio import to_thread
from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop import ledger, limits
from vpsshop.accounts import read_summary
from vpsshop.actors import Customer
from vpsshop.catalog import Plan, price_cents
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict
from vpsshop.hypervisor import CAPABILITY_RESIZE
from vpsshop.inputs import Input
from vpsshop.ledger import InsufficientBalance
from vpsshop.models import LedgerEntry, Server
from vpsshop.money import MICROS_PER_CENT, UsdAmount, micros_to_usd
from vpsshop.servers.jobs import RESIZING
from vpsshop.servers.lifecycle import enqueue, record
from vpsshop.servers.models import ServerJob
from vpsshop.servers.reinstall import require_capability
from vpsshop.servers.resource import ServerOut, owned, server_event, server_out
from vpsshop.servers.termination import unused_micros
from vpsshop.x402 import purchases
from vpsshop.x402.offers import SettledPayment, SignedPayment

__all__ = [
    "ResizeInput",
    "ResizeOut",
    "ResizeQuoteOut",
    "Resized",
    "quote_resize",
    "resize_server",
    "resize_terms",
]


class ResizeInput(Input):
    """Body of ``POST /servers/{id}/resize`` and ``POST /servers/{id}/resize/quote``."""

    plan: str = Field(
        min_length=1,
        max_length=32,
        description="A plan id from GET /catalog other than the server's, whose disk is at least as large "
        "(invalid_plan, same_plan, disk_would_shrink).",
        json_schema_extra={"x-catalog": "plans"},
    )


class ResizeQuoteOut(BaseModel):
    """What a resize would charge now, and whether the balance covers it. Writes nothing."""

    plan: str = Field(description="The plan the server would move to.")
    price_usd: UsdAmount = Field(
        description="What resizing now charges: the new plan's price less the old one's for the paid time left, "
        "prorated to the second and rounded down to the cent (0 when the new plan costs less). A resize made "
        "later charges this or less, never more."
    )
    period_price_usd: UsdAmount = Field(description="The new plan's price of one billing cycle: what renewals bill.")
    old_period_price_usd: UsdAmount = Field(description="The server's price of one billing cycle now.")
    seconds_left: int = Field(description="Whole seconds of paid time left (until expires_at), as priced.")
    balance_usd: UsdAmount = Field(description="The caller's balance now.")
    deficit_usd: UsdAmount = Field(description="How much to top up before the resize succeeds (0 when covered).")
    sufficient: bool = Field(description="True when the balance covers price_usd.")
    expires_at: datetime = Field(description="The end of the paid period; a resize does not move it.")


class ResizeOut(BaseModel):
    """Response of ``POST /servers/{id}/resize``."""

    server: ServerOut
    charged_usd: UsdAmount = Field(
        description="What this resize charged from the balance: the quote's price, or less when paid time "
        "went by since the quote."
    )
    job_id: int = Field(description="The queued resize job.")
    status: Literal["queued"] = "queued"


@dataclass(frozen=True)
class ResizeTerms:
    plan: Plan
    price_micros: int
    """What the resize charges now (0 or more)."""
    period_price_micros: int
    seconds_left: int


def resize_terms(ctx: AppContext, server: Server, plan_id: str, now: datetime) -> ResizeTerms:
    """The one pricing rule of resizes, shared by the quote and the resize: the paid time left (whole
    seconds, ``now`` rounded down to the second) at the new plan's price less at the old price, rounded
    down to the cent. Whole cents are what a customer reads, and they keep a quote's price for a while (a
    difference of 8 USD a month shrinks by a cent an hour), and time only ever makes it smaller, so a
    resize never charges more than the quote read before it.

    :raises BadRequest: invalid_plan. :raises Conflict: server_not_active, same_plan, disk_would_shrink.
    """
    if server.status != "active":
        raise Conflict(
            "server_not_active",
            f"Only an active server can be resized; this one is {server.status}"
            + (" (renew it first)." if server.status == "suspended" else "."),
        )
    data = ctx.catalog_data
    new = next((p for p in data.plans if p.id == plan_id), None)
    if new is None:
        raise BadRequest("invalid_plan", f"No plan {plan_id!r}; GET /catalog lists the plans.")
    if new.id == server.plan:
        raise Conflict("same_plan", f"The server is on plan {new.id} already.")
    old = next((p for p in data.plans if p.id == server.plan), None)
    if old is not None and new.disk_gib < old.disk_gib:
        raise Conflict(
            "disk_would_shrink",
            f"Plan {new.id} has a {new.disk_gib} GiB disk, smaller than this server's {old.disk_gib} GiB: a disk "
            "is never shrunk. Choose a plan with a disk at least as large.",
            disk_gib=old.disk_gib,
        )
    location = next((loc for loc in data.locations if loc.id == server.location), None)
    if location is None:
        raise Conflict("plan_unavailable", f"Location {server.location} is no longer in the catalog.")
    period_price = price_cents(new, location, server.cycle) * MICROS_PER_CENT
    at = now.replace(microsecond=0)
    difference = unused_micros(server, at, period_price) - unused_micros(server, at)
    expires = server.expires_at if server.expires_at.tzinfo else server.expires_at.replace(tzinfo=at.tzinfo)
    left = max(0, int((expires - at).total_seconds()))
    return ResizeTerms(new, max(0, difference) // MICROS_PER_CENT * MICROS_PER_CENT, period_price, left)


def _quote(terms: ResizeTerms, server: Server, balance: int) -> ResizeQuoteOut:
    return ResizeQuoteOut(
        plan=terms.plan.id,
        price_usd=micros_to_usd(terms.price_micros),
        period_price_usd=micros_to_usd(terms.period_price_micros),
        old_period_price_usd=micros_to_usd(server.price_micros),
        seconds_left=terms.seconds_left,
        balance_usd=micros_to_usd(balance),
        deficit_usd=micros_to_usd(max(0, terms.price_micros - balance)),
        sufficient=balance >= terms.price_micros,
        expires_at=server.expires_at,
    )


async def quote_resize(ctx: AppContext, customer: Customer, server_id: int, data: ResizeInput) -> ResizeQuoteOut:
    """What :func:`resize_server` would charge now: the same :func:`resize_terms`, nothing written.

    :raises BadRequest: invalid_plan.
    :raises Conflict: server_not_active, same_plan, disk_would_shrink, not_supported.
    :raises NotFound: not the account's server.
    """
    require_capability(ctx, CAPABILITY_RESIZE, "resize servers")

    def run() -> ResizeQuoteOut:
        limits.count_write(ctx, customer.account_id)
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id)
            terms = resize_terms(ctx, server, data.plan, ctx.clock.now())
            return _quote(terms, server, read_summary(session, customer.account_id).balance_micros)

    return await to_thread.run_sync(run)


def _busy(session: Session, server_id: int) -> None:
    busy = session.exec(
        select(ServerJob.kind).where(
            ServerJob.server_id == server_id,
            col(ServerJob.kind).in_(("resize", "reinstall")),
            col(ServerJob.status).in_(("queued", "running")),
        )
    ).first()
    if busy is not None:
        raise Conflict(f"{busy}_in_progress", f"A {busy} of this server is under way; resize once it is done.")


@dataclass(frozen=True)
class Resized:
    """A resize's answer, whether it repeats an earlier one (a re-sent x402 payment), and the x402
    settlement that paid what the balance lacked."""

    resize: ResizeOut
    replayed: bool = False
    settled: SettledPayment | None = None


RESIZE_DESCRIPTION = "Pays what the balance lacks for resizing this server; it is resized with the paid re-send."


async def resize_server(
    ctx: AppContext, customer: Customer, server_id: int, data: ResizeInput, *, payment: SignedPayment | None = None
) -> Resized:
    """Charge the difference (:func:`resize_terms`), move the server to ``data.plan`` and queue the
    job, atomically; emits ``server.resizing``. With an x402 ``payment`` (what the balance lacks, as for
    an order or a renewal: :mod:`vpsshop.x402.purchases`), it is settled and credited first; the same
    payment re-sent answers the resize it paid for and charges nothing more.

    :raises InsufficientBalance: 402, nothing charged or changed; with the x402 requirements for the
        deficit (``exc.offer``) when the shop takes x402.
    :raises BadRequest: invalid_plan.
    :raises Conflict: server_not_active, same_plan, disk_would_shrink, resize_in_progress,
        reinstall_in_progress, not_supported.
    :raises NotFound: not the account's server.
    """
    require_capability(ctx, CAPABILITY_RESIZE, "resize servers")
    if payment is not None:
        return await _paid_resize(ctx, customer.account_id, server_id, data, payment)
    try:
        return Resized(await to_thread.run_sync(_resize, ctx, customer.account_id, server_id, data))
    except InsufficientBalance as exc:
        raise purchases.offer_deficit(
            ctx, exc, f"/servers/{server_id}/resize", RESIZE_DESCRIPTION, "/servers/{id}/resize"
        ) from None


async def _paid_resize(
    ctx: AppContext, account_id: int, server_id: int, data: ResizeInput, payment: SignedPayment
) -> Resized:
    """A resize sent with an x402 payment: settle and credit it, then resize, once per payment."""
    coin, decoded = purchases.decode(ctx, payment)
    purpose = f"resize:{server_id}:{data.plan}"
    earlier = await to_thread.run_sync(purchases.recorded, ctx, coin, decoded)
    if earlier is not None and (earlier.purpose, earlier.status, earlier.outcome) == (purpose, "settled", "done"):
        settled = await to_thread.run_sync(
            lambda: purchases.replayed_settlement(
                ctx, coin, decoded, payment.version, account_id=account_id, purpose=purpose
            )
        )
        return Resized(await to_thread.run_sync(_last_resize, ctx, account_id, server_id), True, settled)
    price, balance = await to_thread.run_sync(_charge_now, ctx, account_id, server_id, data)
    paid = await purchases.settle_for(
        ctx,
        coin,
        decoded,
        payment,
        account_id=account_id,
        price_micros=price,
        balance_micros=balance,
        path=f"/servers/{server_id}/resize",
        description=RESIZE_DESCRIPTION,
        purpose=purpose,
    )
    out = await purchases.fulfil(
        paid, "the resize", lambda: _resize(ctx, account_id, server_id, data, paid_by=paid.record_id)
    )
    return Resized(out, False, paid.settled)


def _charge_now(ctx: AppContext, account_id: int, server_id: int, body: ResizeInput) -> tuple[int, int]:
    """What the resize would charge now and the balance; its refusals before any payment moves."""
    with ctx.db.session() as session:
        server = owned(session, account_id, server_id)
        terms = resize_terms(ctx, server, body.plan, ctx.clock.now())
        _busy(session, server_id)
        return terms.price_micros, read_summary(session, account_id).balance_micros


def _last_resize(ctx: AppContext, account_id: int, server_id: int) -> ResizeOut:
    """The answer a re-sent payment gets: the server now, its latest resize job and what it charged."""
    with ctx.db.session() as session:
        server = owned(session, account_id, server_id)
        job_id = session.exec(
            select(ServerJob.id)
            .where(ServerJob.server_id == server_id, ServerJob.kind == "resize")
            .order_by(col(ServerJob.id).desc())
        ).first()
        charged = session.exec(
            select(LedgerEntry.amount_micros)
            .where(
                LedgerEntry.account_id == account_id,
                LedgerEntry.reason == "resize",
                LedgerEntry.ref == f"server:{server_id}",
            )
            .order_by(col(LedgerEntry.id).desc())
        ).first()
        return ResizeOut(server=server_out(server), charged_usd=micros_to_usd(-(charged or 0)), job_id=job_id or 0)


def _resize(
    ctx: AppContext, account_id: int, server_id: int, body: ResizeInput, *, paid_by: int | None = None
) -> ResizeOut:
    limits.count_write(ctx, account_id)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        server = owned(session, account_id, server_id, lock=True)
        terms = resize_terms(ctx, server, body.plan, now)
        _busy(session, server_id)
        if paid_by is not None:  # the authorization paid for this resize: a re-send answers it
            purchases.mark_done(session, paid_by)
        old_plan = server.plan
        if terms.price_micros > 0:
            ledger.post(
                session,
                account_id,
                -terms.price_micros,
                "resize",
                ref=f"server:{server_id}",
                memo=f"resize of server {server_id} from {old_plan} to {terms.plan.id}, "
                f"{terms.seconds_left} s of paid time left",
                now=now,
            )
        server.plan = terms.plan.id
        server.price_micros = terms.period_price_micros
        server.status_reason = RESIZING.format(plan=terms.plan.id)
        session.add(server)
        job = enqueue(session, server_id, "resize", now)
        record(session, server_id, "resize", now, f"customer; {old_plan} -> {terms.plan.id}")
        assert job.id is not None
        out = server_event(session, server_id)
        events.emit(session, "server.resizing", account_id, out, now=now)
        session.refresh(server)
        return ResizeOut(server=server_out(server), charged_usd=micros_to_usd(terms.price_micros), job_id=job.id)
