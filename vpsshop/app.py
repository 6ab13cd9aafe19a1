"""The app factory: builds a fresh plugin manager, context and Starlette app for one shop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import AsyncIterator

import pluggy
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vpsshop import metrics
from vpsshop.accesslog import AccessLog, AccessLogWriter
from vpsshop.api import core_routes, llms, x402
from vpsshop.api.console import websocket_route as console_websocket_route
from vpsshop.api.events import openapi_webhooks
from vpsshop.api.spec import SPEC, ApiSpec
from vpsshop.assembly import build_context
from vpsshop.clock import Clock
from vpsshop.context import AppContext
from vpsshop.dashboard import mount as mount_dashboard
from vpsshop.dashboard.web import Dashboard
from vpsshop.db import UNAVAILABLE_ERRORS
from vpsshop.db import unavailable as database_unavailable
from vpsshop.errors import ApiError, PluginError, StartupError
from vpsshop.logs import configure_logging
from vpsshop.mcp.server import PATH as MCP_PATH
from vpsshop.mcp.server import McpEndpoint
from vpsshop.openapi import InsufficientBalanceBody, build_openapi, catalog_ids
from vpsshop.routing import ApiRoute, ApiRouter, json_response, to_starlette_routes
from vpsshop.settings import Settings, load_settings
from vpsshop.tasks import TaskRunner

log = logging.getLogger("vpsshop")

BASE_PATH = "/v1"


def create_app(
    settings: Settings | None = None,
    *,
    pm: pluggy.PluginManager | None = None,
    clock: Clock | None = None,
    background: bool | None = None,
    check: bool = True,
) -> Starlette:
    """Assemble the API of one shop.

    :param settings: validated settings; default :func:`vpsshop.settings.load_settings`.
    :param pm: a plugin manager to use instead of building one (tests registering plugin objects).
    :param clock: the clock of the service (tests pass a :class:`vpsshop.clock.FrozenClock`).
    :param background: run the plugins' background tasks in this app's lifespan; default the
        ``server.background`` setting.
    :param check: run the components' preflight checks in the lifespan (``vpsshop serve`` has
        run them already and passes False).
    :raises StartupError: a plugin clash, a misspelt hook, a missing setting, a route claimed twice.
    """
    settings = settings or load_settings()
    configure_logging(settings)
    if settings.metrics.enabled:
        metrics.configure(settings)
    ctx = build_context(settings, pm=pm, clock=clock)
    routes = list(core_routes())
    for plugin_routes in ctx.pm.hook.vpsshop_routes(ctx=ctx):
        routes.extend(plugin_routes or ())
    _check_unique(routes)
    # A location the hypervisor does not serve is not orderable: the request bodies' enum leaves it out.
    event_models, webhooks = openapi_webhooks()
    openapi = build_openapi(
        routes, extra_models=[InsufficientBalanceBody, *event_models], catalog_ids=catalog_ids(ctx), webhooks=webhooks
    )
    ctx.put(SPEC, ApiSpec.of(routes, openapi))
    run_background = settings.server.background if background is None else background

    access_log = AccessLogWriter() if settings.server.access_log else None
    mcp = McpEndpoint(ctx) if settings.mcp.enabled else None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runner = await start_services(ctx, background=run_background, check=check)
        try:
            async with mcp.running() if mcp is not None else contextlib.nullcontext():
                yield
        finally:
            await stop_services(ctx, runner)
            if access_log is not None:
                access_log.flush()

    middleware = [
        Middleware(AccessLog, writer=access_log, observe=settings.metrics.enabled),
        Middleware(BodyLimit, max_bytes=settings.server.max_body_bytes, timeout=settings.server.body_timeout_seconds),
    ]
    # Routes under /v1, found by a dictionary lookup when the path has no parameters; then the dashboard.
    served: list[BaseRoute] = list(to_starlette_routes(routes, ctx, prefix=BASE_PATH))
    served.append(Route(llms.PATH, llms.llms_txt, methods=["GET", "HEAD"]))  # for agents: what, how to pay
    if settings.metrics.enabled:
        served.append(Route("/metrics", metrics.metrics_endpoint, methods=["GET"], include_in_schema=False))
    served.append(console_websocket_route(BASE_PATH))  # the serial console's WebSocket (ticket-authenticated)
    if mcp is not None:  # the same operations as MCP tools, for agents (docs/mcp.md)
        served.append(Route(MCP_PATH, mcp, methods=["GET", "POST", "DELETE"]))
    dashboard = mount_dashboard(ctx)
    if dashboard is not None:
        served += [dashboard.mount, Route("/", _root, methods=["GET", "HEAD"])]
    app = Starlette(
        middleware=middleware,
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            PluginError: _plugin_error,
            **dict.fromkeys(UNAVAILABLE_ERRORS, _database_unavailable),
            Exception: _internal_error,
        },
        lifespan=lifespan,
    )
    # No trailing-slash redirects: Starlette builds them from the Host header, which a client chooses
    # (GET /v1/account/ with Host: evil.example would be sent to http://evil.example/v1/account).
    app.router = ApiRouter(served, lifespan=lifespan, redirect_slashes=False)
    app.state.ctx = ctx
    app.state.dashboard = dashboard.pages if dashboard is not None else None
    return app


def create_console_app(settings: Settings, *, clock: Clock | None = None) -> Starlette:
    """The operators' web console (:mod:`vpsshop.backoffice`) as an app of its own, for a listener of
    its own (``vpsshop serve --admin-listen``): never routed on the API's port."""
    from vpsshop.backoffice import console_app

    ctx = build_context(settings, clock=clock)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await ctx.close()

    limit = Middleware(
        BodyLimit, max_bytes=settings.server.max_body_bytes, timeout=settings.server.body_timeout_seconds
    )
    return console_app(ctx, [limit], lifespan)


