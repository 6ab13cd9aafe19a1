"""The public endpoints: the catalog, health and the OpenAPI document (no API key needed)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vpsshop.api.spec import spec_of
from vpsshop.catalog import Catalog
from vpsshop.coins import DepositCoin
from vpsshop.context import StateKey
from vpsshop.readiness import component_readiness, ready_in_mode
from vpsshop.routing import ApiRoute, Call, Reply
from vpsshop.version import __version__

HEALTH_CACHE_SECONDS = 2.0


class DatabaseHealth(BaseModel):
    ok: bool
    backend: str | None = Field(None, description="sqlite or postgresql (sandbox only).")


class ComponentHealth(BaseModel):
    kind: str = Field(description="coin, hypervisor, catalog or rates")
    id: str = Field(description="The coin code, backend kind or source name.")
    plugin: str | None = Field(None, description="Name of the plugin that provides it (sandbox only).")
    ready: bool = Field(
        description="Ready for what this mode promises. Production: real customers can use it now (its node "
        "answers, its file loaded). Sandbox: it does what a sandbox does (test addresses, payment requirements, "
        "simulated servers) even when it could not take real money; detail then says what real use needs."
    )
    detail: str | None = Field(None, description="What is wrong or what real use needs (sandbox only).")
    watch: Literal["push", "poll"] | None = Field(
        None,
        description="Coins watched by this process: push while its node's push channel is up (payments are seen "
        "at once), poll while it is down or the coin has none (every watch_interval_seconds).",
    )


class Health(BaseModel):
    """Response of ``GET /health``."""

    status: Literal["ok", "degraded", "down"] = Field(
        description="ok: the database answers and every component is ready (see components[].ready for what "
        "ready means in each mode); degraded: the database works but a component is not ready; down: the database "
        "does not answer (status code 503)."
    )
    version: str | None = Field(None, description="The vpsshop version (sandbox only).")
    mode: Literal["sandbox", "production"]
    database: DatabaseHealth
    components: list[ComponentHealth]


_CATALOG_JSON = StateKey[bytes]("catalog-json")


async def get_catalog(call: Call) -> Response:
    catalog = call.ctx.current_catalog()
    if catalog is call.ctx.catalog:  # every location offers every system: the JSON made once
        body = call.ctx.state(_CATALOG_JSON, lambda ctx: ctx.catalog.__pydantic_serializer__.to_json(ctx.catalog))
    else:
        body = catalog.__pydantic_serializer__.to_json(catalog)
    return Response(body, media_type="application/json", headers={"Cache-Control": "public, max-age=60"})


class _LastHealth:
    def __init__(self, _ctx: object) -> None:
        self.at = 0.0
        self.reply: Reply | None = None


_HEALTH = StateKey[_LastHealth]("health")


def _health_extras(plugin: str, detail: str | None, sandbox: bool, component: object) -> dict[str, Any]:
    """The sandbox's plugin and detail; a coin's watch mode when this process watches it."""
    extras: dict[str, Any] = {"plugin": plugin, "detail": detail} if sandbox else {}
    mode = component.watch_mode if isinstance(component, DepositCoin) else None
    if mode in ("push", "poll"):
        extras["watch"] = mode
    return extras


async def get_health(call: Call) -> Reply:
    ctx = call.ctx
    last = ctx.state(_HEALTH, _LastHealth)
    if last.reply is not None and time.monotonic() - last.at < HEALTH_CACHE_SECONDS:
        return last.reply
    db_ok, checked = await asyncio.gather(run_in_threadpool(ctx.db.check), component_readiness(ctx))
    sandbox = ctx.settings.sandbox
    # Anyone may call /health: in production it names each component and whether it is ready, and
    # nothing else (no error text, node address, plugin or version); the log has the details
    # (vpsshop.readiness logs each component not ready).
    components = [
        ComponentHealth(
            kind=item.kind,
            id=item.key,
            ready=ready_in_mode(r, sandbox),
            **_health_extras(item.plugin, r.detail if sandbox else None, sandbox, item.component),
        )
        for item, r in checked
    ]
    status: Literal["ok", "degraded", "down"] = (
        "down" if not db_ok else ("ok" if all(c.ready for c in components) else "degraded")
    )
    body = Health(
        status=status,
        mode=ctx.settings.mode,
        database=DatabaseHealth(ok=db_ok, **({"backend": ctx.db.dialect} if sandbox else {})),
        components=components,
        **({"version": __version__} if sandbox else {}),
    )
    content = body.model_dump(mode="json", exclude_unset=True)
    reply = Reply(content, 503 if status == "down" else 200, {"Cache-Control": "no-store"})
    last.at, last.reply = time.monotonic(), reply
    return reply


async def get_openapi(call: Call) -> Response:
    return Response(spec_of(call.ctx).openapi_json, media_type="application/json")


class OpenApiDocument(BaseModel):
    """The OpenAPI 3.1 description of this API."""

    openapi: str


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "GET",
            "/catalog",
            get_catalog,
            "Plans, locations, operating systems, prices, payment options",
            Catalog,
            auth=False,
            tags=("catalog",),
            operation_id="getCatalog",
            description="Prices follow one rule: monthly = plan base price x location modifier (rounded to a "
            "cent); annual = 10 x monthly. `pricing` lists every plan at every location. `payment_options` lists "
            "the coins this service accepts right now.",
        ),
        ApiRoute(
            "GET",
            "/health",
            get_health,
            "Service health",
            Health,
            auth=False,
            tags=("service",),
            operation_id="getHealth",
            description="The database and each loaded component (coins, hypervisor backend, catalog, rates). "
            "200 while the database answers, even when a component is not ready (status degraded); 503 when the "
            "database does not answer. Results are cached for two seconds. In production the answer shows only the "
            "overall status, the database's ok and each component's kind, id and ready (no error text, plugin, "
            "version or backend: the log has the details); the sandbox adds them.",
            responses={503: ("The database does not answer.", Health)},
        ),
        ApiRoute(
            "GET",
            "/openapi.json",
            get_openapi,
            "This description",
            OpenApiDocument,
            auth=False,
            tags=("service",),
            operation_id="getOpenApi",
        ),
    ]
