"""Accounts, API keys and dashboard sign-in."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from sqlmodel import select

from vpsshop import events
from vpsshop.auth import login_token_selector, new_api_key, new_login_token, verify_login_token
from vpsshop.context import AppContext
from vpsshop.errors import NotFound, Unauthorized
from vpsshop.events.resources import account_data, api_key_data
from vpsshop.models import Account, ApiKey
from vpsshop.money import UsdAmount, micros_to_usd
from vpsshop.routing import ApiModel, ApiRoute, Call

TAG = ("account",)
NO_STORE = {"Cache-Control": "no-store"}  # responses that carry a credential


class AccountOut(BaseModel):
    """The seed's Account."""

    user_id: int
    balance_usd: UsdAmount = Field(description="Prepaid balance in USD.")
    currency: str = Field("USD", description="Always USD.")
    servers: int = Field(description="Servers of this account that are not terminated.")
    totp_enabled: bool
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


class NewKeyBody(ApiModel):
    name: str | None = Field(None, min_length=1, max_length=64, description="A label for the key.")


class LoginBody(ApiModel):
    login_token: str = Field(min_length=1, max_length=200)


def _create_account(ctx: AppContext) -> AccountCreated:
    key = new_api_key(ctx.settings.secret_key_bytes())
    token = new_login_token()  # argon2: slow on purpose, so this runs in the thread pool
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


async def create_account(call: Call) -> AccountCreated:
    return await run_in_threadpool(_create_account, call.ctx)


async def get_account(call: Call) -> AccountOut:
    me = call.principal
    assert me is not None
    return AccountOut(
        user_id=me.account_id,
        balance_usd=micros_to_usd(me.balance_micros),
        servers=me.servers,
        totp_enabled=me.totp_enabled,
        created_at=me.created_at,
    )


def _list_keys(ctx: AppContext, account_id: int) -> ApiKeyList:
    with ctx.db.session() as session:
        rows = session.exec(
            select(ApiKey).where(ApiKey.account_id == account_id, ApiKey.revoked_at.is_(None)).order_by(ApiKey.id)  # type: ignore[union-attr]
        ).all()
        return ApiKeyList(keys=[ApiKeyOut(id=k.id, prefix=k.prefix, name=k.name, created_at=k.created_at) for k in rows])  # type: ignore[arg-type]


async def list_keys(call: Call) -> ApiKeyList:
    return await run_in_threadpool(_list_keys, call.ctx, call.account_id)


def _mint_key(ctx: AppContext, account_id: int, name: str | None) -> ApiKeyCreated:
    key = new_api_key(ctx.settings.secret_key_bytes())
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = ApiKey(account_id=account_id, key_hash=key.digest, prefix=key.prefix, name=name, created_at=now)
        session.add(row)
        session.flush()
        assert row.id is not None
        events.emit(session, "api_key.created", account_id, api_key_data(row), now=now)
        return ApiKeyCreated(id=row.id, prefix=key.prefix, name=name, created_at=now, api_key=key.value)


async def create_key(call: Call) -> ApiKeyCreated:
    body: NewKeyBody = call.body
    return await run_in_threadpool(_mint_key, call.ctx, call.account_id, body.name)


def _revoke_key(ctx: AppContext, account_id: int, key_id: int) -> ApiKeyRevoked:
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
        return ApiKeyRevoked(id=key_id, prefix=key.prefix, revoked_at=now)


async def revoke_key(call: Call) -> ApiKeyRevoked:
    return await run_in_threadpool(_revoke_key, call.ctx, call.account_id, call.path["id"])


def _login(ctx: AppContext, token: str) -> ApiKeyCreated:
    selector = login_token_selector(token)
    if selector is None:
        raise Unauthorized("The login token is not valid.")
    with ctx.db.session() as session:
        account = session.exec(select(Account).where(Account.login_selector == selector)).first()
        if account is None or not verify_login_token(account.login_hash, token):
            raise Unauthorized("The login token is not valid.")
        assert account.id is not None
    return _mint_key(ctx, account.id, "dashboard")


async def login(call: Call) -> ApiKeyCreated:
    body: LoginBody = call.body
    return await run_in_threadpool(_login, call.ctx, body.login_token)


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST", "/account", create_account, "Create an account", AccountCreated, status=201, auth=False,
            description="Creates an account with a zero balance, its first API key and a dashboard login token. "
            "No body is read and no identity is asked for. The key and the token are shown in this response "
            "only: they are stored as hashes.",
            tags=TAG, operation_id="createAccount", response_headers=NO_STORE,
        ),
        ApiRoute(
            "GET", "/account", get_account, "The caller's account", AccountOut,
            tags=TAG, operation_id="getAccount",
        ),
        ApiRoute(
            "GET", "/keys", list_keys, "List active API keys", ApiKeyList,
            description="Active keys only, each by id and prefix; a key's full value cannot be retrieved.",
            tags=TAG, operation_id="listKeys",
        ),
        ApiRoute(
            "POST", "/keys", create_key, "Mint an API key", ApiKeyCreated, status=201,
            body=NewKeyBody, body_required=False,
            description="The body is optional; it may name the key. The full key is in this response only.",
            tags=TAG, operation_id="createKey", response_headers=NO_STORE,
        ),
        ApiRoute(
            "DELETE", "/keys/{id}", revoke_key, "Revoke an API key", ApiKeyRevoked,
            description="The key is refused from the next request on. A key of another account, or one already "
            "revoked, is a 404. Revoking the key of this request is allowed: sign in again with the login token.",
            errors={404: "No active key with this id on this account."},
            tags=TAG, operation_id="revokeKey",
        ),
        ApiRoute(
            "POST", "/login", login, "Sign in with the login token", ApiKeyCreated, status=201, auth=False,
            body=LoginBody,
            description="Exchanges the account's login_token for a new API key named \"dashboard\". This is how "
            "the web dashboard signs in, and how a customer who lost or revoked every key regains access. "
            "The token is checked with argon2 and is not usable as a Bearer key.",
            errors={401: "The login token is not valid."},
            tags=TAG, operation_id="login", response_headers=NO_STORE,
        ),
    ]
