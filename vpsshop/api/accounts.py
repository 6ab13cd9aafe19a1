"""Accounts, API keys and sign-in with the login token: the endpoints over :mod:`vpsshop.accounts`."""

from __future__ import annotations

from pydantic import Field
from starlette.concurrency import run_in_threadpool

from vpsshop import accounts, limits
from vpsshop.accounts import AccountCreated, AccountOut, ApiKeyCreated, ApiKeyList, ApiKeyOut, ApiKeyRevoked
from vpsshop.money import micros_to_usd
from vpsshop.routing import LABEL_PATTERN, ApiModel, ApiRoute, Call

__all__ = [
    "AccountCreated",
    "AccountOut",
    "ApiKeyCreated",
    "ApiKeyList",
    "ApiKeyOut",
    "ApiKeyRevoked",
    "LoginBody",
    "NewKeyBody",
    "routes",
]

TAG = ("account",)
NO_STORE = {"Cache-Control": "no-store"}  # responses that carry a credential


class NewKeyBody(ApiModel):
    name: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        pattern=LABEL_PATTERN,
        description="A label for the key: no control, format or bidirectional-override characters.",
    )


class LoginBody(ApiModel):
    login_token: str = Field(min_length=1, max_length=200)
    totp_code: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Required when the account has two-factor sign-in on (Account.totp_enabled): the current "
        "6-digit code of the authenticator app, or one of the account's recovery codes (each works once).",
    )


async def create_account(call: Call) -> AccountCreated:
    await run_in_threadpool(limits.signup, call.ctx, limits.client_address(call.request))
    return await run_in_threadpool(accounts.create_account, call.ctx)


async def get_account(call: Call) -> AccountOut:
    me = call.principal
    assert me is not None
    # Every value comes typed from the authentication read: built without validation (hot path).
    return AccountOut.model_construct(
        user_id=me.account_id,
        balance_usd=micros_to_usd(me.balance_micros),
        servers=me.servers,
        totp_enabled=me.totp_enabled,
        created_at=me.created_at,
    )


async def list_keys(call: Call) -> ApiKeyList:
    return await run_in_threadpool(accounts.list_keys, call.ctx, call.account_id)


async def create_key(call: Call) -> ApiKeyCreated:
    body: NewKeyBody = call.body
    return await run_in_threadpool(accounts.mint_key, call.ctx, call.account_id, body.name)


async def revoke_key(call: Call) -> ApiKeyRevoked:
    return await run_in_threadpool(accounts.revoke_key, call.ctx, call.account_id, call.path["id"])


async def login(call: Call) -> ApiKeyCreated:
    body: LoginBody = call.body
    client = call.request.client.host if call.request.client else "unknown"
    return await run_in_threadpool(accounts.login, call.ctx, body.login_token, body.totp_code, client)


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST",
            "/account",
            create_account,
            "Create an account",
            AccountCreated,
            status=201,
            auth=False,
            description="Creates an account with a zero balance, its first API key and a dashboard login token. "
            "No body is read and no identity is asked for. The key and the token are shown in this response "
            "only: they are stored as hashes.",
            tags=TAG,
            operation_id="createAccount",
            response_headers=NO_STORE,
        ),
        ApiRoute(
            "GET",
            "/account",
            get_account,
            "The caller's account",
            AccountOut,
            tags=TAG,
            operation_id="getAccount",
        ),
        ApiRoute(
            "GET",
            "/keys",
            list_keys,
            "List active API keys",
            ApiKeyList,
            description="Active keys only, each by id and prefix; a key's full value cannot be retrieved.",
            tags=TAG,
            operation_id="listKeys",
        ),
        ApiRoute(
            "POST",
            "/keys",
            create_key,
            "Mint an API key",
            ApiKeyCreated,
            status=201,
            body=NewKeyBody,
            body_required=False,
            description="The body is optional; it may name the key. The full key is in this response only.",
            tags=TAG,
            operation_id="createKey",
            response_headers=NO_STORE,
        ),
        ApiRoute(
            "DELETE",
            "/keys/{id}",
            revoke_key,
            "Revoke an API key",
            ApiKeyRevoked,
            description="The key is refused from the next request on (by a deployment's other API processes "
            "within milliseconds). A key of another account, or one already "
            "revoked, is a 404. Revoking the key of this request is allowed: sign in again with the login token.",
            errors={404: "No active key with this id on this account."},
            tags=TAG,
            operation_id="revokeKey",
        ),
        ApiRoute(
            "POST",
            "/login",
            login,
            "Sign in with the login token",
            ApiKeyCreated,
            status=201,
            auth=False,
            body=LoginBody,
            description='Exchanges the account\'s login_token for a new API key named "dashboard": how a customer '
            "who lost or revoked every key regains access (the web dashboard signs in with the same token, into a "
            "browser session rather than a key). The token is checked against a keyed digest and is not usable "
            "as a Bearer key."
            "\n\nTwo-factor: when the account has two-factor sign-in on (`totp_enabled` in GET /account, turned on "
            "in the dashboard), the body must also carry `totp_code`: the current code of the authenticator app or "
            "an unused recovery code. Without it the answer is 401 `totp_required`; a wrong or reused code is 401 "
            "`invalid_totp_code`. Bearer API keys are not affected by two-factor: a key already is a full "
            "credential, minted by someone who signed in.\n\nFailed attempts are limited per client address and "
            "wrong codes per account (the shop's `[signin]` settings; by default 10 failures per 10 minutes, 5 "
            "wrong codes per 15 minutes): over the limit the answer is 429 `rate_limited` with `Retry-After` "
            "and `retry_after` (seconds) until enough failures have slid out of the window.",
            errors={
                401: "unauthorized: the login token is not valid; totp_required: the account has two-factor on "
                "and no totp_code was sent; invalid_totp_code: the code is wrong or was used already.",
                429: "rate_limited: too many failed sign-ins from this address, or wrong codes for this account.",
            },
            tags=TAG,
            operation_id="login",
            response_headers=NO_STORE,
        ),
    ]
