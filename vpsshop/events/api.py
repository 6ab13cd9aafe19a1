"""``/v1/events`` (catch up on missed webhooks) and ``/v1/webhooks`` (endpoints, log, redelivery)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal, Union

import sqlalchemy as sa
from pydantic import BaseModel, Field, StrictBool, create_model
from sqlmodel import Session, select
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict, NotFound
from vpsshop.events import Event, outbox, resources, signing
from vpsshop.events.models import StoredEvent, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from vpsshop.events.sender import InvalidUrl, normalize_url
from vpsshop.events.settings import event_settings
from vpsshop.events.types import EVENT_TYPES, OBJECTS_BY_PREFIX, valid_pattern
from vpsshop.routing import LABEL_PATTERN, ApiModel, ApiRoute, Call, JsonBody, Query, Reply
from vpsshop.servers.resource import ServerOut

TAG = ("events",)
NO_STORE = {"Cache-Control": "no-store"}
EVENT_ID_PATTERN = r"^evt_[A-Za-z0-9_-]{1,36}$"
PATTERNS = ["*", *sorted(f"{prefix}.*" for prefix in OBJECTS_BY_PREFIX), *EVENT_TYPES]


# ---- models --------------------------------------------------------------------------------------


class ServerData(ServerOut):
    object: Literal["server"] = "server"


DATA_MODELS: dict[str, type[BaseModel]] = {
    "account": resources.AccountData,
    "api_key": resources.ApiKeyData,
    "ledger_entry": resources.LedgerEntryData,
    "topup": resources.TopupData,
    "server": ServerData,
    "webhook": resources.WebhookData,
}


def _envelope(obj: str) -> type[BaseModel]:
    names = tuple(name for name, info in EVENT_TYPES.items() if info.object == obj)
    title = "".join(part.capitalize() for part in obj.split("_")) + "Event"
    return create_model(  # type: ignore[call-overload,no-any-return]
        title,
        __doc__=f"An event about a {obj.replace('_', ' ')}: {', '.join(names)}. The body of a webhook and an item "
        "of GET /events.",
        id=(str, Field(description="Stable event id (evt_...): the webhook-id header of every delivery of it.")),
        type=(Literal[names], Field(description="The event type.")),  # type: ignore[valid-type]
        timestamp=(datetime, Field(description="When the change happened (UTC).")),
        account_id=(int, Field(description="The account the event belongs to.")),
        data=(DATA_MODELS[obj], Field(description="The resource as the API shows it, after the change.")),
    )


ENVELOPES: dict[str, type[BaseModel]] = {obj: _envelope(obj) for obj in DATA_MODELS}
AnyData = Union[tuple(DATA_MODELS.values())]  # type: ignore[valid-type]  # noqa: UP007 - built at run time


class EventOut(BaseModel):
    """An event: the body of a webhook and an item of ``GET /events``."""

    id: str = Field(description="Stable event id (evt_...): the webhook-id header of every delivery of it.")
    type: Literal[tuple(EVENT_TYPES)] = Field(description="The event type (docs/events.md).")  # type: ignore[valid-type]
    timestamp: datetime = Field(description="When the change happened (UTC).")
    account_id: int
    data: AnyData = Field(description="The resource as the API shows it after the change; data.object names it.")  # type: ignore[valid-type]


class EventList(BaseModel):
    """Response of ``GET /events``."""

    events: list[EventOut] = Field(description="The events, oldest first (newest first with `before`).")  # type: ignore[valid-type]
    has_more: bool = Field(description="More events follow this page.")
    cursor: str | None = Field(
        description="The last event's id: pass it as `after` (or `before`) for the next "
        "page. With `after` and no new event, the `after` given."
    )


URL_PATTERN = r"^https?://[^\s/?#@]+(?:[/?#]\S*)?$"
"""An http(s) URL with a host and no user name or password: the schema's part of the rule, documented
only; normalize_url checks all of it in words when the endpoint is registered (and every delivery)."""


class WebhookBody(ApiModel):
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
        json_schema_extra={"items": {"type": "string", "enum": PATTERNS}},
        description="Event types to receive: names, `<resource>.*` or `*` (default).",
    )
    description: str | None = Field(
        None,
        max_length=200,
        pattern=LABEL_PATTERN,
        description="A label for the endpoint (no control or bidirectional-override characters).",
    )


class WebhookPatch(ApiModel):
    """Body of ``PATCH /webhooks/{id}``: any of the fields."""

    url: str | None = Field(
        None, min_length=1, max_length=2000, json_schema_extra={"format": "uri", "pattern": URL_PATTERN}
    )
    event_types: list[str] | None = Field(
        None, min_length=1, max_length=50, json_schema_extra={"items": {"type": "string", "enum": PATTERNS}}
    )
    description: str | None = Field(None, max_length=200, pattern=LABEL_PATTERN)
    enabled: StrictBool | None = Field(None, description="true re-enables a disabled endpoint; false pauses it.")


class WebhookOut(BaseModel):
    id: int
    url: str
    description: str | None
    event_types: list[str]
    status: Literal["enabled", "disabled"]
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
    outcome: Literal["accepted", "rejected", "error", "refused"] = Field(
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
    status: Literal["pending", "delivering", "succeeded", "failed", "cancelled"] = Field(
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


class RedeliverBody(ApiModel):
    event_id: str = Field(pattern=EVENT_ID_PATTERN, description="An event of this account (GET /events).")


# ---- events --------------------------------------------------------------------------------------


def _limit(call: Call, default: int = 50) -> int:
    raw = call.request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise BadRequest("invalid_limit", "limit must be a whole number from 1 to 100.")
    return int(raw)


def _anchor(session: Session, account_id: int, public_id: str) -> int:
    row = session.exec(
        select(StoredEvent.seq).where(StoredEvent.public_id == public_id, StoredEvent.account_id == account_id)
    ).first()
    if row is None:
        raise NotFound("event on this account")
    return int(row)


def _list_events(
    ctx: AppContext,
    account_id: int,
    after: str | None,
    before: str | None,
    limit: int,
    type_: str | None,
    *,
    newest_first: bool = False,
) -> Response:
    """The events page ``GET /v1/events`` answers. Oldest first, except with only ``before`` or with
    ``newest_first`` (the dashboard's list, from the newest event down)."""
    outbox.publish_pending(ctx.db)
    with ctx.db.session() as session:
        query = select(StoredEvent).where(StoredEvent.account_id == account_id)
        if type_ is not None and type_ != "*":
            if type_.endswith(".*"):
                query = query.where(StoredEvent.type.startswith(type_[:-1]))  # type: ignore[attr-defined]
            else:
                query = query.where(StoredEvent.type == type_)
        low = _anchor(session, account_id, after) if after is not None else None
        high = _anchor(session, account_id, before) if before is not None else None
        if low is not None and high is not None and low >= high:
            raise BadRequest(
                "invalid_cursor",
                "With both after and before, after must name an older event than before (the events between "
                "them are listed, oldest first); these two are the other way round or the same event.",
            )
        if low is not None:
            query = query.where(StoredEvent.seq > low)  # type: ignore[operator]
        if high is not None:
            query = query.where(StoredEvent.seq < high)  # type: ignore[operator]
        newest_first = newest_first or (before is not None and after is None)
        query = query.order_by(StoredEvent.seq.desc() if newest_first else StoredEvent.seq)  # type: ignore[union-attr]
        rows = list(session.exec(outbox.visible(query.limit(limit + 1))).all())
    has_more = len(rows) > limit
    rows = rows[:limit]
    cursor = rows[-1].public_id if rows else after
    body = (
        b'{"events":['
        + b",".join(Event.from_row(r).body for r in rows)
        + b'],"has_more":'
        + (b"true" if has_more else b"false")
        + b',"cursor":'
        + json.dumps(cursor).encode()
        + b"}"
    )
    return JsonBody(body, 200)


def _event_param(call: Call, name: str) -> str | None:
    value = call.request.query_params.get(name)
    if value is None:
        return None
    if not value.startswith("evt_") or len(value) > 40:
        raise BadRequest("invalid_cursor", f"{name} must be an event id (evt_...) from an earlier page.")
    return value


async def list_events(call: Call) -> Response:
    after, before = _event_param(call, "after"), _event_param(call, "before")
    type_ = call.request.query_params.get("type")
    if type_ is not None and not valid_pattern(type_):
        raise BadRequest("invalid_type", f"Unknown event type {type_!r}; see docs/events.md.")
    return await run_in_threadpool(_list_events, call.ctx, call.account_id, after, before, _limit(call), type_)


def _get_event(ctx: AppContext, account_id: int, public_id: str) -> Response:
    outbox.publish_pending(ctx.db)
    with ctx.db.session() as session:
        row = session.exec(
            outbox.visible(
                select(StoredEvent).where(StoredEvent.public_id == public_id, StoredEvent.account_id == account_id)
            )
        ).first()
        if row is None:
            raise NotFound("event on this account")
    return JsonBody(Event.from_row(row).body, 200)


async def get_event(call: Call) -> Response:
    return await run_in_threadpool(_get_event, call.ctx, call.account_id, str(call.path["event_id"]))


# ---- webhook endpoints ---------------------------------------------------------------------------


def webhook_out(endpoint: WebhookEndpoint) -> WebhookOut:
    assert endpoint.id is not None
    return WebhookOut(
        id=endpoint.id,
        url=endpoint.url,
        description=endpoint.description,
        event_types=json.loads(endpoint.event_types),
        status=endpoint.status,  # type: ignore[arg-type]
        disabled_reason=endpoint.disabled_reason,
        failing_since=endpoint.failing_since,
        created_at=endpoint.created_at,
    )


def webhook_data(endpoint: WebhookEndpoint) -> resources.WebhookData:
    assert endpoint.id is not None
    return resources.WebhookData(
        id=endpoint.id,
        url=endpoint.url,
        event_types=json.loads(endpoint.event_types),
        status=endpoint.status,
        disabled_reason=endpoint.disabled_reason,
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


def _create(ctx: AppContext, account_id: int, body: WebhookBody) -> WebhookCreated:
    url, types = _url(ctx, body.url), _types(body.event_types)
    secret = signing.new_secret()
    now = ctx.clock.now()
    limit = event_settings(ctx).max_endpoints_per_account
    outbox.publish_pending(ctx.db)
    with ctx.db.session() as session:
        count = session.execute(
            sa.select(sa.func.count())
            .select_from(WebhookEndpoint)
            .where(WebhookEndpoint.account_id == account_id, WebhookEndpoint.deleted_at.is_(None))
        ).scalar()  # type: ignore[union-attr]
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
        return WebhookCreated(**webhook_out(endpoint).model_dump(), secret=secret)


async def create_webhook(call: Call) -> Reply:
    created = await run_in_threadpool(_create, call.ctx, call.account_id, call.body)
    return Reply(created, 201, NO_STORE)


def _owned(session: Session, account_id: int, endpoint_id: int) -> WebhookEndpoint:
    endpoint = session.exec(
        select(WebhookEndpoint).where(
            WebhookEndpoint.id == endpoint_id,
            WebhookEndpoint.account_id == account_id,
            WebhookEndpoint.deleted_at.is_(None),
        )
    ).first()  # type: ignore[union-attr]
    if endpoint is None:
        raise NotFound("webhook endpoint")
    return endpoint


def _list(ctx: AppContext, account_id: int) -> WebhookList:
    with ctx.db.session() as session:
        rows = session.exec(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.account_id == account_id, WebhookEndpoint.deleted_at.is_(None))  # type: ignore[union-attr]
            .order_by(WebhookEndpoint.id)
        ).all()  # type: ignore[arg-type]
        return WebhookList(webhooks=[webhook_out(e) for e in rows])


async def list_webhooks(call: Call) -> WebhookList:
    return await run_in_threadpool(_list, call.ctx, call.account_id)


def _get(ctx: AppContext, account_id: int, endpoint_id: int) -> WebhookOut:
    with ctx.db.session() as session:
        return webhook_out(_owned(session, account_id, endpoint_id))


async def get_webhook(call: Call) -> WebhookOut:
    return await run_in_threadpool(_get, call.ctx, call.account_id, call.path["id"])


def _patch(ctx: AppContext, account_id: int, endpoint_id: int, body: WebhookPatch) -> WebhookOut:
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
        return webhook_out(endpoint)


async def patch_webhook(call: Call) -> WebhookOut:
    return await run_in_threadpool(_patch, call.ctx, call.account_id, call.path["id"], call.body)


def _delete(ctx: AppContext, account_id: int, endpoint_id: int) -> WebhookDeleted:
    now = ctx.clock.now()
    with ctx.db.session() as session:
        endpoint = _owned(session, account_id, endpoint_id)
        endpoint.deleted_at = now
        session.add(endpoint)
        session.execute(
            sa.update(WebhookDelivery)
            .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == "pending")
            .values(status="cancelled", finished_at=now)
        )
        return WebhookDeleted(id=endpoint_id)


