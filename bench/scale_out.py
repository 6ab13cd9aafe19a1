"""Scale-out proof: many accounts' top-ups and orders through two API processes and two workers at once.

    .venv/bin/python bench/scale_out.py --pg-admin postgresql://postgres@127.0.0.1:5432/postgres [--accounts 120]

What runs: PostgreSQL (a database made for the run and dropped after it), ``litecoind -regtest`` in a
temp dir, two ``vpsshop serve --no-worker`` processes and two ``vpsshop worker`` processes on one
config (sandbox mode on PostgreSQL, LTC watched on the regtest node, the hypervisor simulator with a
one-second boot). Then:

1. the authenticated read (``GET /v1/account``, measured with wrk) at a fixed number of connections,
   against one API process and against both (the connections split between them): the baseline;
2. every account asks for an LTC top-up (through both API processes); one transaction pays every
   deposit address, blocks are mined, and both workers' watchers credit them: credits/s;
3. every account orders a server, half of them through one API process and half through both
   (orders/s each), and both workers provision them until every server is active.

Afterwards it checks in the database: each balance equals the sum of its ledger entries to the
micro-dollar, each payment was credited exactly once (one ledger entry per payment, 25 USD each), each
server has exactly one ``provision`` job, done, one ``provisioned`` event and a domain of its own (the
simulator holds one domain per server, no more), and every server is active; a kind name that vpsshop
no longer writes stops the run instead of passing unchecked. It exits 1 when any check fails. Throughput is reported as a ratio to the authenticated
read measured in the same run, so the machine's speed cancels out.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import psycopg

VPSSHOP = str(Path(sys.executable).with_name("vpsshop"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Litecoind:
    """``litecoind -regtest`` with a funded wallet, in ``workdir``."""

    def __init__(self, workdir: Path) -> None:
        self.port, self.password = free_port(), secrets.token_hex(12)
        (workdir / "ltc").mkdir()
        self.proc = subprocess.Popen(
            [
                shutil.which("litecoind") or "/usr/bin/litecoind",
                "-regtest",
                f"-datadir={workdir / 'ltc'}",
                f"-rpcport={self.port}",
                f"-port={free_port()}",
                "-rpcbind=127.0.0.1",
                "-rpcallowip=127.0.0.1",
                "-rpcuser=bench",
                f"-rpcpassword={self.password}",
                "-listen=0",
                "-server",
                "-fallbackfee=0.0002",
                "-printtoconsole=0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.rpc("getblockcount")
                break
            except (OSError, RuntimeError):  # not listening yet, or warming up (RPC error -28)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        self.rpc("createwallet", "miner")
        self.address = self.rpc("getnewaddress", "", "bech32")
        self.rpc("generatetoaddress", 200, self.address)  # 100 mature coinbases: 5000 LTC

    def rpc(self, method: str, *params: Any) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/",
            json.dumps({"jsonrpc": "1.0", "id": 1, "method": method, "params": list(params)}).encode(),
            {
                "Content-Type": "application/json",
                "Authorization": "Basic " + base64.b64encode(f"bench:{self.password}".encode()).decode(),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        if body.get("error"):
            raise RuntimeError(f"{method}: {body['error']}")
        return body["result"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def random_tpub() -> str:
    from coincurve import PrivateKey

    from vpsshop.hdkeys import b58check_encode

    return b58check_encode(
        bytes.fromhex("043587cf")
        + bytes([3])
        + b"\0" * 4
        + (0x80000000).to_bytes(4, "big")
        + secrets.token_bytes(32)
        + PrivateKey().public_key.format(compressed=True)
    )


def config(database_url: str, ltc: Litecoind) -> str:
    from cryptography.fernet import Fernet

    return f"""mode = "sandbox"
database_url = "{database_url}"
secret_key = "{secrets.token_urlsafe(32)}"
encryption_key = "{Fernet.generate_key().decode()}"
public_url = "http://127.0.0.1/v1"

[server]
access_log = false

[ratelimit]
signups_per_client = 100000  # every customer of the run signs up from 127.0.0.1; the other limits stay as shipped

[topups]
watch_interval_seconds = 0.5
poll_min_seconds = 5

[servers]
jobs_interval_seconds = 0.5

