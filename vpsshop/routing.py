"""Endpoints described as data: one :class:`ApiRoute` serves the request *and* its OpenAPI entry.

The request body is validated by the route's pydantic model, the response rendered from its
response model, and ``vpsshop.openapi`` documents both from the same objects, so the served
behaviour and the OpenAPI description cannot drift apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from vpsshop.auth import api_key_digest, parse_bearer
from vpsshop.errors import ApiError, BadRequest, Unauthorized

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext


class IdConvertor(Convertor[int]):
    """Path ids: 1 to 18 digits, so an id always fits a 64-bit column (longer is a 404)."""

    regex = "[0-9]{1,18}"

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(value)


register_url_convertor("id", IdConvertor())


class ApiModel(BaseModel):
    """Base of request bodies: unknown fields are refused, each field error has an error code.

    Override :meth:`error_code` to give a field's failures a specific code (``amount_too_low``).
    The default code is ``invalid_<field>``.
    """

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def error_code(cls, field_name: str, error_type: str) -> str:
        if error_type == "extra_forbidden":
            return "unknown_field"
        return f"invalid_{field_name}" if field_name else "invalid_request"


@dataclass(frozen=True)
class Header:
    """A request header an endpoint reads, for the OpenAPI description."""

    name: str
    description: str
    required: bool = False


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: the account behind the API key of this request."""

    key_id: int
    account_id: int
    balance_micros: int
    totp_enabled: bool
    created_at: datetime


@dataclass
class Call:
    """What an endpoint receives."""

    request: Request
    ctx: "AppContext"
    principal: Principal | None
    body: Any
    path: dict[str, Any]

    @property
    def account_id(self) -> int:
        assert self.principal is not None, "endpoint declared auth=False"
        return self.principal.account_id


@dataclass
class Reply:
    """An endpoint's answer when the status or headers differ from the route's defaults."""

    model: BaseModel | dict[str, Any]
    status: int
    headers: dict[str, str] = field(default_factory=dict)


Endpoint = Callable[[Call], Awaitable[BaseModel | Reply | Response]]


@dataclass(frozen=True)
class ApiRoute:
    """An endpoint under ``/v1``: how it is served and how it is documented.

    :param path: OpenAPI-style path (``/keys/{id}``); parameters named ``id`` are integers.
    :param response: model of the success body, rendered with ``status``.
    :param body: request model (a subclass of :class:`ApiModel`), or None for no body.
    :param errors: status -> when it happens, for the OpenAPI description (bodies are ErrorBody).
    :param responses: extra documented responses: status -> (description, model).
    """

    method: str
    path: str
    endpoint: Endpoint
    summary: str
    response: type[BaseModel] | None
    status: int = 200
    auth: bool = True
    body: type[ApiModel] | None = None
    body_required: bool = True
    description: str = ""
    errors: dict[int, str] = field(default_factory=dict)
    responses: dict[int, tuple[str, type[BaseModel] | None]] = field(default_factory=dict)
    headers: tuple[Header, ...] = ()
    response_headers: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    operation_id: str = ""

    MAX_ID: ClassVar[int] = 2**63 - 1

    def starlette_path(self) -> str:
        return self.path.replace("{id}", "{id:id}")

    def to_starlette(self, ctx: "AppContext") -> Route:
        return Route(self.starlette_path(), _handler(self, ctx), methods=[self.method])


def _handler(route: ApiRoute, ctx: "AppContext") -> Callable[[Request], Awaitable[Response]]:
    secret = ctx.settings.secret_key_bytes()
    db = ctx.db
    body_model = route.body
    status = route.status
    static_headers = dict(route.response_headers)

    async def handle(request: Request) -> Response:
        principal = await authenticate(request, db, secret) if route.auth else None
        body = await _read_body(request, body_model, route.body_required) if body_model is not None else None
        result = await route.endpoint(Call(request, ctx, principal, body, request.path_params))
        if isinstance(result, Response):
            return result
        if isinstance(result, Reply):
            return json_response(result.model, result.status, {**static_headers, **result.headers})
        return json_response(result, status, static_headers)

    handle.__name__ = route.operation_id or route.endpoint.__name__
    return handle


_AUTH_SQL = (
    "SELECT k.id, a.id, a.balance_micros, a.totp_enabled, a.created_at FROM api_keys k "
    "JOIN accounts a ON a.id = k.account_id WHERE k.key_hash = :digest AND k.revoked_at IS NULL"
)


async def authenticate(request: Request, db: Any, secret: bytes) -> Principal:
    """The caller's account, or :class:`Unauthorized`. Revocation takes effect on the next request."""
    header = None
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            header = value.decode("latin-1")
            break
    key = parse_bearer(header)
    if key is None:
        raise Unauthorized()
    row = await db.fetch_one(_AUTH_SQL, {"digest": api_key_digest(secret, key)})
    if row is None:
        raise Unauthorized("The API key is unknown or revoked.")
    return Principal(row[0], row[1], row[2], bool(row[3]), as_utc(row[4]))


def as_utc(value: Any) -> datetime:
    """A timestamp read outside the ORM: SQLite gives naive UTC text, PostgreSQL aware datetimes."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


async def _read_body(request: Request, model: type[ApiModel], required: bool) -> Any:
    raw = await request.body()
    if not raw.strip():
        if required:
            raise BadRequest("invalid_request", "This endpoint needs a JSON object as the request body.")
        raw = b"{}"
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise BadRequest("invalid_request", "The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(model, exc) from None


def validation_error(model: type[ApiModel], exc: ValidationError) -> ApiError:
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    first = errors[0]
    field_name = str(first["loc"][0]) if first["loc"] else ""
    details = [{"field": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]} for e in errors]
    message = f"{field_name}: {first['msg']}" if field_name else first["msg"]
    return BadRequest(model.error_code(field_name, first["type"]), message, details=details)


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)  # the edge: money leaves the program as a JSON number
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot render {type(value).__name__} as JSON")


def json_response(model: BaseModel | dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    if isinstance(model, BaseModel):
        content = model.__pydantic_serializer__.to_json(model)
    else:
        content = json.dumps(model, separators=(",", ":"), default=_json_default).encode()
    return Response(content, status_code=status, headers=headers, media_type="application/json")
