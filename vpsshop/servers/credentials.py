"""Root passwords: generated with :mod:`secrets`, stored only encrypted, revealed to their owner
(:func:`reveal_credentials`).

Encrypted with ``settings.encryption_key`` through :mod:`vpsshop.encryption` (Fernet): a copy of
the database alone does not reveal a password, and a tampered column is refused.
"""

from __future__ import annotations

import secrets
import string

from anyio import to_thread
from pydantic import BaseModel, Field

from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.encryption import decrypt_text, encrypt_text
from vpsshop.errors import ApiError
from vpsshop.servers.resource import owned

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


class CredentialsOut(BaseModel):
    """Response of ``GET /servers/{id}/credentials``: sensitive, never cached."""

    server_id: int
    username: str = Field(description="root")
    password: str = Field(description="The root password as set at first boot.")
    ip: str | None
    hostname: str


async def reveal_credentials(ctx: AppContext, customer: Customer, server_id: int) -> CredentialsOut:
    """The root login of one of the account's servers, decrypted for this answer only.

    :raises NotFound: not the account's server; :raises ApiError: 410 ``server_terminated``.
    """

    def read() -> CredentialsOut:
        with ctx.db.session() as session:
            server = owned(session, customer.account_id, server_id)
        if server.status == "terminated" or server.root_password_enc is None:
            raise ApiError(410, "server_terminated", "The server was deleted; its credentials are gone.")
        assert server.id is not None
        return CredentialsOut(
            server_id=server.id,
            username=server.username,
            password=decrypt_password(ctx, server.root_password_enc),
            ip=server.ip,
            hostname=server.hostname,
        )

    return await to_thread.run_sync(read)
