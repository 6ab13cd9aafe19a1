"""The BTC/LTC plugin: BIP-84 derivation against the test vectors, and LTC top-ups on a real
``litecoind -regtest`` started by this module (pay, mine, confirm, credit once; reorgs; restarts)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from chain_nodes import Litecoind, balance, get, random_tpub, run_pass, running_litecoind
from starlette.testclient import TestClient

from vpsshop.hdkeys import ExtendedPublicKey, decode_segwit_v0, p2wpkh_address
from vpsshop.testing import create_test_account

BIP84_ZPUB = (
    "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNfE3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs"
)


def test_bip84_test_vectors() -> None:
    """BIP-84's vectors for the mnemonic "abandon ... about", account 0, from the account zpub."""
    account = ExtendedPublicKey.parse(BIP84_ZPUB)
    assert p2wpkh_address("bc", account.derive(0, 0).public_key) == "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu"
    assert p2wpkh_address("bc", account.derive(0, 1).public_key) == "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"
    assert p2wpkh_address("bc", account.derive(1, 0).public_key) == "bc1q8c6fshw2dlwun7ekn9qwf37cu2rn755upcp6el"
    assert account.derive(0, 0).public_key.hex() == "0330d54fd0dd420a6e5f8d3624f5f3482cae350f79d5f0753bf5beef9c2d91af3c"


def test_bitcoin_plugin_derives_the_vectors_and_refuses_private_keys() -> None:
    from vpsshop.errors import ConfigError
    from vpsshop_bitcoin import Bitcoin

    coin = Bitcoin.from_settings({"xpub": BIP84_ZPUB}, sandbox=False, where="coins.BTC")
    assert coin.derive_address(1).address == "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g"
    assert coin.network == "bitcoin"
    assert coin.payment_uri(coin.derive_address(1).address, 41667, "tp_x") == (
        "bitcoin:bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g?amount=0.00041667&label=tp_x"
    )
    zprv = (
        "zprvAdG4iTXWBoARxkkzNpNh8r6Qag3irQB8PzEMkAFeTRXxHpbF9z4QgEvBRmfvqWvGp42t42nvgGpNgYSJA9iefm1yYNZKEm7z6q"
        "UWCroSQnE"
    )
    with pytest.raises(ConfigError, match="PRIVATE"):
        Bitcoin.from_settings({"xpub": zprv}, sandbox=False, where="coins.BTC")
    with pytest.raises(ConfigError, match=r"coins\.BTC\.xpub"):
        Bitcoin.from_settings({}, sandbox=False, where="coins.BTC")


# ---- LTC on a real litecoind -regtest -------------------------------------------------------------


@pytest.fixture(scope="session")
def litecoind() -> Iterator[Litecoind]:
    with running_litecoind("ltc") as node:
        yield node


@pytest.fixture
def ltc_xpub() -> str:
    return random_tpub()


@pytest.fixture
def confirmations() -> int:
    return 2


@pytest.fixture
def poll_min_seconds() -> float:
    return 0


@pytest.fixture
def vpsshop_overrides(
    litecoind: Litecoind, ltc_xpub: str, confirmations: int, poll_min_seconds: float
) -> dict[str, Any]:
    return {
        "coins": {"LTC": litecoind.settings(ltc_xpub, confirmations)},
        "topups": {"poll_min_seconds": poll_min_seconds, "expiry_minutes": 60},
    }


def new_topup(client: TestClient, headers: dict[str, str], amount: int = 50) -> dict[str, Any]:
    response = client.post("/v1/topups", json={"amount": amount, "coin": "LTC"}, headers=headers)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["deposit_network"] == "litecoin-regtest"
    decode_segwit_v0("rltc", body["deposit_address"])
    assert body["deposit_amount"] == "0.62500000" if amount == 50 else True
    return body


def test_pay_seen_then_completed_and_credited_once(vpsshop_client: TestClient, litecoind: Litecoind) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    run_pass(vpsshop_client)  # the watcher starts at the tip
    topup = new_topup(vpsshop_client, h)
    litecoind.pay(topup["deposit_address"], topup["deposit_amount"])
    seen = get(vpsshop_client, h, topup["ref"])  # the GET checks the chain: mempool payment
    assert (seen["status"], seen["payment_status"], seen["confirmations"]) == ("pending", "seen", 0)
    assert seen["amount_received"] == "0.62500000"
    litecoind.mine(1)
    one = get(vpsshop_client, h, topup["ref"])
    assert (one["status"], one["payment_status"], one["confirmations"]) == ("pending", "seen", 1)
    assert balance(vpsshop_client, h) == 0
    litecoind.mine(1)
    done = get(vpsshop_client, h, topup["ref"])
    assert (done["status"], done["payment_status"], done["credited_usd"]) == ("completed", "confirmed", 50)
    assert balance(vpsshop_client, h) == 50
    litecoind.mine(3)
    for _ in range(3):
        run_pass(vpsshop_client)
        get(vpsshop_client, h, topup["ref"])
    assert balance(vpsshop_client, h) == 50


