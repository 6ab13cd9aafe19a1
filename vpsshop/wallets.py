"""Wallets that own accounts (issue 29): an account created by paying, and signing in with the wallet.

* **Pay as sign-up**: an order paid by x402 without an API key goes to the account the paying wallet
  owns, created for it on its first payment (:func:`owner_account`). The first paid order that
  succeeds shows that account's first API key and login token, once (:func:`deliver_credentials`).
* **Sign in with the wallet**: the x402 ``sign-in-with-x`` extension (CAIP-122 messages: EIP-4361 for
  an EVM wallet, Sign-In With Solana for a Solana one when an x402 coin settles on Solana): a request
  without the ``SIGN-IN-WITH-X`` header is answered 402 with the extension in ``PAYMENT-REQUIRED``
  (:class:`SignatureRequired`, no payment asked: ``accepts`` is empty); the official x402 clients
  sign the message and re-send the request with the header (:func:`verify`). The owner of an account
  gets a fresh API key (:func:`wallet_login`); an account links more wallets the same way
  (:func:`link_wallet`) and removes them (:func:`unlink_wallet`).

Nonces are issued without a write (the shop's MAC over their expiry, so an unauthenticated 402 costs
no row) and are used once: a signed-in nonce is kept in ``siwx_nonces`` until it expires. EVM
wallets sign with EIP-191 ``personal_sign`` (externally owned accounts only: smart-contract wallets,
EIP-1271 and EIP-6492, are refused as ``invalid_siwx_signature``); Solana wallets sign the message's
UTF-8 bytes with their ed25519 key (the signature in base58, the key being the base58 address).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlparse

import sqlalchemy as sa
from anyio import to_thread
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from eth_account import Account as EthAccount
from eth_account.messages import encode_defunct
from eth_keys.exceptions import BadSignature
from eth_utils import ValidationError
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select
from x402.extensions.sign_in_with_x import (
    SIGN_IN_WITH_X,
    SIWxPayload,
    build_siwx_schema,
    decode_base58,
    encode_base58,
    parse_siwx_header,
)

import vpsshop.events as events
from vpsshop import limits, signin
from vpsshop.accounts import ApiKeyCreated, account_out, mint_key
from vpsshop.actors import AccountSummary, Customer
from vpsshop.auth import new_login_token
from vpsshop.context import AppContext
from vpsshop.db import rowcount
from vpsshop.errors import ApiError, Conflict, NotFound
from vpsshop.inputs import Input
from vpsshop.models import Account, SiwxNonce, Wallet, saved_id
from vpsshop.x402.purchases import offered_coins

__all__ = [
    "NONCE_SECONDS",
    "SIGN_IN_WITH_X",
    "SignatureRequired",
    "SignupCredentials",
    "WalletList",
    "WalletLogin",
    "WalletLoginInput",
    "WalletOut",
    "deliver_credentials",
    "link_wallet",
    "list_wallets",
    "owner_account",
    "unlink_wallet",
    "wallet_login",
]

NONCE_SECONDS = 300
"""How long a sign-in challenge can be signed and used: five minutes (the extension's own ``maxAge``)."""
CLOCK_SKEW = timedelta(seconds=30)
"""How far in the future a message's ``issuedAt`` may be: the shop's processes' clocks may differ a little."""
DEFAULT_CHAIN = "eip155:8453"
"""The EVM chain of sign-in messages when no x402 coin names one (Base)."""
STATEMENT = "Sign in to the VPS shop with this wallet."


# ---- the resources -------------------------------------------------------------------------------


class WalletOut(BaseModel):
    """A wallet that owns the account: signing with it signs in (POST /account/wallet-login)."""

    id: int
    address: str = Field(
        description="The wallet's address: an EVM address in lower-case 0x hex, a Solana address in base58 as written."
    )
    created_at: datetime


class WalletList(BaseModel):
    wallets: list[WalletOut] = Field(description="The account's wallets, oldest first.")


class WalletLogin(ApiKeyCreated):
    """Response of ``POST /account/wallet-login``: a new API key of the wallet's account, shown once."""

    user_id: int
    address: str = Field(description="The wallet that signed (EVM: lower-case; Solana: base58 as written).")


class SignupCredentials(BaseModel):
    """The account of an order paid by x402 without an API key: the paying wallet's."""

    user_id: int
    address: str = Field(
        description="The paying wallet, which owns the account (EVM: lower-case; Solana: base58 as written)."
    )
    created: bool = Field(description="True when this payment created the account.")
    api_key: str | None = Field(
        description="The account's first API key (vpsk_...), in the first successful order of a new account only; "
        "shown once. Null otherwise: sign in with the wallet (POST /account/wallet-login) for a key."
    )
    key_id: int | None = Field(description="Id of that key.")
    login_token: str | None = Field(description="Dashboard sign-in credential, beside api_key only. Shown once.")


class WalletLoginInput(Input):
    """Body of ``POST /account/wallet-login``: optional."""

    totp_code: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="Required when the account has two-factor sign-in on: the authenticator's current code or "
        "an unused recovery code.",
    )


