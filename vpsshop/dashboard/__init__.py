"""The customer web dashboard: server-rendered pages beside the API, under ``[dashboard] path``.

Everything a customer can do with the API can be done here with the login token alone: create an
account, sign in (with a two-factor code when it is on), top up, order and manage servers, mint
and revoke API keys, turn two-factor on and off. Pages call the operations the API calls, with the
session's customer; ``docs/dashboard.md`` describes the pages and the security rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.routing import Mount, Router

from vpsshop.context import AppContext
from vpsshop.dashboard.pages import routes
from vpsshop.dashboard.web import Dashboard


@dataclass(frozen=True)
class MountedDashboard:
    mount: Mount
    pages: Dashboard
    """For the app's error pages: a path under the dashboard that is not found gets a page, not JSON."""


def mount(ctx: AppContext) -> MountedDashboard | None:
    """The dashboard mounted at ``[dashboard] path``, or None when ``[dashboard] enabled`` is false."""
    settings = ctx.settings.dashboard
    if not settings.enabled:
        return None
    dash = Dashboard(ctx, settings.path)
    # No trailing-slash redirects (as for the API): Starlette builds them from the Host header, which the
    # client chooses. /dashboard/keys/ is the dashboard's 404 page, with its security headers.
    return MountedDashboard(Mount(settings.path, app=Router(routes(dash), redirect_slashes=False)), dash)
