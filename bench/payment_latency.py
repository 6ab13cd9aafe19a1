"""Payment latency (issue 26): how long a customer waits for the shop to see a payment and to credit it.

Starts the tests' real peers (litecoind -regtest, monerod --regtest with its wallets, anvil; for SOL
the tests' Solana RPC double on LiteSVM, ``tests/solana_rpc_double.py``, with its PubSub endpoint) and, per
chain and mode, the shipped command: ``vpsshop serve --config FILE`` (its worker included, the default)
in a subprocess on a free port, on a fresh SQLite database, with the default ``[topups]`` settings
(``watch_interval_seconds`` 15, ``push`` on) and each coin's node notifications configured (LTC:
``notify_listen``; XMR: ``zmq_pub``; ETH: ``ws_url``; SOL: ``ws_url`` derived from ``rpc_url``) in that
config file. It opens an account
(``POST /v1/account``) and creates top-ups (``POST /v1/topups``) through the served API, pays them and
mines their blocks.
Per chain it reports the median and 95th percentile of

* **seen**: broadcast -> the payment recorded (``topup.payment_seen``, confirmations 0), for the
  chains with a mempool the shop reads (LTC, XMR); a payment not seen within ``--seen-limit``
  seconds is counted in ``seen_only_with_the_block`` and its block mined;
* **credited**: the confirming block mined -> the top-up ``completed`` with the balance credited
  (one confirmation);

first with push (the default), then the polling baseline (``push = false``) in the same run.
A state is read every 10 ms from the served shop's SQLite file, read-only (a GET would run a chain
check of its own).

    .venv/bin/python bench/payment_latency.py --samples 10 [--json]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "plugins"), str(ROOT / "tests")]

import httpx
from chain_nodes import random_tpub, running_litecoind, running_monero
from evm_peers import CHAIN_ID, Anvil, random_xpub, rpc
from served import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, serve, shop_env


def solana_peer(stack: ExitStack) -> Any:
    """The Solana RPC double (LiteSVM) with its PubSub endpoint, and a funded payer."""
    from solana_rpc_double import SolanaChainDouble, SolanaRpcDouble
    from solders.keypair import Keypair

    node = SolanaRpcDouble(SolanaChainDouble())
    stack.callback(node.stop)
    node.payer = Keypair()
    node.chain.airdrop(str(node.payer.pubkey()), 1000 * 10**9)
    return node


def solana_pay(node: Any, topup: dict[str, Any]) -> str:
    """A System Program transfer of the top-up's amount, signed with solders."""
    from solders.message import Message
    from solders.pubkey import Pubkey
    from solders.system_program import TransferParams, transfer
    from solders.transaction import Transaction

    lamports = int(Decimal(topup["deposit_amount"]).scaleb(9))
    payer = node.payer
    move = transfer(
        TransferParams(
            from_pubkey=payer.pubkey(), to_pubkey=Pubkey.from_string(topup["deposit_address"]), lamports=lamports
        )
    )
    tx = Transaction([payer], Message([move], payer.pubkey()), node.chain.svm.latest_blockhash())
    return str(node.chain.send(bytes(tx)))


def solana_block(node: Any) -> float:
    asked = time.monotonic()
    node.chain.produce_block()
    return asked


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "p95": round(percentile(values, 95), 3), "n": len(values)}


def toml_of(data: dict[str, Any], table: tuple[str, ...] = ()) -> str:
    """``data`` as TOML: its strings, numbers and booleans, then its tables (``[a.b]``)."""
    lines = [f"[{'.'.join(table)}]"] if table else []
    for key, value in data.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int | float):
            lines.append(f"{key} = {value}")
        elif isinstance(value, str):
            lines.append(f"{key} = {json.dumps(value)}")  # a JSON string is a TOML basic string
        elif not isinstance(value, dict):
            raise TypeError(f"{key}: {value!r}")
    text = "\n".join(lines) + "\n" if lines else ""
    for key, value in data.items():
        if isinstance(value, dict):
            text += "\n" + toml_of(value, (*table, key))
    return text


class State:
    """A top-up's state, read from the served shop's database (read-only; the file is shared)."""

    def __init__(self, database: Path) -> None:
        self.db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, isolation_level=None)

    def __call__(self, ref: str) -> tuple[str | None, int | None, str]:
        """(status of the top-up's newest payment, its confirmations, the top-up's status)."""
        row = self.db.execute(
            "SELECT p.status, p.confirmations, t.status FROM topups t LEFT JOIN topup_payments p"
            " ON p.topup_id = t.id WHERE t.ref = ? ORDER BY p.id DESC LIMIT 1",
            (ref,),
        ).fetchone()
        assert row is not None, f"no top-up {ref}"
        return row[0], row[1], row[2]


@contextmanager
def shop(coins: dict[str, Any], push: bool, workdir: Path) -> Iterator[tuple[str, State]]:
    """``vpsshop serve --config FILE`` (its worker included) on a free port: (its API base, its states)."""
    database = workdir / ("push.db" if push else "poll.db")
    config = workdir / "shop.toml"
    settings = {
        "mode": "sandbox",
        "database_url": f"sqlite:///{database}",
        "secret_key": TEST_SECRET_KEY,
        "encryption_key": TEST_ENCRYPTION_KEY,
        "server": {"access_log": False},
        "coins": coins,
        # the defaults of watch_interval_seconds and the rest; GETs never check the chain here
        "topups": {"push": push, "poll_min_seconds": 3600},
    }
    config.write_text(toml_of(settings))
    env = shop_env(settings["database_url"], VPSSHOP_CONFIG=str(config))
    with serve(workdir, env, "--config", str(config)) as served:
        state = State(database)
        try:
            yield served.base, state
        except BaseException:
            print(served.output()[-4000:], file=sys.stderr)
            raise
        finally:
            state.db.close()