def wallet_out(wallet: Wallet) -> WalletOut:
    return WalletOut(id=saved_id(wallet), address=wallet.address, created_at=wallet.created_at)


# ---- the challenge -------------------------------------------------------------------------------


def origin(ctx: AppContext) -> str:
    """The origin sign-in messages are bound to: ``public_url``'s scheme and host (never the request's)."""
    parsed = urlparse(ctx.settings.public_url)
    return f"{parsed.scheme}://{parsed.netloc}"


def resource_url(ctx: AppContext, path: str) -> str:
    return f"{ctx.settings.public_url.rstrip('/')}{path}"


def chains(ctx: AppContext) -> list[str]:
    """The CAIP-2 chains a message may name: the first EVM network of the shop's x402 coins (Base when
    none names one), then each Solana network an x402 coin settles on (USDCSOL's ``solana:<genesis>``),
    so that a wallet paying there signs in too."""
    evm: str | None = None
    solana: list[str] = []
    for coin in offered_coins(ctx):
        try:
            accepts = coin.payment_requirements(1, ctx.settings.public_url, "-")
            network = coin.payment_requirements_v2(accepts)["network"]
        except NotImplementedError:
            continue
        if not isinstance(network, str):
            continue
        if network.startswith("eip155:") and evm is None:
            evm = network
        elif network.startswith("solana:") and network not in solana:
            solana.append(network)
    return [evm or DEFAULT_CHAIN, *solana]


def signature_type(chain: str) -> str:
    """The extension's signature ``type`` of a chain: ``ed25519`` on Solana, ``eip191`` on EVM chains."""
    return "ed25519" if chain.startswith("solana:") else "eip191"


def _nonce_mac(ctx: AppContext, body: str) -> str:
    key = ctx.settings.secret_key_bytes()
    return hmac.new(key, b"vpsshop-siwx-nonce:" + body.encode(), hashlib.sha256).hexdigest()[:24]


def issue_nonce(ctx: AppContext, now: datetime) -> str:
    """A fresh nonce (hex: expiry, random, MAC), usable until ``now`` + :data:`NONCE_SECONDS`."""
    body = f"{int(now.timestamp()) + NONCE_SECONDS:010x}{secrets.token_hex(12)}"
    return body + _nonce_mac(ctx, body)


def nonce_expiry(ctx: AppContext, nonce: str) -> datetime | None:
    """When a nonce this shop issued expires (None: not one of its nonces)."""
    if len(nonce) != 58:
        return None
    body, mac = nonce[:34], nonce[34:]
    if not hmac.compare_digest(mac, _nonce_mac(ctx, body)):
        return None
    return datetime.fromtimestamp(int(body[:10], 16), UTC)


