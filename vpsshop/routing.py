"""Endpoints described as data: one :class:`ApiRoute` serves the request *and* its OpenAPI entry.

The request body is validated by the route's pydantic model, the response rendered from its
response model, and ``vpsshop.openapi`` documents both from the same objects, so the served
behaviour and the OpenAPI description cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ValidationError, create_model
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import Receive, Scope, Send

from vpsshop import limits
from vpsshop.accesslog import ACCOUNT_SCOPE_KEY
from vpsshop.accounts import MissingCredential, authenticator
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.errors import ApiError, BadRequest, Unauthorized
from vpsshop.inputs import LABEL_PATTERN, MAX_ID, Input, check_idempotency_key, validation_error

__all__ = [
    "LABEL_PATTERN",
    "ApiModel",
    "ApiRoute",
    "ApiRouter",
    "Call",
    "Header",
    "Query",
    "Reply",
    "body_named",
    "idempotency_header",
    "idempotency_key",
    "json_response",
    "to_starlette_routes",
    "validation_error",
]

_ID_DIGITS = (  # 0 to 2147483647 (inputs.MAX_ID) in decimal: 1 to 9 digits, or 10 digits not above it
    "[0-9]{1,9}|1[0-9]{9}|20[0-9]{8}|21[0-3][0-9]{7}|214[0-6][0-9]{6}|2147[0-3][0-9]{5}|21474[0-7][0-9]{4}"
    "|214748[0-2][0-9]{3}|2147483[0-5][0-9]{2}|21474836[0-3][0-9]|214748364[0-7]"
)


class IdConvertor(Convertor[int]):
    """Path ids: 0 to ApiRoute.MAX_ID, so an id always fits the id columns (anything else is a 404)."""

    regex = _ID_DIGITS

    def convert(self, value: str) -> int:
        return int(value)

    def to_string(self, value: int) -> str:
        return str(value)


register_url_convertor("id", IdConvertor())
ID_PARAMS = ("id", "snapshot_id")
"""Path parameters that are ids (integers, :class:`IdConvertor`); the others are strings."""


ApiModel = Input
"""Base of request bodies: the operations' :class:`vpsshop.inputs.Input` (plugins' routes derive from it)."""


@dataclass(frozen=True)
class Header:
    """A request header an endpoint reads, for the OpenAPI description."""

    name: str
    description: str
    required: bool = False
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})


@dataclass(frozen=True)
class Query:
    """A query parameter an endpoint reads, for the OpenAPI description (the endpoint parses it)."""

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})


InputT = TypeVar("InputT", bound=Input)


def body_named(name: str, model: type[InputT]) -> type[InputT]:
    """``model`` as a request body named ``name`` in the OpenAPI description: the name clients were
    generated with (``OrderBody``) stays, whatever the operation calls its input (``OrderInput``).
    The same fields, rules and error codes; the operation takes it as its input. Call it once per
    name (a module constant): two models of one name would clash in the description."""
    return create_model(name, __base__=model, __doc__=model.__doc__, __module__=model.__module__)


def idempotency_header(description: str) -> Header:
    """The ``Idempotency-Key`` header, documented with the rule :func:`idempotency_key` enforces."""
    return Header(
        "Idempotency-Key",
        description,
        schema={"type": "string", "pattern": "^[!-~]{1,200}$", "minLength": 1, "maxLength": 200},
    )


def idempotency_key(request: Request) -> str | None:
    """The request's ``Idempotency-Key`` (1 to 200 visible ASCII characters), or None when absent.

    :raises BadRequest: ``invalid_idempotency_key`` for any other value.
    """
    return check_idempotency_key(request.headers.get("idempotency-key"))


@dataclass
class Call:
    """What an endpoint receives."""

    request: Request
    ctx: AppContext
    customer: Customer | None
    """The account of the request's API key (None on a route declared ``auth=False``, or without a key on
    one declared ``auth_optional``)."""
    body: Any
    path: dict[str, Any]

    @property
    def account_id(self) -> int:
        return self.actor.account_id

    @property
    def actor(self) -> Customer:
        """The customer of an authenticated route (for the operations it calls)."""
        assert self.customer is not None, "endpoint declared auth=False"
        return self.customer


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
    auth_optional: bool = False
    """With ``auth``: a request without ``Authorization`` reaches the endpoint too, with no customer (an
    order paid by x402 as sign-up); a wrong key is still refused."""
    body: type[ApiModel] | None = None
    body_required: bool = True
    description: str = ""
    errors: dict[int, str] = field(default_factory=dict)
    responses: dict[int, tuple[str, type[BaseModel] | None]] = field(default_factory=dict)
    headers: tuple[Header, ...] = ()
    query: tuple[Query, ...] = ()
    response_headers: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    operation_id: str = ""
    count_writes: bool = True
    """The router counts this route's requests against the account's write limit (``writes_per_account``)
    when its method writes: for plugins' routes. Core's routes set False: their operations count
    themselves, whichever front end calls them."""
    limits: str = ""
    """The route's own reasons for a 429 (a quota), for the OpenAPI description."""

    MAX_ID: ClassVar[int] = MAX_ID
    """The largest id: ids are PostgreSQL ``integer`` columns (SQLite's hold more, PostgreSQL's do not)."""

    def starlette_path(self) -> str:
        path = self.path
        for name in ID_PARAMS:
            path = path.replace(f"{{{name}}}", f"{{{name}:id}}")
        return path


