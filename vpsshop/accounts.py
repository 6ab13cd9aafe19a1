"""Accounts, API keys and signing in with the login token: the services behind ``/v1/account``,
``/v1/keys``, ``/v1/login`` and the dashboard's account pages.

Both the API endpoints (:mod:`vpsshop.api.accounts`) and the dashboard call these functions; they
are synchronous (the database), so async callers run them in the thread pool.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlmodel import select

from vpsshop import events, twofactor
from vpsshop.auth import login_token_selector, new_api_key, new_login_token, verify_login_token
from vpsshop.context import AppContext
from vpsshop.db import touch_account
from vpsshop.errors import ApiError, NotFound, Unauthorized
from vpsshop.events.resources import account_data, api_key_data
from vpsshop.models import Account, ApiKey, LedgerEntry, Server
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.ratelimit import RateLimited, Rule, limiter_for

INVALID_TOKEN = "The login token is not valid."


class AccountOut(BaseModel):
    """The seed's Account."""

    user_id: int
    balance_usd: UsdAmount = Field(description="Prepaid balance in USD.")
    currency: str = Field("USD", description="Always USD.")
    servers: int = Field(description="Servers of this account that are not terminated.")
    totp_enabled: bool = Field(
        description="Two-factor sign-in is on (turned on in the web dashboard): signing in "
        "with the login token, in the dashboard or with POST /login, also needs a TOTP code. "
        "API keys are not affected."
    )
    created_at: datetime


class AccountCreated(BaseModel):
    """Response of ``POST /account``. ``api_key`` and ``login_token`` are shown this once only."""

    user_id: int
    api_key: str = Field(description="Bearer credential, starts with vpsk_. Shown once; stored only as a hash.")
    key_id: int = Field(description="Id of that key, for DELETE /keys/{id}.")
    login_token: str = Field(description="Dashboard sign-in credential, not a Bearer key. Shown once.")
    balance_usd: UsdAmount
    currency: str = "USD"
    created_at: datetime


class ApiKeyOut(BaseModel):
    id: int
    prefix: str = Field(description="First characters of the key, to tell keys apart.")
    name: str | None
    created_at: datetime


class ApiKeyList(BaseModel):
    keys: list[ApiKeyOut] = Field(description="Active keys of the account, oldest first.")


class ApiKeyCreated(ApiKeyOut):
    api_key: str = Field(description="The full key. Shown once; stored only as a hash.")


class ApiKeyRevoked(BaseModel):
    id: int
    prefix: str
    revoked: bool = True
    revoked_at: datetime


class LedgerEntryOut(BaseModel):
    """One change of the balance, as the dashboard lists it."""

    id: int
    amount_usd: UsdAmount
    balance_after_usd: UsdAmount
    reason: str
    ref: str | None
    memo: str | None
    created_at: datetime


def create_account(ctx: AppContext) -> AccountCreated:
    """A new account with a zero balance, its first API key and its login token (both stored as keyed
    digests: no slow hash, so creating an account costs a few writes and no memory to speak of)."""
    key = new_api_key(ctx.settings.secret_key_bytes())
    token = new_login_token(ctx.settings.secret_key_bytes())
    now = ctx.clock.now()
    with ctx.db.session() as session:
        account = Account(login_selector=token.selector, login_hash=token.hash, created_at=now)
        session.add(account)
        session.flush()
        assert account.id is not None
        api_key = ApiKey(account_id=account.id, key_hash=key.digest, prefix=key.prefix, name="default", created_at=now)
        session.add(api_key)
        session.flush()
        assert api_key.id is not None
        events.emit(session, "account.created", account.id, account_data(account.id, now), now=now)
        events.emit(session, "api_key.created", account.id, api_key_data(api_key), now=now)
        return AccountCreated(
            user_id=account.id,
            api_key=key.value,
            key_id=api_key.id,
            login_token=token.value,
            balance_usd=micros_to_usd(0),
            created_at=now,
        )


def get_account(ctx: AppContext, account_id: int) -> AccountOut:
    """The Account of ``GET /v1/account``, read for one account (the API reads it at authentication)."""
    with ctx.db.session() as session:
        account = session.get(Account, account_id)
        if account is None:
            raise NotFound("account")
        servers = session.execute(
            select(sa.func.count())
            .select_from(Server)
            .where(Server.account_id == account_id, Server.status != "terminated")
        ).scalar()
        return AccountOut(
            user_id=account_id,
            balance_usd=micros_to_usd(account.balance_micros),
            servers=int(servers or 0),
            totp_enabled=account.totp_enabled,
            created_at=account.created_at,
        )