def challenge(ctx: AppContext, path: str) -> dict[str, Any]:
    """The ``sign-in-with-x`` extension of a 402 for ``path`` (under /v1), as the x402 package declares it."""
    now = ctx.clock.now()
    url = resource_url(ctx, path)
    info = {
        "domain": urlparse(origin(ctx)).netloc,
        "uri": url,
        "statement": STATEMENT,
        "version": "1",
        "nonce": issue_nonce(ctx, now),
        "issuedAt": _iso(now),
        "expirationTime": _iso(now + timedelta(seconds=NONCE_SECONDS)),
        "resources": [url],
    }
    supported = [{"chainId": chain, "type": signature_type(chain)} for chain in chains(ctx)]
    return {"info": info, "supportedChains": supported, "schema": build_siwx_schema()}


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class SignatureRequired(ApiError):
    """The 402 of a wallet sign-in sent without ``SIGN-IN-WITH-X``: the challenge to sign. No payment is
    asked (``accepts`` is empty); the API adds ``PAYMENT-REQUIRED`` (x402 v2) carrying the extension."""

    def __init__(self, ctx: AppContext, path: str, description: str) -> None:
        self.extension = challenge(ctx, path)
        self.resource = {"url": resource_url(ctx, path), "description": description, "mimeType": "application/json"}
        super().__init__(
            402,
            "wallet_signature_required",
            "Sign the sign-in-with-x message in extensions (CAIP-122: EIP-4361 for an EVM wallet, Sign-In With "
            "Solana for a Solana one) with the wallet and re-send this request with the SIGN-IN-WITH-X header "
            "(base64 JSON of the signed payload). The x402 clients do this with the sign-in-with-x client extension.",
            extensions={SIGN_IN_WITH_X: self.extension},
        )

    def payment_required(self) -> dict[str, Any]:
        """The x402 v2 ``PaymentRequired`` object of ``PAYMENT-REQUIRED``."""
        return {
            "x402Version": 2,
            "error": "SIGN-IN-WITH-X header is required",
            "resource": self.resource,
            "accepts": [],
            "extensions": {SIGN_IN_WITH_X: self.extension},
        }


# ---- verifying a signed message --------------------------------------------------------------------


def siwe_message(payload: SIWxPayload) -> str:
    """The EIP-4361 message of an ``eip155`` payload, as the wallet signed it."""
    chain_id = payload.chain_id.split(":", 1)[1]
    lines = [f"{payload.domain} wants you to sign in with your Ethereum account:", payload.address, ""]
    if payload.statement:
        lines += [payload.statement, ""]
    else:
        lines += [""]
    lines += [
        f"URI: {payload.uri}",
        f"Version: {payload.version}",
        f"Chain ID: {chain_id}",
        f"Nonce: {payload.nonce}",
        f"Issued At: {payload.issued_at}",
    ]
    if payload.expiration_time:
        lines.append(f"Expiration Time: {payload.expiration_time}")
    if payload.not_before:
        lines.append(f"Not Before: {payload.not_before}")
    if payload.request_id is not None:
        lines.append(f"Request ID: {payload.request_id}")
    if payload.resources:
        lines.append("Resources:")
        lines += [f"- {resource}" for resource in payload.resources]
    return "\n".join(lines)


def siws_message(payload: SIWxPayload) -> str:
    """The CAIP-122 (Sign-In With Solana) message of a ``solana`` payload, as the wallet signed it: the
    EIP-4361 layout naming a Solana account, the chain as its genesis hash prefix."""
    lines = [f"{payload.domain} wants you to sign in with your Solana account:", payload.address, ""]
    if payload.statement:
        lines += [payload.statement, ""]
    lines += [
        f"URI: {payload.uri}",
        f"Version: {payload.version}",
        f"Chain ID: {payload.chain_id.split(':', 1)[1]}",
        f"Nonce: {payload.nonce}",
        f"Issued At: {payload.issued_at}",
    ]
    if payload.expiration_time:
        lines.append(f"Expiration Time: {payload.expiration_time}")
    if payload.not_before:
        lines.append(f"Not Before: {payload.not_before}")
    if payload.request_id:
        lines.append(f"Request ID: {payload.request_id}")
    if payload.resources:
        lines.append("Resources:")
        lines += [f"- {resource}" for resource in payload.resources]
    return "\n".join(lines)


def _refused(code: str, message: str) -> ApiError:
    return ApiError(401, code, message)


def _recovered(payload: SIWxPayload) -> str | None:
    try:
        signer = EthAccount.recover_message(encode_defunct(text=siwe_message(payload)), signature=payload.signature)
    except (ValueError, TypeError, IndexError, BadSignature, ValidationError):  # a malformed signature
        return None
    return str(signer).lower()


