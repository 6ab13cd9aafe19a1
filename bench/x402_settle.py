"""Our own overhead per settled x402 payment (USDCBASE, direct mode), measured against anvil.

    .venv/bin/python bench/x402_settle.py [payments]

Starts anvil (npm @foundry-rs/anvil, installed into .peers/npm like the tests do), deploys the
test USDC, and settles ``payments`` authorizations signed by the official PyPI x402 v1 client.
For each payment it times decode_payment + settle and subtracts the time spent waiting for the
chain: every JSON-RPC answer (``BaseChain.rpc_seconds``) and the sleeps while waiting to be mined
(``BaseChain.wait_seconds``). What remains is ours: parsing, the checks, the reference verifier's
EIP-712 hashing and signature recovery, building and signing the transaction, bookkeeping.
Anvil mines each transaction at once here (automine) so the run is short; that changes only the
part subtracted. Target: under 20 ms per payment.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from x402_peers import USDC_UNIT, sign_v1_header, start_chain

from vpsshop_x402 import USDCBASE

TARGET_MS = 20.0


def main() -> int:
    payments = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory() as tmp:
        chain = start_chain(Path(tmp), block_time=0)
        try:
            shop = chain.new_account()
            relayer = chain.new_account(eth_wei=100 * 10**18)
            os.environ["BENCH_X402_RELAYER_KEY"] = bytes(relayer.key).hex()
            coin = USDCBASE.from_settings(
                {
                    "network": "base",
                    "mode": "direct",
                    "pay_to": shop.address,
                    "asset": chain.asset,
                    "rpc_url": chain.url,
                    "relayer_key_env": "BENCH_X402_RELAYER_KEY",
                },
                sandbox=False,
                where="coins.USDCBASE",
            )
            assert isinstance(coin, USDCBASE) and coin.chain is not None
            requirements = coin.payment_requirements(USDC_UNIT, "http://127.0.0.1:8000/v1/topups", "bench")
            payers = [chain.new_account(usdc=USDC_UNIT) for _ in range(payments)]
            headers = [sign_v1_header(p, requirements) for p in payers]  # the client's work, not ours

            def one(header: str) -> tuple[float, float]:
                rpc_before = coin.chain.rpc_seconds + coin.chain.wait_seconds
                started = time.perf_counter()
                asyncio.run(coin.settle(coin.decode_payment(header), requirements))
                total = time.perf_counter() - started
                return total, coin.chain.rpc_seconds + coin.chain.wait_seconds - rpc_before

            for header in headers[:5]:  # warm-up: imports, caches, connection pool
                one(header)
            ours, chain_ms = [], []
            for header in headers[5:]:
                total, waiting = one(header)
                ours.append((total - waiting) * 1000)
                chain_ms.append(waiting * 1000)
            settled = chain.usdc(shop.address) // USDC_UNIT
        finally:
            chain.anvil.stop()
    ours.sort()
    p95 = ours[int(len(ours) * 0.95) - 1]
    print(f"settled {settled} payments on anvil; measured {len(ours)} after 5 warm-up")
    print(
        f"our overhead per payment: median {statistics.median(ours):.2f} ms, mean {statistics.mean(ours):.2f} ms, "
        f"p95 {p95:.2f} ms, max {ours[-1]:.2f} ms (target < {TARGET_MS:.0f} ms)"
    )
    print(f"waiting for the chain (excluded): median {statistics.median(chain_ms):.2f} ms")
    ok = statistics.median(ours) < TARGET_MS and p95 < TARGET_MS
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
