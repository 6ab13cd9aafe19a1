"""Authenticated GET /v1/account of the shipped `vpsshop serve` against a bare Starlette endpoint, with wrk.

    .venv/bin/python bench/account_hot_path.py [--database-url URL] [--rounds 5] [--seconds 5] [--connections 32]

* **vpsshop**: the real command, ``vpsshop serve --port P``, with its defaults: one uvicorn worker,
  its access log on (to a file), its background tasks (provisioning jobs, lifecycle, watchers)
  running in the same process. A sandbox (no config file) on ``--database-url`` (default: SQLite
  in a temporary directory); the PostgreSQL database given is emptied first.
* **baseline**: a bare Starlette endpoint returning the same JSON body with no work behind it, on
  uvicorn with the settings ``vpsshop serve`` uses (1 worker, httptools, uvloop, no proxy headers)
  and stricter ones where they differ: no access log at all.

wrk (1 thread, 32 connections, loopback) measures them in alternating rounds, so both see the
same moments of a shared machine; the ratio is median(vpsshop) / median(baseline). Goal: >= 0.6.
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
VPSSHOP = str(Path(sys.executable).with_name("vpsshop"))
BASELINE = [
    sys.executable,
    "-m",
    "uvicorn",
    "--factory",
    "--workers",
    "1",
    "--http",
    "httptools",
    "--loop",
    "uvloop",
    "--no-access-log",
    "--no-proxy-headers",
    "--log-level",
    "warning",
    "--host",
    "127.0.0.1",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(base: str, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(base + "/v1/catalog", timeout=1)
            return
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start") from None
            time.sleep(0.1)


def start_baseline(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [*BASELINE, "--port", str(port), "_apps:bare_app"],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(base + "/v1/account", timeout=1)
            return proc, base
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the baseline did not start") from None
            time.sleep(0.1)


def start_vpsshop(url: str, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    env.update(VPSSHOP_DATABASE_URL=url)  # the shipped defaults: access log, metrics, rate limits on
    log = work / "vpsshop-serve.log"  # the banner, uvicorn's lines and the access log
    proc = subprocess.Popen(
        [VPSSHOP, "serve", "--port", str(port)], cwd=work, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    base = f"http://127.0.0.1:{port}"
    wait(base, proc, "vpsshop serve")
    return proc, base


def wrk(url: str, seconds: int, connections: int, headers: dict[str, str]) -> float:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise SystemExit(f"{url}: {non2xx.group(1)} failed responses\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def reset_postgres(url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP SCHEMA IF EXISTS public CASCADE"))
        conn.execute(sa.text("CREATE SCHEMA public"))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vpsshop-bench-"))
    url = args.database_url or f"sqlite:///{work}/bench.db"
    if url.startswith("postgresql"):
        reset_postgres(url)
    bare, bare_base = start_baseline(work / "baseline.log")
    try:
        shop, shop_base = start_vpsshop(url, work)
    except BaseException:  # the baseline must not outlive a failed start
        bare.terminate()
        raise
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
            print(
                f"round {round_no}: baseline {bare_rps[-1]:9.0f} req/s   vpsshop serve {shop_rps[-1]:9.0f} req/s   "
                f"ratio {shop_rps[-1] / bare_rps[-1]:.2f}",
                flush=True,
            )
        ratio = statistics.median(shop_rps) / statistics.median(bare_rps)
        per_round = statistics.median(s / b for s, b in zip(shop_rps, bare_rps, strict=False))
        backend = url.split(":", 1)[0].split("+")[0]
        lines = sum(1 for line in (work / "vpsshop-serve.log").open() if '"log":"access"' in line)
        print(
            f"database {backend}: median baseline {statistics.median(bare_rps):.0f} req/s, median vpsshop serve "
            f"GET /v1/account {statistics.median(shop_rps):.0f} req/s, ratio {ratio:.2f} (goal >= 0.60), "
            f"median of the rounds' ratios {per_round:.2f}; access log lines written: {lines}"
        )
    finally:
        for proc in (bare, shop):
            proc.terminate()
            proc.wait(timeout=20)


if __name__ == "__main__":
    main()