def _solana_signer(payload: SIWxPayload) -> str | None:
    """The payload's base58 address when its base58 signature is that key's ed25519 signature of the
    message; None otherwise (malformed, another key's, another message's)."""
    address, signature = payload.address, payload.signature
    if len(address) > 44 or len(signature) > 88:  # longer is not a 32-byte key or a 64-byte signature
        return None
    try:
        key, raw = decode_base58(address), decode_base58(signature)
    except ValueError:
        return None
    if len(key) != 32 or len(raw) != 64 or encode_base58(key) != address:  # one spelling per key
        return None
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(raw, siws_message(payload).encode())
    except (ValueError, InvalidSignature):
        return None
    return address


def _signer(payload: SIWxPayload) -> str | None:
    """The address whose signature the payload carries, as it is kept (:func:`wallet_address`), or None
    when the signature is not the claimed address's signature of the message."""
    if payload.chain_id.startswith("solana:"):
        return _solana_signer(payload)
    recovered = _recovered(payload)
    return recovered if recovered is not None and recovered == payload.address.lower() else None


async def verify(ctx: AppContext, header: str, path: str) -> str:
    """The wallet address that signed ``header`` (``SIGN-IN-WITH-X``) for ``path``, as it is kept (EVM in
    lower case, Solana in base58); its nonce is used up.

    :raises ApiError: 401 with the extension's codes (its ``validate_siwx_message`` checks, made on the
        shop's clock): ``invalid_siwx_payload`` (unreadable), ``invalid_siwx_domain_mismatch``,
        ``invalid_siwx_uri_mismatch`` (another shop's or another endpoint's message),
        ``invalid_siwx_issued_at_too_old``, ``invalid_siwx_expired``, ``invalid_siwx_unsupported_chain``,
        ``invalid_siwx_nonce`` (not issued here, expired or used), ``invalid_siwx_signature``.
    """
    try:
        payload = parse_siwx_header(header.strip())
    except ValueError as exc:
        raise _refused("invalid_siwx_payload", str(exc)[:300]) from None
    now = ctx.clock.now()
    _check_message(ctx, payload, now)
    if payload.uri != resource_url(ctx, path):
        raise _refused("invalid_siwx_uri_mismatch", "The message was signed for another endpoint of this shop.")
    supported = chains(ctx)
    if payload.chain_id not in supported or payload.type != signature_type(payload.chain_id):
        named = ", ".join(f"{chain} ({signature_type(chain)})" for chain in supported)
        raise _refused("invalid_siwx_unsupported_chain", f"Sign for one of {named}.")
    expires = nonce_expiry(ctx, payload.nonce)
    if expires is None or expires < now:
        raise _refused("invalid_siwx_nonce", "The nonce was not issued by this shop or has expired: ask again.")
    address = _signer(payload)
    if address is None:
        raise _refused("invalid_siwx_signature", "The signature is not the address's signature of this message.")
    await to_thread.run_sync(_use_nonce, ctx, payload.nonce, expires, now)
    return address


def _moment(value: str | None, code: str) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _refused(code, f"{value!r} is not an ISO 8601 timestamp.") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _check_message(ctx: AppContext, payload: SIWxPayload, now: datetime) -> None:
    """The checks of the extension's ``validate_siwx_message`` (same codes), on the shop's clock: the
    message is for this shop's origin, issued at most :data:`NONCE_SECONDS` ago and not expired."""
    expected = origin(ctx)
    if payload.domain != urlparse(expected).netloc:
        raise _refused("invalid_siwx_domain_mismatch", f"The message is for {payload.domain!r}, not this shop.")
    uri = urlparse(payload.uri)
    if f"{uri.scheme}://{uri.netloc}" != expected:
        raise _refused("invalid_siwx_uri_mismatch", f"The message's uri is not under {expected}.")
    issued = _moment(payload.issued_at, "invalid_siwx_issued_at")
    assert issued is not None
    if now - issued > timedelta(seconds=NONCE_SECONDS):
        raise _refused("invalid_siwx_issued_at_too_old", "The message is too old: ask for a new one.")
    if issued - now > CLOCK_SKEW:
        raise _refused("invalid_siwx_issued_at_in_future", "issuedAt is in the future.")
    expires = _moment(payload.expiration_time, "invalid_siwx_expiration_time")
    if expires is not None and expires < now:
        raise _refused("invalid_siwx_expired", "The message has expired: ask for a new one.")
    not_before = _moment(payload.not_before, "invalid_siwx_not_before")
    if not_before is not None and now < not_before:
        raise _refused("invalid_siwx_not_yet_valid", "The message is not valid yet (notBefore).")


