"""The console's request pipeline: the customer dashboard's (:class:`vpsshop.dashboard.web.Dashboard`:
CSRF, form limits, security headers, error pages, rendering) with operator sessions instead of
customer ones, its own cookie names and its own templates in front of the dashboard's."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from importlib.resources import files

from jinja2 import ChoiceLoader, PackageLoader, PrefixLoader
from starlette.requests import Request
from starlette.responses import Response

from vpsshop import operators
from vpsshop.context import AppContext
from vpsshop.dashboard.web import Dashboard, Handler, Page
from vpsshop.operators import SignedIn

NOTICES = {
    "signed-out": "You are signed out.",
    "session-ended": "Your session ended. Sign in again with your password and code.",
    "credited": "Done: the balance changed, the ledger has the entry and the customer gets the event.",
}


class Console(Dashboard):
    """The operators' pages, served at the root of their own listener (``--admin-listen``)."""

    def __init__(self, ctx: AppContext) -> None:
        super().__init__(ctx, "")
        prefix = "__Host-" if self.secure else ""
        self.session_cookie = f"{prefix}vpsshop_operator"
        self.csrf_cookie = f"{prefix}vpsshop_operator_csrf"
        self.notices = NOTICES
        dashboard = PackageLoader("vpsshop.dashboard", "templates")
        self.env.loader = ChoiceLoader(
            [PackageLoader("vpsshop.backoffice", "templates"), PrefixLoader({"dashboard": dashboard}), dashboard]
        )
        self.static["console.css"] = (files("vpsshop.backoffice") / "static" / "console.css").read_bytes()
        self.static_version = hashlib.sha256(b"".join(self.static.values())).hexdigest()[:12]
        nav = [
            ("/", "Overview"),
            ("/search", "Search"),
            ("/attention", "Needs attention"),
            ("/hosts", "Hosts"),
            ("/audit", "Audit log"),
        ]
        name = f"{ctx.settings.dashboard.shop_name} console"
        self.env.globals.update(static_version=self.static_version, shop_name=name, nav_items=nav)

    def endpoint(
        self, handler: Handler, *, auth: bool = True, pending: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            signed_in = await operators.resolve(self.ctx, request.cookies.get(self.session_cookie))
            request.state.operator = signed_in
            page = Page(request, self, signed_in.session if signed_in else None)
            response = await self._run(page, handler, auth, pending)
            self.finish(page, response)
            return response

        serve.__name__ = handler.__name__
        return serve

    def sign_in(self, response: Response, token: str) -> None:
        hours = self.ctx.settings.console.session_max_hours
        self.set_cookie(response, self.session_cookie, token, max_age=hours * 3600)


def operator_of(page: Page) -> SignedIn:
    """The signed-in operator of a page declared with ``auth=True``."""
    signed_in = page.request.state.operator
    assert isinstance(signed_in, SignedIn)
    return signed_in
