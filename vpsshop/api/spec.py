"""The API of one shop as it is served and described: its routes and their OpenAPI document.

Built once by the app factory (:func:`vpsshop.app.create_app`) from core's routes and the plugins';
``GET /v1/openapi.json``, ``/llms.txt`` and the x402 discovery extensions read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vpsshop.context import AppContext, StateKey
from vpsshop.routing import ApiRoute

__all__ = ["ApiSpec", "spec_of"]


@dataclass(frozen=True)
class ApiSpec:
    routes: list[ApiRoute]
    openapi: dict[str, Any]
    openapi_json: bytes = field(default=b"", repr=False)

    @classmethod
    def of(cls, routes: list[ApiRoute], openapi: dict[str, Any]) -> ApiSpec:
        return cls(routes, openapi, json.dumps(openapi, separators=(",", ":")).encode())


SPEC = StateKey[ApiSpec]("api-spec")


def spec_of(ctx: AppContext) -> ApiSpec:
    """The shop's API (set by the app factory; an app that serves no API has an empty one)."""
    return ctx.state(SPEC, lambda _ctx: ApiSpec.of([], {}))
