"""The OpenAPI 3.1 description, generated from the same routes and models that serve requests."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from vpsshop import limits
from vpsshop.coins import DepositCoin
from vpsshop.context import AppContext
from vpsshop.money import UsdAmount
from vpsshop.routing import ID_PARAMS, WRITE_METHODS, ApiRoute

API_VERSION = "1.0.0"
_REF = "#/components/schemas/{model}"

DESCRIPTION = """\
REST API for ordering KVM virtual private servers, paid from a prepaid USD balance funded with
cryptocurrency. No identity is asked for. All paths are relative to the base address, which ends in
`/v1`. Every endpoint except `POST /account`, `POST /login`, `GET /catalog`, `GET /health` and
`GET /openapi.json` needs `Authorization: Bearer vpsk_...`.

Every error, including unknown paths, wrong methods, malformed JSON and oversized bodies, has the body
`{"error": "<code>", "message": "<text>"}`; some errors add fields (`insufficient_balance` adds
`price`, `balance` and `deficit`, validation errors add `details`). Money is in USD as JSON numbers
with at most six decimals; balances are kept to the micro-dollar so that no part of a crypto payment
is lost to rounding.

Decisions where the contract left room (see docs/api.md):
* the create-account response also carries `user_id`, `key_id`, `balance_usd`, `currency`, `created_at`;
* `GET /keys` answers `{"keys": [...]}` with `id`, `prefix`, `name`, `created_at`, `revoked_at` (null) of active keys;
* `POST /keys` takes an optional body `{"name": "..."}`; `DELETE /keys/{id}` answers the revoked key;
* `POST /login` exchanges the login token for a new API key (dashboard sign-in and key recovery);
* request bodies refuse unknown fields (`unknown_field`); a bad field gives `invalid_<field>`;
* bodies over the size limit are refused with 413 `body_too_large`;
* request bodies are strict JSON: sent as `Content-Type: application/json` (else 415
  `unsupported_media_type`), no key twice in one object (`duplicate_key`), no nesting deeper than 32
  levels (`too_deep`), no number literal longer than 40 characters (`number_too_large`), booleans
  only as `true`/`false`; numbers with a fraction are read as decimals, never binary floats;
* a body that has not fully arrived 10 seconds (`server.body_timeout_seconds`) after the request
  began is answered 408 `body_timeout`;
* every 401 carries `WWW-Authenticate: Bearer realm="vpsshop"`; every response carries
  `X-Content-Type-Options: nosniff`; a path with a trailing slash is a 404 (no redirect);
