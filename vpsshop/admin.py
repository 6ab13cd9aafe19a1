"""The operator's support tools behind ``vpsshop admin ...``.

Every change goes through the ledger (:func:`vpsshop.ledger.post`) or the job queue
(:func:`vpsshop.servers.lifecycle.enqueue`), in the same transaction as its row of the
``admin_audit`` table (who ran it, what, on what, why), so there is never a change without its
audit entry nor an entry without its change. Server state changes also emit the same events the
shop emits itself (``server.suspended``, ``server.unsuspended``, ``server.terminated``).
"""

from __future__ import annotations

import getpass
import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlmodel import Session, select

from vpsshop import events, ledger
from vpsshop.models import AdminAudit, Server, utcnow

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext


class AdminError(Exception):
    """The action cannot be done; the message says why."""


def actor() -> str:
    try:
        return getpass.getuser()[:64]
    except Exception:  # noqa: BLE001 - no user name in this environment
        return "unknown"


def audit(
    session: Session,
    action: str,
    target: str,
    reason: str,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    session.add(
        AdminAudit(
            created_at=now or utcnow(),
            actor=actor(),
            action=action,
            target=target[:100],
            reason=reason[:500],
            detail=json.dumps(detail, default=str) if detail else None,
        )
    )


def _need_reason(reason: str) -> str:
    reason = reason.strip()
    if not reason:
        raise AdminError("--reason must say why")
    return reason


def lookup(ctx: AppContext, query: str) -> dict[str, Any]:
    """The account behind an account id, API key prefix, top-up ref, deposit address or tx hash."""
    q = query.strip()
    with ctx.db.engine.connect() as conn:
        account_id, how = None, ""
        if q.isdigit():
            account_id = conn.execute(sa.text("SELECT id FROM accounts WHERE id = :q"), {"q": int(q)}).scalar()
            how = "id"
        for sql, name in (
            ("SELECT account_id FROM api_keys WHERE prefix = :q OR :q LIKE prefix || '%'", "key prefix"),
            ("SELECT account_id FROM topups WHERE ref = :q", "top-up ref"),
            ("SELECT account_id FROM topups WHERE deposit_address = :q", "deposit address"),
            ("SELECT account_id FROM topup_payments WHERE txid = :q", "tx hash"),
        ):
            if account_id is None:
                account_id, how = conn.execute(sa.text(sql), {"q": q}).scalar(), name
        if account_id is None:
            raise AdminError(
                f"nothing matches {q!r} (tried account id, key prefix, top-up ref, deposit address, tx hash)"
            )
        account = conn.execute(
            sa.text("SELECT id, balance_micros, created_at, totp_enabled FROM accounts WHERE id = :a"),
            {"a": account_id},
        ).one()
        servers = [
            dict(r._mapping)
            for r in conn.execute(
                sa.text(
                    "SELECT id, status, plan, hostname, ip, expires_at FROM servers WHERE account_id = :a ORDER BY id"
                ),
                {"a": account_id},
            )
        ]
        topups = [
            dict(r._mapping)
            for r in conn.execute(
                sa.text(
                    "SELECT ref, coin, status, amount_micros, deposit_address, created_at FROM topups "
                    "WHERE account_id = :a ORDER BY id DESC LIMIT 20"
                ),
                {"a": account_id},
            )
        ]
        entries = [
            dict(r._mapping)
            for r in conn.execute(
                sa.text(
                    "SELECT id, amount_micros, balance_after_micros, reason, ref, memo, created_at FROM ledger_entries "
                    "WHERE account_id = :a ORDER BY id DESC LIMIT 20"
                ),
                {"a": account_id},
            )
        ]
        keys = [
            dict(r._mapping)
            for r in conn.execute(
                sa.text(
                    "SELECT id, name, prefix, created_at, revoked_at FROM api_keys WHERE account_id = :a ORDER BY id"
                ),
                {"a": account_id},
            )
        ]
    return {
        "matched_by": how,
        "account": dict(account._mapping),
        "servers": servers,
        "recent_topups": topups,
        "recent_ledger": entries,
        "api_keys": keys,
    }


def adjust_balance(ctx: AppContext, account_id: int, micros: int, reason: str) -> ledger.Posting:
    """Credit (``micros`` > 0) or debit through the ledger, with its audit entry."""
    reason = _need_reason(reason)
    kind = "admin_credit" if micros > 0 else "admin_debit"
    with ctx.db.session() as session:
        try:
            posting = ledger.post(session, account_id, micros, kind, memo=reason[:500])
        except LookupError:
            raise AdminError(f"no account {account_id}") from None
        audit(session, kind, f"account:{account_id}", reason, {"amount_micros": micros})
    return posting


def _server(session: Session, server_id: int) -> Server:
    server = session.get(Server, server_id)
    if server is None:
        raise AdminError(f"no server {server_id}")
    return server


def unused_micros(server: Server, now: datetime) -> int:
    """The part of the server's current period not yet used, in micro-USD (0 when it has expired).

    The period is the cycle that ends at ``expires_at`` (a month or a year back from it).
    """
    from vpsshop.servers.lifecycle import CYCLE_MONTHS, add_months

    expires = server.expires_at
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=now.tzinfo)
    left = (expires - now).total_seconds()
    period = (expires - add_months(expires, -CYCLE_MONTHS.get(server.cycle, 1))).total_seconds()
    if left <= 0 or period <= 0:
        return 0
    return int(server.price_micros * min(1.0, left / period))