PREFLIGHT_DONE_ENV = "VPSSHOP_PREFLIGHT_DONE"
"""Set by ``vpsshop serve`` for its uvicorn workers: the checks ran once in the parent."""


def app_from_env() -> Starlette:
    """Factory for ``uvicorn --factory`` workers: settings from ``VPSSHOP_CONFIG`` and the environment."""
    from vpsshop.httpserver import configure

    settings = load_settings(os.environ.get("VPSSHOP_CONFIG") or None)
    configure(settings.server)  # this worker's request-head limits (its protocol class is imported anew)
    return create_app(settings, check=os.environ.get(PREFLIGHT_DONE_ENV) != "1")


async def preflight(ctx: AppContext) -> list[str]:
    """Run every loaded component's :meth:`~vpsshop.Component.preflight`.

    In production any failure stops start-up: :class:`StartupError` listing every component that
    cannot work, each with its remedy. In the sandbox the problems are logged as warnings and
    returned (the banner shows them).
    """
    problems = []
    for item in ctx.components():
        if item.component is None:
            continue
        try:
            await item.component.preflight()
        except StartupError as exc:
            problems.append(f"{item.kind} {item.key} (plugin {item.plugin}): {exc}")
        except Exception as exc:  # noqa: BLE001 - a broken check must not look like a pass
            problems.append(
                f"{item.kind} {item.key} (plugin {item.plugin}): preflight failed: {type(exc).__name__}: {exc}"
            )
        if item.component is ctx.hypervisor:
            unserved = unserved_locations(ctx)
            if unserved:
                problems.append(f"{item.kind} {item.key} (plugin {item.plugin}): {_unserved_problem(ctx, unserved)}")
    for location, missing in ctx.unoffered_systems().items():
        log.warning(
            "location %s offers no %s: no host there holds the image (orders are refused with 409 "
            "os_unavailable; `vpsshop images sync` puts it there, `vpsshop images status` shows each host)",
            location,
            ", ".join(missing),
        )
    if problems and not ctx.settings.sandbox:
        raise StartupError(
            "configured components cannot work (fix each, then start again):\n  " + "\n  ".join(problems)
        )
    for problem in problems:
        log.warning("sandbox: %s", problem)
    return problems


def unserved_locations(ctx: AppContext) -> list[str]:
    """The catalog's location ids the hypervisor backend does not serve (none without a backend)."""
    return [loc.id for loc in ctx.catalog_data.locations if not ctx.serves_location(loc.id)]


def _unserved_problem(ctx: AppContext, unserved: list[str]) -> str:
    assert ctx.hypervisor is not None
    # one setting may serve several locations (a list of them): name it once
    settings = ", ".join(dict.fromkeys(ctx.hypervisor.location_setting(loc) for loc in unserved))
    return (
        f"the catalog sells location(s) {', '.join(unserved)}, where this backend has no hosts (orders there are "
        f"refused with 409 location_unavailable): add {settings}, or limit the catalog to the locations "
        "you serve (with the file catalog: [catalog.file] path naming a catalog file without them)"
    )


async def start_services(ctx: AppContext, *, background: bool, check: bool = True) -> TaskRunner | None:
    """Check the components (:func:`preflight`), migrate, run the start-up hooks and (optionally)
    the background tasks."""
    if check:
        await preflight(ctx)
    await asyncio.to_thread(ctx.db.migrate_when_it_answers, ctx.settings.server.database_wait_seconds)
    for result in ctx.pm.hook.vpsshop_startup(ctx=ctx):
        if inspect.isawaitable(result):
            await result
    if not background:
        return None
    tasks = [task for declared in ctx.pm.hook.vpsshop_background_tasks(ctx=ctx) for task in (declared or ())]
    runner = TaskRunner(tasks)
    runner.start()
    return runner


async def stop_services(ctx: AppContext, runner: TaskRunner | None) -> None:
    if runner is not None:
        await runner.stop()
    for impl in ctx.pm.hook.vpsshop_shutdown.get_hookimpls():
        try:
            result = impl.function(ctx=ctx)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("vpsshop_shutdown of plugin %s failed", impl.plugin_name)
    await ctx.close()


