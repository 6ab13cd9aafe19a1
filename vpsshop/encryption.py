"""Secrets encrypted at rest with the shop's ``encryption_key``: root passwords, TOTP secrets.

The key is ``settings.encryption_key`` (a Fernet key from the settings file or the environment),
never the database: a copy of the database alone reveals none of these secrets. Fernet
authenticates what it decrypts, so a tampered column is refused rather than revealed as garbage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken

from vpsshop.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext

_EXTRA_KEY = "encryption.fernet"


def fernet(ctx: "AppContext") -> Fernet:
    """The Fernet of ``settings.encryption_key`` (built once per context).

    :raises ConfigError: the setting is not a Fernet key.
    """
    cached = ctx.extras.get(_EXTRA_KEY)
    if cached is None:
        key = ctx.settings.encryption_key.get_secret_value()
        try:
            cached = Fernet(key.encode())
        except (ValueError, TypeError):
            raise ConfigError(
                "encryption_key must be a Fernet key: 32 bytes in url-safe base64 "
                "(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
            ) from None
        ctx.extras[_EXTRA_KEY] = cached
    return cached


def encrypt_text(ctx: "AppContext", text: str) -> str:
    return fernet(ctx).encrypt(text.encode()).decode()


def decrypt_text(ctx: "AppContext", token: str, what: str = "secret") -> str:
    """The clear text. :raises ValueError: the column was not written with this key."""
    try:
        return fernet(ctx).decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError(f"the stored {what} does not decrypt with settings.encryption_key") from None
