"""The dashboard's webhook and event pages: register an endpoint (its signing secret shown once),
list, change, pause and delete endpoints, read an endpoint's delivery log and send an event again,
and read the account's events.

They call the operations the API calls (:mod:`vpsshop.events.webhooks`, :mod:`vpsshop.events.feed`),
with the API's rules for URLs and event types and the API's limits.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from starlette.responses import Response

from vpsshop.dashboard.web import Page, format_usd
from vpsshop.dashboard.words import LEDGER_REASONS, friendly
from vpsshop.errors import ApiError, BadRequest
from vpsshop.events import feed, webhooks
from vpsshop.events.feed import PATTERNS, EventQuery
from vpsshop.events.types import EVENT_TYPES
from vpsshop.events.webhooks import DeliveryQuery, RedeliverInput, WebhookChange, WebhookInput
from vpsshop.inputs import parse

OBJECT_NAMES = {
    "account": "Account",
    "api_key": "API keys",
    "ledger": "Balance",
    "topup": "Top-ups",
    "deposit_address": "Deposit addresses",
    "server": "Servers",
    "ssh_key": "SSH keys",
    "webhook": "Webhooks",
}


def event_groups() -> list[dict[str, Any]]:
    """The event types by resource, for the checkboxes: ``{"prefix", "name", "types": [(name, text)]}``."""
    groups: dict[str, dict[str, Any]] = {}
    for name, info in EVENT_TYPES.items():
        prefix = name.split(".", 1)[0]
        group = groups.setdefault(prefix, {"prefix": prefix, "name": OBJECT_NAMES.get(prefix, prefix), "types": []})
        group["types"].append((name, info.description))
    return list(groups.values())


def _chosen(page: Page) -> list[str]:
    return [value for value in page.values("event_types") if value]


# ---- the endpoints ---------------------------------------------------------------------------------------


async def webhooks_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    hooks = await webhooks.list_webhooks(page.ctx, page.customer)
    # a refused form keeps its choices; a new form (or the one after a registration) offers every event
    chosen = _chosen(page) if page.lists else ["*"]
    return page.render(
        "webhooks.html",
        status,
        headers,
        title="Webhooks",
        webhooks=hooks.webhooks,
        groups=event_groups(),
        chosen=set(chosen),
        form=page.form,
        **extra,
    )


async def webhooks_page(page: Page) -> Response:
    return await webhooks_form(page)


def _webhook_data(page: Page) -> dict[str, Any]:
    data: dict[str, Any] = {"url": page.form.get("url", "").strip(), "event_types": _chosen(page)}
    description = page.form.get("description", "").strip()
    data["description"] = description or None
    return data


async def create_webhook(page: Page) -> Response:
    """``POST /v1/webhooks``: the endpoint, and its signing secret shown on this answer only."""
    try:
        created = await webhooks.create_webhook(page.ctx, page.customer, parse(WebhookInput, _webhook_data(page)))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await webhooks_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    page.form.clear()
    page.lists.clear()
    return await webhooks_form(page, status=201, created=created)


async def webhook_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    endpoint_id = int(page.request.path_params["id"])
    hook = await webhooks.get_webhook(page.ctx, page.customer, endpoint_id)
    raw = page.request.query_params.get("before")
    if raw is not None and not (raw.isdigit() and len(raw) <= 18):
        raise BadRequest("invalid_cursor", "That page of the delivery log does not exist.")
    log = await webhooks.list_deliveries(
        page.ctx, page.customer, endpoint_id, DeliveryQuery(before=int(raw) if raw else None, limit=20)
    )
    editing = page.request.method == "POST" and "url" in page.form
    return page.render(
        "webhook.html",
        status,
        headers,
        title=f"Webhook {hook.url}",
        hook=hook,
        deliveries=log.deliveries,
        older=log.cursor,
        groups=event_groups(),
        chosen=set(_chosen(page) if editing else hook.event_types),
        form=page.form if editing else {"url": hook.url, "description": hook.description or ""},
        **extra,
    )


async def webhook_page(page: Page) -> Response:
    return await webhook_form(page)


async def change_webhook(page: Page) -> Response:
    """``PATCH /v1/webhooks/{id}`` with the URL, description and event types of the form."""
    endpoint_id = int(page.request.path_params["id"])
    try:
        await webhooks.change_webhook(page.ctx, page.customer, endpoint_id, parse(WebhookChange, _webhook_data(page)))
    except ApiError as exc:
        if exc.status >= 500 or exc.status == 404:
            raise
        return await webhook_form(page, status=exc.status, headers=exc.headers, edit_error=friendly(exc))
    return page.redirect(f"webhooks/{endpoint_id}", "webhook-saved")


async def enable_webhook(page: Page) -> Response:
    """``PATCH /v1/webhooks/{id}`` with ``enabled``: pause, or turn a disabled endpoint on again."""
    endpoint_id = int(page.request.path_params["id"])
    on = page.form.get("enabled") == "on"
    try:
        await webhooks.change_webhook(page.ctx, page.customer, endpoint_id, WebhookChange(enabled=on))
    except ApiError as exc:
        if exc.status >= 500 or exc.status == 404:
            raise
        return await webhook_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return page.redirect(f"webhooks/{endpoint_id}", "webhook-enabled" if on else "webhook-disabled")


async def delete_webhook(page: Page) -> Response:
    endpoint_id = int(page.request.path_params["id"])
    try:
        await webhooks.delete_webhook(page.ctx, page.customer, endpoint_id)
    except ApiError as exc:
        if exc.status >= 500 or exc.status == 404:
            raise
        return await webhook_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return page.redirect("webhooks", "webhook-deleted")


async def redeliver(page: Page) -> Response:
    """``POST /v1/webhooks/{id}/redeliver``: one of the account's events, queued again for this endpoint."""
    endpoint_id = int(page.request.path_params["id"])
    try:
        await webhooks.redeliver(
            page.ctx,
            page.customer,
            endpoint_id,
            parse(RedeliverInput, {"event_id": page.form.get("event_id", "").strip()}),
        )
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await webhook_form(page, status=exc.status, headers=exc.headers, redeliver_error=friendly(exc))
    return page.redirect(f"webhooks/{endpoint_id}", "redelivery-queued")


