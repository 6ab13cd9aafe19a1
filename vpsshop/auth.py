"""Credentials: API keys (checked on every request) and login tokens (checked once per sign-in).

* An API key is ``vpsk_`` + 43 characters of ``secrets.token_urlsafe`` (256 bits). With that much
  entropy a keyed hash is enough: the database holds ``BLAKE2b-256`` of the key, keyed with a
  digest of ``secret_key`` (BLAKE2b's keyed mode is a MAC, like HMAC, in one C call). A lookup by
  that digest costs microseconds, and a stolen database without the secret key reveals nothing
  usable. No slow hash ever runs per request.
* A login token is ``vpsl_`` + a 12-character selector + ``.`` + a 43-character verifier (256
  bits). The selector finds the account; the whole token is checked against the same kind of keyed
  BLAKE2b digest (stored as ``b2$<hex>``), compared in constant time. A slow password hash buys
  nothing for a random 256-bit secret (no dictionary to slow down) and cost 64 MiB and tens of
  milliseconds per call to anyone who could call ``POST /account`` (docs/architecture.md).
  Tokens stored by earlier versions as argon2id hashes are still verified, and re-stored as a
  digest at their first successful sign-in (:func:`verify_login_token` says so).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

API_KEY_PREFIX = "vpsk_"
LOGIN_TOKEN_PREFIX = "vpsl_"
KEY_DISPLAY_LENGTH = 12  # "vpsk_" + 7 characters: enough to tell keys apart, useless to an attacker
_API_KEY_LENGTH = len(API_KEY_PREFIX) + 43
_SELECTOR_LENGTH = 12

_password_hasher = PasswordHasher()  # only to verify login tokens stored by earlier versions
LOGIN_DIGEST_PREFIX = "b2$"


@dataclass(frozen=True)
class NewApiKey:
    value: str
    digest: str
    prefix: str


def new_api_key(secret_key: bytes) -> NewApiKey:
    """A fresh key; ``secret_key`` is the setting that keys its stored digest."""
    value = API_KEY_PREFIX + secrets.token_urlsafe(32)
    return NewApiKey(value=value, digest=api_key_digest(secret_key, value), prefix=value[:KEY_DISPLAY_LENGTH])


def digest_key(secret_key: bytes) -> bytes:
    """The BLAKE2b key derived from the ``secret_key`` setting (any length in, 32 bytes out)."""
    return hashlib.sha256(b"vpsshop api key digest\x00" + secret_key).digest()


def api_key_digest(secret_key: bytes, value: str) -> str:
    """Keyed digest of an API key as stored in ``api_keys.key_hash``. ``secret_key`` is the setting."""
    return hashlib.blake2b(value.encode(), key=digest_key(secret_key), digest_size=32).hexdigest()


def api_key_digester(secret_key: bytes) -> Callable[[str], str]:
    """:func:`api_key_digest` with the key derived once, for the per-request path."""
    key = digest_key(secret_key)
    blake2b = hashlib.blake2b

    def digest(value: str) -> str:
        return blake2b(value.encode(), key=key, digest_size=32).hexdigest()

    return digest


def parse_bearer(header: str | None) -> str | None:
    """The API key of an ``Authorization: Bearer vpsk_...`` header, or None when it cannot be one."""
    if not header or len(header) != 7 + _API_KEY_LENGTH:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.startswith(API_KEY_PREFIX):
        return None
    return token


@dataclass(frozen=True)
class NewLoginToken:
    value: str
    selector: str
    hash: str


def login_token_digest(secret_key: bytes, value: str) -> str:
    """The stored form of a login token: ``b2$`` + keyed BLAKE2b-256 (``secret_key`` is the setting)."""
    return LOGIN_DIGEST_PREFIX + keyed_digest(secret_key, "login token", value)


def new_login_token(secret_key: bytes) -> NewLoginToken:
    selector = secrets.token_urlsafe(9)  # 12 characters
    value = f"{LOGIN_TOKEN_PREFIX}{selector}.{secrets.token_urlsafe(32)}"
    return NewLoginToken(value=value, selector=selector, hash=login_token_digest(secret_key, value))


def login_token_selector(value: str) -> str | None:
    if not value.startswith(LOGIN_TOKEN_PREFIX):
        return None
    selector, dot, verifier = value[len(LOGIN_TOKEN_PREFIX) :].partition(".")
    if len(selector) != _SELECTOR_LENGTH or not dot or not verifier:
        return None
    return selector


class LoginCheck(NamedTuple):
    ok: bool
    upgrade: str | None = None
    """When set: the token was stored as argon2id by an earlier version; store this digest instead."""


def verify_login_token(secret_key: bytes, stored_hash: str, value: str) -> LoginCheck:
    """Whether ``value`` is the login token stored as ``stored_hash`` (a ``b2$`` digest, or an
    argon2id hash of an earlier version, which comes back with its replacement digest)."""
    if stored_hash.startswith(LOGIN_DIGEST_PREFIX):
        return LoginCheck(hmac.compare_digest(stored_hash, login_token_digest(secret_key, value)))
    if not stored_hash.startswith("$argon2"):
        return LoginCheck(False)
    try:
        ok = _password_hasher.verify(stored_hash, value)
    except (VerificationError, InvalidHashError):
        return LoginCheck(False)
    return LoginCheck(ok, login_token_digest(secret_key, value) if ok else None)


def keyed_digest(secret_key: bytes, purpose: str, value: str) -> str:
    """BLAKE2b-256 of ``value`` keyed with a key derived from ``secret_key`` for ``purpose``.

    For secrets with enough entropy of their own (session tokens, recovery codes): a lookup by
    digest costs microseconds, and the stored digests are useless without the secret key.
    """
    key = hashlib.sha256(b"vpsshop " + purpose.encode() + b"\x00" + secret_key).digest()
    return hashlib.blake2b(value.encode(), key=key, digest_size=32).hexdigest()
