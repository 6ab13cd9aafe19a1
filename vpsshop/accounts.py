"""Accounts and API keys: creating an account, reading it, minting, listing and revoking keys, and
authenticating a request's key.

The Account and API key resources are defined here once: the API answers them and the
``account.*`` and ``api_key.*`` events carry them. Signing in with the login token is
:mod:`vpsshop.signin`; two-factor sign-in :mod:`vpsshop.twofactor`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from anyio import to_thread
from pydantic import BaseModel, Field
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop import limits
from vpsshop.actors import AccountSummary, Customer
from vpsshop.auth import api_key_digester, new_api_key, new_login_token, parse_bearer
from vpsshop.context import AppContext, StateKey
from vpsshop.db import touch_account
from vpsshop.errors import NotFound, Unauthorized
from vpsshop.inputs import LABEL_PATTERN, Input
from vpsshop.models import Account, ApiKey, Server
from vpsshop.money import UsdAmount, micros_to_usd

__all__ = [
    "AccountCreated",
    "AccountOut",
    "ApiKeyCreated",
    "ApiKeyList",
    "ApiKeyOut",
    "ApiKeyRevoked",
    "Authenticator",
    "MissingCredential",
    "NewKeyInput",
    "authenticator",
    "create_account",
    "create_key",
    "customer_of",
    "get_account",
    "list_keys",
    "revoke_key",
]


# ---- the resources -------------------------------------------------------------------------------


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
    """An API key as the account sees it: never the key itself, which is stored only as a hash."""

    id: int
    prefix: str = Field(description="First characters of the key, to tell keys apart.")
    name: str | None
    created_at: datetime
    revoked_at: datetime | None = Field(None, description="When it was revoked (null while it works).")


class ApiKeyList(BaseModel):
    keys: list[ApiKeyOut] = Field(description="Active keys of the account, oldest first.")


class ApiKeyCreated(ApiKeyOut):
    api_key: str = Field(description="The full key. Shown once; stored only as a hash.")


class ApiKeyRevoked(ApiKeyOut):
    revoked: bool = True


def key_out(key: ApiKey) -> ApiKeyOut:
    assert key.id is not None
    return ApiKeyOut(id=key.id, prefix=key.prefix, name=key.name, created_at=key.created_at, revoked_at=key.revoked_at)


def account_out(account_id: int, summary: AccountSummary) -> AccountOut:
    # Every value comes typed from the database read: built without validation (the hot path).
    return AccountOut.model_construct(
        user_id=account_id,
        balance_usd=micros_to_usd(summary.balance_micros),
        currency="USD",
        servers=summary.servers,
        totp_enabled=summary.totp_enabled,
        created_at=summary.created_at,
    )


def _live_servers(session: Session, account_id: int) -> int:
    count = session.execute(
        select(sa.func.count())
        .select_from(Server)
        .where(Server.account_id == account_id, Server.status != "terminated")
    ).scalar()
    return int(count or 0)


def read_summary(session: Session, account_id: int) -> AccountSummary:
    """The account's summary read in ``session``. :raises NotFound: no such account."""
    account = session.get(Account, account_id, populate_existing=True)
    if account is None:
        raise NotFound("account")
    return AccountSummary(
        account.balance_micros, account.totp_enabled, account.created_at, _live_servers(session, account_id)
    )


def account_event(session: Session, account_id: int) -> AccountOut:
    """The account as an event carries it, read in the transaction that changed it."""
    session.flush()
    return account_out(account_id, read_summary(session, account_id))


# ---- authenticating a request's key ---------------------------------------------------------------


class MissingCredential(Unauthorized):
    """The request carries no API key at all (not a wrong one: not counted as a failed key)."""


# One indexed read per request authenticates and gives the account summary GET /v1/account shows.
_AUTH_SQL = (
    "SELECT k.id, a.id, a.balance_micros, a.totp_enabled, a.created_at, "
    "(SELECT count(*) FROM servers s WHERE s.account_id = a.id AND s.status != 'terminated') "
    "FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE k.key_hash = :digest AND k.revoked_at IS NULL"
)


class Authenticator:
    """Finds the customer of an API key (``Authorization: Bearer vpsk_...``): one indexed read that
    also gives the account's summary. A revoked key is refused from the next request on."""

    MAX_REMEMBERED = 4096

    def __init__(self, ctx: AppContext) -> None:
        self.db = ctx.db
        self.digest: Callable[[str], str] = api_key_digester(ctx.settings.secret_key_bytes())
        self._customers: dict[tuple[Any, ...], Customer] = {}
        """Rows already turned into a :class:`Customer`, keyed by the row's values (so never staler
        than the read): parsing the timestamp every time was a tenth of the hot path's own work."""

    async def customer(self, authorization: str | None) -> Customer:
        """The customer of an ``Authorization`` header's value.

        :raises MissingCredential: no header; :raises Unauthorized: not a key, unknown or revoked.
        """
        if authorization is None:
            raise MissingCredential()
        key = parse_bearer(authorization)
        if key is None:
            raise Unauthorized()
        hashed = self.digest(key)
        row = await self.db.fetch_one(_AUTH_SQL, {"digest": hashed}, cache_key=hashed)
        if row is None:
            raise Unauthorized("The API key is unknown or revoked.")
        customer = self._customers.get(row)
        if customer is None:
            if len(self._customers) >= self.MAX_REMEMBERED:
                self._customers.clear()
            summary = AccountSummary(row[2], bool(row[3]), as_utc(row[4]), row[5])
            customer = self._customers[row] = Customer(row[1], row[0], summary)
        return customer


