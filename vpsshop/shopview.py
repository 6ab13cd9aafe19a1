"""What the operators' console shows: the shop's figures per day, search across every handle a
customer may quote, and one account with everything of it. Reads only; the changes are in
:mod:`vpsshop.admin`.

Days are UTC calendar days. The per-day sums are of the ledger itself (``ledger_entries``), so a
day's "credited" is the sum of that day's positive entries and "spent" the sum of its negative ones
(as a positive number): the console's charts draw exactly these numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col

from vpsshop import admin
from vpsshop.context import AppContext
from vpsshop.models import Account, LedgerEntry, Server
from vpsshop.servers.models import ServerTraffic
from vpsshop.servers.resource import current_traffic, traffic_out

DAYS = 14


@dataclass
class DayFigures:
    day: date
    credited_micros: int = 0
    spent_micros: int = 0
    orders: int = 0
    renewals: int = 0


@dataclass
class Overview:
    days: list[DayFigures]
    balances_held_micros: int
    topups: list[dict[str, Any]]
    """Count of top-ups by coin and status."""
    servers: list[dict[str, Any]]
    """Count of servers by status and location."""
    readiness: list[dict[str, Any]] = field(default_factory=list)


def day_figures(ctx: AppContext, last_day: date, days: int = DAYS) -> list[DayFigures]:
    """Credited, spent, orders and renewals for each of the ``days`` UTC days ending with ``last_day``."""
    first = last_day - timedelta(days=days - 1)
    start = datetime(first.year, first.month, first.day, tzinfo=ctx.clock.now().tzinfo)
    figures = {first + timedelta(days=n): DayFigures(first + timedelta(days=n)) for n in range(days)}
    with ctx.db.engine.connect() as conn:
        rows = conn.execute(
            sa.select(col(LedgerEntry.created_at), col(LedgerEntry.amount_micros), col(LedgerEntry.reason)).where(
                col(LedgerEntry.created_at) >= start
            )
        )
        for created_at, amount, reason in rows:
            day = figures.get(created_at.date())
            if day is None:
                continue
            if amount > 0:
                day.credited_micros += amount
            else:
                day.spent_micros -= amount
            if reason == "order":
                day.orders += 1
            elif reason == "renewal":
                day.renewals += 1
    return list(figures.values())


async def overview(ctx: AppContext) -> Overview:
    from anyio import to_thread

    from vpsshop.payments.models import Topup
    from vpsshop.readiness import component_readiness

    def read() -> Overview:
        with ctx.db.engine.connect() as conn:
            held = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(col(Account.balance_micros)), 0))).scalar_one()
            topups = _counts(conn, col(Topup.coin), col(Topup.status))
            servers = _counts(conn, col(Server.status), col(Server.location))
        return Overview(day_figures(ctx, ctx.clock.now().date()), int(held), topups, servers)

    found = await to_thread.run_sync(read)
    for item, ready in await component_readiness(ctx):
        found.readiness.append(
            {"kind": item.kind, "key": item.key, "ready": ready.ok or bool(ready.sandbox_ok), "detail": ready.detail}
        )
    return found


def _counts(conn: sa.Connection, *columns: Any) -> list[dict[str, Any]]:
    """How many rows there are of each combination of ``columns``' values."""
    query = sa.select(*columns, sa.func.count().label("count")).group_by(*columns).order_by(*columns)
    return [dict(r._mapping) for r in conn.execute(query)]


# ---- search --------------------------------------------------------------------------------------------

_SERVER_MATCH = (
    "SELECT id, account_id, status, hostname, ip, location FROM servers "
    "WHERE ip = :q OR lower(hostname) = lower(:q) OR CAST(id AS VARCHAR(20)) = :server_id ORDER BY id LIMIT 20"
)


@dataclass
class SearchResult:
    account: dict[str, Any] | None
    """:func:`vpsshop.admin.lookup`'s answer for an account handle (id, key prefix, top-up ref, deposit
    address, transaction id, x402 payer), or None."""
    servers: list[dict[str, Any]]
    """Servers whose id (``s123`` or ``server 123``), IP address or hostname is the query."""


def search(ctx: AppContext, query: str) -> SearchResult:
    q = query.strip()[:200]
    if not q:
        return SearchResult(None, [])
    try:
        account = admin.lookup(ctx, q)
    except admin.AdminError:
        account = None
    lowered = q.lower().removeprefix("server").removeprefix("s").strip()
    server_id = lowered if lowered.isdigit() and lowered != q else ""
    with ctx.db.engine.connect() as conn:
        servers = [dict(r._mapping) for r in conn.execute(sa.text(_SERVER_MATCH), {"q": q, "server_id": server_id})]
    return SearchResult(account, servers)


def account_page(ctx: AppContext, account_id: int) -> dict[str, Any] | None:
    """Everything of one account: :func:`vpsshop.admin.lookup`'s view, its webhooks, latest events and
    live dashboard sessions."""
    try:
        found = admin.lookup(ctx, str(account_id))
    except admin.AdminError:
        return None
    if found["account"]["id"] != account_id:
        return None
    with ctx.db.engine.connect() as conn:

        def rows(sql: str) -> list[dict[str, Any]]:
            return [dict(r._mapping) for r in conn.execute(sa.text(sql), {"a": account_id})]

        found["webhooks"] = rows(
            "SELECT id, account_id, url, status, disabled_reason, failing_since, created_at FROM webhook_endpoints "
            "WHERE account_id = :a AND deleted_at IS NULL ORDER BY id"
        )
        found["events"] = rows(
            "SELECT public_id, type, created_at FROM events WHERE account_id = :a ORDER BY id DESC LIMIT 20"
        )
        found["sessions"] = rows(
            "SELECT id, user_agent, created_at, last_seen_at, expires_at FROM dashboard_sessions "
            "WHERE account_id = :a AND ended_at IS NULL ORDER BY id DESC LIMIT 20"
        )
    return found


