"""The operator's support tools behind ``vpsshop admin ...``: each takes the :class:`~vpsshop.actors.Operator`
who acts, recorded with the change.

Every change goes through the ledger (:func:`vpsshop.ledger.post`) or the job queue
(:func:`vpsshop.servers.lifecycle.enqueue`), in the same transaction as its row of the
``admin_audit`` table (who ran it, what, on what, why), so there is never a change without its
audit entry nor an entry without its change. Server state changes also emit the same events the
shop emits itself (``server.suspended``, ``server.unsuspended``, ``server.terminated``).

Money handed back:

* ``refund`` of an ``active`` or ``suspended`` server credits the unused part of everything paid
  ahead for it: each whole period still to come at its price, the current one pro rata to the
  second. Never more than the ledger shows was charged for that server (orders and renewals less
  any refund), once (ledger dedupe key ``admin-refund:<id>``). The rule and the guarded step are the
  ones of a customer's own termination (:mod:`vpsshop.servers.termination`): of an admin and a
  customer terminating at once, one wins and one refund is made.
* ``refund`` of a server still ``provisioning``, and ``cancel-job`` of its provisioning job, take the
  path of a provisioning given up after its last attempt
  (:func:`vpsshop.servers.jobs.abandon_provisioning`): terminated, the whole order refunded (dedupe
  key ``refund:server:<id>``, shared with that path), its clean-up queued.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

import vpsshop.events as events
import vpsshop.ledger as ledger
from vpsshop.actors import Operator
from vpsshop.db import rowcount
from vpsshop.models import AdminAudit, Server, saved_id, utcnow

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext


class AdminError(Exception):
    """The action cannot be done; the message says why."""


def audit(
    session: Session,
    operator: Operator,
    action: str,
    target: str,
    reason: str,
    detail: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    session.add(
        AdminAudit(
            created_at=now or utcnow(),
            actor=operator.name[:64],
            action=action,
            target=target[:100],
            reason=reason[:500],
            detail=json.dumps(detail, default=str) if detail else None,
        )
    )


def owner_only(ctx: AppContext, operator: Operator, action: str, target: str, reason: str) -> None:
    """Refuse (and audit the refusal of) an action that destroys or moves an amount no limit bounds
    (terminate, refund, cancel a job) to an operator who is not an ``owner``."""
    if operator.role == "owner":
        return
    with ctx.db.session() as session:
        audit(session, operator, f"{action}_refused", target, reason, {"role": operator.role})
    raise AdminError(f"a {operator.role} operator may not {action.replace('_', ' ')}: ask an owner")


def _need_reason(reason: str) -> str:
    reason = reason.strip()
    if not reason:
        raise AdminError("--reason must say why")
    return reason


# ---- lookup ----------------------------------------------------------------------------------------

_X402_ACCOUNT = "SELECT DISTINCT t.account_id FROM x402_payments x JOIN topups t ON t.id = x.topup_id WHERE "
_LOOKUPS = (
    ("SELECT DISTINCT account_id FROM api_keys WHERE prefix = :q OR :q LIKE prefix || '%'", "key prefix"),
    ("SELECT DISTINCT account_id FROM topups WHERE ref = :q", "top-up ref"),
    ("SELECT DISTINCT account_id FROM topups WHERE deposit_address = :q", "deposit address"),
    ("SELECT DISTINCT account_id FROM topup_payments WHERE lower(txid) = lower(:q)", "tx hash"),
    (_X402_ACCOUNT + 'lower(x."transaction") = lower(:q)', "x402 settlement tx hash"),
    (_X402_ACCOUNT + "lower(x.payer) = lower(:q)", "x402 payer address"),
)


def _rows(conn: sa.Connection, sql: str, **params: Any) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in conn.execute(sa.text(sql), params)]


def lookup(ctx: AppContext, query: str) -> dict[str, Any]:
    """The account behind an account id, API key prefix, top-up ref, deposit address, tx hash, x402
    settlement tx hash or x402 payer address, with its servers, recent top-ups, payments seen on chain,
    x402 payments, ledger entries and API keys. When a payer address paid several accounts, the first is
    shown and ``other_accounts`` lists the rest."""
    q = query.strip()
    with ctx.db.engine.connect() as conn:
        accounts: list[int] = []
        how = ""
        if q.isdigit():
            accounts = list(conn.execute(sa.text("SELECT id FROM accounts WHERE id = :q"), {"q": int(q)}).scalars())
            how = "id"
        for sql, name in _LOOKUPS:
            if not accounts:
                accounts = list(conn.execute(sa.text(sql + " LIMIT 20"), {"q": q}).scalars())
                how = name
        if not accounts:
            raise AdminError(
                f"nothing matches {q!r} (tried account id, key prefix, top-up ref, deposit address, tx hash, "
                "x402 settlement tx hash, x402 payer address)"
            )
        account_id = sorted(accounts)[0]
        account = conn.execute(
            sa.text("SELECT id, balance_micros, created_at, totp_enabled FROM accounts WHERE id = :a"),
            {"a": account_id},
        ).one()
        found = {
            "matched_by": how,
            "account": dict(account._mapping),
            "servers": _rows(
                conn,
                "SELECT id, status, suspended_by, status_reason, plan, hostname, ip, price_micros, expires_at "
                "FROM servers WHERE account_id = :a ORDER BY id",
                a=account_id,
            ),
            "recent_topups": _rows(
                conn,
                "SELECT ref, coin, status, amount_micros, deposit_address, created_at FROM topups "
                "WHERE account_id = :a ORDER BY id DESC LIMIT 20",
                a=account_id,
            ),
            "recent_payments": _rows(
                conn,
                "SELECT p.coin, p.txid, p.status, p.confirmations, p.amount_atomic, p.block_height, p.late, "
                "p.credited_micros, p.first_seen_at, t.ref FROM topup_payments p JOIN topups t ON t.id = p.topup_id "
                "WHERE p.account_id = :a ORDER BY p.id DESC LIMIT 20",
                a=account_id,
            ),
            "recent_x402": _rows(
                conn,
                'SELECT x.id, x.coin, x.payer, x.status, x."transaction", x.amount_atomic, x.purpose, x.outcome, '
                "x.error, x.created_at, t.ref FROM x402_payments x JOIN topups t ON t.id = x.topup_id "
                "WHERE t.account_id = :a ORDER BY x.id DESC LIMIT 20",
                a=account_id,
            ),
            "recent_ledger": _rows(
                conn,
                "SELECT id, amount_micros, balance_after_micros, reason, ref, memo, created_at FROM ledger_entries "
                "WHERE account_id = :a ORDER BY id DESC LIMIT 20",
                a=account_id,
            ),
            "api_keys": _rows(
                conn,
                "SELECT id, name, prefix, created_at, revoked_at FROM api_keys WHERE account_id = :a ORDER BY id",
                a=account_id,
            ),
        }
        if len(accounts) > 1:
            found["other_accounts"] = sorted(accounts)[1:]
    return found


# ---- balances --------------------------------------------------------------------------------------


def adjust_balance(ctx: AppContext, operator: Operator, account_id: int, micros: int, reason: str) -> ledger.Posting:
    """Credit (``micros`` > 0) or debit through the ledger, with its audit entry."""
    reason = _need_reason(reason)
    kind = "admin_credit" if micros > 0 else "admin_debit"
    limit = support_limit_micros(ctx)
    if operator.role != "owner" and abs(micros) > limit:
        with ctx.db.session() as session:
            audit(session, operator, f"{kind}_refused", f"account:{account_id}", reason, {"amount_micros": micros})
        raise AdminError(
            f"a {operator.role} operator may credit or debit at most {limit / 1_000_000:.2f} USD: ask an owner"
        )
    with ctx.db.session() as session:
        try:
            posting = ledger.post(session, account_id, micros, kind, memo=reason[:500])
        except LookupError:
            raise AdminError(f"no account {account_id}") from None
        after = posting.entry.balance_after_micros
        detail = {"amount_micros": micros, "balance_before_micros": after - micros, "balance_after_micros": after}
        audit(session, operator, kind, f"account:{account_id}", reason, detail)
    return posting


def support_limit_micros(ctx: AppContext) -> int:
    """The largest amount a ``support`` operator may move (``[console] support_limit_usd``)."""
    from vpsshop.money import usd_to_micros

    return usd_to_micros(ctx.settings.console.support_limit_usd)


# ---- servers ---------------------------------------------------------------------------------------


def _server(session: Session, server_id: int) -> Server:
    server = session.get(Server, server_id)
    if server is None:
        raise AdminError(f"no server {server_id}")
    return server


def set_server_state(
    ctx: AppContext, operator: Operator, server_id: int, action: str, reason: str, *, refund_unused: bool = False
) -> str:
    """``suspend``, ``unsuspend`` or ``terminate`` a server through the job queue.

    :param refund_unused: with ``terminate``, credit the unused prepaid time to the balance (ledger
        ``refund``, at most what was charged for the server, once) in the same transaction; a server
        still provisioning gets its whole order back (see the module docstring).
    """
    from vpsshop.servers.jobs import abandon_provisioning
    from vpsshop.servers.lifecycle import enqueue, record
    from vpsshop.servers.resource import server_event
    from vpsshop.servers.termination import end_server

    reason = _need_reason(reason)
    now = ctx.clock.now()
    moves: dict[str, tuple[tuple[str, ...], dict[str, Any], str, str, str]] = {
        "suspend": (
            ("active",),
            dict(status="suspended", suspended_at=now, suspended_by="admin", status_reason=f"Suspended: {reason}"),
            "suspend",
            "server.suspended",
            "suspended",
        ),
        "unsuspend": (
            ("suspended",),
            dict(status="active", suspended_at=None, suspended_by=None, status_reason=None),
            "resume",
            "server.unsuspended",
            "unsuspended",
        ),
    }
    allowed = ("active", "suspended", "provisioning") if action == "terminate" else moves[action][0]
    audited = "refund" if refund_unused else action
    if action == "terminate":
        owner_only(ctx, operator, audited, f"server:{server_id}", reason)
    with ctx.db.session() as session:
        server = _server(session, server_id)
        was = server.status
        if was not in allowed:
            raise AdminError(f"server {server_id} is {was}: cannot {audited}")
        if refund_unused and was == "provisioning":
            refunded = abandon_provisioning(
                ctx, session, server, now, f"Provisioning cancelled by the shop: {reason}", "provision_cancelled"
            )
            if refunded is None:
                raise AdminError(f"server {server_id} changed meanwhile: try again")
            audit(
                session,
                operator,
                "refund",
                f"server:{server_id}",
                reason,
                {"was": was, "refunded_micros": refunded},
                now=now,
            )
            return (
                f"server {server_id}: was provisioning: terminated, its order refunded "
                f"({refunded / 1_000_000:.6f} USD), clean-up queued"
            )
        if action == "terminate":
            ended = end_server(
                session,
                server,
                now,
                status_reason=f"Terminated by the shop: {reason}",
                why=f"admin: {reason}",
                refund_key=f"admin-refund:{server_id}" if refund_unused else None,
                memo=f"unused time: {reason}",
            )
            if ended is None:
                raise AdminError(f"server {server_id} changed meanwhile: try again")
            job_id, job_kind, refunded = ended.job_id, "destroy", ended.refunded_micros
        else:
            _, values, job_kind, event, history = moves[action]
            moved = rowcount(
                session.execute(
                    sa.update(Server).where(col(Server.id) == server_id, col(Server.status) == was).values(**values)
                )
            )
            if moved != 1:
                raise AdminError(f"server {server_id} changed meanwhile: try again")
            record(session, server_id, history, now, f"admin: {reason}"[:500])
            job = enqueue(session, server_id, job_kind, now)
            events.emit(session, event, server.account_id, server_event(session, server_id), now=now)
            job_id, refunded = saved_id(job), 0
        detail = {"was": was, "job_id": job_id, "refunded_micros": refunded}
        audit(session, operator, audited, f"server:{server_id}", reason, detail, now=now)
    done = f"server {server_id}: {action} done, job {job_id} ({job_kind}) queued"
    if refund_unused:
        done += f"; refunded {refunded / 1_000_000:.6f} USD of unused prepaid time"
    return done


# ---- access and webhooks ----------------------------------------------------------------------------


def revoke_access(ctx: AppContext, operator: Operator, account_id: int, reason: str) -> str:
    """Revoke every active API key of an account (an ``api_key.revoked`` event each) and sign out
    every dashboard session of it: for a leaked key or an account taken over. The login token stays."""
    from vpsshop.accounts import key_out
    from vpsshop.db import touch_account
    from vpsshop.models import Account, ApiKey, DashboardSession

    reason = _need_reason(reason)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        if session.get(Account, account_id) is None:
            raise AdminError(f"no account {account_id}")
        keys = session.exec(
            select(ApiKey).where(col(ApiKey.account_id) == account_id, col(ApiKey.revoked_at).is_(None))
        ).all()
        for key in keys:
            key.revoked_at = now
            session.add(key)
            events.emit(session, "api_key.revoked", account_id, key_out(key), now=now)
        ended = rowcount(
            session.execute(
                sa.update(DashboardSession)
                .where(col(DashboardSession.account_id) == account_id, col(DashboardSession.ended_at).is_(None))
                .values(ended_at=now)
            )
        )
        touch_account(session, account_id)
        detail = {"keys_revoked": [key.id for key in keys], "sessions_ended": ended}
        audit(session, operator, "revoke_access", f"account:{account_id}", reason, detail, now=now)
    return f"account {account_id}: {len(keys)} API key(s) revoked, {ended} dashboard session(s) signed out"


def disable_webhook(ctx: AppContext, operator: Operator, endpoint_id: int, reason: str) -> str:
    """Disable a webhook endpoint (the account gets ``webhook.disabled``); its owner can turn it on again."""
    from vpsshop.events.delivery import disable
    from vpsshop.events.models import WebhookEndpoint

    reason = _need_reason(reason)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        endpoint = session.get(WebhookEndpoint, endpoint_id)
        if endpoint is None or endpoint.deleted_at is not None:
            raise AdminError(f"no webhook endpoint {endpoint_id}")
        was = endpoint.status
        if not disable(session, endpoint, now, f"Disabled by the shop: {reason}"):
            raise AdminError(f"webhook endpoint {endpoint_id} is {was}: only an enabled one can be disabled")
        detail = {"before": was, "after": "disabled", "account_id": endpoint.account_id}
        audit(session, operator, "disable_webhook", f"webhook:{endpoint_id}", reason, detail, now=now)
    return f"webhook endpoint {endpoint_id} disabled"


# ---- jobs ------------------------------------------------------------------------------------------


def job_action(ctx: AppContext, operator: Operator, job_id: int, action: str, reason: str) -> str:
    """``retry`` a failed or stuck job (queued again, now, with a fresh set of attempts) or ``cancel`` a
    queued or failed one. Cancelling a provisioning job terminates its server and refunds the order.

    A job ``running`` under a live lease is refused: a worker is running it now, and a second could
    start the same hypervisor call.
    """
    from vpsshop.servers.jobs import abandon_provisioning
    from vpsshop.servers.models import ServerJob

    reason = _need_reason(reason)
    if action == "cancel":
        owner_only(ctx, operator, "cancel_job", f"job:{job_id}", reason)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        job = session.get(ServerJob, job_id)
        if job is None:
            raise AdminError(f"no job {job_id}")
        was, kind, server_id, lease = job.status, job.kind, job.server_id, job.locked_until
        guard = [col(ServerJob.id) == job_id, col(ServerJob.status) == was]
        detail: dict[str, Any] = {"was": was, "kind": kind, "server_id": server_id}
        if action == "retry":
            if was == "done":
                raise AdminError(f"job {job_id} is done: nothing to retry")
            if was == "running" and lease is not None and lease >= now:
                raise AdminError(
                    f"job {job_id} is running under a live lease (worker {job.locked_by}, until "
                    f"{lease.isoformat()}): another worker could start the same hypervisor call; "
                    "wait for it to finish, or for its lease to run out if that worker is gone"
                )
            if was == "running":  # the expired lease read above: nobody took the job meanwhile
                guard.append(col(ServerJob.locked_until) == lease)
            if kind == "provision":
                server = _server(session, server_id)
                if server.status != "provisioning":
                    raise AdminError(
                        f"job {job_id} provisions server {server_id}, which is {server.status}: nothing to provision"
                    )
            values: dict[str, Any] = dict(
                status="queued", run_after=now, attempts=0, locked_until=None, locked_by=None, finished_at=None
            )
        else:
            if was not in ("queued", "failed"):
                raise AdminError(f"job {job_id} is {was}: only a queued or failed job can be cancelled")
            values = {
                "status": "cancelled",
                "finished_at": now,
                "locked_until": None,
                "last_error": f"cancelled: {reason}"[:500],
            }
        moved = rowcount(session.execute(sa.update(ServerJob).where(*guard).values(**values)))
        if moved != 1:
            raise AdminError(f"job {job_id} changed meanwhile: try again")
        done = f"job {job_id}: {action} done"
        if action == "cancel" and kind == "provision":
            server = _server(session, server_id)
            refunded = abandon_provisioning(
                ctx, session, server, now, f"Provisioning cancelled by the shop: {reason}", "provision_cancelled"
            )
            if refunded is not None:
                detail["refunded_micros"] = refunded
                done += (
                    f"; server {server_id} terminated and its order refunded ({refunded / 1_000_000:.6f} USD), "
                    "clean-up queued"
                )
        audit(session, operator, f"{action}_job", f"job:{job_id}", reason, detail, now=now)
    return done


# ---- what is stuck ---------------------------------------------------------------------------------


def stuck(ctx: AppContext, minutes: float) -> dict[str, list[dict[str, Any]]]:
    """What has waited longer than ``minutes``:

    * ``jobs``: queued, running or failed;
    * ``servers``: still ``provisioning`` with no job queued or running for them (nothing will
      finish them: retry their job, or refund them);
    * ``topups``: payments seen and not credited;
    * ``deposits``: receipts at standing deposit addresses seen and not credited, or held below
      ``topups.standing_minimum_usd`` (a customer asking where their money is);
    * ``x402``: x402 settlements left ``settling`` (outcome unknown).
    """
    from vpsshop.payments.models import DepositAddressRow, Topup, TopupPayment, X402Record
    from vpsshop.servers.models import ServerJob

    cutoff = ctx.clock.now() - timedelta(minutes=minutes)

    def rows(query: Any) -> list[dict[str, Any]]:
        return [dict(r._mapping) for r in session.execute(query)]

    with ctx.db.session() as session:
        jobs = rows(
            sa.select(
                col(ServerJob.id),
                col(ServerJob.server_id),
                col(ServerJob.kind),
                col(ServerJob.status),
                col(ServerJob.attempts),
                col(ServerJob.locked_by),
                col(ServerJob.locked_until),
                col(ServerJob.created_at),
                col(ServerJob.last_error),
            )
            .where(col(ServerJob.status).in_(("queued", "running", "failed")), col(ServerJob.created_at) < cutoff)
            .order_by(col(ServerJob.id))
        )
        live = sa.exists().where(
            col(ServerJob.server_id) == col(Server.id), col(ServerJob.status).in_(("queued", "running"))
        )
        servers = rows(
            sa.select(
                col(Server.id), col(Server.account_id), col(Server.status), col(Server.plan), col(Server.created_at)
            )
            .where(col(Server.status) == "provisioning", col(Server.created_at) < cutoff, ~live)
            .order_by(col(Server.id))
        )
        topups = rows(
            sa.select(
                col(Topup.ref),
                col(Topup.account_id),
                col(Topup.coin),
                col(Topup.status),
                col(TopupPayment.txid),
                col(TopupPayment.status).label("payment_status"),
                col(TopupPayment.confirmations),
                col(TopupPayment.first_seen_at),
            )
            .join(Topup, col(Topup.id) == col(TopupPayment.topup_id))
            .where(col(TopupPayment.status) == "seen", col(TopupPayment.first_seen_at) < cutoff)
            .order_by(col(TopupPayment.id))
        )
        deposits = rows(
            sa.select(
                col(DepositAddressRow.address),
                col(TopupPayment.account_id),
                col(TopupPayment.coin),
                col(TopupPayment.txid),
                col(TopupPayment.status).label("payment_status"),
                col(TopupPayment.amount_atomic),
                col(TopupPayment.confirmations),
                col(TopupPayment.first_seen_at),
            )
            .join(DepositAddressRow, col(DepositAddressRow.id) == col(TopupPayment.deposit_address_id))
            .where(
                col(TopupPayment.topup_id).is_(None),
                col(TopupPayment.status).in_(("seen", "held")),
                col(TopupPayment.first_seen_at) < cutoff,
            )
            .order_by(col(TopupPayment.id))
        )
        x402 = rows(
            sa.select(
                col(X402Record.id),
                col(X402Record.coin),
                col(X402Record.payer),
                col(X402Record.status),
                col(X402Record.transaction),
                col(X402Record.amount_atomic),
                col(X402Record.purpose),
                col(X402Record.created_at),
                col(Topup.ref),
                col(Topup.account_id),
            )
            .join(Topup, col(Topup.id) == col(X402Record.topup_id))
            .where(col(X402Record.status) == "settling", col(X402Record.created_at) < cutoff)
            .order_by(col(X402Record.id))
        )
    return {"jobs": jobs, "servers": servers, "topups": topups, "deposits": deposits, "x402": x402}


# ---- re-scanning blocks ----------------------------------------------------------------------------


async def rescan(
    ctx: AppContext,
    operator: Operator,
    coin_code: str,
    from_height: int,
    to_height: int | None,
    reason: str,
    topup_ref: str | None = None,
) -> str:
    """Scan blocks ``from_height`` .. ``to_height`` (default: the node's tip) again for the scan group of
    ``coin_code``, record what they pay to the shop's deposit addresses, then run one ordinary watcher
    pass of the group (recheck, credit what has its confirmations).

    The group's stored cursor is not moved. Payments are unique per coin and chain identity, so a
    payment found again is never recorded or credited twice. Only coins scanned block by block
    (built on :class:`vpsshop.chains.BlockCoin`: BTC, LTC, ETH, USDT, TRX, USDTTRC) have heights.
    ``topup_ref`` names the top-up it was asked for in the audit entry (:func:`rescan_topup`).
    """
    from anyio import to_thread

    from vpsshop.chains import BlockCoin, BlockCursor
    from vpsshop.payments import engine_for
    from vpsshop.payments.models import TopupPayment

    reason = _need_reason(reason)
    code = coin_code.strip().upper()
    coin = ctx.coins.get(code)
    if coin is None:
        raise AdminError(f"coin {code!r} is not enabled (enabled: {', '.join(ctx.coins) or 'none'})")
    engine = engine_for(ctx)
    watcher = engine.watcher
    group = getattr(coin, "scan_group", None)
    members = watcher.groups.get(group or "")
    if not members:
        raise AdminError(f"coin {code} is not watched on a chain here (no node configured, or it is paid by x402)")
    scanner = members[0]
    if not isinstance(scanner, BlockCoin):
        raise AdminError(f"scan group {group} does not scan numbered blocks: it cannot be re-scanned by height")
    if from_height < 0 or (to_height is not None and to_height < from_height):
        raise AdminError("FROM_HEIGHT must be 0 or more, and TO_HEIGHT at least FROM_HEIGHT")
    tip = await scanner.tip()
    last = tip if to_height is None else min(to_height, tip)
    if from_height > last:
        raise AdminError(f"FROM_HEIGHT {from_height} is past the node's tip ({tip})")
    codes = [m.code for m in members]

    def count_payments() -> int:
        with ctx.db.session() as session:
            return int(
                session.execute(
                    sa.select(sa.func.count()).select_from(TopupPayment).where(col(TopupPayment.coin).in_(codes))
                ).scalar_one()
            )

    before = await to_thread.run_sync(count_payments)
    keyset = watcher.keysets[scanner.scan_group]  # = group: members are watcher.groups[group]
    position = BlockCursor(from_height - 1, await scanner.block_hash(from_height - 1) if from_height > 0 else "")
    step = scanner.scan_settings.max_blocks_per_scan
    found = 0
    while position.height < last:
        await to_thread.run_sync(keyset.load_new, engine)
        end, payments = await scanner.scan_blocks(
            position, min(last, position.height + step), await scanner.tip(), keyset, tuple(members)
        )
        if payments:
            found += len(payments)
            await to_thread.run_sync(engine.record_payments, payments, keyset.by_key, keyset.any_coin)
        if end.height <= position.height:
            raise AdminError(f"the chain changed while block {position.height + 1} was read: run the re-scan again")
        position = end
    _, credited = await watcher.pass_group(scanner.scan_group)
    new = await to_thread.run_sync(count_payments) - before
    detail = {
        "coin": code,
        "scan_group": group,
        "from_height": from_height,
        "to_height": last,
        "payments_found": found,
        "payments_new": new,
        "credited": credited,
        **({"topup": topup_ref} if topup_ref else {}),
    }

    def write_audit() -> None:
        with ctx.db.session() as session:
            audit(session, operator, "rescan", f"scan_group:{group}", reason, detail)

    await to_thread.run_sync(write_audit)
    return (
        f"scan group {group}: blocks {from_height}..{last} re-scanned; {found} payment(s) to the shop's "
        f"addresses, {new} not known before; {credited} payment(s) credited by the pass that followed"
    )


async def rescan_topup(
    ctx: AppContext,
    operator: Operator,
    account_id: int,
    ref: str,
    from_height: int,
    to_height: int | None,
    reason: str,
) -> str:
    """:func:`rescan` of the chain that pays top-up ``ref`` of account ``account_id`` (the web
    console's "re-scan" of a top-up): its coin's scan group, blocks ``from_height`` .. ``to_height``."""
    from anyio import to_thread

    from vpsshop.payments.models import Topup

    def coin_of() -> str | None:
        with ctx.db.session() as session:
            found = session.exec(
                select(Topup.coin).where(col(Topup.ref) == ref.strip(), col(Topup.account_id) == account_id)
            ).first()
            return str(found) if found is not None else None

    coin = await to_thread.run_sync(coin_of)
    if coin is None:
        raise AdminError(f"account {account_id} has no top-up {ref.strip()!r}")
    return await rescan(ctx, operator, coin, from_height, to_height, reason, topup_ref=ref.strip())


def audit_log(ctx: AppContext, limit: int = 50) -> list[dict[str, Any]]:
    with ctx.db.session() as session:
        rows = session.exec(select(AdminAudit).order_by(col(AdminAudit.id).desc()).limit(limit)).all()
        return [row.model_dump() for row in rows]


# ---- hosts: drain and migrate ---------------------------------------------------------------------


def _migrating_backend(ctx: AppContext) -> Any:
    from vpsshop.hypervisor import CAPABILITY_MIGRATE

    backend = ctx.hypervisor
    if backend is None or CAPABILITY_MIGRATE not in backend.capabilities:
        kind = getattr(backend, "kind", "none")
        raise AdminError(f"the hypervisor backend ({kind}) cannot move servers between hosts")
    return backend


def host_location(ctx: AppContext, host: str) -> str:
    """The location whose hosts (as the backend names them) include ``host``."""
    backend = _migrating_backend(ctx)
    for location in [loc.id for loc in ctx.catalog_data.locations if ctx.serves_location(loc.id)]:
        if host in backend.hosts(location):
            return location
    raise AdminError(f"no location of the catalog has a host named {host!r}")


def drain_host(ctx: AppContext, operator: Operator, host: str, reason: str, *, drained: bool = True) -> str:
    """Stop placing new servers on ``host`` (``drained=False``: place them there again). Servers on
    it stay until moved (:func:`migrate_server`, :func:`evacuate_host`)."""
    from vpsshop.servers.models import DrainedHost

    reason = _need_reason(reason)
    if drained:
        host_location(ctx, host)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = session.get(DrainedHost, host)
        if drained and row is None:
            session.add(DrainedHost(host=host, reason=reason[:500], drained_at=now))
        elif not drained and row is not None:
            session.delete(row)
        audit(session, operator, "host_drain" if drained else "host_undrain", f"host:{host}", reason, now=now)
    if drained:
        return f"host {host}: drained, no new server is placed there (its servers stay until moved)"
    return f"host {host}: new servers may be placed there again"


def drained_hosts(ctx: AppContext) -> list[dict[str, Any]]:
    """The drained hosts, with how many servers still live on each."""
    from vpsshop.servers.models import DrainedHost

    with ctx.db.session() as session:
        rows = session.exec(select(DrainedHost).order_by(col(DrainedHost.host))).all()
        out = []
        for row in rows:
            count = session.execute(
                sa.select(sa.func.count())
                .select_from(Server)
                .where(col(Server.host) == row.host, col(Server.status) != "terminated")
            ).scalar_one()
            out.append({"host": row.host, "reason": row.reason, "drained_at": row.drained_at, "servers": count})
        return out


def hosts_overview(ctx: AppContext) -> list[dict[str, Any]]:
    """Every host of the locations the shop serves, as the backend names them, once each: ``host``,
    ``locations`` (the served locations it is a host of), ``drained`` (with its ``reason`` and
    ``drained_at``) and ``servers`` (those not terminated).

    :raises AdminError: the hypervisor backend cannot move servers (it names no hosts)."""
    backend = _migrating_backend(ctx)
    drained = {row["host"]: row for row in drained_hosts(ctx)}
    with ctx.db.session() as session:
        counts = dict(
            session.execute(
                sa.select(col(Server.host), sa.func.count())
                .where(col(Server.status) != "terminated", col(Server.host).is_not(None))
                .group_by(col(Server.host))
            ).all()
        )
    out: dict[str, dict[str, Any]] = {}
    for location in [loc.id for loc in ctx.catalog_data.locations if ctx.serves_location(loc.id)]:
        for host in backend.hosts(location):
            if host in out:
                out[host]["locations"].append(location)
                continue
            row = drained.get(host)
            out[host] = {
                "host": host,
                "locations": [location],
                "drained": row is not None,
                "reason": row["reason"] if row else None,
                "drained_at": row["drained_at"] if row else None,
                "servers": int(counts.get(host, 0)),
            }
    return list(out.values())


def migrate_server(ctx: AppContext, operator: Operator, server_id: int, host: str | None, reason: str) -> str:
    """Queue a ``migrate`` job moving an active or suspended server to ``host``, another host of its
    location (None: the first of the location's hosts that is neither its own nor drained)."""
    from vpsshop.servers.lifecycle import enqueue
    from vpsshop.servers.models import DrainedHost, ServerJob

    reason = _need_reason(reason)
    backend = _migrating_backend(ctx)
    owner_only(ctx, operator, "migrate", f"server:{server_id}", reason)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        server = _server(session, server_id)
        if server.status not in ("active", "suspended") or not server.host or not server.domain:
            raise AdminError(f"server {server_id} is {server.status}: only a placed active or suspended server moves")
        hosts = backend.hosts(server.location)
        drained = set(session.exec(select(DrainedHost.host)).all())
        if host is None:
            others = [h for h in hosts if h != server.host and h not in drained]
            if not others:
                raise AdminError(
                    f"location {server.location} has no other undrained host to move server {server_id} to"
                )
            host = others[0]
        if host not in hosts:
            raise AdminError(f"host {host!r} is not a host of location {server.location} ({', '.join(hosts)})")
        if host == server.host:
            raise AdminError(f"server {server_id} is on {host} already")
        pending = session.exec(
            select(ServerJob.id).where(
                col(ServerJob.server_id) == server_id,
                col(ServerJob.kind) == "migrate",
                col(ServerJob.status).in_(("queued", "running")),
            )
        ).first()
        if pending is not None:
            raise AdminError(f"server {server_id} is being moved already (job {pending})")
        job = enqueue(session, server_id, "migrate", now)
        job.target = host
        session.add(job)
        detail = {"from": server.host, "to": host, "job_id": saved_id(job)}
        audit(session, operator, "migrate", f"server:{server_id}", reason, detail, now=now)
        return f"server {server_id}: migrate job {saved_id(job)} queued ({server.host} -> {host})"


def evacuate_host(ctx: AppContext, operator: Operator, host: str, reason: str) -> list[str]:
    """Drain ``host`` and queue a move of each of its active or suspended servers to the location's
    other undrained hosts, in turn."""
    from vpsshop.servers.models import DrainedHost

    reason = _need_reason(reason)
    backend = _migrating_backend(ctx)
    location = host_location(ctx, host)
    owner_only(ctx, operator, "evacuate", f"host:{host}", reason)
    out = [drain_host(ctx, operator, host, reason)]
    with ctx.db.session() as session:
        drained = set(session.exec(select(DrainedHost.host)).all())
        ids = session.exec(
            select(Server.id).where(col(Server.host) == host, col(Server.status).in_(("active", "suspended")))
        ).all()
    targets = [h for h in backend.hosts(location) if h != host and h not in drained]
    if ids and not targets:
        raise AdminError(f"location {location} has no other undrained host to move {len(ids)} server(s) to")
    for n, server_id in enumerate(ids):
        assert server_id is not None
        try:
            out.append(migrate_server(ctx, operator, server_id, targets[n % len(targets)], reason))
        except AdminError as exc:
            out.append(str(exc))
    return out
