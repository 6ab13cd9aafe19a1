"""Standing deposit addresses on a real ``litecoind -regtest``, through the shipped ``vpsshop serve`` and
``vpsshop worker``: one address per account and coin at the documented derivation index, a receipt
below the minimum held until a second one makes it up, each receipt credited once as a completed
top-up of its own with its events, and a worker restarted over the same blocks crediting nothing
again."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from chain_nodes import Litecoind, random_tpub, running_litecoind
from served import VPSSHOP, serve, shop_env, worker

from vpsshop.coins import STANDING_INDEX_BASE
from vpsshop.hdkeys import ExtendedPublicKey, p2wpkh_address


@pytest.fixture(scope="module")
def litecoind() -> Iterator[Litecoind]:
    with running_litecoind("ltc-deposit") as node:
        yield node


def _env(database_url: str, litecoind: Litecoind, xpub: str) -> dict[str, str]:
    ltc = litecoind.settings(xpub, 1)
    extra = {f"VPSSHOP__COINS__LTC__{key.upper()}": str(value) for key, value in ltc.items()}
    return shop_env(
        database_url,
        VPSSHOP__SERVER__ACCESS_LOG="false",
        VPSSHOP__TOPUPS__WATCH_INTERVAL_SECONDS="0.5",
        VPSSHOP__TOPUPS__STANDING_MINIMUM_USD="5",
        **extra,
    )


def _balance(base: str, headers: dict[str, str]) -> Decimal:
    return Decimal(str(httpx.get(f"{base}/account", headers=headers).json()["balance_usd"]))


def _until(what: str, check: Any, logs: Any, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds} s:\n{logs()}")
        time.sleep(0.25)


def _topup_events(base: str, headers: dict[str, str], kind: str = "topup.*") -> list[dict[str, Any]]:
    body = httpx.get(f"{base}/events", headers=headers, params={"type": kind, "limit": 100}).json()
    return list(body["events"])


def _address_events(base: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The ``deposit_address.*`` events, oldest first."""
    return _topup_events(base, headers, "deposit_address.*")


def _stuck_deposits(env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [VPSSHOP, "admin", "stuck", "--minutes", "0"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout)["deposits"])