_AUTHENTICATOR = StateKey[Authenticator]("authenticator")


def authenticator(ctx: AppContext) -> Authenticator:
    """The shop's :class:`Authenticator` (one per context)."""
    return ctx.state(_AUTHENTICATOR, Authenticator)


def as_utc(value: datetime | str) -> datetime:
    """A timestamp read outside the ORM: SQLite gives naive UTC text, PostgreSQL aware datetimes."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


async def customer_of(ctx: AppContext, account_id: int) -> Customer:
    """The customer of an account known by id (a dashboard session's), with its summary read now."""

    def read() -> Customer:
        with ctx.db.session() as session:
            return Customer(account_id, None, read_summary(session, account_id))

    return await to_thread.run_sync(read)


# ---- operations ------------------------------------------------------------------------------------


class NewKeyInput(Input):
    """Body of ``POST /keys``: optional."""

    name: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=LABEL_PATTERN,
        description="A label for the key: no control, format or bidirectional-override characters.",
    )


async def create_account(ctx: AppContext, *, client: str) -> AccountCreated:
    """A new account with a zero balance, its first API key and its login token (both stored as keyed
    digests: no slow hash, so creating an account costs a few writes and no memory to speak of).

    :raises RateLimited: too many accounts from ``client`` (its address) in the window.
    """

    def create() -> AccountCreated:
        limits.signup(ctx, client)
        key = new_api_key(ctx.settings.secret_key_bytes())
        token = new_login_token(ctx.settings.secret_key_bytes())
        now = ctx.clock.now()
        with ctx.db.session() as session:
            account = Account(login_selector=token.selector, login_hash=token.hash, created_at=now)
            session.add(account)
            session.flush()
            assert account.id is not None
            api_key = ApiKey(
                account_id=account.id, key_hash=key.digest, prefix=key.prefix, name="default", created_at=now
            )
            session.add(api_key)
            session.flush()
            assert api_key.id is not None
            summary = AccountSummary(0, False, now, 0)
            events.emit(session, "account.created", account.id, account_out(account.id, summary), now=now)
            events.emit(session, "api_key.created", account.id, key_out(api_key), now=now)
            return AccountCreated(
                user_id=account.id,
                api_key=key.value,
                key_id=api_key.id,
                login_token=token.value,
                balance_usd=micros_to_usd(0),
                created_at=now,
            )

    return await to_thread.run_sync(create)


async def get_account(ctx: AppContext, customer: Customer) -> AccountOut:
    """The account as authentication read it (no further read), or read now."""
    if customer.summary is not None:
        return account_out(customer.account_id, customer.summary)
    fresh = await customer_of(ctx, customer.account_id)
    assert fresh.summary is not None
    return account_out(customer.account_id, fresh.summary)


async def list_keys(ctx: AppContext, customer: Customer) -> ApiKeyList:
    """The account's active keys, oldest first."""

    def read() -> ApiKeyList:
        with ctx.db.session() as session:
            rows = session.exec(
                select(ApiKey)
                .where(ApiKey.account_id == customer.account_id, col(ApiKey.revoked_at).is_(None))
                .order_by(col(ApiKey.id))
            ).all()
            return ApiKeyList(keys=[key_out(k) for k in rows])

    return await to_thread.run_sync(read)


def mint_key(ctx: AppContext, account_id: int, name: str | None) -> ApiKeyCreated:
    """A new key of ``account_id`` (the full key is in the answer only), with its event."""
    key = new_api_key(ctx.settings.secret_key_bytes())
    now = ctx.clock.now()
    with ctx.db.session() as session:
        row = ApiKey(account_id=account_id, key_hash=key.digest, prefix=key.prefix, name=name, created_at=now)
        session.add(row)
        session.flush()
        created = ApiKeyCreated(**key_out(row).model_dump(), api_key=key.value)
        events.emit(session, "api_key.created", account_id, key_out(row), now=now)
        return created


async def create_key(ctx: AppContext, customer: Customer, data: NewKeyInput) -> ApiKeyCreated:
    """Mint an API key for the account. :raises RateLimited: the account's write limit."""

    def mint() -> ApiKeyCreated:
        limits.count_write(ctx, customer.account_id)
        return mint_key(ctx, customer.account_id, data.name)

    return await to_thread.run_sync(mint)


async def revoke_key(ctx: AppContext, customer: Customer, key_id: int) -> ApiKeyRevoked:
    """Revoke one of the account's active keys: refused from the next request on.

    :raises NotFound: no active key ``key_id`` on this account.
    """

    def revoke() -> ApiKeyRevoked:
        limits.count_write(ctx, customer.account_id)
        now = ctx.clock.now()
        with ctx.db.session() as session:
            key = session.exec(
                select(ApiKey).where(
                    ApiKey.id == key_id, ApiKey.account_id == customer.account_id, col(ApiKey.revoked_at).is_(None)
                )
            ).first()
            if key is None:
                raise NotFound("API key")
            key.revoked_at = now
            session.add(key)
            events.emit(session, "api_key.revoked", customer.account_id, key_out(key), now=now)
            touch_account(session, customer.account_id)  # this process forgets the key before it answers
            return ApiKeyRevoked(**key_out(key).model_dump())

    return await to_thread.run_sync(revoke)
