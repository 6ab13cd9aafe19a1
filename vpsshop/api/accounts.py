"""The account endpoints: ``/v1/account``, ``/v1/keys``, ``/v1/login``, over :mod:`vpsshop.accounts`
and :mod:`vpsshop.signin`."""

from __future__ import annotations

from starlette.responses import Response

from vpsshop import accounts, limits, signin, wallets
from vpsshop.accounts import AccountCreated, AccountOut, ApiKeyCreated, ApiKeyList, ApiKeyRevoked, NewKeyInput
from vpsshop.actors import Customer
from vpsshop.api.x402 import signed_message
from vpsshop.context import StateKey
from vpsshop.routing import ApiRoute, Call, Header, JsonBody, Reply, body_named, client_address
from vpsshop.signin import LoginInput
from vpsshop.wallets import WalletList, WalletLogin, WalletLoginInput, WalletOut

# The bodies under the names of the OpenAPI description (clients generated from it use them).
NewKeyBody = body_named("NewKeyBody", NewKeyInput)
LoginBody = body_named("LoginBody", LoginInput)
WalletLoginBody = body_named("WalletLoginBody", WalletLoginInput)

TAG = ("account",)
NO_STORE = {"Cache-Control": "no-store"}  # responses that carry a credential


async def create_account(call: Call) -> AccountCreated:
    return await accounts.create_account(call.ctx, client=client_address(call.request))


_ACCOUNT_BODIES = StateKey[dict[Customer, bytes]]("account-bodies")
"""``GET /v1/account``'s body by caller, as authentication read it: the hot path of every client renders
an account once per change of it (a customer with the same summary is the same answer)."""


async def get_account(call: Call) -> Response:
    customer = call.actor
    bodies = call.ctx.state(_ACCOUNT_BODIES, lambda _ctx: {})
    body = bodies.get(customer)
    if body is None:
        account = await accounts.get_account(call.ctx, customer)  # from the authentication read: no query
        if len(bodies) >= 4096:
            bodies.clear()
        body = bodies[customer] = account.__pydantic_serializer__.to_json(account)
    return JsonBody(body, 200)


async def list_keys(call: Call) -> ApiKeyList:
    return await accounts.list_keys(call.ctx, call.actor)


async def create_key(call: Call) -> ApiKeyCreated:
    return await accounts.create_key(call.ctx, call.actor, call.body)


async def revoke_key(call: Call) -> ApiKeyRevoked:
    return await accounts.revoke_key(call.ctx, call.actor, call.path["id"])


async def login(call: Call) -> ApiKeyCreated:
    return await signin.login(call.ctx, call.body, client=client_address(call.request))


WALLET_LOGIN = "/account/wallet-login"
WALLETS = "/account/wallets"


async def wallet_login(call: Call) -> WalletLogin:
    data = call.body if call.body is not None else WalletLoginInput()
    return await wallets.wallet_login(
        call.ctx, signed_message(call.request), data, client=client_address(call.request), path=WALLET_LOGIN
    )


async def list_wallets(call: Call) -> WalletList:
    return await wallets.list_wallets(call.ctx, call.actor)


async def link_wallet(call: Call) -> Reply:
    return Reply(await wallets.link_wallet(call.ctx, call.actor, signed_message(call.request), path=WALLETS), 201)


async def unlink_wallet(call: Call) -> WalletOut:
    return await wallets.unlink_wallet(call.ctx, call.actor, call.path["id"])


_SIWX_HEADER = Header(
    "SIGN-IN-WITH-X",
    "The x402 sign-in-with-x extension's signed message: base64 JSON of the payload (domain, address, uri, "
    "version, chainId, type, nonce, issuedAt, ..., signature) made from the 402's challenge.",
    schema={"type": "string", "minLength": 1},
)
_SIWX_402 = (
    "wallet_signature_required: sent without SIGN-IN-WITH-X. The body and the PAYMENT-REQUIRED header (x402 v2, "
    "`accepts` empty: nothing to pay) carry `extensions.sign-in-with-x`: the CAIP-122 message to sign (domain, uri, "
    "nonce valid 5 minutes, issuedAt, expirationTime) and `supportedChains`: the shop's EVM chain (eip155:8453, "
    "type eip191: an EIP-4361 message) and, when the shop takes USDC on Solana, its Solana chain "
    "(solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp, type ed25519: a Sign-In With Solana message). Sign it for the "
    "wallet's chain and re-send this request with SIGN-IN-WITH-X; the x402 clients do so with the sign-in-with-x "
    "client extension."
)
_SIWX_401 = (
    "The signed message is refused, with the extension's codes: invalid_siwx_payload, invalid_siwx_domain_mismatch, "
    "invalid_siwx_uri_mismatch (another shop's or another endpoint's message), invalid_siwx_issued_at_too_old, "
    "invalid_siwx_expired, invalid_siwx_unsupported_chain, invalid_siwx_nonce (not issued here, expired, or used: "
    "each nonce signs in once), invalid_siwx_signature (not the address's signature of the message; EVM: only "
    "externally owned accounts are verified)."
)