def test_standing_address_holds_credits_once_and_survives_a_restart(
    tmp_path: Path, vpsshop_database_url: str, litecoind: Litecoind
) -> None:
    xpub = random_tpub()
    env = _env(vpsshop_database_url, litecoind, xpub)
    db = sa.create_engine(vpsshop_database_url)
    with serve(tmp_path, env, "--no-worker") as shop:
        account = httpx.post(f"{shop.base}/account").json()
        h = {"Authorization": f"Bearer {account['api_key']}"}
        first = httpx.post(f"{shop.base}/deposit-addresses", headers=h, json={"coin": "ltc"})
        assert first.status_code == 200, first.text
        body = first.json()
        # the documented range: index 2**30 + 1 of the account key's receive branch
        expected = p2wpkh_address("rltc", ExtendedPublicKey.parse(xpub).derive(0, STANDING_INDEX_BASE + 1).public_key)
        assert body["address"] == expected
        assert body["qr_data_uri"].startswith("data:image/png;base64,")
        assert (body["coin"], body["network"], body["minimum_usd"], body["held_amount"]) == (
            "LTC",
            "litecoin-regtest",
            5,
            "0.00000000",
        )
        again = httpx.post(f"{shop.base}/deposit-addresses", headers=h, json={"coin": "LTC"}).json()
        assert again["address"] == expected  # one per account and coin
        other = httpx.post(f"{shop.base}/account").json()
        theirs = httpx.post(
            f"{shop.base}/deposit-addresses",
            headers={"Authorization": f"Bearer {other['api_key']}"},
            json={"coin": "LTC"},
        ).json()
        assert theirs["address"] != expected
        bad = httpx.post(f"{shop.base}/deposit-addresses", headers=h, json={"coin": "DOGE"})
        assert (bad.status_code, bad.json()["error"]) == (400, "invalid_coin")
        listed = httpx.get(f"{shop.base}/deposit-addresses", headers=h).json()["deposit_addresses"]
        assert [a["address"] for a in listed] == [expected]

        with worker(tmp_path, env) as w:

            def cursor() -> str | None:
                with db.connect() as conn:
                    return conn.execute(sa.text("SELECT cursor FROM chain_scan_cursors")).scalar_one_or_none()

            cursor_before = _until("the worker's cursor at the tip", cursor, w.output)
            # 0.05 LTC at 80 USD is 4 USD: below the 5 USD minimum, held
            litecoind.pay(expected, "0.05")
            litecoind.mine(1)

            def held() -> bool:
                row = httpx.get(f"{shop.base}/deposit-addresses", headers=h).json()["deposit_addresses"][0]
                return bool(row["held_amount"] == "0.05000000")

            _until("the small receipt held", held, w.output)
            assert _balance(shop.base, h) == 0
            assert _topup_events(shop.base, h) == []
            # no top-up yet, but the customer hears of it: seen, then held with what is held in all
            seen, held_event = _address_events(shop.base, h)
            assert (seen["type"], held_event["type"]) == (
                "deposit_address.payment_seen",
                "deposit_address.payment_held",
            )
            for event in (seen, held_event):
                data = event["data"]
                assert (data["object"], data["address"], data["coin"], data["minimum_usd"]) == (
                    "deposit_address",
                    expected,
                    "LTC",
                    5,
                )
                assert (data["payment"]["amount"], data["payment"]["credited_usd"]) == ("0.05000000", None)
            assert held_event["data"]["held_amount"] == "0.05000000"
            assert held_event["data"]["payment"]["confirmations"] >= 1
            # the operator's list of what waits shows the held receipt
            [waiting] = _stuck_deposits(env, tmp_path)
            assert (waiting["address"], waiting["coin"], waiting["payment_status"], waiting["amount_atomic"]) == (
                expected,
                "LTC",
                "held",
                "5000000",
            )
            assert waiting["account_id"] == account["user_id"]
            # 0.1 LTC more (8 USD): with the held 4 USD, one top-up of 12 USD
            litecoind.pay(expected, "0.1")
            litecoind.mine(1)
            _until("the receipts credited", lambda: _balance(shop.base, h) == 12, w.output)
            # a third receipt on its own: a second top-up
            litecoind.pay(expected, "0.25")
            litecoind.mine(1)
            _until("the third receipt credited", lambda: _balance(shop.base, h) == 32, w.output)

        with db.connect() as conn:
            refs = (
                conn.execute(sa.text("SELECT ref FROM topups WHERE deposit_address_id IS NOT NULL ORDER BY id"))
                .scalars()
                .all()
            )
            # a rescan from before the first receipt, by a new worker
            conn.execute(sa.text("UPDATE chain_scan_cursors SET cursor = :c"), {"c": cursor_before})
            conn.commit()
        assert len(refs) == 2
        one = httpx.get(f"{shop.base}/topups/{refs[0]}", headers=h).json()
        assert (one["status"], one["credited_usd"], one["amount_received"], one["deposit_address"]) == (
            "completed",
            12,
            "0.15000000",
            expected,
        )
        two = httpx.get(f"{shop.base}/topups/{refs[1]}", headers=h).json()
        assert (two["status"], two["credited_usd"], two["amount_received"]) == ("completed", 20, "0.25000000")

        with worker(tmp_path, env) as w:

            def rescanned() -> bool:
                with db.connect() as conn:
                    return bool(
                        conn.execute(sa.text("SELECT cursor FROM chain_scan_cursors")).scalar_one() != cursor_before
                    )

            _until("the new worker's rescan", rescanned, w.output)
            time.sleep(2)  # more passes
        assert _balance(shop.base, h) == 32
        with db.connect() as conn:
            assert (
                conn.execute(sa.text("SELECT count(*) FROM topups WHERE deposit_address_id IS NOT NULL")).scalar_one()
                == 2
            )
            assert conn.execute(sa.text("SELECT count(*) FROM ledger_entries WHERE reason = 'topup'")).scalar_one() == 3
        address_kinds = [e["type"] for e in _address_events(shop.base, h)]
        # one sighting per receipt (the rescan announced none again), one hold
        assert address_kinds.count("deposit_address.payment_seen") == 3, address_kinds
        assert address_kinds.count("deposit_address.payment_held") == 1, address_kinds
        assert _stuck_deposits(env, tmp_path) == []  # nothing held or waiting any more
        assert _address_events(shop.base, {"Authorization": f"Bearer {other['api_key']}"}) == []
        kinds = [e["type"] for e in reversed(_topup_events(shop.base, h))]
        assert kinds.count("topup.created") == 2
        assert kinds.count("topup.completed") == 2
        assert kinds.count("topup.payment_confirmed") == 3
        assert "topup.late_payment" not in kinds and "topup.underpaid" not in kinds
        assert _balance(shop.base, {"Authorization": f"Bearer {other['api_key']}"}) == 0


# ---- ETH and USDT on a real anvil ------------------------------------------------------------------


@pytest.fixture(scope="module")
def evm_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from evm_peers import start_evm_chain

    chain = start_evm_chain(tmp_path_factory.mktemp("evm-deposit"))
    try:
        yield chain
    finally:
        chain.anvil.stop()