Handler = Callable[[Request], Awaitable[Response]]


class _ApiPath(Route):
    """The Starlette route of one API path, with its handlers by method for :class:`ApiRouter`'s direct calls."""

    def __init__(self, path: str, endpoint: Handler, handlers: dict[str, Handler]) -> None:
        super().__init__(path, endpoint, methods=list(handlers))
        self.api_handlers = handlers


def to_starlette_routes(routes: list[ApiRoute], ctx: AppContext, prefix: str = "") -> list[Route]:
    """One Starlette route per path, so a wrong method gets 405 with every allowed method in Allow."""
    by_path: dict[str, dict[str, Handler]] = {}
    for route in routes:
        by_path.setdefault(prefix + route.starlette_path(), {})[route.method.upper()] = _handler(route, ctx)
    served: list[Route] = []
    for path, handlers in by_path.items():
        if len(handlers) == 1:
            served.append(_ApiPath(path, next(iter(handlers.values())), handlers))
        else:
            if "GET" in handlers:
                handlers.setdefault("HEAD", handlers["GET"])

            async def dispatch(request: Request, handlers: dict[str, Handler] = handlers) -> Response:
                return await handlers[request.method](request)

            served.append(_ApiPath(path, dispatch, handlers))
    return served


class ApiRouter(Router):
    """Starlette's router, with a dictionary for the API paths that have no parameters.

    Starlette tries each route's regular expression in turn; most requests (``/v1/account``,
    ``/v1/catalog``, ``/v1/servers``) name a fixed path, found here with one lookup, and their
    handler is called directly: Starlette's per-route wrappers (the request/response adapter and
    its second exception catcher) are skipped, and an exception reaches the app's exception
    middleware, which answers it with the same handlers. Everything else (paths with ids, 404s,
    405s, the dashboard) goes through Starlette's own matching.
    """

    def __init__(self, routes: list[BaseRoute], **kwargs: Any) -> None:
        super().__init__(routes, **kwargs)
        self.exact: dict[str, tuple[Route, dict[str, Handler]]] = {
            route.path: (route, route.api_handlers)
            for route in routes
            if isinstance(route, _ApiPath) and not route.param_convertors
        }

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            found = self.exact.get(scope["path"])
            if found is not None:
                route, handlers = found
                handler = handlers.get(scope["method"])
                if handler is not None:
                    scope.setdefault("router", self)
                    scope["route"] = route
                    scope["endpoint"] = route.endpoint
                    scope["path_params"] = {}
                    response = await handler(Request(scope, receive, send))
                    await response(scope, receive, send)
                    return
        await super().app(scope, receive, send)


WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _handler(route: ApiRoute, ctx: AppContext) -> Handler:
    authenticate = authenticator(ctx).customer
    blocked = limits.blocked_clients(ctx)
    body_model = route.body
    status = route.status
    static_headers = dict(route.response_headers)
    counts_writes = route.count_writes and route.method.upper() in WRITE_METHODS

    async def handle(request: Request) -> Response:
        customer = None
        if route.auth:
            client = client_address(request)
            limits.auth_blocked(blocked, client)
            header = None
            for name, value in request.scope["headers"]:
                if name == b"authorization":
                    header = value.decode("latin-1")
                    break
            try:
                customer = await authenticate(header)
            except MissingCredential:
                if not route.auth_optional:
                    raise  # no key at all is not a wrong key: not counted against the address
            except Unauthorized:
                await run_in_threadpool(limits.auth_failed, ctx, client)
                raise
            if customer is not None:
                request.scope[ACCOUNT_SCOPE_KEY] = customer.account_id  # for the access log
                if counts_writes:
                    await run_in_threadpool(limits.count_write, ctx, customer.account_id)
        body = await _read_body(request, body_model, route.body_required) if body_model is not None else None
        result = await route.endpoint(Call(request, ctx, customer, body, request.path_params))
        if isinstance(result, Response):
            return result
        if isinstance(result, Reply):
            return json_response(result.model, result.status, {**static_headers, **result.headers})
        return json_response(result, status, static_headers)

    handle.__name__ = route.operation_id or route.endpoint.__name__
    return handle