def _use_nonce(ctx: AppContext, nonce: str, expires: datetime, now: datetime) -> None:
    try:
        with ctx.db.session() as session:
            session.execute(sa.delete(SiwxNonce).where(col(SiwxNonce.expires_at) < now))
            session.add(SiwxNonce(nonce=nonce, expires_at=expires))
    except IntegrityError:
        raise _refused("invalid_siwx_nonce", "This signed message was used already: ask for a new one.") from None


# ---- operations ------------------------------------------------------------------------------------


async def wallet_login(
    ctx: AppContext, header: str | None, data: WalletLoginInput, *, client: str, path: str
) -> WalletLogin:
    """A new API key (named "wallet") of the account the signing wallet owns.

    :raises SignatureRequired: no header (402 with the challenge).
    :raises ApiError: the refusals of :func:`verify`; 401 ``unknown_wallet`` (the wallet owns no account),
        ``totp_required`` / ``invalid_totp_code`` (two-factor on); 429 too many failed sign-ins.
    """
    if header is None:
        raise SignatureRequired(ctx, path, "Sign in with the wallet that owns the account: a new API key.")
    refund = await to_thread.run_sync(signin.count_attempt, ctx, client)
    address = await verify(ctx, header, path)

    def run() -> WalletLogin:
        with ctx.db.session() as session:
            wallet = session.exec(select(Wallet).where(Wallet.address == address)).first()
            account = None if wallet is None else session.get(Account, wallet.account_id)
            enabled = bool(account is not None and account.totp_enabled)
        if wallet is None:
            raise _refused("unknown_wallet", "No account is owned by this wallet: an order paid by it creates one.")
        if enabled:
            signin.second_factor(ctx, wallet.account_id, data.totp_code, client)
        refund()
        key = mint_key(ctx, wallet.account_id, "wallet")
        with ctx.db.session() as session:  # signing in shows a key: the order's first key is not shown any more
            session.execute(sa.update(Wallet).where(col(Wallet.id) == wallet.id).values(credentials_pending=False))
        return WalletLogin(**key.model_dump(), user_id=wallet.account_id, address=address)

    return await to_thread.run_sync(run)


async def list_wallets(ctx: AppContext, customer: Customer) -> WalletList:
    """The account's wallets, oldest first."""

    def read() -> WalletList:
        with ctx.db.session() as session:
            rows = session.exec(
                select(Wallet).where(Wallet.account_id == customer.account_id).order_by(col(Wallet.id))
            ).all()
            return WalletList(wallets=[wallet_out(w) for w in rows])

    return await to_thread.run_sync(read)


async def link_wallet(ctx: AppContext, customer: Customer, header: str | None, *, path: str) -> WalletOut:
    """Link the wallet that signed ``header`` to the account (it signs in from then on).

    :raises SignatureRequired: no header. :raises Conflict: 409 ``wallet_taken`` (another account's).
    :raises ApiError: the refusals of :func:`verify`.
    """
    if header is None:
        raise SignatureRequired(ctx, path, "Sign with the wallet to link it to this account.")
    await to_thread.run_sync(limits.count_write, ctx, customer.account_id)
    address = await verify(ctx, header, path)

    def link() -> WalletOut:
        now = ctx.clock.now()
        try:
            with ctx.db.session() as session:
                wallet = Wallet(account_id=customer.account_id, address=address, created_at=now)
                session.add(wallet)
                session.flush()
                out = wallet_out(wallet)
                events.emit(session, "wallet.linked", customer.account_id, out, now=now)
                return out
        except IntegrityError:
            with ctx.db.session() as session:
                existing = session.exec(select(Wallet).where(Wallet.address == address)).first()
            if existing is not None and existing.account_id == customer.account_id:
                return wallet_out(existing)
            raise Conflict("wallet_taken", "This wallet owns another account; it can own one only.") from None

    return await to_thread.run_sync(link)


