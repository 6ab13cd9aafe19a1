"""Database tables. Money columns are integer micro-dollars; timestamps are aware UTC.

The schema is owned by the Alembic migrations in ``vpsshop/migrations``: change a table here,
then add a migration (``docs/development.md``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Stores aware datetimes as UTC and always returns them aware (SQLite keeps no offset)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def table_of(model: type[SQLModel]) -> sa.Table:
    """The Core table of a table model, for Core statements (an insert compiled once, a statement over
    several tables). SQLModel makes it with the class, as ``__table__``, which its types do not declare."""
    table = sa.inspect(model).local_table
    assert isinstance(table, sa.Table)
    return table


class _Row(Protocol):
    @property
    def id(self) -> int | None: ...


def saved_id(row: _Row) -> int:
    """The id of a row read from the database or flushed to it: the tables declare ``id: int | None``
    for a row not inserted yet, and the database gives every inserted row one."""
    assert row.id is not None
    return row.id


def _ts(nullable: bool = False, index: bool = False) -> Any:
    return Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=nullable, index=index))


class Account(SQLModel, table=True):
    __tablename__ = "accounts"
    __table_args__ = (sa.CheckConstraint("balance_micros >= 0", name="ck_accounts_balance_nonnegative"),)

    id: int | None = Field(default=None, primary_key=True)
    balance_micros: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)
    totp_enabled: bool = Field(default=False, nullable=False)
    login_selector: str = Field(max_length=32, unique=True, nullable=False)
    login_hash: str = Field(max_length=200, nullable=False)
    created_at: datetime = _ts()
    # Added by migration 0008 (dashboard issue): two-factor sign-in, see vpsshop/twofactor.py.
    totp_secret_enc: str | None = Field(default=None, max_length=500)
    """The TOTP secret, Fernet-encrypted with ``settings.encryption_key``. Set while enrolling
    (``totp_enabled`` still false) and while enabled; cleared when two-factor is turned off."""
    totp_last_step: int | None = Field(default=None, sa_type=sa.BigInteger)
    """The 30-second step of the last code accepted: a code is never accepted twice."""


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    key_hash: str = Field(max_length=64, unique=True, nullable=False)
    prefix: str = Field(max_length=16, nullable=False)
    name: str | None = Field(default=None, max_length=64)
    created_at: datetime = _ts()
    revoked_at: datetime | None = _ts(nullable=True)


class Wallet(SQLModel, table=True):
    """A wallet address that owns an account (issue 29): the wallet that paid the order creating the account,
    or one linked later by signing (:mod:`vpsshop.wallets`). An address owns at most one account."""

    __tablename__ = "wallets"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    address: str = Field(max_length=64, unique=True, nullable=False)
    """Lower-case ``0x`` address (EVM)."""
    created_at: datetime = _ts()
    credentials_pending: bool = Field(default=False, nullable=False)
    """The account was created by this wallet's payment and its first API key and login token were not
    shown yet: the first paid order that succeeds shows them (once)."""


class SiwxNonce(SQLModel, table=True):
    """A sign-in-with-x nonce already used: each signed message signs in once (kept until it expires)."""

    __tablename__ = "siwx_nonces"

    nonce: str = Field(primary_key=True, max_length=64)
    expires_at: datetime = _ts(index=True)


class LedgerEntry(SQLModel, table=True):
    """One change of one balance. Rows are only ever inserted; the balance is their running sum."""

    __tablename__ = "ledger_entries"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    amount_micros: int = Field(sa_type=sa.BigInteger, nullable=False)
    balance_after_micros: int = Field(sa_type=sa.BigInteger, nullable=False)
    reason: str = Field(max_length=32, nullable=False)
    ref: str | None = Field(default=None, max_length=200)
    dedupe_key: str | None = Field(default=None, max_length=200, unique=True)
    memo: str | None = Field(default=None, max_length=500)
    created_at: datetime = _ts()


class Server(SQLModel, table=True):
    __tablename__ = "servers"
    __table_args__ = (sa.Index("ux_servers_account_idempotency", "account_id", "idempotency_key", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    plan: str = Field(max_length=32, nullable=False)
    location: str = Field(max_length=32, nullable=False)
    os: str = Field(max_length=32, nullable=False)
    hostname: str = Field(max_length=63, nullable=False)
    cycle: str = Field(max_length=16, nullable=False)
    price_micros: int = Field(sa_type=sa.BigInteger, nullable=False)
    status: str = Field(max_length=16, nullable=False, index=True)
    ip: str | None = Field(default=None, max_length=45)
    username: str = Field(default="root", max_length=32, nullable=False)
    created_at: datetime = _ts()
    expires_at: datetime = _ts(index=True)
    # Added by migration 0003 (servers issue): see vpsshop/servers/ and docs/servers.md.
    root_password_enc: str | None = Field(default=None, max_length=500)
    """The root password, Fernet-encrypted with ``settings.encryption_key`` (never stored in clear)."""
    idempotency_key: str | None = Field(default=None, max_length=200)
    request_digest: str | None = Field(default=None, max_length=64)
    domain: str | None = Field(default=None, max_length=64)
    host: str | None = Field(default=None, max_length=200)
    status_reason: str | None = Field(default=None, max_length=500)
    auto_renew: bool = Field(default=True, nullable=False)
    suspended_at: datetime | None = _ts(nullable=True)
    terminated_at: datetime | None = _ts(nullable=True)
    # Added by migration 0009 (issue 14): access at order time and reverse DNS.
    ssh_keys: str | None = Field(default=None, sa_type=sa.Text)
    """JSON list of the OpenSSH public keys root accepts, copied from the account's key store at order
    (or reinstall), so deleting a stored key later does not change an existing server."""
    user_data_enc: str | None = Field(default=None, sa_type=sa.Text)
    """The customer's cloud-init user data, Fernet-encrypted (it may hold secrets)."""
    reverse_dns: str | None = Field(default=None, max_length=253)
    # Added by migration 0012 (issue 12): who suspended it.
    suspended_by: str | None = Field(default=None, max_length=16)
    """Set while ``suspended``: ``nonpayment`` (the paid period ended; a renewal resumes it) or ``admin``
    (``vpsshop admin suspend``; only ``vpsshop admin unsuspend`` lifts it)."""
    # Added by migration 0013: the VM's power as the last hypervisor job left it (vpsshop/servers/jobs.py).
    power: str | None = Field(default=None, max_length=16)
    """``running`` or ``stopped``; None while provisioning and once the VM is destroyed (the job
    that follows termination, within seconds)."""
    # Added by migration 0015 (issue 24): readiness reported by the guest.
    ready_at: datetime | None = _ts(nullable=True)
    """When the guest reported its last first boot (order or reinstall) finished cleanly; None until
    then, and when it finished with errors."""
    host_keys: str | None = Field(default=None, sa_type=sa.Text)
    """JSON list of ``"<type> <base64>"``: the SSH host keys the guest reported (public parts)."""
    # Added by migration 0018 (issue 25): IPv6.
    ipv6: str | None = Field(default=None, max_length=45)
    """The guest's IPv6 address (None: its location has no IPv6 pool)."""
    ipv6_prefix: str | None = Field(default=None, max_length=49)
    """The /64 routed to the server (``"2001:db8:0:5::/64"``) when its location routes one per
    server; None when the address comes from a prefix shared by the location's servers."""
    # Added by migration 0019 (issue 25): the inbound firewall.
    firewall: str | None = Field(default=None, sa_type=sa.Text)
    """JSON list of the inbound rules (``{"protocol", "ports", "source"}``, vpsshop/servers/firewall.py);
    None or empty: every inbound connection is let in (anti-spoofing is on regardless)."""
    # Added by migration 0023 (issue 25): what the server's snapshots add to each renewal.
    snapshot_fee_micros: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)
    """The sum of the ``fee_micros`` of the server's snapshots (vpsshop/servers/snapshots.py): added to
    the price of each renewal (:func:`vpsshop.servers.lifecycle.renewal_terms`)."""