def client_address(request: Request) -> str:
    """The client's address as uvicorn gives it (the TCP peer, or a trusted proxy's ``X-Forwarded-For``)."""
    client = request.client
    return client.host if client else "unknown"


MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a request body may have (no body of this API needs more than 3)."""
MAX_NUMBER_LENGTH = 40
"""Longest number literal in a request body, in characters (no field needs more than a few digits)."""


class _BodyRefused(Exception):
    """A body refused while parsing it, with the error code and message to answer."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _BodyRefused("duplicate_key", f"The key {key!r} appears twice in one JSON object.")
        obj[key] = value
    return obj


def _number(text: str) -> Any:
    if len(text) > MAX_NUMBER_LENGTH:
        raise _BodyRefused("number_too_large", f"A number in the body has more than {MAX_NUMBER_LENGTH} characters.")
    if any(c in text for c in ".eE"):
        value = Decimal(text)
        if abs(value.adjusted()) > MAX_NUMBER_LENGTH:
            raise _BodyRefused("number_too_large", "A number in the body is too large or too small.")
        return value
    return int(text)


def _no_constant(text: str) -> Any:
    raise _BodyRefused("invalid_json", f"{text} is not a JSON number.")


def _depth_ok(data: Any) -> bool:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                return False
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return True


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON, strictly: no duplicate keys, numbers with a fraction or exponent as
    :class:`~decimal.Decimal` (never float), at most :data:`MAX_NUMBER_LENGTH` characters a number and
    :data:`MAX_JSON_DEPTH` levels of nesting, no ``NaN``/``Infinity``.

    :raises BadRequest: ``invalid_json``, ``duplicate_key``, ``number_too_large`` or ``too_deep``.
    """
    try:
        data = json.loads(
            raw,
            object_pairs_hook=_object_without_duplicates,
            parse_float=_number,
            parse_int=_number,
            parse_constant=_no_constant,
        )
    except _BodyRefused as exc:
        raise BadRequest(exc.error, exc.message) from None
    except RecursionError:
        raise BadRequest("too_deep", f"The request body nests deeper than {MAX_JSON_DEPTH} levels.") from None
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("invalid_json", "The request body is not valid JSON.") from None
    if not _depth_ok(data):
        raise BadRequest("too_deep", f"The request body nests deeper than {MAX_JSON_DEPTH} levels.")
    return data


def is_json_media_type(value: str | None) -> bool:
    """``application/json``, with any parameters: the one type the API's bodies are (and OpenAPI
    documents). ``application/json-patch+json`` and other ``+json`` types mean other things."""
    if not value:
        return False
    return value.split(";", 1)[0].strip().lower() == "application/json"


async def _read_body(request: Request, model: type[ApiModel], required: bool) -> Any:
    raw = await request.body()
    if not raw.strip():
        if required:
            raise BadRequest("invalid_request", "This endpoint needs a JSON object as the request body.")
        raw = b"{}"
    elif not is_json_media_type(request.headers.get("content-type")):
        raise ApiError(
            415,
            "unsupported_media_type",
            "The request body must be JSON, sent with the header Content-Type: application/json.",
        )
    data = parse_json_body(raw)
    if not isinstance(data, dict):
        raise BadRequest("invalid_request", "The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(model, exc) from None
    except RecursionError:  # pragma: no cover - the depth limit above keeps validation shallow
        raise BadRequest("too_deep", "The request body nests too deeply.") from None


def json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)  # the edge: money leaves the program as a JSON number
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot render {type(value).__name__} as JSON")


class JsonBody(Response):
    """A JSON response whose headers are built as raw bytes directly (the hot path renders one per request)."""

    media_type = "application/json"

    def __init__(self, content: bytes, status_code: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.background = None
        self.body = content
        raw = [(b"content-length", str(len(content)).encode()), (b"content-type", b"application/json")]
        if headers:
            raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.raw_headers = raw


def json_response(model: BaseModel | dict[str, Any], status: int, headers: dict[str, str] | None = None) -> Response:
    if isinstance(model, BaseModel):
        content = model.__pydantic_serializer__.to_json(model)
    else:
        content = json.dumps(model, separators=(",", ":"), default=json_default).encode()
    return JsonBody(content, status, headers)