async def delete_webhook(call: Call) -> WebhookDeleted:
    return await run_in_threadpool(_delete, call.ctx, call.account_id, call.path["id"])


# ---- the delivery log and redelivery -------------------------------------------------------------


def _deliveries_out(session: Session, rows: list[tuple[WebhookDelivery, StoredEvent]]) -> list[DeliveryOut]:
    ids = [d.id for d, _ in rows]
    attempts: dict[int, list[AttemptOut]] = {}
    if ids:
        for a in session.exec(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id.in_(ids))  # type: ignore[attr-defined]
            .order_by(WebhookAttempt.id)
        ).all():  # type: ignore[arg-type]
            attempts.setdefault(a.delivery_id, []).append(
                AttemptOut(
                    number=a.number,
                    outcome=a.outcome,
                    status_code=a.status_code,
                    error=a.error,  # type: ignore[arg-type]
                    response_excerpt=a.response_excerpt,
                    duration_ms=a.duration_ms,
                    started_at=a.started_at,
                )
            )
    return [
        DeliveryOut(
            id=d.id,
            event_id=e.public_id,
            event_type=e.type,
            status=d.status,
            redelivery=d.redelivery,  # type: ignore[arg-type]
            attempts=d.attempts,
            next_attempt_at=d.next_attempt_at if d.status == "pending" else None,
            last_status_code=d.last_status_code,
            last_error=d.last_error,
            created_at=d.created_at,
            finished_at=d.finished_at,
            log=attempts.get(d.id, []),
        )
        for d, e in rows
    ]  # type: ignore[index]


