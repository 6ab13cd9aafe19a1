"""Ending a server now: the customer's ``DELETE /v1/servers/{id}`` (:func:`terminate_server`) and the
shop's ``vpsshop admin terminate`` and ``refund`` (:mod:`vpsshop.admin`), over one guarded step
(:func:`end_server`).

The server becomes ``terminated`` in the request's transaction, with its history row, the
``server.terminated`` event and a ``destroy`` job, which removes the domain, its disk and its seed
image on the host and then frees the address lease. A provisioning job still waiting is cancelled.

What the customer gets back, decided here once:

* **active**: the unused prepaid time, as a credit to the balance (ledger ``refund``, ref
  ``server:<id>``): every whole period paid ahead at its price, the current one pro rata to the
  microsecond (:func:`unused_micros`). Never more than the ledger shows was charged for the server
  and not given back (:func:`charged_micros`), and once (dedupe key ``terminate-refund:<id>``; the
  status move is a compare-and-set, so of two racing terminations, or a termination racing the
  lifecycle or an admin, one wins). The balance is never paid out: top-ups stay non-refundable.
* **suspended for non-payment**: its paid time is over, so nothing is credited.
* **suspended by the shop**: refused (409 ``server_admin_suspended``), as a renewal is: only the
  shop lifts or ends its own suspension (it may hold the disk for a dispute).
* **provisioning**: the server never ran: the whole order is refunded, on the path of a provisioning
  given up (:func:`vpsshop.servers.jobs.abandon_provisioning`, dedupe key ``refund:server:<id>``).
* **terminated** already: 409 ``server_terminated``; a retry under the same ``Idempotency-Key``
  answers the first termination again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

import sqlalchemy as sa
from anyio import to_thread
from pydantic import Field
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

import vpsshop.events as events
import vpsshop.ledger as ledger
from vpsshop import idempotency, limits, twofactor
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.db import rowcount, touch_account
from vpsshop.errors import BadRequest, Conflict
from vpsshop.inputs import Input
from vpsshop.models import Account, LedgerEntry, Server
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.servers.jobs import abandon_provisioning, cancel_queued_provisioning
from vpsshop.servers.lifecycle import CYCLE_MONTHS, add_months, enqueue, record
from vpsshop.servers.resource import ServerOut, owned, server_event

__all__ = [
    "ServerTerminated",
    "TerminateInput",
    "Terminated",
    "Termination",
    "charged_micros",
    "credit_due",
    "end_server",
    "quote_termination",
    "terminate_server",
    "unused_micros",
]

OPERATION = "termination"
CUSTOMER_REASON = "Terminated at the customer's request; the server was deleted."
CUSTOMER_CANCELLED = "Cancelled at the customer's request before it was ready."


class TerminateInput(Input):
    """Optional body of ``DELETE /servers/{id}``."""

    totp_code: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Required when the account has two-factor sign-in on (Account.totp_enabled): the current "
        "6-digit code of the authenticator app, or one of the account's recovery codes (each works once). "
        "Ignored otherwise (totp_required, invalid_totp_code).",
    )
    confirm_hostname: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="The server's hostname, as a safeguard: when given, it must be the server's (case aside), "
        "else nothing is done (hostname_mismatch).",
    )


class ServerTerminated(ServerOut):
    """Response of ``DELETE /servers/{id}``: the server as ``GET /servers/{id}`` now answers it
    (status ``terminated``), and what was credited back."""

    refunded_usd: UsdAmount = Field(
        description="What this termination credited to the balance (ledger reason refund, ref server:<id>): the "
        "unused prepaid time of an active server, the whole order of one still provisioning, 0 otherwise."
    )


@dataclass(frozen=True)
class Terminated:
    """What :func:`terminate_server` did: the server, and whether it is the answer of an earlier
    termination under the same idempotency key."""

    server: ServerTerminated
    replayed: bool = False


# ---- money ----------------------------------------------------------------------------------------


def unused_micros(server: Server, now: datetime, price_micros: int | None = None) -> int:
    """What the paid time of ``server`` still to come is worth, in micro-USD (0 once it has expired),
    at its price or at ``price_micros`` a cycle (a resize prices the new plan so).

    Walks back from ``expires_at`` one billing cycle at a time: every cycle that starts after ``now``
    counts its whole price (a renewal for several periods paid each of them), the cycle holding
    ``now`` counts pro rata to the microsecond. Integer arithmetic only.
    """
    price = server.price_micros if price_micros is None else price_micros
    months = CYCLE_MONTHS.get(server.cycle, 1)
    end = server.expires_at if server.expires_at.tzinfo else server.expires_at.replace(tzinfo=now.tzinfo)
    micro = timedelta(microseconds=1)
    total = 0
    for _ in range(2400):  # bounded: 200 years of monthly periods
        if end <= now:
            break
        start = add_months(end, -months)
        if start >= now:
            total += price
            end = start
            continue
        total += price * ((end - now) // micro) // ((end - start) // micro)
        break
    return total


def charged_micros(session: Session, server_id: int) -> int:
    """What the ledger says was paid for ``server_id`` and not given back: its order, renewals and resizes less
    every refund (entries with ``ref = server:<id>``)."""
    rows = session.execute(
        sa.select(col(LedgerEntry.reason), sa.func.sum(col(LedgerEntry.amount_micros)))
        .where(col(LedgerEntry.ref) == f"server:{server_id}")
        .group_by(col(LedgerEntry.reason))
    ).all()
    by_reason = {reason: int(total or 0) for reason, total in rows}
    paid = -(by_reason.get("order", 0) + by_reason.get("renewal", 0) + by_reason.get("resize", 0))
    return max(0, paid - by_reason.get("refund", 0))


def credit_due(session: Session, server: Server, now: datetime) -> int:
    """What terminating ``server`` at ``now`` credits, in micro-USD: the whole order while it is
    provisioning, else its unused prepaid time, at most what it was charged."""
    assert server.id is not None
    if server.status == "provisioning":
        return server.price_micros
    return min(unused_micros(server, now), charged_micros(session, server.id))


async def quote_termination(ctx: AppContext, customer: Customer, server_id: int) -> Decimal:
    """What terminating the server now would credit to the balance, in USD; writes nothing (the
    dashboard's confirmation page shows it). :raises NotFound: not the account's server."""

    def read() -> Decimal:
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id)
            if server.status == "terminated":
                return micros_to_usd(0)
            return micros_to_usd(credit_due(session, server, ctx.clock.now()))

    return await to_thread.run_sync(read)


# ---- the guarded step -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Termination:
    job_id: int
    """The queued ``destroy`` job."""
    refunded_micros: int
    """What was credited back (0: nothing)."""


def end_server(
    session: Session,
    server: Server,
    now: datetime,
    *,
    status_reason: str,
    why: str,
    refund_key: str | None = None,
    memo: str = "",
) -> Termination | None:
    """Terminate ``server`` now, in the caller's transaction, unless it changed since it was read.

    A compare-and-set moves it from the status and ``expires_at`` it was read with to
    ``terminated``; then the history row (``why``), the cancelled provisioning job, the ``destroy``
    job and ``server.terminated``. With ``refund_key``, the unused prepaid time is credited
    (ledger ``refund``, at most :func:`charged_micros`, once per key; ``memo`` on the entry).

    :returns: the job and the credit, or None when the server had changed (nothing done).
    """
    assert server.id is not None
    server_id, account_id = server.id, server.account_id
    refund = credit_due(session, server, now) if refund_key else 0
    moved = rowcount(
        session.execute(
            sa.update(Server)
            .where(
                col(Server.id) == server_id,
                col(Server.status) == server.status,
                col(Server.expires_at) == server.expires_at,
            )
            .values(status="terminated", terminated_at=now, status_reason=status_reason[:500])
        )
    )
    if moved != 1:
        return None
    record(session, server_id, "terminated", now, why[:500])
    cancel_queued_provisioning(session, server_id, now, f"server terminated: {why}")
    job = enqueue(session, server_id, "destroy", now)
    assert job.id is not None
    events.emit(session, "server.terminated", account_id, server_event(session, server_id), now=now)
    touch_account(session, account_id)  # one server fewer in GET /v1/account
    refunded = 0
    if refund > 0 and refund_key is not None:
        posting = ledger.post(
            session,
            account_id,
            refund,
            "refund",
            ref=f"server:{server_id}",
            dedupe_key=refund_key,
            memo=memo[:500],
            now=now,
        )
        refunded = posting.entry.amount_micros if posting.created else 0
        record(session, server_id, "refunded", now, str(refunded))
    return Termination(job.id, refunded)


# ---- the customer's operation ---------------------------------------------------------------------


def _check(server: Server, data: TerminateInput) -> None:
    if server.status == "terminated":
        raise Conflict("server_terminated", f"Server {server.id} is terminated already.")
    if server.status == "suspended" and server.suspended_by == "admin":
        raise Conflict(
            "server_admin_suspended",
            f"Server {server.id} was suspended by the shop ({server.status_reason or 'no reason given'}). Only the "
            "shop lifts or ends its own suspension: contact the shop's support.",
        )
    if data.confirm_hostname is not None and data.confirm_hostname.strip().lower() != server.hostname.lower():
        raise BadRequest(
            "hostname_mismatch",
            f"confirm_hostname does not match the hostname of server {server.id}; nothing was done.",
        )


def _recall(ctx: AppContext, account_id: int, key: str, digest: str) -> ServerTerminated | None:
    with ctx.db.session() as session:
        stored = idempotency.recall(session, account_id, OPERATION, key, digest)
    return ServerTerminated.model_validate_json(stored) if stored is not None else None


def _terminate(
    ctx: AppContext, account_id: int, server_id: int, data: TerminateInput, key: str | None, digest: str
) -> Terminated:
    limits.count_write(ctx, account_id)
    with ctx.db.session() as session:
        server = owned(session, account_id, server_id)
        if key is not None:  # the same key ended it a moment ago: the answer was kept with the change
            stored = idempotency.recall(session, account_id, OPERATION, key, digest)
            if stored is not None:
                return Terminated(ServerTerminated.model_validate_json(stored), True)
        _check(server, data)
        account = session.get(Account, account_id)
        needs_code = account is not None and account.totp_enabled
    if needs_code:
        if data.totp_code is None or not data.totp_code.strip():
            raise twofactor.code_required()
        twofactor.check_code(ctx, account_id, data.totp_code)
    for _ in range(3):
        try:
            with ctx.db.session() as session:
                server = owned(session, account_id, server_id, lock=True)
                if key is not None:  # a request with the same key finished while this one waited
                    stored = idempotency.recall(session, account_id, OPERATION, key, digest)
                    if stored is not None:
                        return Terminated(ServerTerminated.model_validate_json(stored), True)
                _check(server, data)
                now = ctx.clock.now()
                if server.status == "provisioning":
                    refunded = abandon_provisioning(
                        ctx, session, server, now, CUSTOMER_CANCELLED, "provision_cancelled"
                    )
                else:
                    done = end_server(
                        session,
                        server,
                        now,
                        status_reason=CUSTOMER_REASON,
                        why="customer",
                        refund_key=f"terminate-refund:{server_id}",
                        memo=f"unused time of server {server_id}, terminated by the customer",
                    )
                    refunded = done.refunded_micros if done is not None else None
                if refunded is None:
                    continue  # it moved on meanwhile (provisioned, suspended): look again
                out = ServerTerminated(
                    **server_event(session, server_id).model_dump(), refunded_usd=micros_to_usd(refunded)
                )
                if key is not None:
                    idempotency.remember(session, account_id, OPERATION, key, digest, out, now)
                return Terminated(out)
        except IntegrityError:
            replay = _recall(ctx, account_id, key, digest) if key is not None else None
            if replay is None:
                raise
            return Terminated(replay, True)
    raise Conflict("server_busy", "The server changed while it was being terminated; retry.")


async def terminate_server(
    ctx: AppContext,
    customer: Customer,
    server_id: int,
    data: TerminateInput,
    *,
    idempotency_key: str | None = None,
) -> Terminated:
    """Terminate one of the account's servers now (see the module docstring for what is credited);
    emits ``server.terminated`` (and ``ledger.credit`` for a credit). With two-factor on, needs a
    fresh ``totp_code``.

    :raises BadRequest: hostname_mismatch.
    :raises ApiError: 401 totp_required, invalid_totp_code.
    :raises Conflict: server_terminated, server_admin_suspended, server_busy, idempotency_key_reused.
    :raises NotFound: not the account's server.
    :raises RateLimited: the account's write limit, or too many wrong two-factor codes.
    """
    account_id = customer.account_id
    digest = idempotency.digest({"server_id": server_id})
    if idempotency_key is not None:
        replay = await to_thread.run_sync(_recall, ctx, account_id, idempotency_key, digest)
        if replay is not None:
            return Terminated(replay, True)
    return await to_thread.run_sync(_terminate, ctx, account_id, server_id, data, idempotency_key, digest)
