"""Secrets encrypted at rest with the shop's ``encryption_key``: root passwords, customers' cloud-init
user data, TOTP secrets, webhook signing secrets (:data:`ENCRYPTED_COLUMNS`), and the secrets plugins
keep in the settings file (``coins.SOL.seed_encrypted``, ``coins.USDCBASE.relayer_key_encrypted``).

The key is ``settings.encryption_key`` (a Fernet key from the settings file or the environment),
never the database: a copy of the database alone reveals none of these secrets. Fernet
authenticates what it decrypts, so a tampered column is refused rather than revealed as garbage.

**Rotation.** ``settings.old_encryption_keys`` lists earlier keys, newest first. New secrets are
encrypted with ``encryption_key``; a secret decrypts with whichever key of the list made it
(``MultiFernet``). :func:`rotate_stored_secrets` (``vpsshop admin rotate-keys``) re-encrypts every
column of :data:`ENCRYPTED_COLUMNS` with ``encryption_key``; after it, the old keys can go. Each
row is rewritten only if it still holds the value that was read (compare and set), so a secret
written meanwhile by the running shop is never overwritten with a stale one. Secrets in the settings
file are not in the database: each plugin's encrypt command makes them again under the new key.

A new column holding a Fernet token must be added to :data:`ENCRYPTED_COLUMNS`
(``tests/test_encrypted_columns.py`` fails otherwise).
"""

from __future__ import annotations

import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from vpsshop.context import AppContext, StateKey
from vpsshop.errors import ConfigError

ENCRYPTED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("servers", "id", "root_password_enc"),
    ("servers", "id", "user_data_enc"),
    ("accounts", "id", "totp_secret_enc"),
    ("webhook_endpoints", "id", "secret_enc"),
    ("operators", "id", "totp_secret_enc"),
)
"""(table, primary key, column) of every secret stored encrypted with the shop's keys."""


def fernet(ctx: AppContext) -> MultiFernet:
    """A ``MultiFernet`` of ``encryption_key`` then ``old_encryption_keys`` (built once per context).

    :raises ConfigError: a key is not a Fernet key.
    """
    return ctx.state(_FERNET, _build_fernet)


def _build_fernet(ctx: AppContext) -> MultiFernet:
    keys = [ctx.settings.encryption_key, *ctx.settings.old_encryption_keys]
    fernets = []
    for n, key in enumerate(keys):
        try:
            fernets.append(Fernet(key.get_secret_value().encode()))
        except (ValueError, TypeError):
            name = "encryption_key" if n == 0 else f"old_encryption_keys[{n - 1}]"
            raise ConfigError(
                f"{name} must be a Fernet key: 32 bytes in url-safe base64 "
                "(python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
            ) from None
    return MultiFernet(fernets)


_FERNET = StateKey[MultiFernet]("fernet")


def encrypt_text(ctx: AppContext, text: str) -> str:
    return fernet(ctx).encrypt(text.encode()).decode()


def decrypt_text(ctx: AppContext, token: str, what: str = "secret") -> str:
    """The clear text. :raises ValueError: the column was not written with this key."""
    try:
        return fernet(ctx).decrypt(token.encode()).decode()
    except InvalidToken:
        raise ValueError(
            f"the stored {what} does not decrypt with settings.encryption_key or old_encryption_keys"
        ) from None


def rotate_stored_secrets(ctx: AppContext, batch: int = 500) -> dict[str, int]:
    """Re-encrypt every stored secret with ``encryption_key``. Returns rows rewritten per
    ``table.column``.

    :raises ValueError: a stored secret decrypts with none of the configured keys (nothing of that
        row is changed; add the missing key to ``old_encryption_keys`` and run again).
    """
    multi = fernet(ctx)
    counts: dict[str, int] = {}
    tables = set(sa.inspect(ctx.db.engine).get_table_names())
    for table, pk, column in ENCRYPTED_COLUMNS:
        if table not in tables:
            continue
        if column not in {c["name"] for c in sa.inspect(ctx.db.engine).get_columns(table)}:
            continue
        t = sa.table(table, sa.column(pk), sa.column(column))
        done, last = 0, None
        while True:
            query = sa.select(t.c[pk], t.c[column]).where(t.c[column].is_not(None)).order_by(t.c[pk]).limit(batch)
            if last is not None:
                query = query.where(t.c[pk] > last)
            with ctx.db.engine.begin() as conn:
                rows = conn.execute(query).all()
                for row_id, token in rows:
                    try:
                        fresh = multi.rotate(token.encode()).decode()
                    except InvalidToken:
                        raise ValueError(
                            f"{table}.{column} of row {row_id} decrypts with none of the configured keys"
                        ) from None
                    done += conn.execute(
                        sa.update(t).where(t.c[pk] == row_id, t.c[column] == token).values({column: fresh})
                    ).rowcount
            if len(rows) < batch:
                break
            last = rows[-1][0]
        counts[f"{table}.{column}"] = done
    return counts
