"""The core endpoints. Each module exposes ``routes() -> list[ApiRoute]``."""

from __future__ import annotations

from vpsshop import servers
from vpsshop.api import accounts, service, topups
from vpsshop.events import api as events_api
from vpsshop.routing import ApiRoute


def core_routes() -> list[ApiRoute]:
    return [*accounts.routes(), *service.routes(), *topups.routes(), *servers.routes(), *events_api.routes()]