def _check_unique(routes: list[ApiRoute]) -> None:
    seen: dict[tuple[str, str], ApiRoute] = {}
    for route in routes:
        key = (route.method.upper(), route.path)
        if key in seen:
            raise StartupError(f"{key[0]} {BASE_PATH}{key[1]} is declared twice (by two plugins, or a plugin and core)")
        seen[key] = route


# ---- errors: every failure is the seed's error body -----------------------------------------------

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type"}


BEARER_CHALLENGE = 'Bearer realm="vpsshop"'
"""``WWW-Authenticate`` of every 401 (RFC 9110 requires a challenge; the API's credential is a Bearer key)."""


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    headers = {**exc.headers, **x402.error_headers(request.app.state.ctx, exc)}
    if exc.status == 401 and "WWW-Authenticate" not in headers:
        headers["WWW-Authenticate"] = BEARER_CHALLENGE
    return json_response(exc.body(), exc.status, headers or None)


def _wants_html(request: Request) -> bool:
    return "text/html" in request.headers.get("accept", "")


async def _root(request: Request) -> Response:
    """``/``: a browser goes to the dashboard; anything else is told where the API is (404)."""
    dash: Dashboard | None = request.app.state.dashboard  # set by create_app
    if dash is not None and _wants_html(request):
        return RedirectResponse(f"{dash.base}/", 303)
    raise HTTPException(404)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    path = request.url.path
    dash: Dashboard | None = request.app.state.dashboard  # set by create_app
    in_api = path == BASE_PATH or path.startswith(BASE_PATH + "/")
    if dash is not None and not in_api and (path.startswith(dash.base + "/") or _wants_html(request)):
        return dash.http_error_page(request, exc.status_code)
    if exc.status_code == 404 and in_api:
        message = f"No endpoint at {path}; the endpoints of this API are listed in {BASE_PATH}/openapi.json."
    elif exc.status_code == 404:
        where = f"; the customer dashboard is at {dash.base}/" if dash is not None else ""
        message = f"No endpoint at {path}. The API lives under {BASE_PATH} (see {BASE_PATH}/openapi.json){where}."
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}."
    else:
        message = str(exc.detail)
    return json_response({"error": code, "message": message}, exc.status_code, dict(exc.headers or {}))


async def _plugin_error(request: Request, exc: Exception) -> Response:
    # The plugin's text (node errors, setting names) goes to the operator's log only.
    log.error("plugin failure on %s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
    return json_response(
        {"error": "service_unavailable", "message": "A backend this request needs is not available; retry shortly."},
        503,
    )


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    why = database_unavailable(exc)
    if why is None:
        return await _internal_error(request, exc)  # "no such column" and the like are bugs, not outages
    # One line, no traceback: during an outage every request lands here, and /health says the rest.
    log.warning("database unavailable on %s %s: %s", request.method, request.url.path, why)
    return json_response(
        {"error": "service_unavailable", "message": "The shop's database is not answering; retry shortly."},
        503,
        {"Retry-After": "5"},
    )


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return json_response({"error": "internal_error", "message": "The server failed; retry shortly."}, 500)


class ClientGone(Exception):
    """The client closed the connection before sending the whole request body."""


class BodyLimit:
    """Guards request bodies: refuses one over ``max_bytes`` (by Content-Length at once, else while
    streaming) and one that has not arrived ``timeout`` seconds after the request started (408); a
    client that disconnects mid-body ends the request with one log line."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)  # no endpoint reads the body of a GET or HEAD
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > self.max_bytes:
                    await self._refuse(scope, receive, send, declared)
                    return
                break
        received = 0
        limit = self.max_bytes
        complete = False
        deadline = asyncio.get_running_loop().time() + self.timeout

        async def limited_receive() -> Message:
            nonlocal received, complete
            if complete:
                return await receive()  # after the body: only a disconnect, which the app may wait for
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), max(remaining, 0.001))
            except TimeoutError:
                log.warning(
                    "%s %s: request body not received within %g s; answered 408",
                    scope["method"],
                    scope["path"],
                    self.timeout,
                )
                error = ApiError(
                    408, "body_timeout", f"The request body did not arrive within {self.timeout:g} seconds."
                )
                error.headers["Connection"] = "close"
                raise error from None
            if message["type"] == "http.disconnect":
                raise ClientGone()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise ApiError(413, "body_too_large", f"The request body is larger than {limit} bytes.")
                complete = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, limited_receive, send)
        except ClientGone:
            log.info(
                "%s %s: client disconnected before sending the whole body (%d bytes received)",
                scope["method"],
                scope["path"],
                received,
            )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, declared: int) -> None:
        if declared < 0:
            response = json_response({"error": "invalid_request", "message": "Content-Length is not a number."}, 400)
        else:
            response = json_response(
                {"error": "body_too_large", "message": f"The request body is larger than {self.max_bytes} bytes."}, 413
            )
        await response(scope, receive, send)
