"""Block-scan benchmark of the EVM plugin: one block of 2,000 transactions matched against 10,000 watched
addresses. The block is made on a real ``anvil`` (npm ``@foundry-rs/anvil``, installed into ``.peers/npm``
like the tests do) and the scan is timed twice:

* against anvil itself (end to end; anvil needs ~0.5 s just to serialise a 2,000-transaction block);
* against anvil's JSON-RPC responses recorded during the first run and served again by a local HTTP
  replay server (the plugin's own cost: HTTP transfer of the 1.5 MB block, JSON decoding, matching).

The block holds 1,500 ETH transfers (500 of them to watched addresses) and 500 ERC-20 transfers of the
test token (250 to watched addresses), all sent in JSON-RPC batches and mined into one block. The timed
part is one :meth:`EvmCoin.scan` call of the ETH+USDT scan group from the block before: the
``eth_getBlockByNumber(n, true)`` fetch and decode, the match against the watch set, the receipts of the
500 native matches, and the ``eth_getLogs`` of the token. Prints the median of 5 runs and the ratio to
the 1 s budget.

    .venv/bin/python bench/evm_block_scan.py
"""

from __future__ import annotations

import asyncio
import http.server
import json
import secrets
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from evm_peers import Anvil, compile_contracts, rpc

TXS = 2000
TOKEN_TXS = 500
WATCHED = 10_000
BUDGET_SECONDS = 1.0


def batch(url: str, calls: list[tuple[str, list]]) -> list:
    payload = [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)]
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        answer = sorted(json.loads(resp.read()), key=lambda a: a["id"])
    errors = [a["error"] for a in answer if "error" in a]
    if errors:
        raise RuntimeError(errors[:3])
    return [a["result"] for a in answer]


