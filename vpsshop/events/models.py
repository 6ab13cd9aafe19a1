"""Tables of events and webhooks. Schema owned by migration ``0011_events``.

* ``events``: the transactional outbox. One row per state change a customer or reseller cares
  about, inserted by :func:`vpsshop.events.emit` in the transaction that makes the change. Rows
  are only ever inserted.
* ``event_cursors``: how far each consumer of the outbox has read (the webhook fan-out, each
  plugin implementing ``vpsshop_event``), with a lease so one worker at a time moves a cursor.
* ``webhook_endpoints``: a customer's registered URLs, their event types and encrypted secret.
* ``webhook_deliveries``: one event to one endpoint, retried until accepted or given up.
* ``webhook_attempts``: one HTTP request of a delivery: the delivery log.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from vpsshop.models import _ts

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""A 64-bit id on PostgreSQL; on SQLite an ``INTEGER PRIMARY KEY`` (a rowid alias, 64-bit anyway)."""

DELIVERY_STATES = ("pending", "delivering", "succeeded", "failed", "cancelled")
ENDPOINT_STATES = ("enabled", "disabled")


class StoredEvent(SQLModel, table=True):
    """One event in the outbox.

    ``public_id`` (``evt_...``) is the public, stable id: the ``webhook-id`` of every delivery of
    it. ``data`` is the JSON of the resource as the API shows it (see ``vpsshop/events/types.py``).
    ``seq`` is the event's place in the published order, given after commit by
    :func:`vpsshop.events.outbox.publish`; readers page by it and never see an unpublished event.
    """

    __tablename__ = "events"
    __table_args__ = (sa.Index("ix_events_account_id_seq", "account_id", "seq"),)

    id: int | None = Field(default=None, sa_column=sa.Column(BigId, primary_key=True, autoincrement=True))
    public_id: str = Field(max_length=40, unique=True, nullable=False)
    type: str = Field(max_length=64, nullable=False)
    account_id: int = Field(foreign_key="accounts.id", nullable=False)
    resource_type: str = Field(max_length=32, nullable=False)
    resource_id: str = Field(max_length=64, nullable=False)
    data: str = Field(sa_type=sa.Text, nullable=False)
    seq: int | None = Field(default=None, sa_type=sa.BigInteger, unique=True)
    created_at: datetime = _ts()


class EventCursor(SQLModel, table=True):
    """A consumer's position in the outbox: it has handled every published event up to ``last_id`` (a ``seq``).

    ``failures``/``retry_at``/``last_error`` hold back a consumer whose last call failed (a plugin's
    hook that raised); ``locked_by``/``locked_until`` is the lease of the worker moving it.
    """

    __tablename__ = "event_cursors"

    name: str = Field(max_length=120, primary_key=True)
    last_id: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)
    failures: int = Field(default=0, nullable=False)
    retry_at: datetime | None = _ts(nullable=True)
    last_error: str | None = Field(default=None, max_length=500)
    locked_by: str | None = Field(default=None, max_length=64)
    locked_until: datetime | None = _ts(nullable=True)
    updated_at: datetime = _ts()


class WebhookEndpoint(SQLModel, table=True):
    """A URL an account receives events at.

    ``secret_enc`` is the signing secret (``whsec_...``) encrypted with ``settings.encryption_key``
    (Fernet): the shop must sign with it, so it cannot be a one-way hash; a copy of the database
    alone does not reveal it. ``event_types`` is a JSON list of types and ``prefix.*`` patterns.
    """

    __tablename__ = "webhook_endpoints"

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    url: str = Field(max_length=2000, nullable=False)
    description: str | None = Field(default=None, max_length=200)
    event_types: str = Field(sa_type=sa.Text, nullable=False)
    secret_enc: str = Field(max_length=500, nullable=False)
    status: str = Field(default="enabled", max_length=16, nullable=False)
    disabled_reason: str | None = Field(default=None, max_length=500)
    since_event_id: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)
    """The newest published event (``seq``) when the endpoint was registered: it receives those after it."""
    failing_since: datetime | None = _ts(nullable=True)
    """When the run of failed attempts that has not been broken by a success began."""
    created_at: datetime = _ts()
    disabled_at: datetime | None = _ts(nullable=True)
    deleted_at: datetime | None = _ts(nullable=True)


class WebhookDelivery(SQLModel, table=True):
    """One event to one endpoint: ``pending`` -> ``delivering`` (claimed under a lease) -> ``succeeded``,
    back to ``pending`` with ``next_attempt_at`` after a failure, or ``failed`` when the retry window
    is over. ``fanout_key`` (``<endpoint>:<event>``) is unique, so an event is fanned out to an
    endpoint once; a redelivery is a new row without one.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        sa.Index("ix_webhook_deliveries_endpoint_id", "endpoint_id", "id"),
    )

    id: int | None = Field(default=None, sa_column=sa.Column(BigId, primary_key=True, autoincrement=True))
    endpoint_id: int = Field(foreign_key="webhook_endpoints.id", nullable=False)
    event_id: int = Field(sa_type=sa.BigInteger, foreign_key="events.id", nullable=False)
    account_id: int = Field(foreign_key="accounts.id", nullable=False)
    fanout_key: str | None = Field(default=None, max_length=80, unique=True)
    redelivery: bool = Field(default=False, nullable=False)
    status: str = Field(default="pending", max_length=16, nullable=False)
    attempts: int = Field(default=0, nullable=False)
    next_attempt_at: datetime = _ts()
    locked_by: str | None = Field(default=None, max_length=64)
    locked_until: datetime | None = _ts(nullable=True)
    last_status_code: int | None = Field(default=None)
    last_error: str | None = Field(default=None, max_length=500)
    created_at: datetime = _ts()
    finished_at: datetime | None = _ts(nullable=True)


class WebhookAttempt(SQLModel, table=True):
    """One HTTP request of a delivery, kept for the delivery log."""

    __tablename__ = "webhook_attempts"

    id: int | None = Field(default=None, sa_column=sa.Column(BigId, primary_key=True, autoincrement=True))
    delivery_id: int = Field(sa_type=sa.BigInteger, foreign_key="webhook_deliveries.id", index=True, nullable=False)
    endpoint_id: int = Field(foreign_key="webhook_endpoints.id", nullable=False)
    number: int = Field(nullable=False)
    outcome: str = Field(max_length=16, nullable=False)
    """``accepted`` (2xx), ``rejected`` (another status), ``error`` (no answer), ``refused`` (address refused)."""
    status_code: int | None = Field(default=None)
    error: str | None = Field(default=None, max_length=500)
    response_excerpt: str | None = Field(default=None, max_length=500)
    duration_ms: int = Field(default=0, nullable=False)
    worker: str | None = Field(default=None, max_length=64)
    started_at: datetime = _ts()
