"""Root passwords: generated with :mod:`secrets`, stored only encrypted, revealed to their owner.

Encrypted with ``settings.encryption_key`` through :mod:`vpsshop.encryption` (Fernet): a copy of
the database alone does not reveal a password, and a tampered column is refused.
"""

from __future__ import annotations

import secrets
import string

from vpsshop.context import AppContext
from vpsshop.encryption import decrypt_text, encrypt_text

GENERATED_LENGTH = 20
"""Generated passwords: 20 characters from 62 letters and digits, about 119 bits."""
_ALPHABET = string.ascii_letters + string.digits


def generate_root_password() -> str:
    """A strong password with at least one lowercase letter, uppercase letter and digit
    (some images' password policies want all three)."""
    while True:
        value = "".join(secrets.choice(_ALPHABET) for _ in range(GENERATED_LENGTH))
        if any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value):
            return value


def encrypt_password(ctx: AppContext, password: str) -> str:
    return encrypt_text(ctx, password)


def decrypt_password(ctx: AppContext, token: str) -> str:
    """The clear password. :raises ValueError: the column was not written with this key."""
    return decrypt_text(ctx, token, "root password")