class RecordingFront:
    """Forwards JSON-RPC to ``upstream`` and records each answer (``replay`` True: answers from the record)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.replay = False
        self.recorded: dict[str, list] = {}
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                items = body if isinstance(body, list) else [body]
                key = json.dumps([(i["method"], i["params"]) for i in items])
                if not front.replay:
                    req = urllib.request.Request(front.upstream, raw, {"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=300) as resp:
                        answer = json.loads(resp.read())
                    by_id = {a["id"]: a for a in (answer if isinstance(answer, list) else [answer])}
                    front.recorded[key] = [{k: v for k, v in by_id[i["id"]].items() if k != "id"} for i in items]
                parts = [{"id": i["id"], **r} for i, r in zip(items, front.recorded[key], strict=False)]
                payload = json.dumps(parts if isinstance(body, list) else parts[0]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def random_address() -> str:
    return "0x" + secrets.token_hex(20)


def word(value: int | str) -> str:
    return (value[2:] if isinstance(value, str) else f"{value:x}").rjust(64, "0")


async def main() -> None:
    from vpsshop_evm import Ether, TetherErc20

    anvil = Anvil(("--gas-limit", "100000000"))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            compiled = compile_contracts(Path(tmp))
        accounts = rpc(anvil.url, "eth_accounts")
        _abi, bytecode = compiled["TestToken"]
        deployer = accounts[0]
        constructor_args = (
            word(0x60)
            + word(0xA0)
            + word(6)
            + word(4)
            + "54455354".ljust(64, "0")
            + word(4)
            + "54455354".ljust(64, "0")
        )
        rpc(anvil.url, "eth_sendTransaction", [{"from": deployer, "data": "0x" + bytecode + constructor_args}])
        anvil.mine(1)
        block = rpc(anvil.url, "eth_getBlockByNumber", ["latest", True])
        receipt = rpc(anvil.url, "eth_getTransactionReceipt", [block["transactions"][0]["hash"]])
        token = receipt["contractAddress"]
        senders = accounts[1:10]
        mint = "0x40c10f19"  # mint(address,uint256)
        nonce = int(rpc(anvil.url, "eth_getTransactionCount", [deployer, "pending"]), 16)
        batch(
            anvil.url,
            [
                (
                    "eth_sendTransaction",
                    [{"from": deployer, "to": token, "nonce": hex(nonce + i), "data": mint + word(s) + word(10**12)}],
                )
                for i, s in enumerate(senders)
            ],
        )
        anvil.mine(1)

        watched = {random_address() for _ in range(WATCHED - 750)}
        native_to = [random_address() for _ in range(TXS - TOKEN_TXS)]
        token_to = [random_address() for _ in range(TOKEN_TXS)]
        watched.update(native_to[:500])
        watched.update(token_to[:250])
        calls = []
        nonces = dict.fromkeys(senders, 0)

        def send(i: int, tx: dict) -> None:
            sender = senders[i % len(senders)]
            calls.append(("eth_sendTransaction", [{"from": sender, "nonce": hex(nonces[sender]), **tx}]))
            nonces[sender] += 1

        for i, to in enumerate(native_to):
            send(i, {"to": to, "value": hex(10**15), "gas": hex(21000)})
        transfer = "0xa9059cbb"
        for i, to in enumerate(token_to):
            send(i, {"to": token, "gas": hex(60000), "data": transfer + word(to) + word(1_000_000)})
        for start in range(0, len(calls), 500):
            batch(anvil.url, calls[start : start + 500])
        anvil.mine(1)
        height = anvil.height()
        full = rpc(anvil.url, "eth_getBlockByNumber", [hex(height), True])
        assert len(full["transactions"]) == TXS, len(full["transactions"])
        parent = rpc(anvil.url, "eth_getBlockByNumber", [hex(height - 1), False])["hash"]

        front = RecordingFront(anvil.url)
        common = {
            "xpub": "xpub6DCoCpSuQZB2jawqnGMEPS63ePKWkwWPH4TU45Q7LPXWuNd8TMtVxRrgjtEshuqpK3mdhaWHPFsBngh5GFZaM6si3yZdUsT8ddYM3PwnATt",
            "network": "anvil",
            "chain_id": 31337,
            "rpc_url": front.url,
            "timeout_seconds": 120,
        }
        groups = {}
        for label, url in (("anvil", anvil.url), ("replay", front.url)):
            eth = Ether.from_settings({**common, "rpc_url": url}, sandbox=False, where="coins.ETH")
            usdt = TetherErc20.from_settings(
                {**common, "rpc_url": url, "contract": token}, sandbox=False, where="coins.USDT"
            )
            eth.scan_members = usdt.scan_members = (eth, usdt)  # what core sets when it builds a shop
            groups[label] = (eth, usdt)
        assert len(watched) == WATCHED
        few = {random_address() for _ in range(WATCHED - 10)} | set(native_to[:5]) | set(token_to[:5])
        scenarios = {"750 paying": (watched, (500, 250)), "10 paying": (few, (5, 5))}
        await groups["replay"][0].scan(f"{height - 1}:{parent}", watched)  # records anvil's answers
        await groups["replay"][0].scan(f"{height - 1}:{parent}", few)
        front.replay = True
        figures = {}
        for scenario, (keys, expected) in scenarios.items():
            for label in ("anvil", "replay"):
                eth = groups[label][0]
                times = []
                for _ in range(5):
                    started = time.perf_counter()
                    result = await eth.scan(f"{height - 1}:{parent}", keys)
                    times.append(time.perf_counter() - started)
                    native = sum(1 for code, _ in result.payments if code == "ETH")
                    tokens = sum(1 for code, _ in result.payments if code == "USDT")
                    assert (native, tokens) == expected, (native, tokens)
                figures[scenario, label] = times
        for coin in (*groups["anvil"], *groups["replay"]):
            await coin.close()
        front.server.shutdown()
        print(
            f"block {height}: {TXS} transactions ({TXS - TOKEN_TXS} ETH, {TOKEN_TXS} ERC-20), {WATCHED} watched addresses"
        )
        for (scenario, label), times in figures.items():
            what = "anvil" if label == "anvil" else "recorded responses served locally"
            median = statistics.median(times)
            print(
                f"{scenario:>10} | {what:<34} | scan median {median * 1000:5.0f} ms (runs: "
                f"{', '.join(f'{t * 1000:.0f}' for t in times)}) | ratio to the 1 s budget {median / BUDGET_SECONDS:.2f}"
            )
    finally:
        anvil.stop()


if __name__ == "__main__":
    asyncio.run(main())
