"""Reading the account's events (``GET /v1/events``, the dashboard's events page, the MCP tools): for a
client that missed a webhook, or uses none.

Events are listed in the order they were committed, and an event is listed only once every event
before it is, so paging forward with ``after`` never skips one.
"""

from __future__ import annotations

from dataclasses import dataclass

from anyio import to_thread
from pydantic import Field, field_validator
from sqlmodel import Session, col, select

from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, NotFound
from vpsshop.events import Event, outbox
from vpsshop.events.models import StoredEvent
from vpsshop.events.types import EVENT_TYPES, OBJECTS_BY_PREFIX, valid_pattern
from vpsshop.inputs import Input

__all__ = ["EVENT_ID_PATTERN", "PATTERNS", "EventPage", "EventQuery", "get_event", "list_events"]

EVENT_ID_PATTERN = r"^evt_[A-Za-z0-9_-]{1,36}$"
PATTERNS = ["*", *sorted(f"{prefix}.*" for prefix in OBJECTS_BY_PREFIX), *EVENT_TYPES]
"""What a subscription or a filter may name: every type, ``<resource>.*`` and ``*``."""


class EventQuery(Input):
    """Which events: a page after or before an event, of a type."""

    after: str | None = Field(
        None, max_length=40, pattern=EVENT_ID_PATTERN, description="Events after this event id, oldest first."
    )
    before: str | None = Field(
        None, max_length=40, pattern=EVENT_ID_PATTERN, description="Events before this event id, newest first."
    )
    limit: int = Field(50, ge=1, le=100, description="Page size, 1 to 100 (default 50).")
    type: str | None = Field(
        None, max_length=64, description="Only this type, or `<resource>.*`.", json_schema_extra={"enum": [*PATTERNS]}
    )

    @field_validator("type")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and not valid_pattern(value):
            raise ValueError(f"unknown event type {value!r}; see docs/events.md")
        return value

    @classmethod
    def error_code(cls, field_name: str, error_type: str) -> str:
        if field_name in ("after", "before"):
            return "invalid_cursor"
        return super().error_code(field_name, error_type)


@dataclass(frozen=True)
class EventPage:
    """A page of events, and the cursor of the next one."""

    events: list[Event]
    has_more: bool
    cursor: str | None
    """The last event's id: pass it as ``after`` (or ``before``) for the next page. With ``after`` and
    no new event, the ``after`` given."""


def _anchor(session: Session, account_id: int, public_id: str) -> int:
    row = session.exec(
        select(StoredEvent.seq).where(StoredEvent.public_id == public_id, StoredEvent.account_id == account_id)
    ).first()
    if row is None:
        raise NotFound("event on this account")
    return int(row)


async def list_events(
    ctx: AppContext, customer: Customer, query: EventQuery, *, newest_first: bool = False
) -> EventPage:
    """The account's events: oldest first after ``query.after``; newest first with only
    ``query.before`` (or ``newest_first``, the dashboard's list); both: the events between, oldest first.

    :raises BadRequest: invalid_cursor (after not older than before). :raises NotFound: an unknown cursor.
    """
    return await to_thread.run_sync(_list, ctx, customer.account_id, query, newest_first)


def _list(ctx: AppContext, account_id: int, query: EventQuery, newest_first: bool) -> EventPage:
    outbox.publish_pending(ctx.db)
    with ctx.db.session() as session:
        stmt = select(StoredEvent).where(StoredEvent.account_id == account_id)
        if query.type is not None and query.type != "*":
            if query.type.endswith(".*"):
                stmt = stmt.where(col(StoredEvent.type).startswith(query.type[:-1]))
            else:
                stmt = stmt.where(StoredEvent.type == query.type)
        low = _anchor(session, account_id, query.after) if query.after is not None else None
        high = _anchor(session, account_id, query.before) if query.before is not None else None
        if low is not None and high is not None and low >= high:
            raise BadRequest(
                "invalid_cursor",
                "With both after and before, after must name an older event than before (the events between "
                "them are listed, oldest first); these two are the other way round or the same event.",
            )
        if low is not None:
            stmt = stmt.where(col(StoredEvent.seq) > low)
        if high is not None:
            stmt = stmt.where(col(StoredEvent.seq) < high)
        newest_first = newest_first or (query.before is not None and query.after is None)
        stmt = stmt.order_by(col(StoredEvent.seq).desc() if newest_first else col(StoredEvent.seq))
        rows = list(session.exec(outbox.visible(stmt.limit(query.limit + 1))).all())
    has_more = len(rows) > query.limit
    rows = rows[: query.limit]
    return EventPage([Event.from_row(r) for r in rows], has_more, rows[-1].public_id if rows else query.after)


async def get_event(ctx: AppContext, customer: Customer, event_id: str) -> Event:
    """One of the account's events by its id (the webhook-id of its deliveries). :raises NotFound:"""

    def read() -> Event:
        outbox.publish_pending(ctx.db)
        with ctx.db.session() as session:
            row = session.exec(
                outbox.visible(
                    select(StoredEvent).where(
                        StoredEvent.public_id == event_id, StoredEvent.account_id == customer.account_id
                    )
                )
            ).first()
            if row is None:
                raise NotFound("event on this account")
        return Event.from_row(row)

    if not event_id.startswith("evt_") or len(event_id) > 40:
        raise NotFound("event on this account")
    return await to_thread.run_sync(read)