def _deliveries(ctx: AppContext, account_id: int, endpoint_id: int, before: int | None, limit: int) -> DeliveryList:
    with ctx.db.session() as session:
        _owned(session, account_id, endpoint_id)
        query = (
            select(WebhookDelivery, StoredEvent)
            .join(StoredEvent, StoredEvent.id == WebhookDelivery.event_id)  # type: ignore[arg-type]
            .where(WebhookDelivery.endpoint_id == endpoint_id)
        )
        if before is not None:
            query = query.where(WebhookDelivery.id < before)  # type: ignore[operator]
        rows = list(session.exec(query.order_by(WebhookDelivery.id.desc()).limit(limit + 1)).all())  # type: ignore[union-attr]
        has_more = len(rows) > limit
        rows = rows[:limit]
        return DeliveryList(
            deliveries=_deliveries_out(session, rows),
            has_more=has_more,  # type: ignore[arg-type]
            cursor=rows[-1][0].id if rows and has_more else None,
        )


async def list_deliveries(call: Call) -> DeliveryList:
    raw = call.request.query_params.get("before")
    if raw is not None and not (raw.isdigit() and len(raw) <= 18 and int(raw) >= 1):
        raise BadRequest("invalid_cursor", "before must be a delivery id from an earlier page.")
    before = int(raw) if raw is not None else None
    return await run_in_threadpool(_deliveries, call.ctx, call.account_id, call.path["id"], before, _limit(call))


