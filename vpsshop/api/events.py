"""The event endpoints: ``/v1/events`` (catch up on missed webhooks) and ``/v1/webhooks`` (endpoints,
their delivery log, redelivery), over :mod:`vpsshop.events.feed` and :mod:`vpsshop.events.webhooks`;
and the OpenAPI ``webhooks`` section, one entry per event type.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal, TypeAlias, Union

from pydantic import BaseModel, Field, create_model
from starlette.responses import Response

from vpsshop.accounts import AccountOut, ApiKeyOut
from vpsshop.events import Event, feed, webhooks
from vpsshop.events.feed import EVENT_ID_PATTERN, PATTERNS, EventPage, EventQuery
from vpsshop.events.types import EVENT_TYPES
from vpsshop.events.webhooks import (
    DeliveryList,
    DeliveryOut,
    DeliveryQuery,
    RedeliverInput,
    WebhookChange,
    WebhookCreated,
    WebhookDeleted,
    WebhookInput,
    WebhookList,
    WebhookOut,
)
from vpsshop.inputs import parse
from vpsshop.ledger import LedgerEntryOut
from vpsshop.payments.resource import DepositAddressOut, TopupOut
from vpsshop.routing import ApiRoute, Call, JsonBody, Query, Reply, body_named
from vpsshop.servers.resource import ServerOut
from vpsshop.servers.snapshots import SnapshotOut
from vpsshop.servers.sshkeys import SshKeyOut
from vpsshop.wallets import WalletOut

# The bodies under the names of the OpenAPI description (clients generated from it use them).
WebhookBody = body_named("WebhookBody", WebhookInput)
WebhookPatch = body_named("WebhookPatch", WebhookChange)
RedeliverBody = body_named("RedeliverBody", RedeliverInput)

TAG = ("events",)
NO_STORE = {"Cache-Control": "no-store"}


def page_body(page: EventPage) -> bytes:
    """``GET /events``' answer, from the events' stored JSON (no re-encoding of the data)."""
    return (
        b'{"events":['
        + b",".join(event.body for event in page.events)
        + b'],"has_more":'
        + (b"true" if page.has_more else b"false")
        + b',"cursor":'
        + json.dumps(page.cursor).encode()
        + b"}"
    )


def _query(call: Call, model: Any) -> Any:
    names = model.model_fields
    return parse(model, {k: v for k, v in call.request.query_params.items() if k in names})


async def list_events(call: Call) -> Response:
    page = await feed.list_events(call.ctx, call.actor, _query(call, EventQuery))
    return JsonBody(page_body(page), 200)


async def get_event(call: Call) -> Response:
    event: Event = await feed.get_event(call.ctx, call.actor, str(call.path["event_id"]))
    return JsonBody(event.body, 200)


async def create_webhook(call: Call) -> Reply:
    return Reply(await webhooks.create_webhook(call.ctx, call.actor, call.body), 201, NO_STORE)


async def list_webhooks(call: Call) -> WebhookList:
    return await webhooks.list_webhooks(call.ctx, call.actor)


async def get_webhook(call: Call) -> WebhookOut:
    return await webhooks.get_webhook(call.ctx, call.actor, call.path["id"])


async def patch_webhook(call: Call) -> WebhookOut:
    return await webhooks.change_webhook(call.ctx, call.actor, call.path["id"], call.body)


async def delete_webhook(call: Call) -> WebhookDeleted:
    return await webhooks.delete_webhook(call.ctx, call.actor, call.path["id"])


async def list_deliveries(call: Call) -> DeliveryList:
    return await webhooks.list_deliveries(call.ctx, call.actor, call.path["id"], _query(call, DeliveryQuery))


async def redeliver(call: Call) -> Reply:
    return Reply(await webhooks.redeliver(call.ctx, call.actor, call.path["id"], call.body), 202)


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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
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
            count_writes=False,
            operation_id="redeliverEvent",
        ),
    ]


def _data_model(obj: str, resource: type[BaseModel]) -> type[BaseModel]:
    """The model of an event's ``data``: the resource as the API answers it, plus ``object`` naming it."""
    title = "".join(part.capitalize() for part in obj.split("_")) + "Data"
    return create_model(
        title,
        __base__=resource,
        __doc__=f"The {obj.replace('_', ' ')} as the API shows it, with data.object {obj!r}.",
        object=(Literal[obj], Field(obj, description="The resource in data.")),  # type: ignore[arg-type]  # a Literal of a run-time value: the model is built from the type table
    )


_RESOURCES: dict[str, type[BaseModel]] = {
    "account": AccountOut,
    "api_key": ApiKeyOut,
    "ledger_entry": LedgerEntryOut,
    "topup": TopupOut,
    "deposit_address": DepositAddressOut,
    "server": ServerOut,
    "snapshot": SnapshotOut,
    "ssh_key": SshKeyOut,
    "wallet": WalletOut,
    "webhook": WebhookOut,
}
DATA_MODELS: dict[str, type[BaseModel]] = {obj: _data_model(obj, model) for obj, model in _RESOURCES.items()}
"""Every event ``object`` and the model of its data: one resource model each, the API's own."""


def _envelope(obj: str) -> type[BaseModel]:
    names = tuple(name for name, info in EVENT_TYPES.items() if info.object == obj)
    title = "".join(part.capitalize() for part in obj.split("_")) + "Event"
    return create_model(
        title,
        __doc__=f"An event about a {obj.replace('_', ' ')}: {', '.join(names)}. The body of a webhook and an item "
        "of GET /events.",
        id=(str, Field(description="Stable event id (evt_...): the webhook-id header of every delivery of it.")),
        type=(Literal[names], Field(description="The event type.")),  # type: ignore[arg-type]  # a Literal of the run-time EVENT_TYPES names
        timestamp=(datetime, Field(description="When the change happened (UTC).")),
        account_id=(int, Field(description="The account the event belongs to.")),
        data=(DATA_MODELS[obj], Field(description="The resource as the API shows it, after the change.")),
    )


ENVELOPES: dict[str, type[BaseModel]] = {obj: _envelope(obj) for obj in DATA_MODELS}
AnyData: TypeAlias = Union[tuple(DATA_MODELS.values())]  # type: ignore[valid-type]  # the union of DATA_MODELS, built at run time  # noqa: UP007


class EventOut(BaseModel):
    """An event: the body of a webhook and an item of ``GET /events``."""

    id: str = Field(description="Stable event id (evt_...): the webhook-id header of every delivery of it.")
    type: Literal[tuple(EVENT_TYPES)] = Field(description="The event type (docs/events.md).")  # type: ignore[valid-type]  # a Literal of the run-time EVENT_TYPES names
    timestamp: datetime = Field(description="When the change happened (UTC).")
    account_id: int
    data: AnyData = Field(description="The resource as the API shows it after the change; data.object names it.")


class EventList(BaseModel):
    """Response of ``GET /events``."""

    events: list[EventOut] = Field(description="The events, oldest first (newest first with `before`).")
    has_more: bool = Field(description="More events follow this page.")
    cursor: str | None = Field(
        description="The last event's id: pass it as `after` (or `before`) for the next "
        "page. With `after` and no new event, the `after` given."
    )


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