def set_server_state(ctx: AppContext, server_id: int, action: str, reason: str, *, refund_unused: bool = False) -> str:
    """``suspend``, ``unsuspend`` or ``terminate`` a server through the job queue.

    :param refund_unused: with ``terminate``, credit the unused part of the paid period to the balance
        (ledger ``refund``, once per server) in the same transaction.
    """
    from vpsshop.events.resources import server_data
    from vpsshop.servers.lifecycle import enqueue, record

    reason = _need_reason(reason)
    now = ctx.clock.now()
    moves = {
        "suspend": (
            ("active",),
            dict(status="suspended", suspended_at=now, status_reason=f"Suspended: {reason}"),
            "suspend",
            "server.suspended",
            "suspended",
        ),
        "unsuspend": (
            ("suspended",),
            dict(status="active", suspended_at=None, status_reason=None),
            "resume",
            "server.unsuspended",
            "unsuspended",
        ),
        "terminate": (
            ("active", "suspended", "provisioning"),
            dict(status="terminated", terminated_at=now, status_reason=f"Terminated by the shop: {reason}"),
            "destroy",
            "server.terminated",
            "terminated",
        ),
    }
    allowed, values, job_kind, event, history = moves[action]
    with ctx.db.session() as session:
        server = _server(session, server_id)
        was = server.status
        if was not in allowed:
            raise AdminError(f"server {server_id} is {was}: cannot {action}")
        moved = session.execute(
            sa.update(Server).where(Server.id == server_id, Server.status == was).values(**values)
        ).rowcount
        if moved != 1:
            raise AdminError(f"server {server_id} changed meanwhile: try again")
        record(session, server_id, history, now, f"admin: {reason}"[:500])
        job = enqueue(session, server_id, job_kind, now)
        events.emit(session, event, server.account_id, server_data(session, server_id), now=now)
        refunded = 0
        if refund_unused and action == "terminate" and was in ("active", "suspended"):
            refunded = unused_micros(server, now)
            if refunded > 0:
                ledger.post(
                    session,
                    server.account_id,
                    refunded,
                    "refund",
                    ref=f"server:{server_id}",
                    dedupe_key=f"admin-refund:{server_id}",
                    memo=f"unused time: {reason}"[:500],
                    now=now,
                )
        audit(session, action, f"server:{server_id}", reason, {"job_id": job.id, "refunded_micros": refunded}, now=now)
    done = f"server {server_id}: {action} done, job {job.id} ({job_kind}) queued"
    if refund_unused:
        done += f"; refunded {refunded / 1_000_000:.6f} USD of unused time"
    return done


def job_action(ctx: AppContext, job_id: int, action: str, reason: str) -> str:
    """``retry`` a failed or stuck job (queued again, now) or ``cancel`` a queued or failed one."""
    from vpsshop.servers.models import ServerJob

    reason = _need_reason(reason)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        job = session.get(ServerJob, job_id)
        if job is None:
            raise AdminError(f"no job {job_id}")
        if action == "retry":
            if job.status == "done":
                raise AdminError(f"job {job_id} is done: nothing to retry")
            values: dict[str, Any] = dict(
                status="queued", run_after=now, locked_until=None, locked_by=None, finished_at=None
            )
        else:
            if job.status not in ("queued", "failed"):
                raise AdminError(f"job {job_id} is {job.status}: only a queued or failed job can be cancelled")
            values = {
                "status": "cancelled",
                "finished_at": now,
                "locked_until": None,
                "last_error": f"cancelled: {reason}"[:500],
            }
        moved = session.execute(
            sa.update(ServerJob).where(ServerJob.id == job_id, ServerJob.status == job.status).values(**values)
        ).rowcount
        if moved != 1:
            raise AdminError(f"job {job_id} changed meanwhile: try again")
        audit(session, f"{action}_job", f"job:{job_id}", reason, {"was": job.status, "kind": job.kind}, now=now)
    return f"job {job_id}: {action} done"


def stuck(ctx: AppContext, minutes: float) -> dict[str, list[dict[str, Any]]]:
    """Jobs queued, running or failed for longer than ``minutes``; pending top-ups with a payment seen
    that long ago and not credited."""
    cutoff = ctx.clock.now() - timedelta(minutes=minutes)
    with ctx.db.engine.connect() as conn:
        jobs = [
            dict(r._mapping)
            for r in conn.execute(
                sa.text(
                    "SELECT id, server_id, kind, status, attempts, created_at, last_error FROM server_jobs "
                    "WHERE status IN ('queued', 'running', 'failed') AND created_at < :c ORDER BY id"
                ),
                {"c": cutoff},
            )
        ]
        topups = [
            dict(r._mapping)
            for r in conn.execute(
                sa.text(
                    "SELECT t.ref, t.account_id, t.coin, t.status, p.txid, p.status AS payment_status, "
                    "p.confirmations, p.first_seen_at FROM topup_payments p JOIN topups t ON t.id = p.topup_id "
                    "WHERE p.status = 'seen' AND p.first_seen_at < :c ORDER BY p.id"
                ),
                {"c": cutoff},
            )
        ]
    return {"jobs": jobs, "topups": topups}


def audit_log(ctx: AppContext, limit: int = 50) -> list[dict[str, Any]]:
    with ctx.db.session() as session:
        rows = session.exec(select(AdminAudit).order_by(AdminAudit.id.desc()).limit(limit)).all()  # type: ignore[union-attr]
        return [row.model_dump() for row in rows]
