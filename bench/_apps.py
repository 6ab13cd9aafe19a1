"""The baseline of the hot-path benchmark, as a uvicorn factory."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route


def bare_app() -> Starlette:
    """A Starlette JSON endpoint with the same body shape as GET /v1/account and no work behind it."""

    async def account(request):
        return JSONResponse(
            {
                "user_id": 1,
                "balance_usd": 0.0,
                "currency": "USD",
                "servers": 0,
                "totp_enabled": False,
                "created_at": "2026-11-22T03:00:00+00:00",
            }
        )

    return Starlette(routes=[Mount("/v1", routes=[Route("/account", account)])])
