"""Webhook endpoints of an account: register, list, change, pause, delete, the delivery log, and
sending an event again. Deliveries themselves are :mod:`vpsshop.events.delivery`'s.

A registration, a change and a deletion emit ``webhook.created``, ``webhook.updated`` and
``webhook.deleted``; the delivery task emits ``webhook.disabled`` when it gives an endpoint up.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal, cast

import sqlalchemy as sa
from anyio import to_thread
from pydantic import BaseModel, Field, StrictBool
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict, NotFound
from vpsshop.events import outbox, signing
from vpsshop.events.feed import EVENT_ID_PATTERN, PATTERNS
from vpsshop.events.models import StoredEvent, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from vpsshop.events.sender import InvalidUrl, normalize_url
from vpsshop.events.settings import event_settings
from vpsshop.events.types import valid_pattern
from vpsshop.inputs import LABEL_PATTERN, Input
from vpsshop.models import saved_id

__all__ = [
    "AttemptOut",
    "DeliveryList",
    "DeliveryOut",
    "DeliveryQuery",
    "RedeliverInput",
    "WebhookChange",
    "WebhookCreated",
    "WebhookDeleted",
    "WebhookInput",
    "WebhookList",
    "WebhookOut",
    "change_webhook",
    "create_webhook",
    "delete_webhook",
    "get_webhook",
    "list_deliveries",
    "list_webhooks",
    "redeliver",
    "webhook_out",
]

URL_PATTERN = r"^https?://[^\s/?#@]+(?:[/?#]\S*)?$"
"""An http(s) URL with a host and no user name or password: the schema's part of the rule, documented
only; normalize_url checks all of it in words when the endpoint is registered (and every delivery)."""


class WebhookInput(Input):
    """Body of ``POST /webhooks``."""

    url: str = Field(
        min_length=1,
        max_length=2000,
        json_schema_extra={"format": "uri", "pattern": URL_PATTERN},
        description="Where to POST events. https (the sandbox also allows http and loopback); no "
        "user name or password; a private, loopback or link-local address is refused (invalid_url).",
    )
    event_types: list[str] = Field(
        ["*"],
        min_length=1,
        max_length=50,
        json_schema_extra={"items": {"type": "string", "enum": [*PATTERNS]}},
        description="Event types to receive: names, `<resource>.*` or `*` (default).",
    )
    description: str | None = Field(
        None,
        max_length=200,
        pattern=LABEL_PATTERN,
        description="A label for the endpoint (no control or bidirectional-override characters).",
    )


class WebhookChange(Input):
    """Body of ``PATCH /webhooks/{id}``: any of the fields."""

    url: str | None = Field(
        None,
        min_length=1,
        max_length=2000,
        json_schema_extra={"format": "uri", "pattern": URL_PATTERN},
        description="A new URL to POST events to, under the rules of registration (invalid_url); absent: unchanged.",
    )
    event_types: list[str] | None = Field(
        None,
        min_length=1,
        max_length=50,
        json_schema_extra={"items": {"type": "string", "enum": [*PATTERNS]}},
        description="The event types to receive from now on (names, `<resource>.*` or `*`); absent: unchanged.",
    )
    description: str | None = Field(
        None, max_length=200, pattern=LABEL_PATTERN, description="A new label; null removes it; absent: unchanged."
    )
    enabled: StrictBool | None = Field(None, description="true re-enables a disabled endpoint; false pauses it.")


EndpointStatus = Literal["enabled", "disabled"]
AttemptOutcome = Literal["accepted", "rejected", "error", "refused"]
DeliveryStatus = Literal["pending", "delivering", "succeeded", "failed", "cancelled"]


class WebhookOut(BaseModel):
    """A webhook endpoint of the account (its secret is shown once, at registration)."""

    id: int
    url: str
    description: str | None
    event_types: list[str]
    status: EndpointStatus
    disabled_reason: str | None = Field(description="Why it was disabled (failing for days, 410 Gone, by hand).")
    failing_since: datetime | None = Field(description="Start of the current run of failed attempts, else null.")
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (whsec_...). Shown here once; stored encrypted.")


class WebhookList(BaseModel):
    webhooks: list[WebhookOut] = Field(description="The account's endpoints, oldest first.")


class WebhookDeleted(BaseModel):
    id: int
    deleted: bool = True


class AttemptOut(BaseModel):
    number: int = Field(description="1 for the first attempt of the delivery.")
    outcome: AttemptOutcome = Field(
        description="accepted: 2xx; rejected: another status (a 3xx is not followed); error: no answer in time "
        "or the connection failed; refused: the URL resolves to an address webhooks may not reach."
    )
    status_code: int | None
    error: str | None
    response_excerpt: str | None = Field(description="The start of the response body.")
    duration_ms: int
    started_at: datetime


class DeliveryOut(BaseModel):
    id: int
    event_id: str
    event_type: str
    status: DeliveryStatus = Field(
        description="pending (waiting for its next attempt), delivering, succeeded (a 2xx), failed (the retry "
        "window of about three days ended), cancelled (the endpoint was deleted)."
    )
    redelivery: bool = Field(description="Made by POST /webhooks/{id}/redeliver.")
    attempts: int
    next_attempt_at: datetime | None = Field(description="When it is tried next, while pending.")
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None
    log: list[AttemptOut] = Field(description="Its attempts, oldest first.")


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut] = Field(description="Newest first.")
    has_more: bool
    cursor: int | None = Field(description="Pass as `before` for the next (older) page.")


class RedeliverInput(Input):
    """Body of ``POST /webhooks/{id}/redeliver``."""

    event_id: str = Field(pattern=EVENT_ID_PATTERN, description="An event of this account (GET /events).")


# ---- rows and checks ------------------------------------------------------------------------------


def webhook_out(endpoint: WebhookEndpoint) -> WebhookOut:
    assert endpoint.id is not None
    return WebhookOut(
        id=endpoint.id,
        url=endpoint.url,
        description=endpoint.description,
        event_types=json.loads(endpoint.event_types),
        status=cast(EndpointStatus, endpoint.status),  # the column holds only what this module writes
        disabled_reason=endpoint.disabled_reason,
        failing_since=endpoint.failing_since,
        created_at=endpoint.created_at,
    )


def _url(ctx: AppContext, url: str) -> str:
    try:
        return normalize_url(url, event_settings(ctx))
    except InvalidUrl as exc:
        raise BadRequest("invalid_url", f"url: {exc}.") from None


def _types(patterns: list[str]) -> str:
    unknown = [p for p in patterns if not valid_pattern(p)]
    if unknown:
        raise BadRequest("invalid_event_types", f"Unknown event type {unknown[0]!r}; see docs/events.md for the list.")
    return json.dumps(list(dict.fromkeys(patterns)))


def _create(ctx: AppContext, account_id: int, body: WebhookInput) -> WebhookCreated:
    limits.count_write(ctx, account_id)
    url, types = _url(ctx, body.url), _types(body.event_types)
    secret = signing.new_secret()
    now = ctx.clock.now()
    limit = event_settings(ctx).max_endpoints_per_account
    outbox.publish_pending(ctx.db)
    with ctx.db.session() as session:
        count = session.execute(
            sa.select(sa.func.count())
            .select_from(WebhookEndpoint)
            .where(col(WebhookEndpoint.account_id) == account_id, col(WebhookEndpoint.deleted_at).is_(None))
        ).scalar()
        if int(count or 0) >= limit:
            raise Conflict("too_many_webhooks", f"An account may have {limit} webhook endpoints; delete one first.")
        since = outbox.head(session)
        endpoint = WebhookEndpoint(
            account_id=account_id,
            url=url,
            description=body.description,
            event_types=types,
            secret_enc=signing.encrypt_secret(ctx, secret),
            status="enabled",
            since_event_id=since,
            created_at=now,
        )
        session.add(endpoint)
        session.flush()
        out = webhook_out(endpoint)
        events.emit(session, "webhook.created", account_id, out, now=now)
        return WebhookCreated(**out.model_dump(), secret=secret)


def _owned(session: Session, account_id: int, endpoint_id: int) -> WebhookEndpoint:
    endpoint = session.exec(
        select(WebhookEndpoint).where(
            col(WebhookEndpoint.id) == endpoint_id,
            col(WebhookEndpoint.account_id) == account_id,
            col(WebhookEndpoint.deleted_at).is_(None),
        )
    ).first()
    if endpoint is None:
        raise NotFound("webhook endpoint")
    return endpoint


def _list(ctx: AppContext, account_id: int) -> WebhookList:
    with ctx.db.session() as session:
        rows = session.exec(
            select(WebhookEndpoint)
            .where(col(WebhookEndpoint.account_id) == account_id, col(WebhookEndpoint.deleted_at).is_(None))
            .order_by(col(WebhookEndpoint.id))
        ).all()
        return WebhookList(webhooks=[webhook_out(e) for e in rows])


def _get(ctx: AppContext, account_id: int, endpoint_id: int) -> WebhookOut:
    with ctx.db.session() as session:
        return webhook_out(_owned(session, account_id, endpoint_id))


def _patch(ctx: AppContext, account_id: int, endpoint_id: int, body: WebhookChange) -> WebhookOut:
    limits.count_write(ctx, account_id)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        endpoint = _owned(session, account_id, endpoint_id)
        if body.url is not None:
            endpoint.url = _url(ctx, body.url)
        if body.event_types is not None:
            endpoint.event_types = _types(body.event_types)
        if "description" in body.model_fields_set:
            endpoint.description = body.description
        if body.enabled is True and endpoint.status != "enabled":
            endpoint.status, endpoint.disabled_reason, endpoint.disabled_at = "enabled", None, None
            endpoint.failing_since = None
        elif body.enabled is False and endpoint.status == "enabled":
            endpoint.status, endpoint.disabled_at = "disabled", now
            endpoint.disabled_reason = "Disabled by the account."
        session.add(endpoint)
        session.flush()
        out = webhook_out(endpoint)
        events.emit(session, "webhook.updated", account_id, out, now=now)
        return out


def _delete(ctx: AppContext, account_id: int, endpoint_id: int) -> WebhookDeleted:
    limits.count_write(ctx, account_id)
    now = ctx.clock.now()
    with ctx.db.session() as session:
        endpoint = _owned(session, account_id, endpoint_id)
        endpoint.deleted_at = now
        session.add(endpoint)
        session.execute(
            sa.update(WebhookDelivery)
            .where(col(WebhookDelivery.endpoint_id) == endpoint_id, col(WebhookDelivery.status) == "pending")
            .values(status="cancelled", finished_at=now)
        )
        events.emit(session, "webhook.deleted", account_id, webhook_out(endpoint), now=now)
        return WebhookDeleted(id=endpoint_id)


# ---- the delivery log and redelivery -------------------------------------------------------------


def _deliveries_out(session: Session, rows: list[tuple[WebhookDelivery, StoredEvent]]) -> list[DeliveryOut]:
    ids = [saved_id(d) for d, _ in rows]
    attempts: dict[int, list[AttemptOut]] = {}
    if ids:
        for a in session.exec(
            select(WebhookAttempt).where(col(WebhookAttempt.delivery_id).in_(ids)).order_by(col(WebhookAttempt.id))
        ).all():
            attempts.setdefault(a.delivery_id, []).append(
                AttemptOut(
                    number=a.number,
                    outcome=cast(AttemptOutcome, a.outcome),  # the column holds only what delivery writes
                    status_code=a.status_code,
                    error=a.error,
                    response_excerpt=a.response_excerpt,
                    duration_ms=a.duration_ms,
                    started_at=a.started_at,
                )
            )
    return [
        DeliveryOut(
            id=saved_id(d),
            event_id=e.public_id,
            event_type=e.type,
            status=cast(DeliveryStatus, d.status),  # the column holds only what delivery writes
            redelivery=d.redelivery,
            attempts=d.attempts,
            next_attempt_at=d.next_attempt_at if d.status == "pending" else None,
            last_status_code=d.last_status_code,
            last_error=d.last_error,
            created_at=d.created_at,
            finished_at=d.finished_at,
            log=attempts.get(saved_id(d), []),
        )
        for d, e in rows
    ]


def _deliveries(ctx: AppContext, account_id: int, endpoint_id: int, before: int | None, limit: int) -> DeliveryList:
    with ctx.db.session() as session:
        _owned(session, account_id, endpoint_id)
        query = (
            select(WebhookDelivery, StoredEvent)
            .join(StoredEvent, col(StoredEvent.id) == col(WebhookDelivery.event_id))
            .where(col(WebhookDelivery.endpoint_id) == endpoint_id)
        )
        if before is not None:
            query = query.where(col(WebhookDelivery.id) < before)
        rows = list(session.exec(query.order_by(col(WebhookDelivery.id).desc()).limit(limit + 1)).all())
        has_more = len(rows) > limit
        rows = rows[:limit]
        return DeliveryList(
            deliveries=_deliveries_out(session, rows),
            has_more=has_more,
            cursor=rows[-1][0].id if rows and has_more else None,
        )


def _redeliver(ctx: AppContext, account_id: int, endpoint_id: int, event_id: str) -> DeliveryOut:
    limits.count_write(ctx, account_id)
    now = ctx.clock.now()
    outbox.publish_pending(ctx.db)
    with ctx.db.session() as session:
        endpoint = _owned(session, account_id, endpoint_id)
        if endpoint.status != "enabled":
            raise Conflict("webhook_disabled", "The endpoint is disabled; re-enable it with PATCH /webhooks/{id}.")
        row = session.exec(
            outbox.visible(
                select(StoredEvent).where(StoredEvent.public_id == event_id, StoredEvent.account_id == account_id)
            )
        ).first()
        if row is None:
            raise NotFound("event on this account")
        delivery = WebhookDelivery(
            endpoint_id=endpoint_id,
            event_id=row.id,
            account_id=account_id,
            redelivery=True,
            status="pending",
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
        session.add(delivery)
        session.flush()
        return _deliveries_out(session, [(delivery, row)])[0]


class DeliveryQuery(Input):
    """A page of an endpoint's delivery log: newest first, before a delivery."""

    before: int | None = Field(
        None, ge=1, le=999_999_999_999_999_999, description="Deliveries older than this delivery id."
    )
    limit: int = Field(50, ge=1, le=100, description="Page size, 1 to 100 (default 50).")

    @classmethod
    def error_code(cls, field_name: str, error_type: str) -> str:
        if field_name == "before":
            return "invalid_cursor"
        return super().error_code(field_name, error_type)


