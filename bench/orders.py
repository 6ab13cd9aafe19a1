"""Order throughput: POST /v1/servers with 32 concurrent clients, as a ratio to GET /v1/account.

Starts ``vpsshop serve --no-worker`` (one uvicorn process; provisioning jobs are queued, not run)
on a loopback port against a fresh database, funds one account through ``vpsshop admin credit``,
then drives both endpoints with ``wrk`` (Debian package ``wrk``) for the same duration and
connection count, and prints orders/s, account reads/s and their ratio. Afterwards it checks that
every order that answered 201 left exactly one server and one queued job, and the ledger balances.

    .venv/bin/python bench/orders.py                        # SQLite and PostgreSQL
    .venv/bin/python bench/orders.py --db sqlite --duration 10
    VPSSHOP_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/wt_servers .venv/bin/python bench/orders.py --db postgresql

The PostgreSQL database named by ``VPSSHOP_TEST_PG_URL`` (default database ``test``) is emptied.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VPSSHOP = str(Path(sys.executable).parent / "vpsshop")
ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}

POST_LUA = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
local statuses = {}
response = function(status, headers, body)
   statuses[status] = (statuses[status] or 0) + 1
end
done = function(summary, latency, requests)
end
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, method: str = "GET", headers: dict | None = None) -> dict:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _wrk(url: str, seconds: int, connections: int, key: str, script: str | None = None) -> tuple[float, int, int]:
    cmd = ["wrk", "-t", "2", "-c", str(connections), "-d", f"{seconds}s", "--latency",
           "-H", f"Authorization: Bearer {key}"]
    if script:
        cmd += ["-s", script]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+(\S+)", out)
    print(f"    {total} requests, {rps:.0f}/s, p99 {p99.group(1) if p99 else '?'}, non-2xx {non2xx.group(1) if non2xx else 0}")
    return rps, total, int(non2xx.group(1)) if non2xx else 0


def run(db: str, seconds: int, connections: int) -> float:
    work = Path(tempfile.mkdtemp(prefix="vpsshop-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    if db == "sqlite":
        url = f"sqlite:///{work / 'bench.db'}"
    else:
        from vpsshop.testing import postgres_test_url, reset_postgres

        url = postgres_test_url()
        reset_postgres(url)
    env.update(VPSSHOP_DATABASE_URL=url, VPSSHOP_SECRET_KEY="bench-secret",
               VPSSHOP_ENCRYPTION_KEY="3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", VPSSHOP_MODE="sandbox")
    port = _free_port()
    base = f"http://127.0.0.1:{port}/v1"
    server = subprocess.Popen([VPSSHOP, "serve", "--no-worker", "--port", str(port)], cwd=work, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                _request(f"{base}/health")
                break
            except OSError:
                time.sleep(0.1)
        account = _request(f"{base}/account", "POST")
        key = account["api_key"]
        subprocess.run([VPSSHOP, "admin", "credit", str(account["user_id"]), "10000000", "--reason", "bench"],
                       cwd=work, env=env, check=True, capture_output=True)
        print(f"  {db}: GET /v1/account, {connections} connections, {seconds}s")
        account_rps, _, bad = _wrk(f"{base}/account", seconds, connections, key)
        assert bad == 0, "account reads failed"
        script = work / "order.lua"
        script.write_text(POST_LUA % (json.dumps(ORDER), key))
        print(f"  {db}: POST /v1/servers, {connections} connections, {seconds}s")
        order_rps, total, bad = _wrk(f"{base}/servers", seconds, connections, key, str(script))
        assert bad == 0, f"{bad} orders failed"
        time.sleep(3)  # wrk stops with requests in flight; let them finish before counting
        listed = _request(f"{base}/servers", headers={"Authorization": f"Bearer {key}"})["servers"]
        me = _request(f"{base}/account", headers={"Authorization": f"Bearer {key}"})
        assert len(listed) == me["servers"], "server count mismatch"
        assert {s["status"] for s in listed} == {"provisioning"}, "jobs were not meant to run"
        expected = 10_000_000 - len(listed) * 3.99
        assert abs(me["balance_usd"] - expected) < 1e-6, (me["balance_usd"], expected)
        print(f"    {len(listed)} servers created (wrk counted {total} completed requests), balance exact")
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    ratio = order_rps / account_rps
    print(f"  {db}: orders {order_rps:.0f}/s, account reads {account_rps:.0f}/s, ratio {ratio:.3f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed (apt-get install wrk)")
    for db in (["sqlite", "postgresql"] if args.db == "both" else [args.db]):
        run(db, args.duration, args.connections)


if __name__ == "__main__":
    main()