[coins.LTC]
xpub = "{random_tpub()}"
network = "regtest"
rpc_url = "http://127.0.0.1:{ltc.port}/"
rpc_user = "bench"
rpc_password = "{ltc.password}"
confirmations = 1

[hypervisor]
backend = "simulator"

[hypervisor.simulator]
boot_seconds = 1
addresses = "10.80.0.0/16"
"""


def start(argv: list[str], workdir: Path, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - the child writes it until it exits
    return subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)


def hammer(bases: list[str], headers: dict[str, str], seconds: float, concurrency: int) -> float:
    """Requests/s of ``GET /account`` over ``seconds``: one wrk per base (``concurrency`` connections
    split between them) at the same time, summed. wrk, not a Python client: the client must not be
    the bottleneck of the baseline."""
    per = max(1, concurrency // len(bases))
    auth = f"Authorization: {headers['Authorization']}"
    runs = [
        subprocess.Popen(
            ["wrk", "-t1", f"-c{per}", f"-d{seconds:g}s", "-H", auth, f"{base}/account"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for base in bases
    ]
    total = 0.0
    for run in runs:
        out, _ = run.communicate(timeout=seconds + 60)
        line = next(line for line in out.splitlines() if line.startswith("Requests/sec:"))
        if "Non-2xx" in out:
            raise SystemExit(f"the read answered non-2xx:\n{out}")
        total += float(line.split()[1])
    return total


async def each(items: list[Any], fn: Any, concurrency: int) -> tuple[list[Any], float]:
    """``fn(i, item)`` for every item, ``concurrency`` at once: (results, items/s)."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int, item: Any) -> Any:
        async with semaphore:
            return await fn(i, item)

    started = time.monotonic()
    results = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    return list(results), len(items) / (time.monotonic() - started)


async def scenario(args: argparse.Namespace, bases: list[str], ltc: Litecoind) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:

        async def new_account(i: int, _: Any) -> dict[str, str]:
            response = await client.post(f"{bases[i % 2]}/account")
            assert response.status_code == 201, response.text
            return {"Authorization": f"Bearer {response.json()['api_key']}"}

        accounts, _ = await each(list(range(args.accounts)), new_account, args.concurrency)

        figures["read_1"] = await asyncio.to_thread(hammer, bases[:1], accounts[0], args.seconds, args.concurrency)
        figures["read_2"] = await asyncio.to_thread(hammer, bases, accounts[0], args.seconds, args.concurrency)

        async def topup(i: int, auth: dict[str, str]) -> dict[str, Any]:
            response = await client.post(f"{bases[i % 2]}/topups", json={"amount": 25, "coin": "LTC"}, headers=auth)
            assert response.status_code == 201, response.text
            return response.json()

        topups, figures["topups_per_s"] = await each(accounts, topup, args.concurrency)
        ltc.rpc("sendmany", "", {t["deposit_address"]: t["deposit_amount"] for t in topups})
        started = time.monotonic()
        ltc.rpc("generatetoaddress", 1, ltc.address)

        async def credited(i: int, auth: dict[str, str]) -> None:
            while True:
                body = (await client.get(f"{bases[i % 2]}/account", headers=auth)).json()
                if body["balance_usd"] >= 25:
                    return
                await asyncio.sleep(0.5)

        await asyncio.wait_for(each(accounts, credited, args.concurrency), args.timeout)
        figures["credits_per_s"] = len(accounts) / (time.monotonic() - started)

        half = len(accounts) // 2

        def order_via(targets: list[str]) -> Any:
            async def order(i: int, auth: dict[str, str]) -> int:
                response = await client.post(
                    f"{targets[i % len(targets)]}/servers",
                    headers=auth,
                    json={"plan": "pup", "location": "nl", "os": "debian-12"},
                )
                assert response.status_code == 201, response.text
                return int(response.json()["server"]["id"])

            return order

        first, figures["orders_per_s_1"] = await each(accounts[:half], order_via(bases[:1]), args.concurrency)
        second, figures["orders_per_s_2"] = await each(accounts[half:], order_via(bases), args.concurrency)
        started = time.monotonic()

        async def active(i: int, pair: tuple[dict[str, str], int]) -> None:
            auth, server_id = pair
            while True:
                body = (await client.get(f"{bases[i % 2]}/servers/{server_id}", headers=auth)).json()
                if body["status"] == "active":
                    return
                await asyncio.sleep(0.5)

        pairs = list(zip(accounts, first + second, strict=True))
        await asyncio.wait_for(each(pairs, active, args.concurrency), args.timeout)
        figures["active_per_s"] = len(accounts) / (time.monotonic() - started)
    return figures