class RecoveryCode(SQLModel, table=True):
    """A one-time two-factor recovery code, stored only as a keyed digest (``vpsshop.twofactor``)."""

    __tablename__ = "recovery_codes"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    code_hash: str = Field(max_length=64, unique=True, nullable=False)
    created_at: datetime = _ts()
    used_at: datetime | None = _ts(nullable=True)


class DashboardSession(SQLModel, table=True):
    """A signed-in browser. The cookie holds a random token; the row holds its keyed digest.

    A session is valid while ``ended_at`` is null and both ``expires_at`` (absolute) and
    ``last_seen_at`` + the idle limit are in the future. Sign-out and revocation set ``ended_at``:
    the next request with that cookie is refused. ``pending_totp`` marks a session whose login
    token was right but whose two-factor code is still to come: it opens no page but that step.
    """

    __tablename__ = "dashboard_sessions"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    token_hash: str = Field(max_length=64, unique=True, nullable=False)
    pending_totp: bool = Field(default=False, nullable=False)
    user_agent: str | None = Field(default=None, max_length=200)
    created_at: datetime = _ts()
    last_seen_at: datetime = _ts()
    expires_at: datetime = _ts()
    ended_at: datetime | None = _ts(nullable=True)


class RateLimitCounter(SQLModel, table=True):
    """Attempts counted for one key in one fixed window (``vpsshop.ratelimit.DatabaseRateLimiter``)."""

    __tablename__ = "rate_limit_counters"

    key: str = Field(max_length=200, primary_key=True)
    window_start: int = Field(sa_type=sa.BigInteger, primary_key=True, index=True)
    """Start of the window, whole seconds since the epoch."""
    count: int = Field(default=0, nullable=False)


class AdminAudit(SQLModel, table=True):
    """One action of an operator through ``vpsshop admin`` (vpsshop/admin.py): who, what, on what, why.

    Rows are only ever inserted. ``actor`` is the operating-system user who ran the command.
    """

    __tablename__ = "admin_audit"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = _ts(index=True)
    actor: str = Field(max_length=64, nullable=False)
    action: str = Field(max_length=32, nullable=False)
    target: str = Field(max_length=100, nullable=False)
    reason: str = Field(max_length=500, nullable=False)
    detail: str | None = Field(default=None, sa_type=sa.Text)


class IdempotentRequest(SQLModel, table=True):
    """The answer of an operation made under an idempotency key, for the operations whose own rows
    cannot hold the key (a renewal; an order and a top-up keep theirs on their own row).

    Unique per (account, operation, key): a retry with the same key and the same input is answered
    ``response`` again; with another input it is refused (``vpsshop.idempotency``).
    """

    __tablename__ = "idempotent_requests"
    __table_args__ = (
        sa.UniqueConstraint("account_id", "operation", "key", name="uq_idempotent_requests_account_operation_key"),
    )

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", nullable=False)
    operation: str = Field(max_length=32, nullable=False)
    key: str = Field(max_length=300, nullable=False)
    request_digest: str = Field(max_length=64, nullable=False)
    response: str = Field(sa_type=sa.Text, nullable=False)
    """The operation's result as JSON."""
    created_at: datetime = _ts()