def server_page(ctx: AppContext, server_id: int) -> dict[str, Any] | None:
    """One server: its row, its jobs and its history, newest first, and its traffic in the current
    period as the API's server resource shows it (``traffic``: a
    :class:`~vpsshop.servers.resource.TrafficOut`, None before its first count)."""
    with ctx.db.engine.connect() as conn:
        server = conn.execute(
            sa.text(
                "SELECT id, account_id, status, suspended_by, status_reason, plan, location, os, host, hostname, ip, "
                "price_micros, created_at, expires_at FROM servers WHERE id = :s"
            ),
            {"s": server_id},
        ).first()
        if server is None:
            return None

        def rows(sql: str) -> list[dict[str, Any]]:
            return [dict(r._mapping) for r in conn.execute(sa.text(sql), {"s": server_id})]

        found: dict[str, Any] = {
            "server": dict(server._mapping),
            "jobs": rows(
                "SELECT id, kind, status, attempts, locked_by, last_error, created_at, finished_at FROM server_jobs "
                "WHERE server_id = :s ORDER BY id DESC LIMIT 50"
            ),
            "events": rows(
                "SELECT kind, detail, created_at FROM server_events WHERE server_id = :s ORDER BY id DESC LIMIT 50"
            ),
        }
    with ctx.db.session() as session:
        found["traffic"] = traffic_out(current_traffic(session, server_id))
    return found


def host_traffic(ctx: AppContext) -> dict[str, tuple[int, int]]:
    """Host -> (bytes in, bytes out) of the current traffic period (:func:`current_traffic`, the one
    the server resource's ``traffic`` shows) of each server on it that is not terminated, summed; a
    host none of whose servers was counted yet is absent. /metrics' ``vpsshop_traffic_bytes`` sums
    every period instead."""
    latest = (
        sa.select(
            col(ServerTraffic.server_id),
            col(ServerTraffic.in_bytes),
            col(ServerTraffic.out_bytes),
            sa.func.row_number()
            .over(
                partition_by=col(ServerTraffic.server_id),
                order_by=(col(ServerTraffic.period_start).desc(), col(ServerTraffic.id).desc()),
            )
            .label("newest"),
        )
    ).subquery()
    query = (
        sa.select(col(Server.host), sa.func.sum(latest.c.in_bytes), sa.func.sum(latest.c.out_bytes))
        .join(latest, latest.c.server_id == col(Server.id))
        .where(latest.c.newest == 1, col(Server.status) != "terminated", col(Server.host).is_not(None))
        .group_by(col(Server.host))
    )
    with ctx.db.engine.connect() as conn:
        return {str(host): (int(received or 0), int(sent or 0)) for host, received, sent in conn.execute(query)}


def failing_webhooks(ctx: AppContext) -> list[dict[str, Any]]:
    """Webhook endpoints failing now (``failing_since`` set) or disabled, the longest failing first."""
    with ctx.db.engine.connect() as conn:
        return [
            dict(r._mapping)
            for r in conn.execute(
                sa.text(
                    "SELECT id, account_id, url, status, failing_since, disabled_reason FROM webhook_endpoints "
                    "WHERE deleted_at IS NULL AND (failing_since IS NOT NULL OR status = 'disabled') "
                    "ORDER BY failing_since LIMIT 100"
                )
            )
        ]


_TOPUPS_TO_CHECK = (
    "SELECT t.ref, t.account_id, t.coin, t.status, t.amount_micros, "
    "SUM(COALESCE(p.credited_micros, 0)) AS credited_micros, "
    "SUM(CASE WHEN p.late THEN 1 ELSE 0 END) AS late_payments "
    "FROM topups t JOIN topup_payments p ON p.topup_id = t.id "
    "WHERE p.status = 'credited' AND p.credited_at >= :since "
    "GROUP BY t.id, t.ref, t.account_id, t.coin, t.status, t.amount_micros ORDER BY t.id DESC"
)


def topups_to_check(ctx: AppContext, days: int = 7) -> list[dict[str, Any]]:
    """Top-ups of the last ``days`` days whose credited payments were late, or add up to less or more than
    the amount asked for (what arrived was credited all the same: these are for a customer's question)."""
    since = ctx.clock.now() - timedelta(days=days)
    found = []
    with ctx.db.engine.connect() as conn:
        for row in conn.execute(sa.text(_TOPUPS_TO_CHECK), {"since": since}):
            item = dict(row._mapping)
            why = [
                word
                for word, hit in (
                    ("late", item["late_payments"] > 0),
                    ("underpaid", item["credited_micros"] < item["amount_micros"]),
                    ("overpaid", item["credited_micros"] > item["amount_micros"]),
                )
                if hit
            ]
            if why:
                found.append({**item, "why": ", ".join(why)})
    return found