def test_two_payments_to_one_address_under_and_over(vpsshop_client: TestClient, litecoind: Litecoind) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    run_pass(vpsshop_client)
    twice = new_topup(vpsshop_client, h)
    under = new_topup(vpsshop_client, h)
    over = new_topup(vpsshop_client, h)
    litecoind.pay(twice["deposit_address"], "0.5")
    litecoind.pay(twice["deposit_address"], "0.25")
    litecoind.pay(under["deposit_address"], "0.3125")  # half: 25 USD at 80 USD/LTC
    litecoind.pay(over["deposit_address"], "1.25")  # double: 100 USD
    litecoind.mine(2)
    run_pass(vpsshop_client)
    assert get(vpsshop_client, h, twice["ref"])["credited_usd"] == 60
    assert get(vpsshop_client, h, under["ref"])["credited_usd"] == 25
    assert get(vpsshop_client, h, over["ref"])["credited_usd"] == 100
    assert get(vpsshop_client, h, under["ref"])["status"] == "completed"
    assert balance(vpsshop_client, h) == 185


def test_late_payments_after_expiry_and_cancel_are_credited(
    vpsshop_client: TestClient, litecoind: Litecoind, vpsshop_clock: Any
) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    run_pass(vpsshop_client)
    expiring = new_topup(vpsshop_client, h)
    cancelled = new_topup(vpsshop_client, h)
    response = vpsshop_client.post(f"/v1/topups/{cancelled['ref']}/cancel", headers=h)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    vpsshop_clock.advance(minutes=61)
    assert get(vpsshop_client, h, expiring["ref"])["status"] == "expired"
    litecoind.pay(expiring["deposit_address"], "0.625")
    litecoind.pay(cancelled["deposit_address"], "0.625")
    litecoind.mine(2)
    run_pass(vpsshop_client)
    late = get(vpsshop_client, h, expiring["ref"])
    assert (late["status"], late["credited_usd"]) == ("completed", 50)
    assert get(vpsshop_client, h, cancelled["ref"])["status"] == "completed"
    assert balance(vpsshop_client, h) == 100


def test_watcher_restart_midway(vpsshop_settings: Any, vpsshop_clock: Any, litecoind: Litecoind) -> None:
    from vpsshop.app import create_app

    with TestClient(create_app(vpsshop_settings, clock=vpsshop_clock, background=False)) as first:
        account = create_test_account(first)
        run_pass(first)
        topup = new_topup(first, account.headers)
        litecoind.pay(topup["deposit_address"], topup["deposit_amount"])
        litecoind.mine(1)
        run_pass(first)
        assert get(first, account.headers, topup["ref"])["payment_status"] == "seen"
    litecoind.mine(1)  # while no watcher runs
    with TestClient(create_app(vpsshop_settings, clock=vpsshop_clock, background=False)) as second:
        run_pass(second)
        assert get(second, account.headers, topup["ref"])["status"] == "completed"
        run_pass(second)
        assert balance(second, account.headers) == 50


@pytest.mark.parametrize("confirmations", [3])
def test_payment_reorganised_away_credits_nothing(vpsshop_client: TestClient, litecoind: Litecoind) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h)
    txid = litecoind.pay(topup["deposit_address"], topup["deposit_amount"], replaceable=True)
    [block] = litecoind.mine(1)
    run_pass(vpsshop_client)
    assert get(vpsshop_client, h, topup["ref"])["confirmations"] == 1
    # The block is orphaned and the transaction replaced by a double-spend back to the node's wallet.
    litecoind.rpc("invalidateblock", block)
    tx = litecoind.rpc("getrawtransaction", txid, True)
    inputs = [{"txid": vin["txid"], "vout": vin["vout"]} for vin in tx["vin"]]
    total = sum(Decimal(str(litecoind.rpc("gettxout", i["txid"], i["vout"], False)["value"])) for i in inputs)
    refund = litecoind.rpc("getnewaddress", "", "bech32")
    raw = litecoind.rpc("createrawtransaction", inputs, [{refund: str(total - Decimal("0.01"))}])
    signed = litecoind.rpc("signrawtransactionwithwallet", raw)
    litecoind.rpc("sendrawtransaction", signed["hex"])
    litecoind.mine(4)
    run_pass(vpsshop_client)
    after = get(vpsshop_client, h, topup["ref"])
    assert after["status"] == "pending" and after["payment_status"] == "awaiting_payment"
    assert after["credited_usd"] == 0
    assert balance(vpsshop_client, h) == 0


