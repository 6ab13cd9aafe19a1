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

The many-accounts case (``--case many``): 50 funded accounts order at once through two
``vpsshop serve --no-worker`` processes on PostgreSQL (wrk against each, 25 connections each,
every request with the next account's key), as a ratio to the authenticated ``GET /v1/account``
measured the same way in the same run; afterwards every balance is checked against its servers
and its ledger entries.

    VPSSHOP_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/wt9bench \
        .venv/bin/python bench/orders.py --case many
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


def _serve_no_worker(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen(
        [VPSSHOP, "serve", "--no-worker", "--port", str(port)],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return server, f"http://127.0.0.1:{port}/v1"


def _wait_health(base: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            _request(f"{base}/health")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{base} did not answer") from None
            time.sleep(0.1)


def _wrk(url: str, seconds: int, connections: int, key: str, script: str | None = None) -> tuple[float, int, int]:
    cmd = [
        "wrk",
        "-t",
        "2",
        "-c",
        str(connections),
        "-d",
        f"{seconds}s",
        "--latency",
        "-H",
        f"Authorization: Bearer {key}",
    ]
    if script:
        cmd += ["-s", script]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p99 = re.search(r"99%\s+(\S+)", out)
    print(
        f"    {total} requests, {rps:.0f}/s, p99 {p99.group(1) if p99 else '?'}, non-2xx {non2xx.group(1) if non2xx else 0}"
    )
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
    env.update(
        VPSSHOP_DATABASE_URL=url,
        VPSSHOP_SECRET_KEY="bench-secret",
        VPSSHOP_ENCRYPTION_KEY="3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        VPSSHOP_MODE="sandbox",
        VPSSHOP__RATELIMIT__ENABLED="false",
    )  # throughput, not the per-account write limit
    server, base = _serve_no_worker(work, env)
    try:
        _wait_health(base)
        account = _request(f"{base}/account", "POST")
        key = account["api_key"]
        subprocess.run(
            [VPSSHOP, "admin", "credit", str(account["user_id"]), "10000000", "--reason", "bench"],
            cwd=work,
            env=env,
            check=True,
            capture_output=True,
        )
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


ROTATE_LUA = """
local keys = {%s}
local n = 0
request = function()
   n = n + 1
   local headers = {["Authorization"] = "Bearer " .. keys[(n %% #keys) + 1]}
   %s
end
"""
ORDER_REQUEST = (
    'headers["Content-Type"] = "application/json"\n   return wrk.format("POST", "/v1/servers", headers, \'%s\')'
)
READ_REQUEST = 'return wrk.format("GET", "/v1/account", headers)'


def _wrk_pair(bases: list[str], seconds: int, connections: int, script: Path) -> tuple[float, int]:
    """wrk against each process at once (connections split between them); summed requests/s and failures."""
    procs = []
    for base in bases:
        url = base.removesuffix("/v1")
        cmd = ["wrk", "-t1", "-c", str(connections // len(bases)), "-d", f"{seconds}s", "-s", str(script), url]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    rps, bad = 0.0, 0
    for proc in procs:
        out = proc.communicate()[0]
        rps += float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        bad += int(non2xx.group(1)) if non2xx else 0
    return rps, bad


def run_many(seconds: int, accounts: int, processes: int) -> float:
    """``accounts`` funded accounts ordering at once through ``processes`` ``vpsshop serve --no-worker``
    on PostgreSQL; ratio of orders/s to authenticated reads/s measured the same way in the same run."""
    import sqlalchemy as sa

    from vpsshop.testing import postgres_test_url, reset_postgres

    work = Path(tempfile.mkdtemp(prefix="vpsshop-bench-"))
    url = postgres_test_url()
    reset_postgres(url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    env.update(
        VPSSHOP_DATABASE_URL=url,
        VPSSHOP_SECRET_KEY="bench-secret",
        VPSSHOP_ENCRYPTION_KEY="3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        VPSSHOP_MODE="sandbox",
        VPSSHOP__RATELIMIT__ENABLED="false",
    )  # throughput: the accounts are made from one address, past the sign-up limit
    servers, bases = [], []
    for _ in range(processes):
        server, base = _serve_no_worker(work, env)
        servers.append(server)
        bases.append(base)
    try:
        for base in bases:
            _wait_health(base)
        made = [_request(f"{bases[0]}/account", "POST") for _ in range(accounts)]
        from vpsshop import ledger
        from vpsshop.db import Database

        db = Database(url)
        with db.session() as session:
            for account in made:
                ledger.post(session, account["user_id"], 10_000_000_000_000, "admin_credit", memo="bench")
        keys = ", ".join(f'"{a["api_key"]}"' for a in made)
        read_script, order_script = work / "read.lua", work / "order.lua"
        read_script.write_text(ROTATE_LUA % (keys, READ_REQUEST))
        order_script.write_text(ROTATE_LUA % (keys, ORDER_REQUEST % json.dumps(ORDER)))
        print(
            f"  postgresql, {accounts} accounts, {processes} x vpsshop serve --no-worker, {accounts} connections, "
            f"{seconds}s each"
        )
        read_rps, bad = _wrk_pair(bases, seconds, accounts, read_script)
        assert bad == 0, f"{bad} reads failed"
        order_rps, bad = _wrk_pair(bases, seconds, accounts, order_script)
        assert bad == 0, f"{bad} orders failed"
        time.sleep(3)
        with db.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT a.id, a.balance_micros, (SELECT count(*) FROM servers s WHERE s.account_id = a.id), "
                    "(SELECT coalesce(sum(amount_micros), 0) FROM ledger_entries e WHERE e.account_id = a.id) "
                    "FROM accounts a"
                )
            ).all()
            jobs = conn.execute(sa.text("SELECT count(*) FROM server_jobs WHERE kind = 'provision'")).scalar()
        db.dispose()
        total = sum(r[2] for r in rows)
        for _, balance, count, entries in rows:
            assert balance == 10_000_000_000_000 - count * 3_990_000 == entries, "a balance is off"
        assert jobs == total, "one provisioning job per server"
        print(f"    {total} servers over {len(rows)} accounts; every balance exact; one job each")
    finally:
        for server in servers:
            server.terminate()
            server.wait(20)
        shutil.rmtree(work, ignore_errors=True)
    ratio = order_rps / read_rps
    print(f"  many accounts: orders {order_rps:.0f}/s, account reads {read_rps:.0f}/s, ratio {ratio:.3f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--accounts", type=int, default=50, help="accounts of the many-accounts case")
    parser.add_argument("--processes", type=int, default=2, help="vpsshop serve processes of the many-accounts case")
    parser.add_argument(
        "--case",
        choices=["one", "many", "all"],
        default="all",
        help="one: one account, one process (SQLite and/or PostgreSQL); many: --accounts accounts "
        "through --processes processes on PostgreSQL",
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed (apt-get install wrk)")
    if args.case in ("one", "all"):
        for db in ["sqlite", "postgresql"] if args.db == "both" else [args.db]:
            run(db, args.duration, args.connections)
    if args.case in ("many", "all"):
        run_many(args.duration, args.accounts, args.processes)


if __name__ == "__main__":
    main()
