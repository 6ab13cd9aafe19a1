"""Dashboard sessions: server-side, so that sign-out and revocation end them at once.

The browser holds a random 256-bit token in an HttpOnly cookie; the ``dashboard_sessions`` row
holds its keyed digest (:func:`vpsshop.auth.keyed_digest`), so a copy of the table signs no one in.
Every page request looks the row up: a session that was ended, has passed its absolute lifetime
(``[dashboard] session_max_hours``) or sat unused too long (``session_idle_minutes``) is refused.

A session opened with the right login token on an account with two-factor is ``pending_totp``:
it opens only the code step. The code swaps it for a new session with a new token, so a token
seen before the second factor is worth nothing after it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from anyio import to_thread
from sqlmodel import Session, col, select

from vpsshop.actors import Customer
from vpsshop.auth import keyed_digest
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.models import DashboardSession, saved_id

TOUCH_EVERY = timedelta(minutes=1)
"""``last_seen_at`` is written at most this often per session."""


@dataclass(frozen=True)
class ActiveSession:
    id: int
    account_id: int
    pending_totp: bool
    token_hash: str
    created_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    user_agent: str | None

    @classmethod
    def of(cls, row: DashboardSession | Any, owner_id: int) -> ActiveSession:
        """The session of a row of ``dashboard_sessions`` (``owner_id``: its account) or of another
        table of the same columns (the console's ``operator_sessions``: its operator)."""
        return cls(
            saved_id(row),
            owner_id,
            bool(getattr(row, "pending_totp", False)),
            row.token_hash,
            row.created_at,
            row.last_seen_at,
            row.expires_at,
            row.user_agent,
        )


def token_digest(ctx: AppContext, token: str) -> str:
    return keyed_digest(ctx.settings.secret_key_bytes(), "dashboard session", token)


async def start(ctx: AppContext, account_id: int, *, pending_totp: bool, user_agent: str | None) -> str:
    """Open a session for an account that just signed in; returns the token for the cookie (its only copy)."""
    return await to_thread.run_sync(lambda: _start(ctx, account_id, pending_totp=pending_totp, user_agent=user_agent))


def _start(ctx: AppContext, account_id: int, *, pending_totp: bool, user_agent: str | None) -> str:
    token = secrets.token_urlsafe(32)
    now = ctx.clock.now()
    limits = ctx.settings.dashboard
    # a pending session lives only as long as it takes to type a code
    lifetime = timedelta(minutes=10) if pending_totp else timedelta(hours=limits.session_max_hours)
    with ctx.db.session() as session:
        session.add(
            DashboardSession(
                account_id=account_id,
                token_hash=token_digest(ctx, token),
                pending_totp=pending_totp,
                user_agent=(user_agent or "")[:200] or None,
                created_at=now,
                last_seen_at=now,
                expires_at=now + lifetime,
            )
        )
    return token


async def resolve(ctx: AppContext, token: str | None) -> ActiveSession | None:
    """The live session of a cookie's token, or None (unknown, ended, expired or idle too long)."""
    if not token or len(token) > 100:
        return None
    return await to_thread.run_sync(_resolve, ctx, token)


def _resolve(ctx: AppContext, token: str) -> ActiveSession | None:
    now = ctx.clock.now()
    idle = timedelta(minutes=ctx.settings.dashboard.session_idle_minutes)
    with ctx.db.session() as session:
        row = session.exec(
            select(DashboardSession).where(
                col(DashboardSession.token_hash) == token_digest(ctx, token),
                col(DashboardSession.ended_at).is_(None),
            )
        ).first()
        if row is None or not still_live(session, row, now, idle):
            return None
        return ActiveSession.of(row, row.account_id)


def still_live(session: Session, row: DashboardSession | Any, now: datetime, idle: timedelta) -> bool:
    """Whether a session row (of ``dashboard_sessions`` or a table of the same columns) has neither
    passed its lifetime nor sat unused ``idle``; a live one's ``last_seen_at`` is written, at most
    once per :data:`TOUCH_EVERY`."""
    if row.expires_at <= now or row.last_seen_at + idle <= now:
        return False
    if now - row.last_seen_at >= TOUCH_EVERY:
        row.last_seen_at = now
        session.add(row)
    return True


async def complete_second_factor(ctx: AppContext, pending: ActiveSession) -> str:
    """End the pending session and open a full one for the same browser; returns the new token."""

    def swap() -> str:
        _end(ctx, pending.account_id, pending.id)
        return _start(ctx, pending.account_id, pending_totp=False, user_agent=pending.user_agent)

    return await to_thread.run_sync(swap)


async def end(ctx: AppContext, account_id: int, session_id: int) -> bool:
    """Sign a session of ``account_id`` out (sign-out; the account's own sign-out of another browser).
    False when there was no such live session."""
    return await to_thread.run_sync(_end, ctx, account_id, session_id)


def _end(ctx: AppContext, account_id: int, session_id: int) -> bool:
    with ctx.db.session() as session:
        ended = rowcount(
            session.execute(
                sa.update(DashboardSession)
                .where(
                    col(DashboardSession.id) == session_id,
                    col(DashboardSession.account_id) == account_id,
                    col(DashboardSession.ended_at).is_(None),
                )
                .values(ended_at=ctx.clock.now())
            )
        )
    return ended == 1


async def end_others(ctx: AppContext, customer: Customer, keep_id: int | None) -> int:
    """Sign out every session of the account but ``keep_id``; returns how many ended."""
    return await to_thread.run_sync(_end_others, ctx, customer.account_id, keep_id)


def _end_others(ctx: AppContext, account_id: int, keep_id: int | None) -> int:
    with ctx.db.session() as session:
        stmt = sa.update(DashboardSession).where(
            col(DashboardSession.account_id) == account_id, col(DashboardSession.ended_at).is_(None)
        )
        if keep_id is not None:
            stmt = stmt.where(col(DashboardSession.id) != keep_id)
        return rowcount(session.execute(stmt.values(ended_at=ctx.clock.now())))


async def live(ctx: AppContext, customer: Customer) -> list[ActiveSession]:
    """The account's signed-in browsers, newest first."""
    return await to_thread.run_sync(_live, ctx, customer.account_id)


def _live(ctx: AppContext, account_id: int) -> list[ActiveSession]:
    now = ctx.clock.now()
    idle = timedelta(minutes=ctx.settings.dashboard.session_idle_minutes)
    with ctx.db.session() as session:
        rows = session.exec(
            select(DashboardSession)
            .where(
                col(DashboardSession.account_id) == account_id,
                col(DashboardSession.ended_at).is_(None),
                col(DashboardSession.pending_totp).is_(False),
                col(DashboardSession.expires_at) > now,
                col(DashboardSession.last_seen_at) > now - idle,
            )
            .order_by(col(DashboardSession.id).desc())
        ).all()
    return [ActiveSession.of(r, r.account_id) for r in rows]
