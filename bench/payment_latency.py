"""Payment latency (issue 26): how long a customer waits for the shop to see a payment and to credit it.

Starts the tests' real peers (litecoind -regtest, monerod --regtest with its wallets, anvil) and a shop
with its background tasks running as in ``vpsshop serve``, with the default ``[topups]`` settings
(``watch_interval_seconds`` 15, ``push`` on) and each coin's node notifications configured (LTC:
``notify_listen``; XMR: ``zmq_pub``; ETH: ``ws_url``), then pays top-ups and mines their blocks.
Per chain it reports the median and 95th percentile of

* **seen**: broadcast -> the payment recorded (``topup.payment_seen``, confirmations 0), for the
  chains with a mempool the shop reads (LTC, XMR); a payment not seen within ``--seen-limit``
  seconds is counted in ``seen_only_with_the_block`` and its block mined;
* **credited**: the confirming block mined -> the top-up ``completed`` with the balance credited
  (one confirmation);

first with push (the default), then the polling baseline (``push = false``) in the same run.
A state is read from the database every 10 ms (a GET would run a chain check of its own).

    .venv/bin/python bench/payment_latency.py --samples 10 [--json]
"""

from __future__ import annotations

import argparse
import json
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

from chain_nodes import random_tpub, running_litecoind, running_monero
from evm_peers import CHAIN_ID, Anvil, random_xpub, rpc
from starlette.testclient import TestClient
from topup_push import new_topup, wait_for, watched_state

from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "p95": round(percentile(values, 95), 3), "n": len(values)}


@contextmanager
def shop(coins: dict[str, Any], push: bool, workdir: Path) -> Iterator[TestClient]:
    from vpsshop.app import create_app
    from vpsshop.settings import load_settings

    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{workdir / ('push' if push else 'poll')}.db",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "server": {"access_log": False},
            "coins": coins,
            # the defaults of watch_interval_seconds and the rest; GETs never check the chain here
            "topups": {"push": push, "poll_min_seconds": 3600},
        },
    )
    with TestClient(create_app(settings, background=True)) as client:
        yield client


def mine_one(node: Any) -> float:
    """Mine a block; returns when it was asked for (``time.monotonic()``)."""
    asked = time.monotonic()
    node.mine(1)
    return asked


def measure(
    client: TestClient,
    code: str,
    amount: int,
    pay: Callable[[dict[str, Any]], str],
    mine: Callable[[str], float],
    samples: int,
    mempool: bool,
    seen_limit: float,
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {client.post('/v1/account').json()['api_key']}"}
    seen: list[float] = []
    credited: list[float] = []
    missed = 0
    time.sleep(2)  # the watchers' first passes (or the push channel) are up
    for _ in range(samples):
        topup = new_topup(client, headers, code, amount)
        ref = topup["ref"]
        sent = time.monotonic()
        txid = pay(topup)
        if mempool:
            try:
                wait_for(lambda ref=ref: watched_state(client, ref)[0] == "seen", seen_limit, f"{code} seen", 0.01)
                seen.append(time.monotonic() - sent)
            except AssertionError:
                missed += 1  # not seen before its block
        mined = mine(txid)
        wait_for(lambda ref=ref: watched_state(client, ref)[2] == "completed", 120, f"{code} credited", 0.01)
        credited.append(time.monotonic() - mined)
    return {"seen": summary(seen), "seen_only_with_the_block": missed, "credited": summary(credited)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10, help="payments per chain and mode")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--chains", default="LTC,XMR,ETH")
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
                with shop(coins, push, where) as client:
                    figures = measure(
                        client, code, run[0], run[1], run[2], args.samples, code != "ETH", args.seen_limit
                    )
                results.setdefault(code, {})[mode] = figures
                if not args.json:
                    print(code, mode, json.dumps(figures), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
