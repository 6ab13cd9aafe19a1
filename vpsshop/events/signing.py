"""Webhook signing secrets and signatures, by the Standard Webhooks scheme.

A secret is ``whsec_`` + base64 of 32 random bytes (the bytes are the HMAC key). It is shown to
the customer once, when the endpoint is created, and stored encrypted with ``settings.encryption_key``
(Fernet, like root passwords): the shop needs it in clear to sign, so it cannot be a one-way hash,
and a copy of the database without the key does not reveal it.

A request is signed over ``{webhook-id}.{webhook-timestamp}.{body}`` with HMAC-SHA256; the
``webhook-signature`` header is ``v1,<base64 MAC>``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING

from cryptography.fernet import InvalidToken, MultiFernet

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_key_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value of one request."""
    mac = hmac.new(secret_key_bytes(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, msg_id, timestamp, body),
    }


def _fernet(ctx: AppContext) -> MultiFernet:
    """The shop's keys, newest first (vpsshop.encryption: rotation re-encrypts these secrets too)."""
    from vpsshop.encryption import fernet

    return fernet(ctx)


def encrypt_secret(ctx: AppContext, secret: str) -> str:
    return _fernet(ctx).encrypt(secret.encode()).decode()


def decrypt_secret(ctx: AppContext, token: str) -> str:
    try:
        return _fernet(ctx).decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError("a webhook secret does not decrypt with settings.encryption_key") from None
