"""x402 v2 extensions declared on every 402 of the shop: ``bazaar`` and ``payment-identifier``.

``bazaar`` (discovery): how to call the paid resource and what it answers, so a facilitator's
catalogue or an agent can list it. ``info.input`` is ``{"type": "http", "method", "bodyType":
"json", "body": <an example body>}``, ``info.output`` ``{"type": "json"}``;
``schema`` is a JSON Schema of ``info`` whose ``input.body`` is the endpoint's request body schema and
whose ``output.example`` is its success response schema (an answer matches it), both taken from this shop's OpenAPI
description (component references become ``#/$defs/...`` of the same schema, nothing external).

``payment-identifier``: the shop accepts an optional client id of the payment (16 to 128 letters,
digits, ``_``, ``-``) and uses it as the idempotency key of an order paid in the same request
(see :mod:`vpsshop.x402.purchases`).
"""

from __future__ import annotations

from typing import Any

from vpsshop.api.spec import spec_of
from vpsshop.context import AppContext

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_COMPONENTS = "#/components/schemas/"


def _refs(node: Any, found: set[str]) -> Any:
    """A copy of ``node`` with OpenAPI component references rewritten to ``#/$defs/``; names in ``found``."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "title":
                continue  # pydantic's field titles repeat the names; the header stays small
            if key == "$ref" and isinstance(value, str) and value.startswith(_COMPONENTS):
                name = value[len(_COMPONENTS) :]
                found.add(name)
                out[key] = "#/$defs/" + name
            else:
                out[key] = _refs(value, found)
        return out
    if isinstance(node, list):
        return [_refs(item, found) for item in node]
    return node


def _defs(components: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """Every component in ``names`` and those they reference, rewritten."""
    defs: dict[str, Any] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in defs or name not in components:
            continue
        more: set[str] = set()
        defs[name] = _refs(components[name], more)
        todo.extend(more - set(defs))
    return defs


def _inline(schema: dict[str, Any] | None, components: dict[str, Any]) -> dict[str, Any]:
    """``schema`` itself when it only references a component (the body and answer are shown in place)."""
    if not schema:
        return {"type": "object"}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(_COMPONENTS) and len(schema) == 1:
        component: dict[str, Any] = components.get(ref[len(_COMPONENTS) :], {"type": "object"})
        return component
    return schema


def _example(schema: dict[str, Any], ctx: AppContext) -> dict[str, Any]:
    """A valid example body: the first catalog id for catalog fields, schema defaults otherwise."""
    example: dict[str, Any] = {}
    for name in schema.get("required", []):
        prop = schema.get("properties", {}).get(name, {})
        kind = prop.get("x-catalog")
        if prop.get("enum"):
            example[name] = prop["enum"][0]
        elif kind in ("plans", "locations", "operating_systems"):
            items = getattr(ctx.catalog_data, kind)
            if items:
                example[name] = items[0].id
        elif "default" in prop:
            example[name] = prop["default"]
    return example


def bazaar(ctx: AppContext, path: str, method: str = "POST") -> dict[str, Any] | None:
    """The ``bazaar`` extension of ``method path`` (an OpenAPI path under /v1), or None if not described."""
    openapi = spec_of(ctx).openapi
    operation = openapi.get("paths", {}).get(path, {}).get(method.lower())
    if operation is None:
        return None
    components = openapi.get("components", {}).get("schemas", {})
    names: set[str] = set()
    body_schema = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    body_schema = _refs(_inline(body_schema, components), names)
    # The answer's schema is left out: it travels in the PAYMENT-REQUIRED header, which clients cap
    # at 16 KiB (undici), and the server resource's schema alone filled most of that. /openapi.json has it.
    info = {
        "input": {"type": "http", "method": method.upper(), "bodyType": "json", "body": _example(body_schema, ctx)},
        "output": {"type": "json"},
    }
    schema: dict[str, Any] = {
        "$schema": SCHEMA_DIALECT,
        "type": "object",
        "properties": {
            "input": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "const": "http"},
                    "method": {"type": "string", "enum": [method.upper()]},
                    "bodyType": {"type": "string", "enum": ["json"]},
                    "body": body_schema,
                },
                "required": ["type", "method", "bodyType", "body"],
                "additionalProperties": False,
            },
            "output": {
                "type": "object",
                "properties": {"type": {"type": "string", "const": "json"}},
                "required": ["type"],
            },
        },
        "required": ["input"],
    }
    defs = _defs(components, names)
    if defs:
        schema["$defs"] = defs
    return {"info": info, "schema": schema}


def payment_identifier() -> dict[str, Any]:
    """The ``payment-identifier`` extension: optional, an id of 16 to 128 characters."""
    return {
        "info": {"required": False},
        "schema": {
            "$schema": SCHEMA_DIALECT,
            "type": "object",
            "properties": {
                "required": {"type": "boolean"},
                "id": {"type": "string", "minLength": 16, "maxLength": 128, "pattern": "^[a-zA-Z0-9_-]+$"},
            },
            "required": ["required"],
        },
    }


def extensions(ctx: AppContext, path: str, method: str = "POST") -> dict[str, Any]:
    """The extensions of a 402 of ``method path`` (the OpenAPI path, e.g. ``/servers/{id}/renew``)."""
    found: dict[str, Any] = {"payment-identifier": payment_identifier()}
    described = bazaar(ctx, path, method)
    if described is not None:
        found["bazaar"] = described
    return found