* a 503 says only that a backend is unavailable (the operator's log has the cause); see
  docs/security.md for what each answer discloses.
"""


class ErrorBody(BaseModel):
    """The error body of every failure."""

    model_config = ConfigDict(extra="allow")

    error: str = Field(description="Machine-readable code.")
    message: str = Field(description="Human-readable text.")


class InsufficientBalanceBody(ErrorBody):
    error: str = Field(description="insufficient_balance")
    price: UsdAmount
    balance: UsdAmount
    deficit: UsdAmount


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}},
    }


X402_REQUEST_HEADERS = frozenset({"X-PAYMENT", "PAYMENT-SIGNATURE"})
"""An operation that takes one of these x402 payment headers also declares the x402 response headers
(:func:`_declare_x402_headers`)."""

_BASE64_JSON = {"type": "string", "contentEncoding": "base64", "contentMediaType": "application/json"}

X402_PAYMENT_REQUIRED = {
    "description": "x402 v2 payment requirements: base64 JSON `{x402Version: 2, error, resource: {url, description, "
    "mimeType}, accepts: [{scheme, network (CAIP-2), amount, asset, payTo, maxTimeoutSeconds, extra}], extensions: "
    "{bazaar, payment-identifier}}`. Sent when the shop takes x402 and asks for a payment (the body holds the same "
    "in x402 v1); absent on a 402 that refuses a payment.",
    "schema": _BASE64_JSON,
}
X402_PAYMENT_RESPONSES = {
    "X-PAYMENT-RESPONSE": {
        "description": "x402 v1 settlement: base64 JSON `{success, transaction, network, payer}`. Sent when the "
        "request was paid with X-PAYMENT; a replay (Idempotent-Replayed: true) reports the settlement that paid it.",
        "schema": _BASE64_JSON,
    },
    "PAYMENT-RESPONSE": {
        "description": "x402 v2 settlement: base64 JSON `{success, transaction, network (CAIP-2), payer, amount}`. "
        "Sent when the request was paid with PAYMENT-SIGNATURE; a replay reports the settlement that paid it.",
        "schema": _BASE64_JSON,
    },
}


def _declare_x402_headers(responses: dict[str, Any], success: str) -> None:
    """The x402 headers of an operation paid by x402: ``PAYMENT-REQUIRED`` on its 402, the payment
    responses on its success (and, as the descriptions say, on a failure after the payment settled)."""
    if "402" in responses:
        responses["402"].setdefault("headers", {})["PAYMENT-REQUIRED"] = X402_PAYMENT_REQUIRED
    responses[success].setdefault("headers", {}).update(X402_PAYMENT_RESPONSES)


CATALOG_MARK = "x-catalog"
"""Put ``json_schema_extra={"x-catalog": "plans"}`` on a request field that takes a catalog id: the
document then lists the ids this shop offers as the field's ``enum`` (plans, locations,
operating_systems, coins, standing_coins: the coins with standing deposit addresses)."""


def catalog_ids(ctx: AppContext) -> dict[str, list[str]]:
    """The ids a request may name, by kind: the catalog's plans and operating systems, the locations the
    hypervisor serves (all of them when it serves none: a start-up problem, not an empty enum), the systems
    some served location holds the image of (all when none does), the coins."""
    data = ctx.catalog_data
    locations = [loc.id for loc in data.locations]
    served = [loc for loc in locations if ctx.serves_location(loc)]
    offered = {os_id for loc in served for os_id in ctx.orderable_systems(loc)}
    systems = [system.id for system in data.operating_systems]
    return {
        "plans": [plan.id for plan in data.plans],
        "locations": served or locations,
        "operating_systems": [s for s in systems if s in offered] or systems,
        "coins": list(ctx.coins),
        "standing_coins": [
            code for code, coin in ctx.coins.items() if isinstance(coin, DepositCoin) and coin.standing_addresses
        ],  # vpsshop.deposits.standing_coins (not imported here: it imports the payment engine)
    }


def mark_catalog_enums(schemas: dict[str, Any], catalog_ids: dict[str, list[str]]) -> None:
    """Each property marked ``x-catalog`` gets the ids of its kind as its ``enum`` (the mark is removed)."""
    for schema in schemas.values():
        for prop in schema.get("properties", {}).values():
            kind = prop.pop(CATALOG_MARK, None)
            if kind is not None:
                nullable = any(option.get("type") == "null" for option in prop.get("anyOf", ()))
                prop["enum"] = [*catalog_ids[kind], *([None] if nullable else [])]


def _limits(route: ApiRoute) -> str | None:
    """When ``route`` answers 429 (None: never): the client address's failed keys for an authenticated
    route, the account's write limit for one that writes, and the route's own quota."""
    if not route.auth:
        return route.limits or None
    reasons = [limits.AUTH_LIMIT]
    if route.method.upper() in WRITE_METHODS:
        reasons.append(limits.WRITE_LIMIT)
    if route.limits:
        reasons.append(route.limits)
    return "; ".join(reasons) + ". Retry-After says when to try again."


def build_openapi(
    routes: list[ApiRoute],
    *,
    extra_models: Sequence[type[BaseModel]] = (),
    catalog_ids: dict[str, list[str]] | None = None,
    webhooks: dict[str, Any] | None = None,
) -> dict[str, Any]:
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ErrorBody, "serialization")]
    wanted += [(m, "serialization") for m in extra_models]
    for route in routes:
        if route.response is not None:
            wanted.append((route.response, "serialization"))
        if route.body is not None:
            wanted.append((route.body, "validation"))
        wanted += [(model, "serialization") for _, model in route.responses.values() if model is not None]
    unique = list(dict.fromkeys(wanted))
    refs, definitions = models_json_schema(unique, ref_template=_REF)
    schemas = definitions.get("$defs", {})
    mark_catalog_enums(schemas, catalog_ids or {"plans": [], "locations": [], "operating_systems": [], "coins": []})

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "operationId": route.operation_id or route.endpoint.__name__,
            "summary": route.summary,
            "tags": list(route.tags),
            "responses": {},
        }
        if route.description:
            operation["description"] = route.description
        parameters: list[dict[str, Any]] = []
        for name in ID_PARAMS:
            if f"{{{name}}}" in route.path:
                parameters.append(
                    {
                        "name": name,
                        "in": "path",
                        "required": True,
                        "schema": {"type": "integer", "minimum": 0, "maximum": ApiRoute.MAX_ID},
                    }
                )
        for name in re.findall(r"\{(\w+)\}", route.path):  # other path parameters are strings
            if name not in ID_PARAMS:
                parameters.append(
                    {
                        "name": name,
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "minLength": 1, "maxLength": 64},
                    }
                )
        for param in route.query:
            parameters.append(
                {
                    "name": param.name,
                    "in": "query",
                    "required": False,
                    "description": param.description,
                    "schema": param.schema,
                }
            )
        for header in route.headers:
            parameters.append(
                {
                    "name": header.name,
                    "in": "header",
                    "required": header.required,
                    "description": header.description,
                    "schema": header.schema,
                }
            )
        if parameters:
            operation["parameters"] = parameters
        if route.body is not None:
            operation["requestBody"] = {
                "required": route.body_required,
                "content": {"application/json": {"schema": refs[(route.body, "validation")]}},
            }
        responses = operation["responses"]
        success: dict[str, Any] = {"description": route.summary}
        if route.response_headers:
            success["headers"] = {
                name: {"description": f"Always `{value}`.", "schema": {"type": "string", "const": value}}
                for name, value in route.response_headers.items()
            }
        if route.response is not None:
            success["content"] = {"application/json": {"schema": refs[(route.response, "serialization")]}}
        responses[str(route.status)] = success
        for status, (description, model) in route.responses.items():
            entry: dict[str, Any] = {"description": description}
            if model is not None:
                entry["content"] = {"application/json": {"schema": refs[(model, "serialization")]}}
            responses[str(status)] = entry
        if any(header.name in X402_REQUEST_HEADERS for header in route.headers):
            _declare_x402_headers(responses, str(route.status))
        if route.body is not None:
            responses.setdefault("400", _error_response("The body is not valid JSON or a field is invalid."))
            responses.setdefault("413", _error_response("The body is larger than the limit (body_too_large)."))
            responses.setdefault("408", _error_response("The body did not arrive in time (body_timeout)."))
            responses.setdefault(
                "415", _error_response("The body is not sent as application/json (unsupported_media_type).")
            )
        if route.auth:
            operation["security"] = [{"bearerAuth": []}, *([{}] if route.auth_optional else [])]
            unauthorized = "Missing, unknown or revoked API key (unauthorized); sent with WWW-Authenticate: Bearer."
            if 401 in route.errors:  # the operation's own 401s (a two-factor code) beside the key's
                unauthorized += " " + route.errors[401]
            responses.setdefault("401", _error_response(unauthorized))
        for status, description in route.errors.items():
            responses.setdefault(str(status), _error_response(description))
        limited = _limits(route)
        if limited is not None:
            entry = responses.setdefault("429", _error_response(limited))
            entry.setdefault("headers", {})["Retry-After"] = {
                "description": "Seconds until the limit allows this request again.",
                "schema": {"type": "integer", "minimum": 1},
            }
        responses["default"] = _error_response("Any other failure, with the error body.")
        paths.setdefault(route.path, {})[route.method.lower()] = operation

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "vpsshop: prepaid crypto VPS ordering API",
            "version": API_VERSION,
            "description": DESCRIPTION,
        },
        "servers": [{"url": "/v1", "description": "The base path of this service."}],
        "paths": paths,
        **({"webhooks": webhooks} if webhooks else {}),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "An API key starting vpsk_."}
            },
        },
    }
