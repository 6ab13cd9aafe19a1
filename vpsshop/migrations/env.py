"""Alembic environment: runs on the connection vpsshop hands it (``Database.migrate``)."""

from alembic import context
from sqlmodel import SQLModel

import vpsshop.events.models
import vpsshop.models
import vpsshop.payments.models
import vpsshop.plugin_state
import vpsshop.servers.models  # noqa: F401 - servers area: jobs, events, ip leases


def _render_item(type_: str, obj: object, autogen_context: object) -> str | bool:
    # SQLModel's AutoString is a plain VARCHAR: render it as such so migrations import only sqlalchemy.
    if type_ == "type" and type(obj).__name__ == "AutoString":
        return f"sa.String(length={obj.length})"  # type: ignore[attr-defined]
    return False


connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - vpsshop always passes its connection
    raise RuntimeError("run migrations through `vpsshop migrate` or Database.migrate()")

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    render_item=_render_item,
)
with context.begin_transaction():
    context.run_migrations()