async def unlink_wallet(ctx: AppContext, customer: Customer, wallet_id: int) -> WalletOut:
    """Remove one of the account's wallets: it no longer signs in. :raises NotFound: not this account's."""

    def unlink() -> WalletOut:
        limits.count_write(ctx, customer.account_id)
        with ctx.db.session() as session:
            wallet = session.exec(
                select(Wallet).where(Wallet.id == wallet_id, Wallet.account_id == customer.account_id)
            ).first()
            if wallet is None:
                raise NotFound("wallet")
            out = wallet_out(wallet)
            session.delete(wallet)
            events.emit(session, "wallet.unlinked", customer.account_id, out, now=ctx.clock.now())
            return out

    return await to_thread.run_sync(unlink)


# ---- pay as sign-up ----------------------------------------------------------------------------------


def wallet_address(address: str) -> str:
    """How a paying wallet's address is kept and shown: an EVM address in lower case (its checksum is
    only a spelling), any other (a Solana address: base58, where case is part of the key) as it is."""
    return address.lower() if address.startswith("0x") else address


@dataclass(frozen=True)
class Owner:
    account_id: int
    created: bool


def owner_account(ctx: AppContext, address: str, client: str) -> Owner:
    """The account ``address`` owns, created now (zero balance, no key shown yet) if it owns none.

    Runs in a worker thread. :raises RateLimited: creating it is over the sign-up limit of ``client``.
    """
    address = wallet_address(address)
    with ctx.db.session() as session:
        found = session.exec(select(Wallet).where(Wallet.address == address)).first()
    if found is not None:
        return Owner(found.account_id, False)
    limits.signup(ctx, client)
    token = new_login_token(ctx.settings.secret_key_bytes())  # replaced when the credentials are shown
    now = ctx.clock.now()
    try:
        with ctx.db.session() as session:
            account = Account(login_selector=token.selector, login_hash=token.hash, created_at=now)
            session.add(account)
            session.flush()
            account_id = saved_id(account)
            wallet = Wallet(account_id=account_id, address=address, created_at=now, credentials_pending=True)
            session.add(wallet)
            session.flush()
            summary = AccountSummary(0, False, now, 0)
            events.emit(session, "account.created", account_id, account_out(account_id, summary), now=now)
            events.emit(session, "wallet.linked", account_id, wallet_out(wallet), now=now)
    except IntegrityError:  # the same wallet's other payment created it a moment ago
        with ctx.db.session() as session:
            raced = session.exec(select(Wallet).where(Wallet.address == address)).first()
        if raced is None:
            raise
        return Owner(raced.account_id, False)
    return Owner(account_id, True)


def deliver_credentials(ctx: AppContext, address: str, owner: Owner) -> SignupCredentials:
    """The credentials an order paid by ``address`` without a key shows: the account's first API key and
    a new login token when they were not shown yet (exactly once, whatever runs at the same time)."""
    address = wallet_address(address)
    shown = SignupCredentials(
        user_id=owner.account_id, address=address, created=owner.created, api_key=None, key_id=None, login_token=None
    )
    with ctx.db.session() as session:
        taken = rowcount(
            session.execute(
                sa.update(Wallet)
                .where(col(Wallet.address) == address, col(Wallet.credentials_pending).is_(True))
                .values(credentials_pending=False)
            )
        )
    if taken != 1:
        return shown
    key = mint_key(ctx, owner.account_id, "default")
    token = new_login_token(ctx.settings.secret_key_bytes())
    with ctx.db.session() as session:
        session.execute(
            sa.update(Account)
            .where(col(Account.id) == owner.account_id)
            .values(login_selector=token.selector, login_hash=token.hash)
        )
    return shown.model_copy(update={"api_key": key.api_key, "key_id": key.id, "login_token": token.value})
