"""Tables of the payment engine: top-ups, detected payments, x402 settlements, scan cursors and
address index counters. Schema owned by migration ``0002_topups``."""

from __future__ import annotations

import secrets
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from vpsshop.models import _ts

TOPUP_STATES = ("pending", "completed", "expired", "cancelled")
PAYMENT_STATES = ("seen", "held", "credited", "dropped")


class Topup(SQLModel, table=True):
    """One top-up: a request to fund ``account_id`` with ``amount_micros`` USD in ``coin``.

    ``rate`` is USD per coin unit, locked for the top-up's lifetime; ``deposit_amount_atomic``
    follows from it. ``watch_key`` is what chain scans match on (unique per coin).
    """

    __tablename__ = "topups"
    __table_args__ = (
        sa.UniqueConstraint("coin", "watch_key", name="uq_topups_coin_watch_key"),
        sa.UniqueConstraint("account_id", "idempotency_key", name="uq_topups_account_idempotency"),
        sa.Index("ix_topups_status_expires", "status", "expires_at"),
        sa.Index("ix_topups_coin_registered", "coin", "registered"),
    )

    id: int | None = Field(default=None, primary_key=True)
    ref: str = Field(max_length=40, unique=True, nullable=False)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    coin: str = Field(max_length=16, nullable=False)
    status: str = Field(max_length=16, nullable=False)
    amount_micros: int = Field(sa_type=sa.BigInteger, nullable=False)
    rate: str = Field(max_length=40, nullable=False)
    deposit_address: str | None = Field(default=None, max_length=200)
    deposit_amount_atomic: str = Field(max_length=40, nullable=False)
    deposit_network: str | None = Field(default=None, max_length=40)
    address_index: int | None = Field(default=None, sa_type=sa.BigInteger)
    watch_key: str | None = Field(default=None, max_length=200)
    idempotency_key: str | None = Field(default=None, max_length=200)
    registered: bool = Field(default=False, nullable=False)
    """The coin's node was told about the address (:meth:`DepositCoin.register_address`)."""
    deposit_address_id: int | None = Field(default=None, foreign_key="deposit_addresses.id", index=True)
    """The standing deposit address whose receipt this top-up credits (null: a top-up asked for)."""
    created_at: datetime = _ts()
    expires_at: datetime = _ts()
    completed_at: datetime | None = _ts(nullable=True)
    cancelled_at: datetime | None = _ts(nullable=True)


class TopupPayment(SQLModel, table=True):
    """A payment found on chain to a top-up's deposit address, keyed on the chain's identity.

    A payment to a standing deposit address (``deposit_address_id``) has no top-up until it is
    credited: then core makes a completed top-up for it (and the receipts held with it).

    ``status``: ``seen`` (waiting for confirmations), ``held`` (a standing address's confirmed
    receipt below the minimum, waiting for more to add up), ``credited`` (posted to the ledger once,
    under dedupe key ``topup:<coin>:<identity>``), ``dropped`` (left the chain before its
    confirmations; it comes back to ``seen`` if a later scan finds it again).
    """

    __tablename__ = "topup_payments"
    __table_args__ = (sa.UniqueConstraint("coin", "identity", name="uq_topup_payments_coin_identity"),)

    id: int | None = Field(default=None, primary_key=True)
    coin: str = Field(max_length=16, nullable=False)
    identity: str = Field(max_length=200, nullable=False)
    topup_id: int | None = Field(default=None, foreign_key="topups.id", index=True)
    deposit_address_id: int | None = Field(default=None, foreign_key="deposit_addresses.id", index=True)
    account_id: int = Field(foreign_key="accounts.id", nullable=False)
    txid: str = Field(max_length=128, nullable=False)
    amount_atomic: str = Field(max_length=40, nullable=False)
    status: str = Field(max_length=16, nullable=False, index=True)
    confirmations: int = Field(default=0, nullable=False)
    block_height: int | None = Field(default=None, sa_type=sa.BigInteger)
    block_hash: str | None = Field(default=None, max_length=128)
    late: bool = Field(default=False, nullable=False)
    """First seen after the top-up expired or was cancelled: valued at the rate of that moment."""
    rate: str | None = Field(default=None, max_length=40)
    credited_micros: int | None = Field(default=None, sa_type=sa.BigInteger)
    ledger_entry_id: int | None = Field(default=None, foreign_key="ledger_entries.id")
    first_seen_at: datetime = _ts()
    credited_at: datetime | None = _ts(nullable=True)


