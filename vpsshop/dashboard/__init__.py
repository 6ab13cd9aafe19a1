"""The customer web dashboard: server-rendered pages beside the API, under ``[dashboard] path``.

Everything a customer can do with the API can be done here with the login token alone: create an
account, sign in (with a two-factor code when it is on), top up, order and manage servers, mint
and revoke API keys, turn two-factor on and off. Pages call the API's own services
(:mod:`vpsshop.dashboard.shop`); ``docs/dashboard.md`` describes the pages and the security rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from starlette.routing import Mount

    from vpsshop.context import AppContext


def mount(ctx: AppContext) -> Mount | None:
    """The dashboard mounted at ``[dashboard] path``, or None when ``[dashboard] enabled`` is false."""
    settings = ctx.settings.dashboard
    if not settings.enabled:
        return None
    from starlette.routing import Mount, Router

    from vpsshop.dashboard.pages import routes
    from vpsshop.dashboard.web import Dashboard

    dash = Dashboard(ctx, settings.path)
    ctx.dashboard = dash
    # No trailing-slash redirects (as for the API): Starlette builds them from the Host header, which the
    # client chooses. /dashboard/keys/ is the dashboard's 404 page, with its security headers.
    return Mount(settings.path, app=Router(routes(dash), redirect_slashes=False))