# ---- operations ------------------------------------------------------------------------------------


async def create_webhook(ctx: AppContext, customer: Customer, data: WebhookInput) -> WebhookCreated:
    """Register an endpoint; its signing secret is in the answer only.

    :raises BadRequest: invalid_url, invalid_event_types. :raises Conflict: too_many_webhooks.
    """
    return await to_thread.run_sync(_create, ctx, customer.account_id, data)


async def list_webhooks(ctx: AppContext, customer: Customer) -> WebhookList:
    """The account's endpoints, oldest first (secrets are never shown again)."""
    return await to_thread.run_sync(_list, ctx, customer.account_id)


async def get_webhook(ctx: AppContext, customer: Customer, endpoint_id: int) -> WebhookOut:
    """One endpoint. :raises NotFound: not the account's."""
    return await to_thread.run_sync(_get, ctx, customer.account_id, endpoint_id)


async def change_webhook(ctx: AppContext, customer: Customer, endpoint_id: int, data: WebhookChange) -> WebhookOut:
    """Change the URL, types or description; ``enabled`` true re-enables a disabled endpoint (its pending
    deliveries resume), false pauses it. :raises NotFound: not the account's."""
    return await to_thread.run_sync(_patch, ctx, customer.account_id, endpoint_id, data)


async def delete_webhook(ctx: AppContext, customer: Customer, endpoint_id: int) -> WebhookDeleted:
    """Stop deliveries to an endpoint at once; pending ones are cancelled. :raises NotFound:"""
    return await to_thread.run_sync(_delete, ctx, customer.account_id, endpoint_id)


async def list_deliveries(ctx: AppContext, customer: Customer, endpoint_id: int, query: DeliveryQuery) -> DeliveryList:
    """An endpoint's delivery log, newest first, each delivery with its attempts. :raises NotFound:"""
    return await to_thread.run_sync(_deliveries, ctx, customer.account_id, endpoint_id, query.before, query.limit)


async def redeliver(ctx: AppContext, customer: Customer, endpoint_id: int, data: RedeliverInput) -> DeliveryOut:
    """Queue a new delivery of one of the account's events to an endpoint (same webhook-id).

    :raises NotFound: no such endpoint or event. :raises Conflict: webhook_disabled.
    """
    return await to_thread.run_sync(_redeliver, ctx, customer.account_id, endpoint_id, data.event_id)
