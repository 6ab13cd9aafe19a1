"""Push on Monero: the watcher follows monerod's ZMQ publisher (``--zmq-pub``), so an XMR payment is
credited within a second of its block; and while a top-up is open it asks the wallet for pool
payments every ``pool_poll_seconds``, so a payment is seen within a second of reaching the node.

(A payment in the pool wakes nothing on the ZMQ channel here: monerod publishes ``txpool_add`` only
once a transaction is fluffed to peers, which an offline regtest node never does. The pool poll is
what sees it; with no top-up open the wallet is left alone.)"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from chain_nodes import MoneroRegtest, balance, running_monero
from starlette.testclient import TestClient
from topup_push import assert_prompt, coin_mode, new_topup, push_settings_of, wait_for, watched_state

from vpsshop.chains import JsonRpcClient
from vpsshop.testing import create_test_account


@pytest.fixture(scope="module")
def monero() -> Iterator[MoneroRegtest]:
    with running_monero("xmr-push") as peers:
        yield peers


@pytest.fixture
def vpsshop_overrides(monero: MoneroRegtest) -> dict[str, Any]:
    account = int(monero.call(monero.shop_url, "create_account")["account_index"])
    coin = {**monero.settings(confirmations=1), "account_index": account, "zmq_pub": monero.zmq_pub}
    return push_settings_of({"XMR": coin})


@pytest.fixture
def vpsshop_app(background_app: Any) -> Any:
    return background_app


def test_xmr_is_seen_within_a_second_and_credited_within_a_second_of_its_block(
    vpsshop_client: TestClient, monero: MoneroRegtest
) -> None:
    account = create_test_account(vpsshop_client)
    wait_for(lambda: coin_mode(vpsshop_client, "XMR") == "push", 30, "push mode")
    seen: list[float] = []
    credited: list[float] = []
    for _ in range(3):
        topup = new_topup(vpsshop_client, account.headers, "XMR", 30)
        ref = topup["ref"]
        txid = monero.pay(topup["deposit_address"], int(Decimal(topup["deposit_amount"]) * 10**12))
        sent = time.monotonic()
        wait_for(lambda ref=ref: watched_state(vpsshop_client, ref)[1] == 0, 10, "seen in the pool")
        seen.append(time.monotonic() - sent)
        mined = monero.mine_until_mined(txid)
        wait_for(lambda ref=ref: watched_state(vpsshop_client, ref)[2] == "completed", 10, "credited")
        credited.append(time.monotonic() - mined)
    assert_prompt(seen, "seen in the pool")
    assert_prompt(credited, "credited after the block")
    assert balance(vpsshop_client, account.headers) == 90


def test_with_no_topup_open_the_wallet_gets_no_request(
    vpsshop_client: TestClient, monero: MoneroRegtest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No top-up open, the channel up: neither the pool poll nor the periodic pass (every 15 s by
    default) asks the wallet anything; a block still wakes the watcher."""
    wait_for(lambda: coin_mode(vpsshop_client, "XMR") == "push", 30, "push mode")
    time.sleep(1.5)  # a pass woken by the channel's connection has ended
    calls: list[str] = []
    call: Callable[..., Any] = JsonRpcClient.call

    async def counting(self: JsonRpcClient, method: str, *params: Any, **named: Any) -> Any:
        calls.append(method)
        return await call(self, method, *params, **named)

    monkeypatch.setattr(JsonRpcClient, "call", counting)
    time.sleep(16)
    assert coin_mode(vpsshop_client, "XMR") == "push"
    assert calls == []
    monero.mine(1)
    wait_for(lambda: "get_transfers" in calls, 5, "a pass woken by the block")