def wait_for(check: Callable[[], bool], seconds: float, what: str, step: float = 0.01) -> None:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"{what}: not within {seconds}s")
        time.sleep(step)


def mine_one(node: Any) -> float:
    """Mine a block; returns when it was asked for (``time.monotonic()``)."""
    asked = time.monotonic()
    node.mine(1)
    return asked


def measure(
    base: str,
    state: State,
    code: str,
    amount: int,
    pay: Callable[[dict[str, Any]], str],
    mine: Callable[[str], float],
    samples: int,
    mempool: bool,
    seen_limit: float,
) -> dict[str, Any]:
    http = httpx.Client(base_url=base, timeout=30)
    created = http.post("/account")
    assert created.status_code in (200, 201), created.text
    headers = {"Authorization": f"Bearer {created.json()['api_key']}"}
    seen: list[float] = []
    credited: list[float] = []
    missed = 0
    time.sleep(2)  # the watchers' first passes (or the push channel) are up
    for _ in range(samples):
        response = http.post("/topups", json={"amount": amount, "coin": code}, headers=headers)
        assert response.status_code == 201, response.text
        topup = response.json()
        ref = topup["ref"]
        sent = time.monotonic()
        txid = pay(topup)
        if mempool:
            try:
                wait_for(lambda ref=ref: state(ref)[0] == "seen", seen_limit, f"{code} seen")
                seen.append(time.monotonic() - sent)
            except AssertionError:
                missed += 1  # not seen before its block
        mined = mine(txid)
        wait_for(lambda ref=ref: state(ref)[2] == "completed", 120, f"{code} credited")
        credited.append(time.monotonic() - mined)
    http.close()
    return {"seen": summary(seen), "seen_only_with_the_block": missed, "credited": summary(credited)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10, help="payments per chain and mode")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--chains", default="LTC,XMR,ETH,SOL")
    parser.add_argument("--modes", default="push,poll", help="push (the default settings), poll (push = false)")
    parser.add_argument(
        "--seen-limit", type=float, default=40, help="seconds to wait for a mempool payment before mining its block"
    )
    args = parser.parse_args()
    chains = args.chains.split(",")
    results: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="vpsshop-latency-") as tmp:
        workdir = Path(tmp)
        peers: dict[str, Any] = {}
        if "LTC" in chains:
            peers["LTC"] = stack.enter_context(running_litecoind("bench-ltc"))
        if "XMR" in chains:
            peers["XMR"] = stack.enter_context(running_monero("bench-xmr"))
        if "ETH" in chains:
            peers["ETH"] = anvil = Anvil()
            stack.callback(anvil.stop)
        if "SOL" in chains:
            peers["SOL"] = solana_peer(stack)
        for mode in args.modes.split(","):
            push = mode == "push"
            for code in chains:
                node = peers[code]
                if code == "LTC":
                    coins = {"LTC": node.push_settings(random_tpub(), 1)}
                    run = (
                        25,
                        lambda t, n=node: n.pay(t["deposit_address"], t["deposit_amount"]),
                        lambda _, n=node: mine_one(n),
                    )
                elif code == "XMR":
                    account = int(node.call(node.shop_url, "create_account")["account_index"])
                    coins = {"XMR": {**node.settings(1), "account_index": account, "zmq_pub": node.zmq_pub}}
                    run = (
                        30,
                        lambda t, n=node: n.pay(t["deposit_address"], int(Decimal(t["deposit_amount"]) * 10**12)),
                        lambda txid, n=node: n.mine_until_mined(txid),
                    )
                elif code == "SOL":
                    from bip_utils import Bip39MnemonicGenerator, Bip39WordsNum

                    from vpsshop_solana import encrypt_mnemonic

                    mnemonic = str(Bip39MnemonicGenerator().FromWordsNumber(Bip39WordsNum.WORDS_NUM_12))
                    coins = {
                        "SOL": {
                            "seed_encrypted": encrypt_mnemonic(TEST_ENCRYPTION_KEY, mnemonic),
                            "network": "solana-double",
                            "rpc_url": node.url,
                            "confirmations": 1,
                        }
                    }
                    run = (25, lambda t, n=node: solana_pay(n, t), lambda _, n=node: solana_block(n))
                else:
                    coins = {
                        "ETH": {
                            "xpub": random_xpub(),
                            "network": "anvil",
                            "chain_id": CHAIN_ID,
                            "rpc_url": node.url,
                            "ws_url": node.url.replace("http://", "ws://"),
                            "confirmations": 1,
                        }
                    }
                    sender = rpc(node.url, "eth_accounts")[0]
                    run = (
                        25,
                        lambda t, n=node, s=sender: rpc(
                            n.url,
                            "eth_sendTransaction",
                            [
                                {
                                    "from": s,
                                    "to": t["deposit_address"],
                                    "value": hex(int(Decimal(t["deposit_amount"]) * 10**18)),
                                }
                            ],
                        ),
                        lambda _, n=node: mine_one(n),
                    )
                where = workdir / f"{code}-{mode}"
                where.mkdir()
                with shop(coins, push, where) as (base, state):
                    figures = measure(
                        base, state, code, run[0], run[1], run[2], args.samples, code in ("LTC", "XMR"), args.seen_limit
                    )
                results.setdefault(code, {})[mode] = figures
                if not args.json:
                    print(code, mode, json.dumps(figures), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