def _redeliver(ctx: AppContext, account_id: int, endpoint_id: int, event_id: str) -> Reply:
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
            account_id=account_id,  # type: ignore[arg-type]
            redelivery=True,
            status="pending",
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
        session.add(delivery)
        session.flush()
        return Reply(_deliveries_out(session, [(delivery, row)])[0], 202)


async def redeliver(call: Call) -> Reply:
    body: RedeliverBody = call.body
    return await run_in_threadpool(_redeliver, call.ctx, call.account_id, call.path["id"], body.event_id)


# ---- routes and the OpenAPI `webhooks` section ---------------------------------------------------

_NOT_YOURS = "No webhook endpoint with this id on this account."
_EVENTS_DOC = (
    "Each event is `{id, type, timestamp, account_id, data}`; `data` is the resource as the API "
    "shows it with `data.object` naming it. Types: " + ", ".join(EVENT_TYPES) + ". "
    "The OpenAPI `webhooks` section and docs/events.md describe each one."
)


def routes() -> list[ApiRoute]:
    limit = Query("limit", "Page size, 1 to 100 (default 50).", {"type": "integer", "minimum": 1, "maximum": 100})
    return [
        ApiRoute(
            "GET",
            "/events",
            list_events,
            "List the account's events",
            EventList,
            description="The account's own events, oldest first: page with `after` (the `cursor` of the previous "
            "page), or newest first with `before` alone. Both: the events between them, oldest first; `after` "
            "must then be the older of the two (else 400 invalid_cursor). "
            "A client that missed a webhook (or uses none) polls with "
            "`after=<last id seen>`. Events are listed in the order they were committed, and an event is listed "
            "only once every event before it is, so paging forward never skips one. " + _EVENTS_DOC,
            query=(
                Query(
                    "after",
                    "Events after this event id, oldest first.",
                    {"type": "string", "pattern": EVENT_ID_PATTERN},
                ),
                Query(
                    "before",
                    "Events before this event id, newest first.",
                    {"type": "string", "pattern": EVENT_ID_PATTERN},
                ),
                limit,
                Query("type", "Only this type, or `<resource>.*`.", {"type": "string", "enum": PATTERNS}),
            ),
            errors={
                400: "invalid_cursor (not an event id; or after not older than before), invalid_limit, invalid_type",
                404: "after or before names no event of this account.",
            },
            tags=TAG,
            operation_id="listEvents",
        ),
        ApiRoute(
            "GET",
            "/events/{event_id}",
            get_event,
            "Show an event",
            EventOut,
            description="One event of the account by its id (the webhook-id of its deliveries).",
            errors={404: "No such event on this account."},
            tags=TAG,
            operation_id="getEvent",
        ),
        ApiRoute(
            "POST",
            "/webhooks",
            create_webhook,
            "Register a webhook endpoint",
            WebhookCreated,
            status=201,
            body=WebhookBody,
            response_headers=NO_STORE,
            description="Events of the account are POSTed to `url` as JSON, signed by the Standard Webhooks scheme: "
            "headers `webhook-id` (the event id), `webhook-timestamp` (Unix seconds of the attempt) and "
            "`webhook-signature` (`v1,<base64 HMAC-SHA256 of '{id}.{timestamp}.{body}'>`, keyed with the base64-"
            "decoded part of `secret` after `whsec_`). Verify with any Standard Webhooks library. `secret` is in this "
            "response only. A 2xx answer within 10 seconds accepts the event; anything else (a redirect too) is "
            "retried with exponential backoff for about three days. An endpoint that fails for five days, or "
            "answers 410, is disabled (event webhook.disabled). Delivery is at least once: drop repeats by "
            "webhook-id.",
            errors={
                400: "invalid_url (scheme, credentials in the URL, a private, loopback or link-local address), "
                "invalid_event_types, unknown_field",
                409: "too_many_webhooks: the account has the maximum number of endpoints.",
            },
            tags=TAG,
            operation_id="createWebhook",
        ),
        ApiRoute(
            "GET",
            "/webhooks",
            list_webhooks,
            "List webhook endpoints",
            WebhookList,
            description="The account's endpoints; secrets are never shown again.",
            tags=TAG,
            operation_id="listWebhooks",
        ),
        ApiRoute(
            "GET",
            "/webhooks/{id}",
            get_webhook,
            "Show a webhook endpoint",
            WebhookOut,
            errors={404: _NOT_YOURS},
            tags=TAG,
            operation_id="getWebhook",
        ),
        ApiRoute(
            "PATCH",
            "/webhooks/{id}",
            patch_webhook,
            "Change or re-enable a webhook endpoint",
            WebhookOut,
            body=WebhookPatch,
            errors={400: "invalid_url, invalid_event_types", 404: _NOT_YOURS},
            description="Change the URL, types or description; `enabled: true` re-enables a disabled endpoint (its "
            "pending deliveries resume), `enabled: false` pauses it. Events that happen while an endpoint is "
            "disabled are not queued for it: catch up with GET /events.",
            tags=TAG,
            operation_id="updateWebhook",
        ),
        ApiRoute(
            "DELETE",
            "/webhooks/{id}",
            delete_webhook,
            "Delete a webhook endpoint",
            WebhookDeleted,
            description="Stops deliveries to it at once; pending ones are cancelled.",
            errors={404: _NOT_YOURS},
            tags=TAG,
            operation_id="deleteWebhook",
        ),
        ApiRoute(
            "GET",
            "/webhooks/{id}/deliveries",
            list_deliveries,
            "The delivery log of an endpoint",
            DeliveryList,
            description="Each event sent (or being sent) to the endpoint, newest first, with every attempt: status "
            "code, error, the start of the response and the time it took.",
            query=(
                Query(
                    "before",
                    "Deliveries older than this delivery id.",
                    {"type": "integer", "minimum": 1, "maximum": 999_999_999_999_999_999},
                ),
                limit,
            ),
            errors={400: "invalid_cursor, invalid_limit", 404: _NOT_YOURS},
            tags=TAG,
            operation_id="listDeliveries",
        ),
        ApiRoute(
            "POST",
            "/webhooks/{id}/redeliver",
            redeliver,
            "Send an event again",
            DeliveryOut,
            status=202,
            body=RedeliverBody,
            description="Queues a new delivery of one of the account's events to this endpoint (same webhook-id), "
            "sent within seconds and retried like any other. For replaying what an outage missed.",
            errors={
                404: "No such endpoint, or no such event on this account.",
                409: "webhook_disabled: re-enable the endpoint first.",
            },
            tags=TAG,
            operation_id="redeliverEvent",
        ),
    ]


def openapi_webhooks() -> tuple[list[type[BaseModel]], dict[str, Any]]:
    """The models and the OpenAPI 3.1 ``webhooks`` object: one entry per event type."""
    signed = [
        {
            "name": "webhook-id",
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "The event id (evt_...): the same on every retry and redelivery.",
        },
        {
            "name": "webhook-timestamp",
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "Unix time in seconds of this attempt.",
        },
        {
            "name": "webhook-signature",
            "in": "header",
            "required": True,
            "schema": {"type": "string"},
            "description": "v1,<base64 HMAC-SHA256 of '{webhook-id}.{webhook-timestamp}.{body}'> (Standard Webhooks).",
        },
    ]
    hooks: dict[str, Any] = {}
    for name, info in EVENT_TYPES.items():
        model = ENVELOPES[info.object]
        hooks[name] = {
            "post": {
                "summary": name,
                "description": info.description,
                "operationId": f"webhook_{name.replace('.', '_')}",
                "tags": list(TAG),
                "parameters": signed,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
                },
                "responses": {
                    "2XX": {"description": "Accepted: the event will not be sent again."},
                    "default": {"description": "Not accepted: retried with exponential backoff."},
                },
            }
        }
    return list(ENVELOPES.values()), hooks
