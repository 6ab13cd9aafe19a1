"""Two-factor sign-in: TOTP (RFC 6238, what authenticator apps speak) and one-time recovery codes.

* The secret (160 random bits, base32) is stored Fernet-encrypted with ``settings.encryption_key``
  (:mod:`vpsshop.encryption`), never in clear. It is written when enrolment starts, while
  ``accounts.totp_enabled`` is still false; a code from the app turns two-factor on.
* A code is six digits for a 30-second step; the previous and the next step are accepted too, for
  clocks that drift. A code is accepted at most once: ``accounts.totp_last_step`` remembers the
  step of the last one, and a conditional update refuses a step at or before it, even when two
  requests race.
* Ten recovery codes are made when two-factor is turned on, shown once and stored only as keyed
  digests (:func:`vpsshop.auth.keyed_digest`). Each works once, wherever a code is asked for.
* Wrong codes are counted per account (:mod:`vpsshop.ratelimit`, ``[signin]`` settings); over the
  limit, every code of that account is refused until enough have slid out of the window, so the
  million codes cannot be tried.

What it changes (``docs/dashboard.md``): signing in to the dashboard and ``POST /v1/login`` ask for a
code; the dashboard asks for one again before it reveals a server's root password. Bearer API keys
are not affected (a key is a full credential of its own, minted by someone who signed in), but for
one irreversible call: terminating a server (``DELETE /v1/servers/{id}``) asks for ``totp_code``.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyotp
import sqlalchemy as sa
from anyio import to_thread
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop.accounts import account_event
from vpsshop.actors import Customer
from vpsshop.auth import keyed_digest
from vpsshop.context import AppContext
from vpsshop.db import rowcount, touch_account
from vpsshop.encryption import decrypt_text, encrypt_text
from vpsshop.errors import ApiError, BadRequest, Conflict
from vpsshop.models import Account, RecoveryCode
from vpsshop.qrcodes import png_data_uri
from vpsshop.ratelimit import RateLimited, Rule, limiter_for

STEP_SECONDS = 30
DIGITS = 6
RECOVERY_CODE_COUNT = 10
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: read off paper without doubt


class InvalidCode(ApiError):
    """A two-factor code that is wrong, used already or from another step: 401 ``invalid_totp_code``."""

    def __init__(
        self,
        message: str = "The two-factor code is not right. Use the current code from your "
        "authenticator app, or one of your recovery codes.",
    ) -> None:
        super().__init__(401, "invalid_totp_code", message)


@dataclass(frozen=True)
class Enrolment:
    """What an authenticator app needs: the secret, its ``otpauth://`` URI and that URI as a QR code."""

    secret: str
    uri: str
    qr_data_uri: str


def failure_rule(ctx: AppContext) -> Rule:
    limits = ctx.settings.signin
    return Rule("totp-failures", limits.totp_failures_per_account, limits.totp_window_seconds)


def _issuer(ctx: AppContext) -> str:
    return urlsplit(ctx.settings.public_url).hostname or "vpsshop"


def _enrolment(ctx: AppContext, account_id: int, secret: str) -> Enrolment:
    uri = pyotp.TOTP(secret).provisioning_uri(name=f"account {account_id}", issuer_name=_issuer(ctx))
    return Enrolment(secret=secret, uri=uri, qr_data_uri=png_data_uri(uri))


async def begin_enrolment(ctx: AppContext, customer: Customer) -> Enrolment:
    """The secret to add to an authenticator app: a new one, or the one of an unfinished enrolment.

    :raises Conflict: ``totp_enabled`` (turn it off first to change the app).
    """
    return await to_thread.run_sync(_begin_enrolment, ctx, customer.account_id)


def _begin_enrolment(ctx: AppContext, account_id: int) -> Enrolment:
    with ctx.db.session() as session:
        account = _enrolling(session, account_id)
        if account.totp_secret_enc is None:
            secret = pyotp.random_base32()
            account.totp_secret_enc = encrypt_text(ctx, secret)
            account.totp_last_step = None
            session.add(account)
        else:
            secret = decrypt_text(ctx, account.totp_secret_enc, "TOTP secret")
    return _enrolment(ctx, account_id, secret)


