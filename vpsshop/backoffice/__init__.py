"""The operators' web console: the shop's figures, search, accounts and the support actions, for the
people in ``vpsshop admin operator list``. Never on the API's port: ``vpsshop serve --admin-listen
ADDR:PORT`` serves it on its own listener (docs/operations.md, "The web console").

Every page reads through :mod:`vpsshop.shopview` and every action calls :mod:`vpsshop.admin`, as the
``vpsshop admin`` commands do, so both land in one audit log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Router

from vpsshop.backoffice.pages import routes
from vpsshop.backoffice.web import Console
from vpsshop.context import AppContext


def console_app(ctx: AppContext, middleware: Sequence[Middleware] = (), lifespan: Any = None) -> Starlette:
    """The console as its own ASGI app over ``ctx`` (no background tasks: the shop's processes run them)."""
    console = Console(ctx)

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        return console.http_error_page(request, status)

    app = Starlette(middleware=middleware, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.router = Router(routes(console), redirect_slashes=False, lifespan=lifespan)
    app.state.ctx = ctx
    return app
