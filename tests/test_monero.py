"""The XMR plugin on real Monero peers started by this module: ``monerod --regtest --offline`` and
``monero-wallet-rpc`` with the shop's view-only wallet; a second wallet-rpc mines and pays."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from chain_nodes import MoneroRegtest, balance, eventually, get, run_pass, running_monero
from starlette.testclient import TestClient

from vpsshop.testing import create_test_account


@pytest.fixture(scope="session")
def monero() -> Iterator[MoneroRegtest]:
    with running_monero("xmr") as peers:
        yield peers


@pytest.fixture
def xmr_account(monero: MoneroRegtest) -> int:
    """A fresh wallet account per test, so tests on one shared chain never share a subaddress."""
    return int(monero.call(monero.shop_url, "create_account")["account_index"])


@pytest.fixture
def confirmations() -> int:
    return 2


@pytest.fixture
def vpsshop_overrides(monero: MoneroRegtest, xmr_account: int, confirmations: int) -> dict[str, Any]:
    return {
        "coins": {"XMR": {**monero.settings(confirmations=confirmations), "account_index": xmr_account}},
        "topups": {"poll_min_seconds": 0},
    }


def xmr_topup(client: TestClient, headers: dict[str, str], amount: int = 30) -> dict[str, Any]:
    response = client.post("/v1/topups", json={"amount": amount, "coin": "XMR"}, headers=headers)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["deposit_network"] == "monero-regtest"
    return body


def atomic(xmr: str) -> int:
    return int(Decimal(xmr) * 10**12)


def test_derived_subaddresses_match_the_wallet(
    vpsshop_client: TestClient, monero: MoneroRegtest, xmr_account: int
) -> None:
    account = create_test_account(vpsshop_client)
    topups = [xmr_topup(vpsshop_client, account.headers) for _ in range(3)]
    answer = monero.call(monero.shop_url, "get_address", account_index=xmr_account, address_index=[1, 2, 3])
    assert [a["address"] for a in answer["addresses"]] == [t["deposit_address"] for t in topups]


def test_pay_seen_then_completed_once(vpsshop_client: TestClient, monero: MoneroRegtest) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    run_pass(vpsshop_client)
    topup = xmr_topup(vpsshop_client, h)
    assert topup["deposit_amount"] == "0.200000000000"
    txid = monero.pay(topup["deposit_address"], atomic(topup["deposit_amount"]))
    seen = eventually(vpsshop_client, h, topup["ref"], payment_status="seen")
    assert (seen["status"], seen["amount_received"]) == ("pending", "0.200000000000")
    monero.mine_until_mined(txid)
    assert eventually(vpsshop_client, h, topup["ref"], confirmations=1)["status"] == "pending"
    monero.mine(1)
    done = eventually(vpsshop_client, h, topup["ref"], status="completed")
    assert (done["status"], done["credited_usd"]) == ("completed", 30)
    monero.mine(2)
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 30


def test_twice_under_over_and_restart(vpsshop_settings: Any, vpsshop_clock: Any, monero: MoneroRegtest) -> None:
    from vpsshop.app import create_app

    with TestClient(create_app(vpsshop_settings, clock=vpsshop_clock, background=False)) as first:
        account = create_test_account(first)
        h = account.headers
        run_pass(first)
        twice = xmr_topup(first, h)
        under = xmr_topup(first, h)
        over = xmr_topup(first, h)
        monero.pay(twice["deposit_address"], atomic("0.1"))
        monero.pay(under["deposit_address"], atomic("0.1"))  # 15 USD of 30
        monero.pay(over["deposit_address"], atomic("0.4"))  # 60 USD of 30
        monero.mine(1)
        monero.pay(twice["deposit_address"], atomic("0.2"))
        assert eventually(first, h, twice["ref"], payment_status="seen")["credited_usd"] == 0
    monero.mine(2)  # while no watcher runs
    with TestClient(create_app(vpsshop_settings, clock=vpsshop_clock, background=False)) as second:
        eventually(second, h, under["ref"], credited_usd=15)
        eventually(second, h, over["ref"], credited_usd=60)
        monero.mine(1)
        both = eventually(second, h, twice["ref"], credited_usd=45)
        assert (both["status"], both["credited_usd"], both["amount_received"]) == ("completed", 45, "0.300000000000")
        run_pass(second)
        assert balance(second, h) == 120


def test_late_payment_after_expiry(vpsshop_client: TestClient, monero: MoneroRegtest, vpsshop_clock: Any) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    run_pass(vpsshop_client)
    topup = xmr_topup(vpsshop_client, h)
    vpsshop_clock.advance(hours=2)
    assert get(vpsshop_client, h, topup["ref"])["status"] == "expired"
    txid = monero.pay(topup["deposit_address"], atomic(topup["deposit_amount"]))
    monero.mine_until_mined(txid)  # a block template may predate the tx: mining two blocks blindly gave it one
    monero.mine(1)
    late = eventually(vpsshop_client, h, topup["ref"], status="completed")
    assert (late["status"], late["credited_usd"]) == ("completed", 30)


def test_config_refuses_a_view_key_of_another_wallet() -> None:
    from vpsshop.errors import ConfigError
    from vpsshop_monero import SANDBOX_ADDRESS, SANDBOX_VIEW_KEY, Monero
    from vpsshop_monero.addresses import hash_to_scalar, keys_from_spend_secret

    other_address, other_view = keys_from_spend_secret(
        hash_to_scalar(b"another wallet").to_bytes(32, "little"), "stagenet"
    )
    with pytest.raises(ConfigError, match="does not belong"):
        Monero.from_settings(
            {"address": SANDBOX_ADDRESS, "view_key": other_view, "network": "stagenet"},
            sandbox=False,
            where="coins.XMR",
        )
    with pytest.raises(ConfigError, match="stagenet address"):
        Monero.from_settings(
            {"address": SANDBOX_ADDRESS, "view_key": SANDBOX_VIEW_KEY, "network": "mainnet"},
            sandbox=False,
            where="coins.XMR",
        )
    coin = Monero.from_settings(
        {"address": other_address, "view_key": other_view, "network": "stagenet"}, sandbox=False, where="coins.XMR"
    )
    assert coin.derive_address(1).address.startswith("7") and coin.derive_address(1).watch_key == "1"
    assert SANDBOX_VIEW_KEY not in repr(coin.config)


@pytest.mark.parametrize("confirmations", [3])
def test_payment_dropped_before_confirmations_credits_nothing(
    vpsshop_client: TestClient, monero: MoneroRegtest
) -> None:
    """The block holding the payment is popped and the transaction flushed from the pool
    (monerod's pop_blocks and flush_txpool): the payment is dropped and nothing is credited."""
    account = create_test_account(vpsshop_client)
    h = account.headers
    run_pass(vpsshop_client)
    topup = xmr_topup(vpsshop_client, h)
    txid = monero.pay(topup["deposit_address"], atomic(topup["deposit_amount"]))
    monero.mine_until_mined(txid)
    seen = eventually(vpsshop_client, h, topup["ref"], confirmations=1)
    assert seen["payment_status"] == "seen"
    monero.drop(txid, blocks=1)
    monero.mine(3)
    after = eventually(vpsshop_client, h, topup["ref"], payment_status="awaiting_payment")
    assert (after["status"], after["payment_status"], after["credited_usd"]) == ("pending", "awaiting_payment", 0)
    assert balance(vpsshop_client, h) == 0
