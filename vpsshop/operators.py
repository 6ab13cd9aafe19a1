"""The people who run the shop through its web console (:mod:`vpsshop.backoffice`): operator accounts,
their sign-in and their sessions.

* An operator has a name, a role (``owner`` or ``support``, see :class:`vpsshop.actors.Operator`), a
  password stored as an argon2id hash, and a TOTP secret (Fernet-encrypted with ``encryption_key``,
  like the customers' in :mod:`vpsshop.twofactor`). Both are needed at every sign-in: there is no
  operator without two-factor. A code is accepted once (``totp_last_step``, as for customers).
* ``vpsshop admin operator add|list|disable|reset`` manages them; each change is in the audit log
  (``operator_add``, ``operator_disable``, ``operator_reset``) with who made it.
* Wrong sign-ins are counted per operator name and per client address (``[signin]`` limits); over
  either, sign-in is refused until the window has slid on.
* Sessions are server-side rows holding the keyed digest of a random cookie token, ended by
  sign-out, by disabling or resetting the operator, by ``[console] session_idle_minutes`` unused and
  by ``session_max_hours`` after sign-in.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pyotp
import sqlalchemy as sa
from anyio import to_thread
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlmodel import Field, SQLModel, col, select

from vpsshop.actors import Operator
from vpsshop.admin import AdminError, audit
from vpsshop.auth import keyed_digest
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.encryption import decrypt_text, encrypt_text
from vpsshop.models import UTCDateTime, saved_id
from vpsshop.ratelimit import Rule, limiter_for
from vpsshop.sessions import ActiveSession, still_live
from vpsshop.twofactor import matching_step

ROLES = ("owner", "support")
MIN_PASSWORD_LENGTH = 12
_hasher = PasswordHasher()
_NAME_CHARACTERS = set("abcdefghijklmnopqrstuvwxyz0123456789._-")


def _ts(nullable: bool = False) -> Any:
    return Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=nullable))


class OperatorAccount(SQLModel, table=True):
    """A person who signs in to the web console."""

    __tablename__ = "operators"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, unique=True, nullable=False)
    role: str = Field(max_length=16, nullable=False)
    password_hash: str = Field(max_length=200, nullable=False)
    totp_secret_enc: str = Field(max_length=500, nullable=False)
    totp_last_step: int | None = Field(default=None, sa_type=sa.BigInteger)
    created_at: datetime = _ts()
    disabled_at: datetime | None = _ts(nullable=True)
    last_signin_at: datetime | None = _ts(nullable=True)


class OperatorSession(SQLModel, table=True):
    """A signed-in browser of an operator: the keyed digest of its cookie's token."""

    __tablename__ = "operator_sessions"

    id: int | None = Field(default=None, primary_key=True)
    operator_id: int = Field(foreign_key="operators.id", index=True, nullable=False)
    token_hash: str = Field(max_length=64, unique=True, nullable=False)
    user_agent: str | None = Field(default=None, max_length=200)
    created_at: datetime = _ts()
    last_seen_at: datetime = _ts()
    expires_at: datetime = _ts()
    ended_at: datetime | None = _ts(nullable=True)


@dataclass(frozen=True)
class Enrolment:
    """What the new operator types into an authenticator app (shown once, by the command)."""

    name: str
    role: str
    secret: str
    uri: str


@dataclass(frozen=True)
class SignedIn:
    """A live console session and the operator it belongs to."""

    session: ActiveSession
    """The session, as the dashboard's pipeline reads one (``account_id`` holds the operator's id)."""
    name: str
    role: str

    @property
    def actor(self) -> Operator:
        """Who acts, as the audit log names them: ``console:<name>``."""
        return Operator(f"console:{self.name}", self.role)


class SigninRefused(Exception):
    """Wrong name, password or code (one message for all three), a disabled operator, or too many tries."""


# ---- managing operators (vpsshop admin operator ...) -------------------------------------------------


def _check_name(name: str) -> str:
    name = name.strip().lower()
    if not 2 <= len(name) <= 40 or not set(name) <= _NAME_CHARACTERS:
        raise AdminError("NAME must be 2 to 40 characters: lower-case letters, digits, '.', '_' or '-'")
    return name


