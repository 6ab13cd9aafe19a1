"""Events: a transactional outbox, webhook deliveries, and the ``vpsshop_event`` hook.

Every state change a customer or reseller cares about calls :func:`emit` inside the transaction
that makes the change, so the event exists exactly when the change does (a rolled-back order
leaves no ``server.provisioning`` behind). After commit:

* the ``webhooks`` background task fans each event out to the account's matching endpoints and
  delivers them, signed (Standard Webhooks), retried with exponential backoff for about three days
  (:mod:`vpsshop.events.delivery`, :mod:`vpsshop.events.sender`);
* the ``event-hooks`` background task calls each plugin's ``vpsshop_event`` with every event, in
  order, from the plugin's own cursor (:mod:`vpsshop.events.dispatch`);
* ``GET /v1/events`` pages through the account's events (:mod:`vpsshop.events.feed`); the account's
  webhook endpoints are managed by :mod:`vpsshop.events.webhooks`.

Types: :mod:`vpsshop.events.types`. Payloads: the resource models of the API (the one model of each
resource: :class:`vpsshop.accounts.AccountOut`, :class:`vpsshop.servers.resource.ServerOut` ...),
``docs/events.md``.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from pydantic_core import to_jsonable_python
from sqlmodel import Session

from vpsshop.events.models import StoredEvent
from vpsshop.events.types import EVENT_TYPES
from vpsshop.models import table_of, utcnow

__all__ = ["EVENT_TYPES", "Event", "emit"]


def new_event_id() -> str:
    """``evt_`` + 128 random bits (url-safe, no ``.``: usable as a Standard Webhooks message id)."""
    return "evt_" + secrets.token_urlsafe(16)


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return to_jsonable_python(value)


def emit(
    session: Session,
    type: str,
    account_id: int,
    resource: BaseModel | dict[str, Any],
    *,
    now: datetime | None = None,
) -> str:
    """Record event ``type`` about ``resource`` for ``account_id`` in the caller's transaction.

    :param resource: the resource as the API shows it (a response model, or a dict of JSON
        values); it becomes the event's ``data``, with ``data.object`` naming its kind.
    :param now: the time of the change (the service clock); default now.
    :return: the event's public id (``evt_...``).
    :raises ValueError: an unknown event type (every type is listed in ``vpsshop.events.types``).
    """
    info = EVENT_TYPES.get(type)
    if info is None:
        raise ValueError(f"unknown event type {type!r}")
    data = {"object": info.object, **_jsonable(resource)}
    data["object"] = info.object
    resource_id = next((str(data[k]) for k in ("ref", "id", "user_id") if data.get(k) is not None), "")
    public_id = new_event_id()
    values: dict[str, Any] = dict(
        public_id=public_id,
        type=type,
        account_id=account_id,
        resource_type=info.object,
        resource_id=resource_id[:64],
        data=json.dumps(data, separators=(",", ":"), ensure_ascii=False),
        created_at=now or utcnow(),
    )
    # a Core insert of the table with bound parameters: compiled once, cheap on the order hot path
    session.execute(_INSERT, values)
    return public_id


_INSERT = sa.insert(table_of(StoredEvent))


@dataclass(frozen=True)
class Event:
    """An event as plugins, webhooks and ``GET /v1/events`` see it.

    ``body`` is the exact JSON a webhook delivers (and signs): ``{"id", "type", "timestamp",
    "account_id", "data"}``.
    """

    id: str
    type: str
    timestamp: datetime
    account_id: int
    data: dict[str, Any]
    body: bytes
    seq: int
    """Position in the published order of the outbox (increasing); internal, not shown to customers."""

    @classmethod
    def from_row(cls, row: StoredEvent) -> Event:
        assert row.seq is not None
        timestamp = to_jsonable_python(row.created_at)
        body = (
            '{"id":'
            + json.dumps(row.public_id)
            + ',"type":'
            + json.dumps(row.type)
            + ',"timestamp":'
            + json.dumps(timestamp)
            + ',"account_id":'
            + str(row.account_id)
            + ',"data":'
            + row.data
            + "}"
        ).encode()
        return cls(
            id=row.public_id,
            type=row.type,
            timestamp=row.created_at,
            account_id=row.account_id,
            data=json.loads(row.data),
            body=body,
            seq=row.seq,
        )

    def payload(self) -> dict[str, Any]:
        """The body as a dict."""
        payload: dict[str, Any] = json.loads(self.body)
        return payload