def _wallet_routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST",
            WALLET_LOGIN,
            wallet_login,
            "Sign in with a wallet",
            WalletLogin,
            status=201,
            auth=False,
            body=WalletLoginBody,
            body_required=False,
            headers=(_SIWX_HEADER,),
            description="The x402 `sign-in-with-x` extension (CAIP-122: EIP-4361 for an EVM wallet, Sign-In With "
            "Solana for a Solana wallet where the shop takes USDC on Solana): the wallet that owns an account "
            "(it paid the order that created it, or was linked with POST /account/wallets) signs a message and gets "
            'a new API key named "wallet", shown once; so an agent that lost or revoked its key keeps its servers. '
            "Without the SIGN-IN-WITH-X header the answer is a 402 carrying the message to sign.\n\n"
            "Two-factor: with two-factor sign-in on, the body must carry `totp_code` (as POST /login). Failed "
            "attempts count against the client address as POST /login's do.",
            errors={
                400: "invalid_siwx_payload: the SIGN-IN-WITH-X header is empty.",
                401: _SIWX_401 + " unknown_wallet: the wallet owns no account; totp_required, invalid_totp_code.",
                402: _SIWX_402,
                429: "rate_limited: too many failed sign-ins from this client address ([signin]).",
            },
            tags=TAG,
            count_writes=False,
            operation_id="walletLogin",
            response_headers=NO_STORE,
            limits="rate_limited: too many failed sign-ins from this client address ([signin]); see Retry-After.",
        ),
        ApiRoute(
            "GET",
            WALLETS,
            list_wallets,
            "List the account's wallets",
            WalletList,
            description="The wallets that own the account: each signs in with POST /account/wallet-login.",
            tags=TAG,
            count_writes=False,
            operation_id="listWallets",
        ),
        ApiRoute(
            "POST",
            WALLETS,
            link_wallet,
            "Link a wallet",
            WalletOut,
            status=201,
            headers=(_SIWX_HEADER,),
            description="Links the wallet that signs (sign-in-with-x, as POST /account/wallet-login) to the caller's "
            "account: it signs in from then on. A wallet owns one account at most; linking a wallet of this "
            "account again answers it unchanged.",
            errors={
                400: "invalid_siwx_payload: the SIGN-IN-WITH-X header is empty.",
                402: _SIWX_402,
                409: "wallet_taken: the wallet owns another account.",
                401: _SIWX_401,
            },
            tags=TAG,
            count_writes=False,
            operation_id="linkWallet",
        ),
        ApiRoute(
            "DELETE",
            WALLETS + "/{id}",
            unlink_wallet,
            "Remove a wallet",
            WalletOut,
            description="The wallet no longer signs in to this account (its servers stay). Removing the last wallet "
            "is allowed: the API keys and the login token still work.",
            errors={404: "No wallet with this id on this account."},
            tags=TAG,
            count_writes=False,
            operation_id="unlinkWallet",
        ),
    ]


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
            count_writes=False,
            operation_id="createAccount",
            response_headers=NO_STORE,
            limits=limits.SIGNUP_LIMIT,
        ),
        ApiRoute(
            "GET",
            "/account",
            get_account,
            "The caller's account",
            AccountOut,
            tags=TAG,
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
            operation_id="login",
            response_headers=NO_STORE,
            limits="rate_limited: too many failed sign-ins from this client address ([signin]); see Retry-After.",
        ),
        *_wallet_routes(),
    ]
