"""Alembic environment: runs on the connection vpsshop hands it (``Database.migrate``)."""

from typing import Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

import vpsshop.events.models
import vpsshop.models
import vpsshop.operators
import vpsshop.payments.models
import vpsshop.plugin_state
import vpsshop.servers.models  # noqa: F401 - servers area: jobs, events, ip leases


def _render_item(type_: str, obj: object, autogen_context: AutogenContext) -> str | Literal[False]:
    # SQLModel's AutoString is a plain VARCHAR: render it as such so migrations import only sqlalchemy.
    if type_ == "type" and isinstance(obj, AutoString):
        return f"sa.String(length={obj.length})"
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
