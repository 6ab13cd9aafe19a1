"""Concurrent orders against one balance never overdraw it (SQLite and PostgreSQL).

Requests go through the whole ASGI app concurrently (httpx.AsyncClient over ASGITransport), so
each order runs in its own thread-pool thread with its own database connection, as under uvicorn.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
from sqlmodel import func, select

from vpsshop import ledger
from vpsshop.models import Server
from vpsshop.servers.models import ServerJob

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}  # 3.99


async def _fire(app, headers, count: int, per_request_headers=None) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop", timeout=120) as client:
        return await asyncio.gather(
            *(
                client.post(
                    "/v1/servers",
                    headers={**headers, **(per_request_headers(i) if per_request_headers else {})},
                    json=ORDER,
                )
                for i in range(count)
            )
        )


def test_200_concurrent_orders_against_a_balance_for_50(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("199.50")  # exactly 50 x 3.99
    responses = asyncio.run(_fire(vpsshop_client.app, vpsshop_account.headers, 200))
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 50, 402: 150}, statuses
    assert {r.json()["error"] for r in responses if r.status_code == 402} == {"insufficient_balance"}
    me = vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()
    assert me["balance_usd"] == 0 and me["servers"] == 50
    ctx = vpsshop_client.app.state.ctx
    with ctx.db.session() as session:
        assert session.exec(select(func.count()).select_from(Server)).one() == 50
        assert session.exec(select(func.count()).select_from(ServerJob)).one() == 50
        assert ledger.balance_from_entries(session, vpsshop_account.user_id) == 0
    ids = {r.json()["server"]["id"] for r in responses if r.status_code == 201}
    assert len(ids) == 50


def test_concurrent_retries_with_one_idempotency_key_buy_one_server(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("20")
    responses = asyncio.run(_fire(vpsshop_client.app, {**vpsshop_account.headers, "Idempotency-Key": "same"}, 20))
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["server"]["id"] for r in responses}) == 1
    assert len({r.json()["root_password"] for r in responses}) == 1
    me = vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()
    assert me["servers"] == 1 and me["balance_usd"] == 16.01