# ---- events -----------------------------------------------------------------------------------------------


def summary(event: dict[str, Any]) -> str:
    """What an event is about, in a line: the resource of its ``data``."""
    data = event["data"]
    kind = data.get("object")
    if kind == "server":
        return f"Server {data['hostname']} (number {data['id']}): {data['status']}"
    if kind == "topup":
        return f"Top-up {data['ref']} of {format_usd(data['amount_usd'])} in {data['coin']}: {data['status']}"
    if kind == "deposit_address":
        paid = (data.get("payment") or {}).get("amount")
        line = f"{data['coin']} deposit address {data['address']}"
        line += f": a payment of {paid} {data['coin']}" if paid else ""
        return line + f" ({data['held_amount']} {data['coin']} held below the minimum)"
    if kind == "ledger_entry":
        amount = data["amount_usd"]
        sign = "+" if amount > 0 else ""
        reason = LEDGER_REASONS.get(data["reason"], data["reason"])
        return f"{reason}: {sign}{format_usd(amount)}, balance {format_usd(data['balance_after_usd'])}"
    if kind == "api_key":
        return f"API key {data['prefix']}…" + (f" ({data['name']})" if data.get("name") else "")
    if kind == "webhook":
        return f"Webhook endpoint {data['url']}: {data['status']}"
    if kind == "account":
        return f"Account number {data['user_id']}"
    return str(kind)


async def events_page(page: Page) -> Response:
    """``GET /v1/events``, newest first, 25 a page, optionally of one type."""
    before = page.request.query_params.get("before") or None
    type_ = page.request.query_params.get("type") or None
    if before is not None and not (before.startswith("evt_") and len(before) <= 40):
        raise BadRequest("invalid_cursor", "That page of events does not exist.")
    if type_ is not None and type_ not in PATTERNS:
        raise BadRequest("invalid_type", f"There is no event type {type_[:60]!r}.")
    listed = await feed.list_events(
        page.ctx, page.customer, parse(EventQuery, {"before": before, "type": type_, "limit": 25}), newest_first=True
    )
    events = [event.payload() for event in listed.events]
    older = listed.cursor if listed.has_more else None
    return page.render(
        "events.html",
        title="Events",
        events=[
            {
                **event,
                "when": datetime.fromisoformat(event["timestamp"]),
                "summary": summary(event),
                "text": EVENT_TYPES[event["type"]].description if event["type"] in EVENT_TYPES else "",
                "json": json.dumps(event["data"], indent=2, sort_keys=True),
            }
            for event in events
        ],
        older=older,
        type=type_ or "*",
        patterns=PATTERNS,
        webhooks=(await webhooks.list_webhooks(page.ctx, page.customer)).webhooks,
    )