async def confirm_enrolment(ctx: AppContext, customer: Customer, code: str) -> list[str]:
    """Turn two-factor on with a code from the app; returns the recovery codes (shown once). Emits
    ``account.updated``.

    :raises InvalidCode: the code does not match the enrolment's secret.
    :raises Conflict: no enrolment started (``totp_not_started``) or on already (``totp_enabled``).
    :raises RateLimited: too many wrong codes.
    """
    return await to_thread.run_sync(_confirm_enrolment, ctx, customer.account_id, code)


def _confirm_enrolment(ctx: AppContext, account_id: int, code: str) -> list[str]:
    code = _normalise(code)
    _count_attempt(ctx, account_id)
    with ctx.db.session() as session:
        account = _enrolling(session, account_id)
        if account.totp_secret_enc is None:
            raise Conflict("totp_not_started", "Start setting up two-factor sign-in first.")
        secret = decrypt_text(ctx, account.totp_secret_enc, "TOTP secret")
        step = matching_step(secret, code, ctx.clock.now().timestamp()) if code.isdigit() else None
        if step is not None:
            account.totp_enabled = True
            account.totp_last_step = step
            session.add(account)
            touch_account(session, account_id)  # GET /v1/account shows totp_enabled: drop this process's copy
            codes = _new_recovery_codes(ctx, session, account_id)
            events.emit(session, "account.updated", account_id, account_event(session, account_id), now=ctx.clock.now())
    if step is not None:
        _refund_attempt(ctx, account_id)  # after the commit: SQLite has one writer at a time
        return codes
    raise InvalidCode(
        "That code does not match. Check that the app shows the account you just added, and type the code it shows now."
    )


async def disable(ctx: AppContext, customer: Customer, code: str) -> None:
    """Turn two-factor off; needs a current code or a recovery code. Clears the secret and codes.
    Emits ``account.updated``."""

    def run() -> None:
        account_id = customer.account_id
        check_code(ctx, account_id, code)
        with ctx.db.session() as session:
            session.execute(
                sa.update(Account)
                .where(col(Account.id) == account_id)
                .values(totp_enabled=False, totp_secret_enc=None, totp_last_step=None)
            )
            touch_account(session, account_id)
            session.execute(sa.delete(RecoveryCode).where(col(RecoveryCode.account_id) == account_id))
            events.emit(session, "account.updated", account_id, account_event(session, account_id), now=ctx.clock.now())

    await to_thread.run_sync(run)


async def regenerate_recovery_codes(ctx: AppContext, customer: Customer, code: str) -> list[str]:
    """New recovery codes for old ones (which stop working); needs a current code."""

    def run() -> list[str]:
        check_code(ctx, customer.account_id, code)
        with ctx.db.session() as session:
            return _new_recovery_codes(ctx, session, customer.account_id)

    return await to_thread.run_sync(run)


async def recovery_codes_left(ctx: AppContext, customer: Customer) -> int:
    def count() -> int:
        with ctx.db.session() as session:
            found = session.execute(
                select(sa.func.count())
                .select_from(RecoveryCode)
                .where(RecoveryCode.account_id == customer.account_id, col(RecoveryCode.used_at).is_(None))
            ).scalar()
            return int(found or 0)

    return await to_thread.run_sync(count)


async def verify(ctx: AppContext, customer: Customer, code: str | None) -> str:
    """:func:`check_code` for the account of ``customer`` (the dashboard asks for a fresh code before it
    reveals a secret)."""
    return await to_thread.run_sync(check_code, ctx, customer.account_id, code)


def code_required() -> ApiError:
    """The API's 401 ``totp_required``: a call that needs a two-factor code (``POST /v1/login``,
    ``DELETE /v1/servers/{id}``) was sent without ``totp_code`` by an account that has two-factor on."""
    return ApiError(
        401,
        "totp_required",
        "This account has two-factor sign-in: send totp_code, the current code of the authenticator app "
        "(or a recovery code).",
    )


