"""What an operation is given: typed inputs validated the same way whichever front end calls it.

Every operation of the shop (:mod:`vpsshop.servers.orders`, :mod:`vpsshop.topups` ...) takes
its input as a model derived from :class:`Input`. The REST API validates a request body with it, the
dashboard a form, the MCP tools a call's arguments: the same rules, error codes and messages
everywhere. A field's failure is ``400 invalid_<field>`` unless the model says otherwise
(:meth:`Input.error_code`); an unknown field is ``unknown_field``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from vpsshop.errors import BadRequest

__all__ = [
    "IDEMPOTENCY_KEY",
    "LABEL_PATTERN",
    "MAX_ID",
    "Input",
    "JsonInt",
    "check_idempotency_key",
    "parse",
    "validation_error",
]


class Input(BaseModel):
    """Base of operations' inputs (and of request bodies): unknown fields are refused, each field
    error has an error code.

    Override :meth:`error_code` to give a field's failures a specific code (``amount_too_low``).
    The default code is ``invalid_<field>``.
    """

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def error_code(cls, field_name: str, error_type: str) -> str:
        if error_type == "extra_forbidden":
            return "unknown_field"
        return f"invalid_{field_name}" if field_name else "invalid_request"


InputT = TypeVar("InputT", bound=Input)

MAX_ID = 2**31 - 1
"""The largest id an input may name: ids are PostgreSQL ``integer`` columns (SQLite's hold more). A
larger id is refused by the model (or is a 404 in a path) instead of overflowing the database."""


def _whole_json_number(value: Any) -> Any:
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError, ValueError):  # infinities and NaN are no number of anything
            if value == int(value):
                return int(value)  # 3, or 3.0 (a JSON Schema integer too): never true, "3" or 3.5
    raise PydanticCustomError("int_type", "Input should be a whole JSON number (not text, not true or false)")


JsonInt = Annotated[int, BeforeValidator(_whole_json_number)]
"""An integer field: a JSON number without a fraction (``3`` or ``3.0``, as JSON Schema's integer),
nothing pydantic would otherwise coerce (``true``, ``"3"``)."""


def validation_error(model: type[Input], exc: ValidationError) -> BadRequest:
    """The 400 of a failed validation: the first field's code and message, every problem in ``details``."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    field_name = str(first["loc"][0]) if first["loc"] else ""
    details = [{"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]} for e in errors]
    message = f"{field_name}: {first['msg']}" if field_name else first["msg"]
    return BadRequest(model.error_code(field_name, first["type"]), message, details=details)


def parse(model: type[InputT], data: Mapping[str, Any]) -> InputT:
    """``data`` validated by ``model``. :raises BadRequest: the model's code for the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(model, exc) from None
    except RecursionError:  # pragma: no cover - the front ends bound nesting before this
        raise BadRequest("too_deep", "The input nests too deeply.") from None


LABEL_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]+$"
"""A label chosen by a customer (a key name, a description): any characters except control, invisible
format and bidirectional-override characters, which could disguise the label where it is shown."""

IDEMPOTENCY_KEY = r"^[\x21-\x7e]{1,200}$"
"""An idempotency key: 1 to 200 visible ASCII characters (no spaces)."""
IDEMPOTENCY_KEY_PATTERN = re.compile(IDEMPOTENCY_KEY)


def check_idempotency_key(value: str | None) -> str | None:
    """An idempotency key as given (1 to 200 visible ASCII characters), or None when absent.

    :raises BadRequest: ``invalid_idempotency_key`` for any other value.
    """
    if value is None:
        return None
    if not IDEMPOTENCY_KEY_PATTERN.fullmatch(value):
        raise BadRequest(
            "invalid_idempotency_key", "Idempotency-Key must be 1 to 200 visible ASCII characters (no spaces)."
        )
    return value