def list_keys(ctx: AppContext, account_id: int) -> ApiKeyList:
    with ctx.db.session() as session:
        rows = session.exec(
            select(ApiKey).where(ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None)).order_by(ApiKey.id)  # type: ignore[union-attr]
        ).all()
        return ApiKeyList(
            keys=[
                ApiKeyOut(id=k.id, prefix=k.prefix, name=k.name, created_at=k.created_at)  # type: ignore[arg-type]
                for k in rows
            ]
        )


def mint_key(ctx: AppContext, account_id: int, name: str | None) -> ApiKeyCreated:
    key = new_api_key(ctx.settings.secret_key_bytes())
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = ApiKey(account_id=account_id, key_hash=key.digest, prefix=key.prefix, name=name, created_at=now)
        session.add(row)
        session.flush()
        assert row.id is not None
        events.emit(session, "api_key.created", account_id, api_key_data(row), now=now)
        return ApiKeyCreated(id=row.id, prefix=key.prefix, name=name, created_at=now, api_key=key.value)


def revoke_key(ctx: AppContext, account_id: int, key_id: int) -> ApiKeyRevoked:
    """:raises NotFound: no active key ``key_id`` on this account."""
    now = ctx.clock.now()
    with ctx.db.session() as session:
        key = session.exec(
            select(ApiKey).where(ApiKey.id == key_id, ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None))  # type: ignore[union-attr]
        ).first()
        if key is None:
            raise NotFound("API key")
        key.revoked_at = now
        session.add(key)
        events.emit(session, "api_key.revoked", account_id, api_key_data(key), now=now)
        touch_account(session, account_id)  # this process forgets the key before it answers
        return ApiKeyRevoked(id=key_id, prefix=key.prefix, revoked_at=now)


def ledger_entries(ctx: AppContext, account_id: int, limit: int = 20) -> list[LedgerEntryOut]:
    """The account's newest balance changes, newest first."""
    with ctx.db.session() as session:
        rows = session.exec(
            select(LedgerEntry).where(LedgerEntry.account_id == account_id).order_by(LedgerEntry.id.desc()).limit(limit)
        ).all()  # type: ignore[union-attr]
        return [
            LedgerEntryOut(
                id=e.id,
                amount_usd=micros_to_usd(e.amount_micros),  # type: ignore[arg-type]
                balance_after_usd=micros_to_usd(e.balance_after_micros),
                reason=e.reason,
                ref=e.ref,
                memo=e.memo,
                created_at=e.created_at,
            )
            for e in rows
        ]


# ---- signing in with the login token -------------------------------------------------------------


def client_rule(ctx: AppContext) -> Rule:
    limits = ctx.settings.signin
    return Rule("signin-failures", limits.failures_per_client, limits.client_window_seconds)


def check_login_token(ctx: AppContext, token: str, client: str) -> tuple[int, bool]:
    """The account of a login token and whether it has two-factor on.

    Failed attempts are counted per client address (``[signin]`` settings); over the limit every
    attempt from that address is refused until enough have slid out of the window, before any hash
    is computed. An attempt is counted before it is checked and given back when it succeeds, so
    attempts sent together cannot slip past the limit.

    :raises Unauthorized: the token is not valid.
    :raises RateLimited: too many failed sign-ins from ``client``.
    """
    limiter, rule = limiter_for(ctx), client_rule(ctx)
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
                .where(Account.id == account.id, Account.login_hash == account.login_hash)
                .values(login_hash=check.upgrade)
            )
    limiter.refund(rule, client)
    assert account.id is not None
    return account.id, account.totp_enabled


def check_second_factor(ctx: AppContext, account_id: int, code: str | None, client: str) -> None:
    """:func:`vpsshop.twofactor.verify`, a failure also counted against the client address."""
    try:
        twofactor.verify(ctx, account_id, code)
    except twofactor.InvalidCode:
        limiter_for(ctx).hit(client_rule(ctx), client)
        raise


def login(ctx: AppContext, token: str, totp_code: str | None, client: str) -> ApiKeyCreated:
    """``POST /v1/login``: a new API key named "dashboard" for the login token, and the two-factor
    code when the account has two-factor on (401 ``totp_required`` without it)."""
    account_id, totp_enabled = check_login_token(ctx, token, client)
    if totp_enabled:
        if totp_code is None or not totp_code.strip():
            raise ApiError(
                401,
                "totp_required",
                "This account has two-factor sign-in: send totp_code, the "
                "current code of the authenticator app (or a recovery code).",
            )
        check_second_factor(ctx, account_id, totp_code, client)
    return mint_key(ctx, account_id, "dashboard")
