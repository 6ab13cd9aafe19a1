"""Push on an EVM node: the watcher follows anvil's ``eth_subscribe`` ``newHeads`` over WebSocket (the
same port as its HTTP JSON-RPC), so an ETH payment is credited within a second of its block, an idle
node gets no request, and a node that goes away is polled, then followed again, losing nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from chain_nodes import balance
from evm_peers import CHAIN_ID, Anvil, random_xpub, rpc
from starlette.testclient import TestClient
from topup_push import assert_prompt, coin_mode, new_topup, push_settings_of, wait_for, watched_state

from vpsshop.chains import HttpJsonClient
from vpsshop.testing import create_test_account


@pytest.fixture
def vpsshop_overrides(anvil: Anvil) -> dict[str, Any]:
    coin = {
        "xpub": random_xpub(),
        "network": "anvil",
        "chain_id": CHAIN_ID,
        "rpc_url": anvil.url,
        "ws_url": anvil.url.replace("http://", "ws://"),
        "confirmations": 1,
    }
    return push_settings_of({"ETH": coin})


@pytest.fixture
def vpsshop_app(background_app: Any) -> Any:
    return background_app


def pay(anvil: Anvil, topup: dict[str, Any]) -> str:
    sender = rpc(anvil.url, "eth_accounts")[0]
    wei = int(float(topup["deposit_amount"]) * 10**18)  # the test's own amount: a few wei short is fine
    return str(
        rpc(anvil.url, "eth_sendTransaction", [{"from": sender, "to": topup["deposit_address"], "value": hex(wei)}])
    )


def test_eth_is_credited_within_a_second_of_its_block(vpsshop_client: TestClient, anvil: Anvil) -> None:
    account = create_test_account(vpsshop_client)
    wait_for(lambda: coin_mode(vpsshop_client, "ETH") == "push", 30, "push mode")
    credited: list[float] = []
    for _ in range(3):
        topup = new_topup(vpsshop_client, account.headers, "ETH")
        pay(anvil, topup)
        mined = time.monotonic()
        anvil.mine(1)
        ref = topup["ref"]
        wait_for(lambda ref=ref: watched_state(vpsshop_client, ref)[2] == "completed", 5, "credited")
        credited.append(time.monotonic() - mined)
    assert_prompt(credited, "credited after the block")
    assert balance(vpsshop_client, account.headers) > 74


def test_an_idle_node_gets_no_request(
    vpsshop_client: TestClient, anvil: Anvil, monkeypatch: pytest.MonkeyPatch
) -> None:
    wait_for(lambda: coin_mode(vpsshop_client, "ETH") == "push", 30, "push mode")
    time.sleep(1)
    calls: list[Any] = []
    post_json: Callable[..., Any] = HttpJsonClient.post_json

    async def counting(self: HttpJsonClient, body: Any, **kw: Any) -> Any:
        calls.append(body)
        return await post_json(self, body, **kw)

    monkeypatch.setattr(HttpJsonClient, "post_json", counting)
    time.sleep(6)
    assert coin_mode(vpsshop_client, "ETH") == "push"
    assert calls == []