class DepositAddressRow(SQLModel, table=True):
    """An account's standing deposit address in one coin: one per account and coin, never expiring.

    Number ``number`` (1, 2, 3 ... per coin and key) derives with
    :meth:`vpsshop.coins.DepositCoin.derive_standing_address`, apart from top-up addresses.
    """

    __tablename__ = "deposit_addresses"
    __table_args__ = (
        sa.UniqueConstraint("account_id", "coin", name="uq_deposit_addresses_account_coin"),
        sa.UniqueConstraint("coin", "watch_key", name="uq_deposit_addresses_coin_watch_key"),
        sa.Index("ix_deposit_addresses_coin_registered", "coin", "registered"),
    )

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    coin: str = Field(max_length=16, nullable=False)
    address: str = Field(max_length=200, nullable=False)
    network: str | None = Field(default=None, max_length=40)
    key_id: str = Field(max_length=80, nullable=False)
    number: int = Field(sa_type=sa.BigInteger, nullable=False)
    watch_key: str = Field(max_length=200, nullable=False)
    registered: bool = Field(default=False, nullable=False)
    created_at: datetime = _ts()


class X402Record(SQLModel, table=True):
    """One x402 authorization, recorded *before* it is settled: (payer, nonce) is unique.

    ``status``: ``settling`` (outcome unknown: a retry or the watcher asks the coin),
    ``settled`` (credited once), ``rejected`` (nothing moved).

    ``purpose`` is null for a top-up, ``order:<idempotency key>`` or ``renew:<server id>`` for an
    authorization sent to pay an order or a renewal in the same request; ``outcome`` is ``done`` once
    that order or renewal was made (so a re-sent payment never buys twice).
    """

    __tablename__ = "x402_payments"
    __table_args__ = (sa.UniqueConstraint("coin", "payer", "nonce", name="uq_x402_payments_payer_nonce"),)

    id: int | None = Field(default=None, primary_key=True)
    coin: str = Field(max_length=16, nullable=False)
    payer: str = Field(max_length=64, nullable=False)
    nonce: str = Field(max_length=80, nullable=False)
    topup_id: int = Field(foreign_key="topups.id", index=True, nullable=False)
    status: str = Field(max_length=16, nullable=False, index=True)
    amount_atomic: str = Field(max_length=40, nullable=False)
    header: str = Field(sa_type=sa.Text, nullable=False)
    requirements: str = Field(sa_type=sa.Text, nullable=False)
    transaction: str | None = Field(default=None, max_length=128)
    network: str | None = Field(default=None, max_length=40)
    error: str | None = Field(default=None, max_length=200)
    purpose: str | None = Field(default=None, max_length=220)
    outcome: str | None = Field(default=None, max_length=16)
    created_at: datetime = _ts()
    settled_at: datetime | None = _ts(nullable=True)


class ScanCursor(SQLModel, table=True):
    """How far the watcher has scanned one scan group (opaque to core, see DepositCoin.scan)."""

    __tablename__ = "chain_scan_cursors"

    scan_group: str = Field(max_length=40, primary_key=True)
    cursor: str | None = Field(default=None, max_length=400)
    updated_at: datetime = _ts()


class AddressCounter(SQLModel, table=True):
    """The last deposit address index handed out for one coin and public key."""

    __tablename__ = "deposit_address_counters"

    coin: str = Field(max_length=16, primary_key=True)
    key_id: str = Field(max_length=80, primary_key=True)
    last_index: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)


def new_ref() -> str:
    """An unguessable top-up reference (128 random bits)."""
    return "tp_" + secrets.token_urlsafe(16)
