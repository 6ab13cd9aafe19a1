"""Orders paid by an x402 authorization held until the server is ready (``[x402] settle = "on_ready"``).

The order verified the authorization, held it (:func:`vpsshop.x402.settlement.hold`: the record
``held``, its amount credited for the order's charge) and made the server. Here the server's side:

* **ready** (the provisioning job made it ``active`` with ``ready_at``): :func:`settle_when_ready`
  settles the authorization; one worker of several moves the record from ``held`` to ``settling`` and
  sends it, so it is never settled twice (the chain refuses a used nonce all the same);
* **never ready** (provisioning given up, an operator's cancel, a first boot with errors):
  :func:`release_for_server` drops the authorization in the transaction that refunds the order: the
  credit is taken back (ledger ``reversal``) and nothing was ever sent, so the payer's USDC never moved;
* **settlement refused at readiness** (the payer moved the funds away, the authorization expired or
  its nonce was used): the server is terminated, its whole charge refunded and the held credit taken
  back (the account's balance is as before the order), the record closed, and ``server.payment_failed``
  is sent;
* **settlement outcome unknown at readiness** (the node or facilitator timed out): the record stays
  ``settling`` and the ``x402-settlements`` task asks the chain. Settled late: a settled order as any
  other (the credit kept). Never settled (``valid_before`` passed, the nonce unused): the record is
  closed ``not_settled`` and the server ends as after a refused settlement (:func:`end_never_settled`),
  in one transaction with the record locked, so once whichever worker gets there.

:func:`settle_ready_holds` runs in each ``servers-lifecycle`` pass: it settles what a worker stopped
between a server's activation and its settlement left held.
"""

from __future__ import annotations

import logging
from datetime import datetime

from anyio import to_thread
from sqlmodel import Session, col, select

import vpsshop.events as events
import vpsshop.ledger as ledger
from vpsshop.context import AppContext
from vpsshop.models import Server, saved_id
from vpsshop.payments.models import Topup, X402Record
from vpsshop.servers.jobs import ON_ABANDONED, ON_ACTIVATED
from vpsshop.servers.lifecycle import record
from vpsshop.servers.resource import server_event
from vpsshop.servers.termination import charged_micros, end_server
from vpsshop.x402 import settlement

log = logging.getLogger("vpsshop.servers")

NOT_READY = "server_not_ready"
"""``X402Record.error`` of an authorization dropped because its server never got ready."""


def _purpose(server: Server) -> str | None:
    return f"order:{server.idempotency_key}" if server.idempotency_key else None


def release_for_server(ctx: AppContext, session: Session, server: Server, code: str = NOT_READY) -> bool:
    """In the caller's transaction (the one refunding the order): drop the authorization held for
    ``server``'s order, if one is. Returns whether one was."""
    purpose = _purpose(server)
    if purpose is None:
        return False
    held = settlement.held_record(session, server.account_id, purpose)
    if held is None:
        return False
    settlement.release(ctx, session, held, code)
    record(session, saved_id(server), "payment_released", ctx.clock.now(), code[:500])
    return True


def _held_id(ctx: AppContext, server_id: int) -> tuple[int, bool] | None:
    """The held record of ``server_id``'s order and whether the server is ready (None: nothing held)."""
    with ctx.db.session() as session:
        server = session.get(Server, server_id)
        purpose = None if server is None else _purpose(server)
        if server is None or purpose is None or server.status != "active":
            return None
        held = settlement.held_record(session, server.account_id, purpose)
        if held is None or held.id is None:
            return None
        return held.id, server.ready_at is not None


async def settle_when_ready(ctx: AppContext, server_id: int) -> None:
    """The server just became ``active``: settle its order's held authorization (ready), or end the
    server and drop it (a first boot that ended in errors is not ready)."""
    found = await to_thread.run_sync(_held_id, ctx, server_id)
    if found is None:
        return
    record_id, ready = found
    if not ready:
        await to_thread.run_sync(
            _payment_failed, ctx, server_id, record_id, NOT_READY, "its first boot did not complete"
        )
        return
    refused = await settlement.settle_held(ctx, record_id)
    if refused is not None:
        log.warning("server %s: its x402 payment could not be settled: %s", server_id, refused)
        await to_thread.run_sync(_payment_failed, ctx, server_id, record_id, refused.code, refused.message)


