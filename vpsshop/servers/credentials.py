"""Root passwords: generated with :mod:`secrets`, stored only encrypted, revealed to their owner.

The key is ``settings.encryption_key`` (a Fernet key from the settings file or the environment),
never the database: a copy of the database alone does not reveal a password. Fernet authenticates
what it decrypts, so a tampered column is refused rather than revealed as garbage.
"""

from __future__ import annotations

import secrets
import string

from cryptography.fernet import Fernet, InvalidToken

from vpsshop.context import AppContext
from vpsshop.errors import ConfigError

GENERATED_LENGTH = 20
"""Generated passwords: 20 characters from 62 letters and digits, about 119 bits."""
_ALPHABET = string.ascii_letters + string.digits
_EXTRA_KEY = "servers.fernet"


def generate_root_password() -> str:
    """A strong password with at least one lowercase letter, uppercase letter and digit
    (some images' password policies want all three)."""
    while True:
        value = "".join(secrets.choice(_ALPHABET) for _ in range(GENERATED_LENGTH))
        if (
            any(c.islower() for c in value)
            and any(c.isupper() for c in value)
            and any(c.isdigit() for c in value)
        ):
            return value


def _fernet(ctx: AppContext) -> Fernet:
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


def encrypt_password(ctx: AppContext, password: str) -> str:
    return _fernet(ctx).encrypt(password.encode()).decode()


def decrypt_password(ctx: AppContext, token: str) -> str:
    """The clear password. :raises ValueError: the column was not written with this key."""
    try:
        return _fernet(ctx).decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError("the stored root password does not decrypt with settings.encryption_key") from None
