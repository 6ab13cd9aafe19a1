"""Push on Solana: the watcher follows the node's WebSocket PubSub ``slotSubscribe`` (the endpoint derived
from ``rpc_url`` as Solana's CLI derives it: the port after the RPC port), so a SOL payment is credited
within a second of its block while the periodic pass waits an hour; health and /metrics say ``push``;
and a PubSub endpoint that goes away leaves the coin polled, losing no payment, then followed again.

The node is ``tests/solana_rpc_double.py``, a TEST DOUBLE of the Solana JSON-RPC whose transactions run
on LiteSVM, with its PubSub endpoint speaking the documented wire format (``slotSubscribe`` -> id,
``slotNotification`` with ``{parent, root, slot}``, ``slotUnsubscribe``)."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest
from chain_nodes import balance
from solana_rpc_double import SolanaRpcDouble
from solders.keypair import Keypair
from starlette.testclient import TestClient
from test_solana import funded_payer, pay, random_mnemonic
from topup_push import assert_prompt, coin_mode, new_topup, push_settings_of, wait_for, watched_state

from vpsshop.payments import engine_for
from vpsshop.testing import TEST_ENCRYPTION_KEY, create_test_account
from vpsshop_solana import encrypt_mnemonic

METRICS_TOKEN = "metrics-token-for-the-sol-push-test-0123"


@pytest.fixture
def watch_interval() -> float:
    return 3600.0


@pytest.fixture
def vpsshop_overrides(solana_node: SolanaRpcDouble, watch_interval: float) -> dict[str, Any]:
    coin = {
        "seed_encrypted": encrypt_mnemonic(TEST_ENCRYPTION_KEY, random_mnemonic()),
        "network": "solana-double",
        "rpc_url": solana_node.url,  # no ws_url: derived, the port after the RPC port
        "confirmations": 1,
    }
    overrides = push_settings_of({"SOL": coin})
    overrides["topups"]["watch_interval_seconds"] = watch_interval
    overrides["metrics"] = {"token": METRICS_TOKEN}
    return overrides


@pytest.fixture
def vpsshop_app(background_app: Any) -> Any:
    return background_app


def pay_topup(node: SolanaRpcDouble, payer: Keypair, topup: dict[str, Any]) -> None:
    lamports = int(Decimal(topup["deposit_amount"]).scaleb(9))
    pay(node, payer, (topup["deposit_address"], lamports))


def watching(client: TestClient, *topups: dict[str, Any]) -> bool:
    """Whether the watcher's set of watched addresses holds those of ``topups``."""
    keys = engine_for(client.app.state.ctx).watcher.keysets["SOL"]  # type: ignore[attr-defined]
    return all(t["deposit_address"] in keys for t in topups)


def push_metric(client: TestClient) -> str:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200, response.text
    lines = [line for line in response.text.splitlines() if line.startswith('vpsshop_watcher_push{group="SOL"}')]
    assert len(lines) == 1, response.text
    return lines[0].rsplit(" ", 1)[1]


def health_mode(client: TestClient) -> str | None:
    health = client.get("/v1/health").json()
    return {c["id"]: c.get("watch") for c in health["components"] if c["kind"] == "coin"}["SOL"]


def test_sol_is_credited_within_a_second_of_its_block(vpsshop_client: TestClient, solana_node: SolanaRpcDouble) -> None:
    coin = vpsshop_client.app.state.ctx.coins["SOL"]  # type: ignore[attr-defined]
    assert coin.ws_url == solana_node.pubsub.url  # derived: http -> ws, port + 1
    account = create_test_account(vpsshop_client)
    wait_for(lambda: coin_mode(vpsshop_client, "SOL") == "push", 30, "push mode")
    assert health_mode(vpsshop_client) == "push"
    assert float(push_metric(vpsshop_client)) == 1
    payer = funded_payer(solana_node)
    credited: list[float] = []
    for _ in range(3):
        topup = new_topup(vpsshop_client, account.headers, "SOL")
        pay_topup(solana_node, payer, topup)
        mined = time.monotonic()
        solana_node.chain.produce_block()
        ref = topup["ref"]
        wait_for(lambda ref=ref: watched_state(vpsshop_client, ref)[2] == "completed", 5, "credited")
        credited.append(time.monotonic() - mined)
    assert_prompt(credited, "credited after the block")
    assert balance(vpsshop_client, account.headers) == 75


@pytest.mark.parametrize("watch_interval", [2.0])
def test_a_pubsub_endpoint_that_goes_away_is_polled_and_followed_again_losing_nothing(
    vpsshop_client: TestClient, solana_node: SolanaRpcDouble
) -> None:
    account = create_test_account(vpsshop_client)
    payer = funded_payer(solana_node)
    wait_for(lambda: coin_mode(vpsshop_client, "SOL") == "push", 30, "push mode")
    before = new_topup(vpsshop_client, account.headers, "SOL")
    during = new_topup(vpsshop_client, account.headers, "SOL")
    # The watcher reads new top-ups at each pass: a pass (this block's) has their addresses before
    # they are paid. (A top-up made, paid and mined within one pass, as only a test double can,
    # would be read after the block that pays it.)
    solana_node.chain.produce_block()
    wait_for(lambda: watching(vpsshop_client, before, during), 5, "the top-ups watched")
    pay_topup(solana_node, payer, before)  # sent; its block comes while the endpoint is away
    solana_node.pubsub.stop()
    try:
        wait_for(lambda: coin_mode(vpsshop_client, "SOL") == "poll", 10, "poll mode")
        assert health_mode(vpsshop_client) == "poll"
        assert float(push_metric(vpsshop_client)) == 0
        solana_node.chain.produce_block()
        pay_topup(solana_node, payer, during)  # paid and mined while the endpoint is away
        solana_node.chain.produce_block()
        for topup in (before, during):  # the polls (every 2 s) credit both, the endpoint still away
            wait_for(lambda t=topup: watched_state(vpsshop_client, t["ref"])[2] == "completed", 15, "credited")
        assert coin_mode(vpsshop_client, "SOL") == "poll"
    finally:
        solana_node.pubsub.start()
    wait_for(lambda: coin_mode(vpsshop_client, "SOL") == "push", 90, "push mode again")
    assert float(push_metric(vpsshop_client)) == 1
    after = new_topup(vpsshop_client, account.headers, "SOL")
    pay_topup(solana_node, payer, after)
    solana_node.chain.produce_block()
    wait_for(lambda: watched_state(vpsshop_client, after["ref"])[2] == "completed", 2, "credited by push")
    assert balance(vpsshop_client, account.headers) == 75