def test_eth_standing_address_credits_eth_and_a_token_sent_to_it(
    tmp_path: Path, vpsshop_database_url: str, evm_chain: Any
) -> None:
    from evm_peers import CHAIN_ID, random_xpub

    from vpsshop_evm import public_key_to_address

    xpub = random_xpub()
    common = (
        f'xpub = "{xpub}"\nnetwork = "anvil"\nchain_id = {CHAIN_ID}\nrpc_url = "{evm_chain.url}"\nconfirmations = 2\n'
    )
    config = tmp_path / "shop.toml"
    config.write_text(
        f"[coins.ETH]\n{common}[coins.USDT]\n{common}"
        f'contract = "{evm_chain.token.address}"\ndecimals = 6\n[topups]\nwatch_interval_seconds = 0.5\n'
    )
    env = shop_env(vpsshop_database_url, VPSSHOP__SERVER__ACCESS_LOG="false")
    with serve(tmp_path, env, "--config", str(config)) as shop:  # the shop's own worker watches the chain
        account = httpx.post(f"{shop.base}/account").json()
        h = {"Authorization": f"Bearer {account['api_key']}"}
        made = httpx.post(f"{shop.base}/deposit-addresses", headers=h, json={"coin": "ETH"})
        assert made.status_code == 200, made.text
        address = made.json()["address"]
        key = ExtendedPublicKey.parse(xpub).derive(0, STANDING_INDEX_BASE + 1)
        assert address == public_key_to_address(key.uncompressed())  # <account>/0/2**30+1
        usdt = httpx.post(f"{shop.base}/deposit-addresses", headers=h, json={"coin": "USDT"}).json()["address"]
        assert usdt not in (address,)
        time.sleep(2)  # the watcher is at the tip
        evm_chain.pay_eth(address, 10**16)  # 0.01 ETH at 3000 USD: 30 USD
        evm_chain.anvil.mine(2)
        _until("the ETH receipt credited", lambda: _balance(shop.base, h) == 30, shop.output)
        evm_chain.pay_token(address, 7_000_000)  # 7 USDT sent to the ETH address
        evm_chain.anvil.mine(2)
        _until("the token receipt credited", lambda: _balance(shop.base, h) == 37, shop.output)
        time.sleep(2)  # more passes credit nothing more
        assert _balance(shop.base, h) == 37
        events = _topup_events(shop.base, h)
        completed = [e["data"] for e in events if e["type"] == "topup.completed"]
        assert sorted((d["coin"], d["credited_usd"], d["deposit_address"]) for d in completed) == [
            ("ETH", 30, address),
            ("USDT", 7, address),
        ]


@pytest.fixture(scope="module")
def monero() -> Iterator[Any]:
    from chain_nodes import running_monero

    with running_monero("xmr-deposit") as peers:
        yield peers


def test_xmr_standing_address_is_a_subaddress_of_the_next_account_and_credits_once(
    tmp_path: Path, vpsshop_database_url: str, monero: Any
) -> None:
    """XMR: subaddress (account_index + 1, n), made in the view-only wallet by the shop itself; a
    receipt there (seen in the pool, then confirmed) credited once as a top-up of its own, beside an
    ordinary XMR top-up of the same account, which still completes as before."""
    from vpsshop_monero.addresses import ViewWallet

    account = int(monero.call(monero.shop_url, "create_account")["account_index"])
    xmr = {**monero.settings(confirmations=1), "account_index": account}
    lines = "".join(f"{key} = {value!r}\n".replace("'", '"') for key, value in xmr.items())
    config = tmp_path / "shop.toml"
    config.write_text(f"[coins.XMR]\n{lines}[topups]\nwatch_interval_seconds = 0.5\nstanding_minimum_usd = 5\n")
    env = shop_env(vpsshop_database_url, VPSSHOP__SERVER__ACCESS_LOG="false")
    with serve(tmp_path, env, "--config", str(config)) as shop:
        made = httpx.post(f"{shop.base}/account").json()
        h = {"Authorization": f"Bearer {made['api_key']}"}
        answer = httpx.post(f"{shop.base}/deposit-addresses", headers=h, json={"coin": "XMR"})
        assert answer.status_code == 200, answer.text
        address = answer.json()["address"]
        assert address == ViewWallet(monero.address, monero.view_key).subaddress(1, account + 1)
        again = httpx.post(f"{shop.base}/deposit-addresses", headers=h, json={"coin": "XMR"}).json()
        assert again["address"] == address  # one per account and coin
        wallet = monero.call(monero.shop_url, "get_address", account_index=account + 1, address_index=[1])
        assert wallet["addresses"][0]["address"] == address  # the shop made it in the wallet's next account
        ordered = httpx.post(f"{shop.base}/topups", headers=h, json={"amount": 25, "coin": "XMR"})
        assert ordered.status_code == 201, ordered.text
        topup = ordered.json()
        monero.pay(address, 2 * 10**11)  # 0.2 XMR at 150 USD: 30 USD
        paid = monero.pay(topup["deposit_address"], int(Decimal(topup["deposit_amount"]) * 10**12))
        monero.mine_until_mined(paid)
        monero.mine(1)
        _until("both credited", lambda: _balance(shop.base, h) == 55, shop.output, seconds=90)
        time.sleep(2)  # more passes credit nothing more
        assert _balance(shop.base, h) == 55
        completed = [e["data"] for e in _topup_events(shop.base, h) if e["type"] == "topup.completed"]
        assert sorted((d["credited_usd"], d["deposit_address"]) for d in completed) == sorted(
            [(30, address), (25, topup["deposit_address"])]
        )
