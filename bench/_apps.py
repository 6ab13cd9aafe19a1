"""The two apps the hot-path benchmark compares, as uvicorn factories."""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route


def bare_app() -> Starlette:
    """The baseline: a Starlette JSON endpoint with the same body shape and no work behind it."""

    async def account(request):  # noqa: ANN001
        return JSONResponse(
            {"user_id": 1, "balance_usd": 0.0, "currency": "USD", "servers": 0, "totp_enabled": False,
             "created_at": "2026-11-22T03:00:00+00:00"}
        )

    return Starlette(routes=[Mount("/v1", routes=[Route("/account", account)])])


def vpsshop_app() -> Starlette:
    from vpsshop import create_app
    from vpsshop.settings import load_settings

    settings = load_settings(
        None,
        environ={},
        overrides={
            "database_url": os.environ["BENCH_DATABASE_URL"],
            "secret_key": "bench-secret",
            "encryption_key": "bench-encryption",
            "server": {"background": False},
        },
    )
    return create_app(settings, background=False)