PROVISION_JOB = "provision"
"""The job kind that creates a server's domain (``vpsshop.servers.models.JOB_KINDS``)."""
PROVISIONED_EVENT = "provisioned"
"""The server event a provision job records when it ends well (``vpsshop.servers.jobs``)."""


def provisioning_checks(conn: psycopg.Connection[Any], servers_expected: int) -> list[str]:
    """Each server provisioned exactly once: one ``provision`` job, done; one ``provisioned`` event;
    a domain of its own, and the simulator holds exactly those domains (a create run twice would
    make a second). Every server is counted, so a server with no job or no event fails too.

    Raises SystemExit when a kind name this relies on is not vpsshop's (renamed in the code): a
    check that counts a kind nobody writes would pass without checking anything."""
    from vpsshop.servers.models import JOB_KINDS

    if PROVISION_JOB not in JOB_KINDS:
        raise SystemExit(f"job kind {PROVISION_JOB!r} is not among vpsshop's JOB_KINDS {JOB_KINDS}: update this bench")
    failed = []
    rows = conn.execute(
        "SELECT s.id, s.domain, "
        "(SELECT COUNT(*) FROM server_jobs j WHERE j.server_id = s.id AND j.kind = %(job)s), "
        "(SELECT COUNT(*) FROM server_jobs j WHERE j.server_id = s.id AND j.kind = %(job)s AND j.status = 'done'), "
        "(SELECT COUNT(*) FROM server_events e WHERE e.server_id = s.id AND e.kind = %(event)s) "
        "FROM servers s ORDER BY s.id",
        {"job": PROVISION_JOB, "event": PROVISIONED_EVENT},
    ).fetchall()
    if len(rows) != servers_expected:
        failed.append(f"{len(rows)} servers for {servers_expected} orders")
    if (
        rows
        and not conn.execute("SELECT 1 FROM server_events WHERE kind = %s LIMIT 1", (PROVISIONED_EVENT,)).fetchone()
    ):
        kinds = [k for (k,) in conn.execute("SELECT DISTINCT kind FROM server_events ORDER BY kind")]
        raise SystemExit(
            f"no server has a {PROVISIONED_EVENT!r} event (kinds recorded: {kinds}): was it renamed? update this bench"
        )
    jobs = [(sid, n, done) for sid, _d, n, done, _e in rows if n != 1 or done != 1]
    if jobs:
        failed.append(f"servers without exactly one {PROVISION_JOB} job, done (server, jobs, done): {jobs[:5]}")
    events = [(sid, n) for sid, _d, _n, _done, n in rows if n != 1]
    if events:
        failed.append(f"servers without exactly one {PROVISIONED_EVENT!r} event (server, events): {events[:5]}")
    domains = [domain for _s, domain, *_rest in rows]
    if None in domains or len(set(domains)) != len(domains):
        failed.append(f"servers without a domain of their own: {sorted(map(str, domains))[:5]}")
    simulated = sorted(key for (key,) in conn.execute("SELECT key FROM plugin_records WHERE namespace = 'simulator'"))
    if simulated != sorted(d for d in domains if d is not None):
        failed.append(f"{len(simulated)} simulated domains for {len(domains)} servers (one each expected)")
    return failed


