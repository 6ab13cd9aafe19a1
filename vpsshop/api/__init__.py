"""The REST API: thin endpoints over the shop's operations. Each module exposes ``routes() -> list[ApiRoute]``.

An endpoint reads the request (the body through its route's input model, headers, path), calls one
operation with the caller's account (``call.actor``) and renders its result; the operations
(:mod:`vpsshop.accounts`, :mod:`vpsshop.topups`, :mod:`vpsshop.servers.orders` ...) hold the
rules, limits and events, so the dashboard and the MCP tools behave the same.
"""

from __future__ import annotations

from vpsshop.api import accounts, deposits, events, public, servers, topups
from vpsshop.routing import ApiRoute


def core_routes() -> list[ApiRoute]:
    return [
        *accounts.routes(),
        *public.routes(),
        *topups.routes(),
        *deposits.routes(),
        *servers.routes(),
        *events.routes(),
    ]
