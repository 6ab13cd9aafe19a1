"""Signing in with the login token: a new API key for it (``POST /v1/login``), or the dashboard's
sign-in (a session, :mod:`vpsshop.sessions`), with the two-factor code when the account has it on.

Failed attempts are counted per client address (``[signin]`` settings); over the limit every
attempt from that address is refused until enough have slid out of the (sliding) window, before any
hash is computed. An attempt is counted before it is checked and given back when it succeeds, so
attempts sent together cannot slip past the limit.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from anyio import to_thread
from pydantic import Field
from sqlmodel import col, select

from vpsshop import twofactor
from vpsshop.accounts import ApiKeyCreated, mint_key
from vpsshop.auth import login_token_selector, verify_login_token
from vpsshop.context import AppContext
from vpsshop.errors import Unauthorized
from vpsshop.inputs import Input
from vpsshop.models import Account
from vpsshop.ratelimit import RateLimited, Rule, limiter_for

__all__ = [
    "INVALID_TOKEN",
    "LoginInput",
    "check_login_token",
    "check_second_factor",
    "count_attempt",
    "login",
    "second_factor",
]

INVALID_TOKEN = "The login token is not valid."


class LoginInput(Input):
    """Body of ``POST /login``."""

    login_token: str = Field(
        min_length=1,
        max_length=200,
        description="The account's login token (vpsl_...), shown once when the account was created.",
    )
    totp_code: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Required when the account has two-factor sign-in on (Account.totp_enabled): the current "
        "6-digit code of the authenticator app, or one of the account's recovery codes (each works once).",
    )


def _client_rule(ctx: AppContext) -> Rule:
    limits = ctx.settings.signin
    return Rule("signin-failures", limits.failures_per_client, limits.client_window_seconds)


def _check_login_token(ctx: AppContext, token: str, client: str) -> tuple[int, bool]:
    limiter, rule = limiter_for(ctx), _client_rule(ctx)
    decision = limiter.hit(rule, client)
    if not decision.allowed:
        raise RateLimited("Too many failed sign-ins from your address.", decision.retry_after)
    selector = login_token_selector(token)
    account = None
    if selector is not None:
        with ctx.db.session() as session:
            account = session.exec(select(Account).where(Account.login_selector == selector)).first()
    check = verify_login_token(ctx.settings.secret_key_bytes(), account.login_hash, token) if account else None
    if account is None or check is None or not check.ok:
        raise Unauthorized(INVALID_TOKEN)
    if check.upgrade is not None:  # stored as argon2id by an earlier version: keep the fast digest from now on
        with ctx.db.session() as session:
            session.execute(
                sa.update(Account)
                .where(col(Account.id) == account.id, col(Account.login_hash) == account.login_hash)
                .values(login_hash=check.upgrade)
            )
    limiter.refund(rule, client)
    assert account.id is not None
    return account.id, account.totp_enabled


def _check_second_factor(ctx: AppContext, account_id: int, code: str | None, client: str) -> None:
    try:
        twofactor.check_code(ctx, account_id, code)
    except twofactor.InvalidCode:
        limiter_for(ctx).hit(_client_rule(ctx), client)
        raise


def count_attempt(ctx: AppContext, client: str) -> Callable[[], None]:
    """Count a sign-in attempt from ``client`` as failed until the returned function gives it back (on
    success): a wallet sign-in counts as a login token's does. Runs in a worker thread.

    :raises RateLimited: too many failed sign-ins from ``client``.
    """
    limiter, rule = limiter_for(ctx), _client_rule(ctx)
    decision = limiter.hit(rule, client)
    if not decision.allowed:
        raise RateLimited("Too many failed sign-ins from your address.", decision.retry_after)
    return lambda: limiter.refund(rule, client)


def second_factor(ctx: AppContext, account_id: int, code: str | None, client: str) -> None:
    """The two-factor code of an account that has it on (in a worker thread): 401 ``totp_required``
    without one, ``invalid_totp_code`` for a wrong one (also counted against ``client``)."""
    if code is None or not code.strip():
        raise twofactor.code_required()
    _check_second_factor(ctx, account_id, code, client)


async def check_login_token(ctx: AppContext, token: str, *, client: str) -> tuple[int, bool]:
    """The account of a login token and whether it has two-factor on.

    :raises Unauthorized: the token is not valid.
    :raises RateLimited: too many failed sign-ins from ``client``.
    """
    return await to_thread.run_sync(_check_login_token, ctx, token, client)


async def check_second_factor(ctx: AppContext, account_id: int, code: str | None, *, client: str) -> None:
    """The second step of a sign-in: :func:`vpsshop.twofactor.check_code`, a failure also counted
    against the client address."""
    await to_thread.run_sync(_check_second_factor, ctx, account_id, code, client)


async def login(ctx: AppContext, data: LoginInput, *, client: str) -> ApiKeyCreated:
    """A new API key named "dashboard" for the login token, and the two-factor code when the account
    has two-factor on (401 ``totp_required`` without it)."""

    def run() -> ApiKeyCreated:
        account_id, totp_enabled = _check_login_token(ctx, data.login_token, client)
        if totp_enabled:
            if data.totp_code is None or not data.totp_code.strip():
                raise twofactor.code_required()
            _check_second_factor(ctx, account_id, data.totp_code, client)
        return mint_key(ctx, account_id, "dashboard")

    return await to_thread.run_sync(run)