def checks(database_url: str, accounts: int) -> list[str]:
    """What must hold after the run; the list of what does not."""
    failed = []
    with psycopg.connect(database_url.replace("+psycopg", "")) as conn:
        q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
        off = q(
            "SELECT a.id, a.balance_micros, COALESCE(SUM(l.amount_micros), 0) FROM accounts a "
            "LEFT JOIN ledger_entries l ON l.account_id = a.id GROUP BY a.id "
            "HAVING a.balance_micros <> COALESCE(SUM(l.amount_micros), 0)"
        )
        if off:
            failed.append(f"balances differ from their ledger: {off[:5]}")
        payments = q(
            "SELECT p.id, p.credited_micros, COUNT(l.id) FROM topup_payments p LEFT JOIN ledger_entries l "
            "ON l.dedupe_key = 'topup:' || p.coin || ':' || p.identity GROUP BY p.id, p.credited_micros"
        )
        if len(payments) != accounts or any(n != 1 or c != 25_000_000 for _, c, n in payments):
            failed.append(
                f"payments not each credited once with 25 USD: {len(payments)} payments, "
                f"{[p for p in payments if p[2] != 1 or p[1] != 25_000_000][:5]}"
            )
        failed += provisioning_checks(conn, accounts)
        servers = q("SELECT status, COUNT(*) FROM servers GROUP BY status")
        if servers != [("active", accounts)]:
            failed.append(f"servers not all active: {servers}")
        charged = q("SELECT COUNT(*) FROM ledger_entries WHERE amount_micros < 0")[0][0]
        if charged != accounts:
            failed.append(f"{charged} order charges for {accounts} orders")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--pg-admin",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="PostgreSQL URL where the run's database is created and dropped",
    )
    parser.add_argument("--database", default=f"vpsshop_scale_{secrets.token_hex(3)}")
    parser.add_argument("--accounts", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8, help="length of each read measurement")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="vpsshop-scale-"))
    with psycopg.connect(args.pg_admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{args.database}"')
    server = args.pg_admin.replace("postgresql://", "postgresql+psycopg://", 1).rsplit("/", 1)[0]
    database_url = f"{server}/{args.database}"
    procs: list[subprocess.Popen[bytes]] = []
    ltc: Litecoind | None = None
    try:
        ltc = Litecoind(workdir)
        (workdir / "vpsshop.toml").write_text(config(database_url, ltc))
        env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
        env["VPSSHOP_CONFIG"] = str(workdir / "vpsshop.toml")
        subprocess.run([VPSSHOP, "migrate"], cwd=workdir, env=env, check=True, capture_output=True)
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            procs.append(start([VPSSHOP, "serve", "--no-worker", "--port", str(port)], workdir, f"api{i}", env))
        for i in range(2):
            procs.append(start([VPSSHOP, "worker"], workdir, f"worker{i}", env))
        bases = [f"http://127.0.0.1:{port}/v1" for port in ports]
        for base in bases:
            deadline = time.monotonic() + 90
            while True:
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code in (200, 503):
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit(f"{base} did not answer")
                time.sleep(0.2)
        figures = asyncio.run(scenario(args, bases, ltc))
        failed = checks(database_url, args.accounts)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        if ltc is not None:
            ltc.stop()
        with psycopg.connect(args.pg_admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')
        shutil.rmtree(workdir, ignore_errors=True)

    read = figures["read_1"]
    print(f"accounts {args.accounts}, concurrency {args.concurrency}, 2 API processes, 2 workers, PostgreSQL")
    rows = [
        ("authenticated read, 1 API process:", "read_1", "req/s"),
        ("authenticated read, 2 API processes:", "read_2", "req/s"),
        ("top-up created (2 API):", "topups_per_s", "/s"),
        ("top-up credited (2 workers):", "credits_per_s", "/s"),
        ("order placed, 1 API process:", "orders_per_s_1", "/s"),
        ("order placed, 2 API processes:", "orders_per_s_2", "/s"),
        ("server active (2 workers):", "active_per_s", "/s"),
    ]
    for label, key, unit in rows:
        ratio = (
            "baseline 1.00"
            if key == "read_1"
            else (f"{figures[key] / read:.2f}x" if key == "read_2" else f"{figures[key] / read:.4f}x")
        )
        extra = f"; {figures[key] / figures['orders_per_s_1']:.2f}x of 1 process" if key == "orders_per_s_2" else ""
        print(f"{label:<37} {figures[key]:9.1f} {unit:<6} ({ratio}{extra})")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)
    print(
        "checks: every balance = its ledger sum to the micro-dollar; each payment credited once; "
        "each server provisioned once (one provision job, done; one provisioned event; one domain); "
        "every server active"
    )


if __name__ == "__main__":
    main()
