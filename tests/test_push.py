"""Push: the watcher follows litecoind's own notifications (``waitfornewblock`` long polls and
``-walletnotify`` datagrams) in a shop whose background tasks run as in ``vpsshop serve``.

Payments are seen within a second of reaching the node and credited within a second of their
block; a node that goes away is polled and followed again when it is back, losing no payment; an
idle node gets one request per long-poll time limit."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from chain_nodes import Litecoind, balance, random_tpub, running_litecoind
from starlette.testclient import TestClient
from topup_push import assert_prompt, coin_mode, new_topup, push_settings_of, wait_for, watched_state

from vpsshop.chains import HttpJsonClient
from vpsshop.testing import create_test_account


@pytest.fixture(scope="module")
def litecoind() -> Iterator[Litecoind]:
    with running_litecoind("ltc-push") as node:
        yield node


@pytest.fixture
def push_timeout() -> float:
    return 60


@pytest.fixture
def vpsshop_overrides(litecoind: Litecoind, push_timeout: float) -> dict[str, Any]:
    coin = {**litecoind.push_settings(random_tpub(), 1), "push_timeout_seconds": push_timeout}
    return push_settings_of({"LTC": coin})


@pytest.fixture
def vpsshop_app(background_app: Any) -> Any:
    return background_app


def test_payment_is_seen_within_a_second_and_credited_within_a_second_of_its_block(
    vpsshop_client: TestClient, litecoind: Litecoind
) -> None:
    account = create_test_account(vpsshop_client)
    wait_for(lambda: coin_mode(vpsshop_client, "LTC") == "push", 30, "push mode")
    seen: list[float] = []
    credited: list[float] = []
    for _ in range(3):
        topup = new_topup(vpsshop_client, account.headers, "LTC")
        sent = time.monotonic()
        litecoind.pay(topup["deposit_address"], topup["deposit_amount"])
        ref = topup["ref"]
        wait_for(lambda ref=ref: watched_state(vpsshop_client, ref)[0] == "seen", 5, "payment seen")
        seen_after = time.monotonic() - sent
        assert watched_state(vpsshop_client, ref)[1] == 0  # in the mempool
        mined = time.monotonic()
        litecoind.mine(1)
        wait_for(lambda ref=ref: watched_state(vpsshop_client, ref)[2] == "completed", 5, "credited")
        credited.append(time.monotonic() - mined)
        seen.append(seen_after)
    assert_prompt(seen, "seen after the payment")
    assert_prompt(credited, "credited after the block")
    assert balance(vpsshop_client, account.headers) == 75


def test_a_node_that_goes_away_is_polled_and_followed_again_losing_nothing(
    vpsshop_client: TestClient, litecoind: Litecoind
) -> None:
    account = create_test_account(vpsshop_client)
    wait_for(lambda: coin_mode(vpsshop_client, "LTC") == "push", 30, "push mode")
    before = new_topup(vpsshop_client, account.headers, "LTC")
    litecoind.pay(before["deposit_address"], before["deposit_amount"])
    litecoind.stop()  # the push channel (and the node) goes away with a payment in the mempool
    wait_for(lambda: coin_mode(vpsshop_client, "LTC") == "poll", 30, "poll mode")
    health = vpsshop_client.get("/v1/health").json()
    assert {c["id"]: c.get("watch") for c in health["components"] if c["kind"] == "coin"}["LTC"] == "poll"
    litecoind.restart()
    during = new_topup(vpsshop_client, account.headers, "LTC")
    litecoind.pay(during["deposit_address"], during["deposit_amount"])  # before the channel is back
    assert coin_mode(vpsshop_client, "LTC") == "poll"
    litecoind.mine(1)
    for topup in (before, during):
        wait_for(lambda t=topup: watched_state(vpsshop_client, t["ref"])[2] == "completed", 60, "credited")
    wait_for(lambda: coin_mode(vpsshop_client, "LTC") == "push", 90, "push mode again")
    after = new_topup(vpsshop_client, account.headers, "LTC")
    litecoind.pay(after["deposit_address"], after["deposit_amount"])
    litecoind.mine(1)
    wait_for(lambda: watched_state(vpsshop_client, after["ref"])[2] == "completed", 5, "credited by push")
    assert balance(vpsshop_client, account.headers) == 75


@pytest.mark.parametrize("push_timeout", [2.0])
def test_an_idle_node_gets_one_request_per_long_poll(
    vpsshop_client: TestClient, litecoind: Litecoind, monkeypatch: pytest.MonkeyPatch, push_timeout: float
) -> None:
    """With nothing pending, only the long polls reach the node: one per ``push_timeout_seconds``
    (60 by default: one a minute). Counted for 8 s with a 2 s limit."""
    wait_for(lambda: coin_mode(vpsshop_client, "LTC") == "push", 30, "push mode")
    time.sleep(1)  # the pass run when the channel connected is over
    calls: list[str] = []
    post_json: Callable[..., Any] = HttpJsonClient.post_json

    async def counting(self: HttpJsonClient, body: Any, **kw: Any) -> Any:
        calls.append(body.get("method", "?") if isinstance(body, dict) else "batch")
        return await post_json(self, body, **kw)

    monkeypatch.setattr(HttpJsonClient, "post_json", counting)
    window = 8.0
    time.sleep(window)
    assert coin_mode(vpsshop_client, "LTC") == "push"
    assert set(calls) <= {"waitfornewblock"}, calls
    assert 1 <= len(calls) <= window / push_timeout + 1, calls