def test_two_workers_never_double_credit(vpsshop_settings: Any, vpsshop_clock: Any, litecoind: Litecoind) -> None:
    """Two apps (two workers) on one database run passes at the same time over the same blocks."""
    from vpsshop.app import create_app

    with (
        TestClient(create_app(vpsshop_settings, clock=vpsshop_clock, background=False)) as one,
        TestClient(create_app(vpsshop_settings, clock=vpsshop_clock, background=False)) as two,
    ):
        account = create_test_account(one)
        run_pass(one)
        run_pass(two)
        topups = [new_topup(one, account.headers) for _ in range(4)]
        for topup in topups:
            litecoind.pay(topup["deposit_address"], topup["deposit_amount"])
        litecoind.mine(2)
        errors: list[BaseException] = []

        def work(client: TestClient) -> None:
            try:
                for _ in range(3):
                    run_pass(client)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(c,)) for c in (one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert balance(one, account.headers) == 200
        assert all(get(two, account.headers, t["ref"])["status"] == "completed" for t in topups)


def test_health_reports_the_node(vpsshop_client: TestClient) -> None:
    body = vpsshop_client.get("/v1/health").json()
    assert "litecoin-regtest at height" in str(body)


@pytest.mark.parametrize("confirmations", [1])
def test_worker_processes_confirm_topups_nobody_polls(
    vpsshop_client: TestClient, vpsshop_settings: Any, litecoind: Litecoind, ltc_xpub: str, tmp_path: Any
) -> None:
    """Two `vpsshop worker` processes on one database credit a payment nobody polls, once."""
    import json
    import os
    import subprocess
    import sys
    import time

    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

    account = create_test_account(vpsshop_client)
    topup = new_topup(vpsshop_client, account.headers)
    ltc = litecoind.settings(ltc_xpub, 1)
    config = tmp_path / "worker.toml"
    lines = [
        'mode = "sandbox"',
        f"database_url = {json.dumps(vpsshop_settings.database_url)}",
        f'secret_key = "{TEST_SECRET_KEY}"',
        f'encryption_key = "{TEST_ENCRYPTION_KEY}"',
        "[topups]",
        "watch_interval_seconds = 0.5",
        "[coins.LTC]",
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in ltc.items()]
    config.write_text("\n".join(lines) + "\n")
    argv = [
        sys.executable,
        "-c",
        "import sys; from vpsshop.cli import main; sys.exit(main())",
        "worker",
        "--config",
        str(config),
    ]
    workers = [
        subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        for _ in range(2)
    ]
    try:
        time.sleep(3)  # both workers have set their cursor at the tip
        litecoind.pay(topup["deposit_address"], topup["deposit_amount"])
        litecoind.mine(1)
        deadline = time.time() + 30
        from sqlmodel import select

        from vpsshop.payments.models import Topup

        ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
        while time.time() < deadline:
            with ctx.db.session() as session:  # read the row, not GET: a GET would run a pass itself
                row = session.exec(select(Topup).where(Topup.ref == topup["ref"])).one()
            if row.status == "completed":
                break
            time.sleep(0.5)
        assert row.status == "completed", [w.poll() for w in workers]
        time.sleep(2)  # more passes by both workers
        assert balance(vpsshop_client, account.headers) == 50
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()


@pytest.mark.parametrize("poll_min_seconds", [3600])
def test_polling_is_rate_limited(vpsshop_client: TestClient, litecoind: Litecoind) -> None:
    """GETs within poll_min_seconds of the last chain check answer from the database alone."""
    account = create_test_account(vpsshop_client)
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, account.headers)
    litecoind.pay(topup["deposit_address"], topup["deposit_amount"])
    litecoind.mine(2)
    for _ in range(5):
        assert get(vpsshop_client, account.headers, topup["ref"])["payment_status"] == "awaiting_payment"
    run_pass(vpsshop_client)  # the watcher
    assert get(vpsshop_client, account.headers, topup["ref"])["status"] == "completed"