def _check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_LENGTH or len(password) > 500:
        raise AdminError(f"the password must be {MIN_PASSWORD_LENGTH} to 500 characters long")
    return password


def _enrolment(ctx: AppContext, name: str, role: str, secret: str) -> Enrolment:
    from urllib.parse import urlsplit

    issuer = f"{urlsplit(ctx.settings.public_url).hostname or 'vpsshop'} console"
    uri = pyotp.TOTP(secret).provisioning_uri(name=name, issuer_name=issuer)
    return Enrolment(name, role, secret, uri)


def add_operator(ctx: AppContext, by: Operator, name: str, role: str, password: str) -> Enrolment:
    """A new operator; returns the TOTP secret for their authenticator app (its only showing)."""
    name, password = _check_name(name), _check_password(password)
    if role not in ROLES:
        raise AdminError(f"--role must be one of {', '.join(ROLES)}")
    secret = pyotp.random_base32()
    now = ctx.clock.now()
    with ctx.db.session() as session:
        if session.exec(select(OperatorAccount).where(col(OperatorAccount.name) == name)).first() is not None:
            raise AdminError(f"there is an operator {name} already (reset or disable it)")
        session.add(
            OperatorAccount(
                name=name,
                role=role,
                password_hash=_hasher.hash(password),
                totp_secret_enc=encrypt_text(ctx, secret),
                created_at=now,
            )
        )
        audit(session, by, "operator_add", f"operator:{name}", f"new {role}", {"after": {"role": role}}, now=now)
    return _enrolment(ctx, name, role, secret)


def list_operators(ctx: AppContext) -> list[dict[str, Any]]:
    with ctx.db.session() as session:
        rows = session.exec(select(OperatorAccount).order_by(col(OperatorAccount.name))).all()
        return [
            {
                "name": r.name,
                "role": r.role,
                "created_at": r.created_at,
                "disabled_at": r.disabled_at,
                "last_signin_at": r.last_signin_at,
            }
            for r in rows
        ]


def _end_sessions(session: Any, operator_id: int, now: datetime) -> int:
    return rowcount(
        session.execute(
            sa.update(OperatorSession)
            .where(col(OperatorSession.operator_id) == operator_id, col(OperatorSession.ended_at).is_(None))
            .values(ended_at=now)
        )
    )


def _named(session: Any, name: str) -> OperatorAccount:
    row = session.exec(
        select(OperatorAccount).where(col(OperatorAccount.name) == name.strip().lower()).with_for_update()
    ).first()
    if row is None:
        raise AdminError(f"no operator {name!r}")
    return row  # type: ignore[no-any-return]


