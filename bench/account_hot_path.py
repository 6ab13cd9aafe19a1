"""Authenticated GET /v1/account against a bare Starlette JSON endpoint, alternated, with wrk.

    python bench/account_hot_path.py [--database-url URL] [--rounds 3] [--seconds 5] [--connections 32]

Both apps run in their own uvicorn process with identical settings (1 worker, httptools, uvloop,
no access log); wrk runs on loopback. Rounds alternate bare / vpsshop so both see the same machine
moment; the ratio is median(vpsshop req/s) / median(bare req/s). Goal: >= 0.6.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
UVICORN = [sys.executable, "-m", "uvicorn", "--factory", "--workers", "1", "--http", "httptools", "--loop", "uvloop",
           "--no-access-log", "--log-level", "warning", "--host", "127.0.0.1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(factory: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([*UVICORN, "--port", str(port), f"_apps:{factory}"], cwd=HERE, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(base + "/v1/account", timeout=1)
            return proc, base
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{factory} did not start")
            time.sleep(0.1)


def wrk(url: str, seconds: int, connections: int, headers: dict[str, str]) -> float:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise SystemExit(f"{url}: {non2xx.group(1)} failed responses\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="vpsshop-bench-")
    url = args.database_url or f"sqlite:///{tmp}/bench.db"
    env = {**os.environ, "BENCH_DATABASE_URL": url, "PYTHONPATH": str(HERE)}
    bare, bare_base = start("bare_app", env)
    shop, shop_base = start("vpsshop_app", env)
    try:
        for _ in range(20):  # other accounts and keys, so the lookup is not against a one-row table
            httpx.post(shop_base + "/v1/account")
        created = httpx.post(shop_base + "/v1/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        check = httpx.get(shop_base + "/v1/account", headers=headers)
        assert check.status_code == 200 and check.json()["user_id"] == created["user_id"], check.text
        wrk(bare_base + "/v1/account", 1, args.connections, {})  # warm-up
        wrk(shop_base + "/v1/account", 1, args.connections, headers)
        bare_rps, shop_rps = [], []
        for round_no in range(1, args.rounds + 1):
            bare_rps.append(wrk(bare_base + "/v1/account", args.seconds, args.connections, {}))
            shop_rps.append(wrk(shop_base + "/v1/account", args.seconds, args.connections, headers))
            print(f"round {round_no}: bare {bare_rps[-1]:9.0f} req/s   vpsshop {shop_rps[-1]:9.0f} req/s", flush=True)
        ratio = statistics.median(shop_rps) / statistics.median(bare_rps)
        backend = url.split(":", 1)[0]
        print(f"database {backend}: median bare {statistics.median(bare_rps):.0f} req/s, "
              f"median vpsshop GET /v1/account {statistics.median(shop_rps):.0f} req/s, ratio {ratio:.2f} (goal >= 0.60)")
    finally:
        for proc in (bare, shop):
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