def check_code(ctx: AppContext, account_id: int, code: str | None) -> str:
    """Check a second factor of an account that has two-factor on: a TOTP code, used once, or an
    unused recovery code, which is used up. Returns ``"totp"`` or ``"recovery_code"``.

    :raises InvalidCode: wrong, reused, or two-factor is off.
    :raises BadRequest: ``totp_required`` when no code was given.
    :raises RateLimited: too many wrong codes for this account.
    """
    if code is None or not code.strip():
        raise BadRequest(
            "totp_required",
            "This account has two-factor sign-in: give the code from your authenticator app (or a recovery code).",
        )
    code = _normalise(code)
    _count_attempt(ctx, account_id)
    kind = _check(ctx, account_id, code)
    if kind is None:
        raise InvalidCode()
    _refund_attempt(ctx, account_id)
    return kind


def _check(ctx: AppContext, account_id: int, code: str) -> str | None:
    """Use up the code if it is right: ``"totp"``, ``"recovery_code"``, else None."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        account = session.get(Account, account_id)
        if account is None or not account.totp_enabled or account.totp_secret_enc is None:
            raise InvalidCode("Two-factor sign-in is not on for this account.")
        if code.isdigit() and len(code) == DIGITS:
            secret = decrypt_text(ctx, account.totp_secret_enc, "TOTP secret")
            step = matching_step(secret, code, now.timestamp())
            if step is not None:
                used = rowcount(
                    session.execute(
                        sa.update(Account)
                        .where(
                            col(Account.id) == account_id,
                            sa.or_(col(Account.totp_last_step).is_(None), col(Account.totp_last_step) < step),
                        )
                        .values(totp_last_step=step)
                    )
                )
                if used == 1:
                    return "totp"
        elif len(code) >= 8:
            digest = keyed_digest(ctx.settings.secret_key_bytes(), "recovery code", code)
            used = rowcount(
                session.execute(
                    sa.update(RecoveryCode)
                    .where(
                        col(RecoveryCode.account_id) == account_id,
                        col(RecoveryCode.code_hash) == digest,
                        col(RecoveryCode.used_at).is_(None),
                    )
                    .values(used_at=now)
                )
            )
            if used == 1:
                return "recovery_code"
    return None


def current_code(secret: str, timestamp: float) -> str:
    """The code an authenticator app shows for ``secret`` at ``timestamp`` (tests, support)."""
    return pyotp.TOTP(secret).generate_otp(int(timestamp) // STEP_SECONDS)


# ---- internals -----------------------------------------------------------------------------------


def _enrolling(session: Session, account_id: int) -> Account:
    """The account, locked for this transaction. :raises Conflict: two-factor is on already."""
    account = session.get(Account, account_id, with_for_update=True)
    assert account is not None
    if account.totp_enabled:
        raise Conflict("totp_enabled", "Two-factor sign-in is on already; turn it off first to change the app.")
    return account


def _normalise(code: str) -> str:
    return "".join(code.split()).replace("-", "").lower()[:64]


def matching_step(secret: str, code: str, timestamp: float) -> int | None:
    """The 30-second step whose code ``code`` is (the previous, current or next), or None."""
    totp = pyotp.TOTP(secret)
    now_step = int(timestamp) // STEP_SECONDS
    for step in (now_step - 1, now_step, now_step + 1):
        if hmac.compare_digest(totp.generate_otp(step), code):
            return step
    return None


def _count_attempt(ctx: AppContext, account_id: int) -> None:
    """Count a code attempt before checking it (so attempts sent together all count); a right code
    is given back by :func:`_refund_attempt`, so the limit counts wrong codes."""
    decision = limiter_for(ctx).hit(failure_rule(ctx), str(account_id))
    if not decision.allowed:
        raise RateLimited("Too many wrong two-factor codes for this account.", decision.retry_after)


def _refund_attempt(ctx: AppContext, account_id: int) -> None:
    limiter_for(ctx).refund(failure_rule(ctx), str(account_id))


def _new_recovery_codes(ctx: AppContext, session: Session, account_id: int) -> list[str]:
    session.execute(sa.delete(RecoveryCode).where(col(RecoveryCode.account_id) == account_id))
    now = ctx.clock.now()
    codes = []
    key = ctx.settings.secret_key_bytes()
    for _ in range(RECOVERY_CODE_COUNT):
        raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(10))
        codes.append(f"{raw[:5]}-{raw[5:]}")
        session.add(
            RecoveryCode(account_id=account_id, code_hash=keyed_digest(key, "recovery code", raw), created_at=now)
        )
    session.flush()
    return codes