def disable_operator(ctx: AppContext, by: Operator, name: str, reason: str) -> int:
    """Disable an operator and end their sessions at once; returns how many sessions ended."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = _named(session, name)
        was = "disabled" if row.disabled_at else "enabled"
        row.disabled_at = row.disabled_at or now
        session.add(row)
        ended = _end_sessions(session, saved_id(row), now)
        detail = {"before": was, "after": "disabled", "sessions_ended": ended}
        audit(session, by, "operator_disable", f"operator:{row.name}", reason.strip() or "disabled", detail, now=now)
    return ended


def reset_operator(ctx: AppContext, by: Operator, name: str, password: str, reason: str) -> Enrolment:
    """A new password and a new TOTP secret (the old app entry stops working), sessions ended, and the
    operator enabled again."""
    password = _check_password(password)
    secret = pyotp.random_base32()
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = _named(session, name)
        was = "disabled" if row.disabled_at else "enabled"
        row.password_hash = _hasher.hash(password)
        row.totp_secret_enc = encrypt_text(ctx, secret)
        row.totp_last_step = None
        row.disabled_at = None
        session.add(row)
        ended = _end_sessions(session, saved_id(row), now)
        detail = {"before": was, "after": "enabled, new password and TOTP secret", "sessions_ended": ended}
        audit(session, by, "operator_reset", f"operator:{row.name}", reason.strip() or "reset", detail, now=now)
        role = row.role
    return _enrolment(ctx, name.strip().lower(), role, secret)


# ---- signing in --------------------------------------------------------------------------------------


def _rules(ctx: AppContext) -> tuple[Rule, Rule]:
    limits = ctx.settings.signin
    return (
        Rule("operator-signin-name", limits.totp_failures_per_account, limits.totp_window_seconds),
        Rule("operator-signin-client", limits.failures_per_client, limits.client_window_seconds),
    )


def token_digest(ctx: AppContext, token: str) -> str:
    return keyed_digest(ctx.settings.secret_key_bytes(), "operator session", token)


async def sign_in(ctx: AppContext, name: str, password: str, code: str, client: str, user_agent: str | None) -> str:
    """Check name, password and TOTP code together; returns a new session's token for the cookie.

    :raises SigninRefused: any of the three wrong, the operator disabled, or too many failures.
    """
    return await to_thread.run_sync(lambda: _sign_in(ctx, name, password, code, client, user_agent))


def _sign_in(ctx: AppContext, name: str, password: str, code: str, client: str, user_agent: str | None) -> str:
    name = name.strip().lower()[:64]
    by_name, by_client = _rules(ctx)
    limiter = limiter_for(ctx)
    decisions = (limiter.hit(by_name, name), limiter.hit(by_client, client))
    if not all(d.allowed for d in decisions):
        raise SigninRefused("Too many failed sign-ins: wait a few minutes, then try again.")
    now = ctx.clock.now()
    code = "".join(code.split())
    with ctx.db.session() as session:
        row = session.exec(select(OperatorAccount).where(col(OperatorAccount.name) == name)).first()
        ok = row is not None and row.disabled_at is None and _password_matches(row.password_hash, password)
        step = None
        if row is not None and ok and code.isdigit():
            step = matching_step(decrypt_text(ctx, row.totp_secret_enc, "operator TOTP secret"), code, now.timestamp())
        if row is None or step is None:
            raise SigninRefused("The name, password or code is not right.")
        used = rowcount(
            session.execute(
                sa.update(OperatorAccount)
                .where(
                    col(OperatorAccount.id) == row.id,
                    sa.or_(col(OperatorAccount.totp_last_step).is_(None), col(OperatorAccount.totp_last_step) < step),
                )
                .values(totp_last_step=step, last_signin_at=now)
            )
        )
        if used != 1:
            raise SigninRefused("That code was used already: wait for the next one.")
        token = secrets.token_urlsafe(32)
        hours = ctx.settings.console.session_max_hours
        session.add(
            OperatorSession(
                operator_id=saved_id(row),
                token_hash=token_digest(ctx, token),
                user_agent=(user_agent or "")[:200] or None,
                created_at=now,
                last_seen_at=now,
                expires_at=now + timedelta(hours=hours),
            )
        )
    for rule, key in ((by_name, name), (by_client, client)):
        limiter.refund(rule, key)
    return token


def _password_matches(stored: str, password: str) -> bool:
    try:
        return _hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False


async def resolve(ctx: AppContext, token: str | None) -> SignedIn | None:
    """The live session of a cookie's token, or None (unknown, ended, expired, idle, operator disabled)."""
    if not token or len(token) > 100:
        return None
    return await to_thread.run_sync(_resolve, ctx, token)


def _resolve(ctx: AppContext, token: str) -> SignedIn | None:
    now = ctx.clock.now()
    idle = timedelta(minutes=ctx.settings.console.session_idle_minutes)
    with ctx.db.session() as session:
        found = session.exec(
            select(OperatorSession, OperatorAccount)
            .join(OperatorAccount, col(OperatorAccount.id) == col(OperatorSession.operator_id))
            .where(
                col(OperatorSession.token_hash) == token_digest(ctx, token),
                col(OperatorSession.ended_at).is_(None),
                col(OperatorAccount.disabled_at).is_(None),
            )
        ).first()
        if found is None:
            return None
        row, operator = found
        if not still_live(session, row, now, idle):
            return None
        return SignedIn(ActiveSession.of(row, saved_id(operator)), operator.name, operator.role)


async def sign_out(ctx: AppContext, signed_in: SignedIn) -> None:
    def end() -> None:
        with ctx.db.session() as session:
            session.execute(
                sa.update(OperatorSession)
                .where(col(OperatorSession.id) == signed_in.session.id)
                .values(ended_at=ctx.clock.now())
            )

    await to_thread.run_sync(end)