def _payment_failed(ctx: AppContext, server_id: int, record_id: int, code: str, why: str) -> None:
    """Terminate the server whose held payment will not settle, refund all it was charged, take the
    held credit back, close the record and send ``server.payment_failed``; once (the record is locked
    and must still be held or settling)."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        held = settlement.lock_record(session, record_id)
        server = session.get(Server, server_id)
        if server is None or held is None or held.status not in ("held", "settling"):
            return
        if _end_unpaid(session, server, code, why, now):
            settlement.release(ctx, session, held, code)


def _end_unpaid(session: Session, server: Server, code: str, why: str, now: datetime) -> bool:
    """In the caller's transaction: terminate ``server`` (unless it already is), refund all it was
    charged and send ``server.payment_failed`` (not for a server that never got ready: its
    ``server.terminated`` says it). False when the server changed meanwhile (nothing done)."""
    server_id = saved_id(server)
    if server.status != "terminated":
        reason = f"The x402 payment for this order could not be settled ({code}: {why}); the server was terminated."
        if end_server(session, server, now, status_reason=reason, why=f"payment_failed: {code}") is None:
            return False  # the server changed meanwhile: the next pass decides again
    charged = charged_micros(session, server_id)
    if charged > 0:
        ledger.post(
            session,
            server.account_id,
            charged,
            "refund",
            ref=f"server:{server_id}",
            dedupe_key=f"refund:server:{server_id}",
            memo=f"x402 payment not settled: {code}"[:500],
            now=now,
        )
    record(session, server_id, "payment_failed", now, f"{code}: {why}"[:500])
    if code != NOT_READY:  # a boot with errors ends as a failed provisioning does: server.terminated
        events.emit(session, "server.payment_failed", server.account_id, server_event(session, server_id), now=now)
    return True


def end_never_settled(ctx: AppContext, session: Session, held: X402Record, code: str) -> bool:
    """:data:`vpsshop.x402.settlement.ON_HELD_NOT_SETTLED`: the authorization held for an order was sent
    at the server's readiness with an unknown outcome, and the chain never settled it (``valid_before``
    passed, its nonce unused). The server ends as after a settlement refused at readiness (terminated,
    refunded, ``server.payment_failed``); the caller then takes the held credit back. True when there is
    no such server (the order was never made) or it ended."""
    topup = session.get(Topup, held.topup_id)
    if topup is None or not (held.purpose or "").startswith("order:"):
        return True
    key = (held.purpose or "").removeprefix("order:")
    server = session.exec(
        select(Server).where(Server.account_id == topup.account_id, Server.idempotency_key == key)
    ).first()
    if server is None:
        return True
    log.warning("server %s: its x402 payment was never settled on chain (%s)", server.id, code)
    why = "the authorization expired before its settlement was seen on chain"
    return _end_unpaid(session, server, code, why, ctx.clock.now())


def _ready_with_holds(ctx: AppContext) -> list[int]:
    """Active servers whose order's authorization is still held (at most 100 a pass)."""
    with ctx.db.session() as session:
        rows = session.exec(
            select(Server.id)
            .join(Topup, col(Topup.account_id) == col(Server.account_id))
            .join(X402Record, col(X402Record.topup_id) == col(Topup.id))
            .where(
                col(X402Record.status) == "held",
                col(Server.status) == "active",
                col(Server.idempotency_key).is_not(None),
                col(X402Record.purpose) == "order:" + col(Server.idempotency_key),
            )
            .limit(100)
        ).all()
        return [int(row) for row in rows if row is not None]


async def settle_ready_holds(ctx: AppContext) -> int:
    """Settle the held authorizations of servers already active (a worker stopped between the two
    steps); returns how many servers it looked at. Run by each ``servers-lifecycle`` pass."""
    server_ids = await to_thread.run_sync(_ready_with_holds, ctx)
    for server_id in server_ids:
        await settle_when_ready(ctx, server_id)
    return len(server_ids)


ON_ACTIVATED.append(settle_when_ready)
ON_ABANDONED.append(release_for_server)
settlement.ON_HELD_NOT_SETTLED.append(end_never_settled)
