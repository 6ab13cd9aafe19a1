"""Helpers of the push tests: a shop's settings for push, the
watcher's mode of a coin, and a top-up's state read from the database (not by a GET, whose chain
check would run a pass of its own)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlmodel import select
from starlette.testclient import TestClient

from vpsshop.payments import engine_for
from vpsshop.payments.models import Topup, TopupPayment


def push_settings_of(coins: dict[str, Any], push: bool = True) -> dict[str, Any]:
    """Overrides of a shop with ``coins`` whose GETs never check the chain (poll_min_seconds is an
    hour): whatever is seen or credited, the watchers found."""
    return {"coins": coins, "topups": {"push": push, "poll_min_seconds": 3600, "expiry_minutes": 60}}


def coin_mode(client: TestClient, code: str) -> str | None:
    coin = client.app.state.ctx.coins[code]  # type: ignore[attr-defined]
    return getattr(coin, "watch_mode", None)


def watched_state(client: TestClient, ref: str) -> tuple[str | None, int | None, str]:
    """(status of the top-up's newest payment, its confirmations, the top-up's status)."""
    ctx = engine_for(client.app.state.ctx).ctx  # type: ignore[attr-defined]
    with ctx.db.session() as session:
        topup = session.exec(select(Topup).where(Topup.ref == ref)).one()
        payment = session.exec(
            select(TopupPayment).where(TopupPayment.topup_id == topup.id).order_by(TopupPayment.id.desc())  # type: ignore[union-attr]
        ).first()
        if payment is None:
            return None, None, topup.status
        return payment.status, payment.confirmations, topup.status


def wait_for(check: Callable[[], bool], seconds: float, what: str, step: float = 0.02) -> float:
    """Seconds until ``check()`` holds; fails after ``seconds``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"{what}: not within {seconds}s")
        time.sleep(step)
    return time.monotonic() - start


def new_topup(client: TestClient, headers: dict[str, str], coin: str, amount: int = 25) -> dict[str, Any]:
    response = client.post("/v1/topups", json={"amount": amount, "coin": coin}, headers=headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


def assert_prompt(seconds: list[float], what: str) -> None:
    """The done criteria of issue 26 on a few samples: median under 1 s, none over 2 s."""
    ordered = sorted(seconds)
    median = ordered[len(ordered) // 2]
    assert median < 1.0 and ordered[-1] < 2.0, f"{what}: {', '.join(f'{s:.2f}' for s in seconds)} s"
