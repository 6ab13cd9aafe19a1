"""Failure drills: the shipped processes under SIGKILL, a PostgreSQL outage, a chain node that
comes back behind a reorganised tip and libvirtd restarting under provisioning. After recovery
nothing is lost or done twice, and ``/health`` and ``/metrics`` said what was wrong while it was
wrong (each drill reads both during the failure, and ``/metrics`` again after it).

Every drill runs on peers of its own: a PostgreSQL cluster made with ``initdb`` in a temp dir and
started with ``pg_ctl`` on a free port (never the machine's shared server, which these drills stop),
``litecoind -regtest`` (tests/chain_nodes.py), a libvirtd of the drill's own
(tests/libvirt_peer.py ``PrivateLibvirtd``: the machine's libvirtd serves other tests and is never
restarted), and the real ``vpsshop serve --no-worker`` and ``vpsshop worker`` commands on one
sandbox config with the hypervisor simulator or that libvirtd.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from chain_nodes import Litecoind, free_port, peer_workdir, remove_workdir, running_litecoind
from libvirt_peer import PrivateLibvirtd
from served import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, VPSSHOP, stop, wait_for
from test_bitcoin import random_tpub

pytestmark = pytest.mark.slow

PG_BIN = Path("/usr/lib/postgresql/15/bin")


class PrivateCluster:
    """A PostgreSQL cluster of this module: initdb in a temp dir, pg_ctl on a free port, trust auth."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vpsshop-drill-pg-"))
        self.port = free_port()
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.prefix = as_postgres
        if as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        bin_dir = PG_BIN if PG_BIN.is_dir() else Path(shutil.which("initdb") or "/usr/bin/initdb").parent
        self.bin = bin_dir
        subprocess.run(
            [*self.prefix, str(bin_dir / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres"],
            check=True,
            capture_output=True,
        )
        self.start()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE drill")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/drill"

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        subprocess.run(
            [
                *self.prefix,
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.dir / "data"),
                "-l",
                str(self.dir / "log"),
                "-w",
                "-o",
                f"-p {self.port} -k {self.dir} -h 127.0.0.1",
                "start",
            ],
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        subprocess.run(
            [*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop"],
            check=True,
            capture_output=True,
        )

    def remove(self) -> None:
        subprocess.run(
            [*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


SIMULATOR = """[hypervisor]
backend = "simulator"

[hypervisor.simulator]
boot_seconds = 2
"""


class Shop:
    """One sandbox shop on the private cluster: an API process and workers started and killed at will."""

    def __init__(self, workdir: Path, database_url: str, ltc: Litecoind, hypervisor: str = "") -> None:
        self.workdir = workdir
        config = workdir / "vpsshop.toml"
        config.write_text(f"""mode = "sandbox"
database_url = "{database_url}"
secret_key = "{TEST_SECRET_KEY}"
encryption_key = "{TEST_ENCRYPTION_KEY}"
public_url = "http://127.0.0.1/v1"

[server]
access_log = false

[topups]
watch_interval_seconds = 0.5
poll_min_seconds = 60

[servers]
jobs_interval_seconds = 0.5
job_lease_seconds = 10
retry_seconds = 1
provision_attempts = 10

[coins.LTC]
xpub = "{random_tpub()}"
network = "regtest"
rpc_url = "{ltc.url}"
rpc_user = "{ltc.user}"
rpc_password = "{ltc.password}"
confirmations = 2

{hypervisor or SIMULATOR}""")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
        self.env["VPSSHOP_CONFIG"] = str(config)
        subprocess.run([VPSSHOP, "migrate"], cwd=workdir, env=self.env, check=True, capture_output=True)
        port = free_port()
        self.base = f"http://127.0.0.1:{port}/v1"
        self.api = self._start("api", "serve", "--no-worker", "--port", str(port))
        wait_for(self.base, self.api, workdir / "api.log")
        self.worker = self.start_worker()

    def _start(self, name: str, *argv: str) -> subprocess.Popen[str]:
        log = open(self.workdir / f"{name}.log", "a")  # noqa: SIM115 - the child writes it until it exits
        return subprocess.Popen(
            [VPSSHOP, *argv], cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT, text=True
        )

    def start_worker(self) -> subprocess.Popen[str]:
        self.worker = self._start("worker", "worker")
        return self.worker

    def kill_worker(self) -> None:
        self.worker.send_signal(signal.SIGKILL)
        self.worker.wait(10)

    def account(self, fund_usd: int = 0) -> tuple[int, dict[str, str]]:
        body = httpx.post(f"{self.base}/account", timeout=30).json()
        if fund_usd:
            subprocess.run(
                [VPSSHOP, "admin", "credit", str(body["user_id"]), str(fund_usd), "--reason", "drill"],
                cwd=self.workdir,
                env=self.env,
                check=True,
                capture_output=True,
            )
        return body["user_id"], {"Authorization": f"Bearer {body['api_key']}"}

    def close(self) -> None:
        stop(self.worker)
        stop(self.api)


@pytest.fixture(scope="module")
def litecoind() -> Iterator[Litecoind]:
    with running_litecoind("drill-ltc") as node:
        yield node


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    pg = PrivateCluster()
    yield pg
    pg.remove()


@pytest.fixture
def shop(tmp_path: Path, cluster: PrivateCluster, litecoind: Litecoind) -> Iterator[Shop]:
    running = Shop(tmp_path, cluster.url, litecoind)
    yield running
    running.close()


def sql(cluster: PrivateCluster, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{cluster.port}/drill") as conn:
        return conn.execute(query).fetchall()


def ledger_matches_balances(cluster: PrivateCluster) -> None:
    off = sql(
        cluster,
        "SELECT a.id, a.balance_micros, COALESCE(SUM(l.amount_micros), 0) FROM accounts a "
        "LEFT JOIN ledger_entries l ON l.account_id = a.id GROUP BY a.id "
        "HAVING a.balance_micros <> COALESCE(SUM(l.amount_micros), 0)",
    )
    assert off == []


def metrics(shop: Shop) -> dict[str, float]:
    """The ``vpsshop_`` samples of the API process's /metrics (issue 12): it must answer 200."""
    response = httpx.get(shop.base.removesuffix("/v1") + "/metrics", timeout=10)
    assert response.status_code == 200, response.text
    samples = {}
    for line in response.text.splitlines():
        if line.startswith("vpsshop_"):
            series, _, value = line.rpartition(" ")
            samples[series] = float(value)
    return samples


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of the samples of metric ``name`` whose labels include ``labels``."""
    return sum(
        value
        for series, value in samples.items()
        if series.split("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items())
    )


def until(what: str, probe: Any, seconds: float = 120) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        answer = probe()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"{what} within {seconds} s"
        time.sleep(0.2)


def test_sigkill_worker_mid_provisioning(shop: Shop, cluster: PrivateCluster) -> None:
    """SIGKILL the worker while servers are being provisioned: the next worker finishes each once."""
    orders = []
    for _ in range(5):
        _user, auth = shop.account(fund_usd=10)
        response = httpx.post(
            f"{shop.base}/servers", headers=auth, timeout=30, json={"plan": "pup", "location": "nl", "os": "debian-12"}
        )
        assert response.status_code == 201, response.text
        orders.append((auth, response.json()["server"]["id"]))
    # the worker has made a domain for some server, which still boots: kill it there
    until(
        "a domain made and still provisioning",
        lambda: sql(cluster, "SELECT id FROM servers WHERE domain IS NOT NULL AND status = 'provisioning'"),
        60,
    )
    shop.kill_worker()
    in_flight = sql(cluster, "SELECT COUNT(*) FROM servers WHERE status = 'provisioning'")[0][0]
    assert in_flight > 0
    # While no worker runs: /health has nothing to report (the API and the database are fine), and
    # /metrics shows the jobs waiting and the oldest one ageing (the "job queue age" alert of
    # docs/operations.md).
    assert httpx.get(f"{shop.base}/health", timeout=10).json()["status"] == "ok"
    first = metrics(shop)
    time.sleep(3)
    dead = metrics(shop)
    assert dead["vpsshop_job_queue_depth"] >= in_flight, dead
    assert dead["vpsshop_job_oldest_age_seconds"] >= first["vpsshop_job_oldest_age_seconds"] + 2.5, (first, dead)
    assert total(dead, "vpsshop_jobs", status="done") < 5, dead
    shop.start_worker()
    for auth, server_id in orders:
        until(
            f"server {server_id} active",
            lambda auth=auth, server_id=server_id: (
                httpx.get(f"{shop.base}/servers/{server_id}", headers=auth, timeout=30).json()["status"] == "active"
            ),
            120,
        )
    assert (
        sql(
            cluster,
            "SELECT server_id, COUNT(*) FROM server_events WHERE kind = 'provisioned' "
            "GROUP BY server_id HAVING COUNT(*) <> 1",
        )
        == []
    )
    assert sql(cluster, "SELECT COUNT(*) FROM ledger_entries WHERE amount_micros < 0")[0][0] == 5
    # one simulated domain per server: a retried create made no second one
    domains = sql(cluster, "SELECT COUNT(*) FROM plugin_records WHERE namespace = 'simulator'")[0][0]
    assert domains == 5
    ledger_matches_balances(cluster)
    after = metrics(shop)  # and /metrics says all is well again, each job counted once
    assert total(after, "vpsshop_jobs", status="done") == 5 and total(after, "vpsshop_jobs") == 5, after
    assert after["vpsshop_job_queue_depth"] == 0 and after["vpsshop_job_oldest_age_seconds"] == 0, after
    assert after["vpsshop_orders_total"] == 5, after


def _pay_topups(shop: Shop, litecoind: Litecoind, count: int) -> list[tuple[dict[str, str], dict[str, Any]]]:
    paid = []
    for _ in range(count):
        _user, auth = shop.account()
        topup = httpx.post(f"{shop.base}/topups", headers=auth, json={"amount": 25, "coin": "LTC"}, timeout=30)
        assert topup.status_code == 201, topup.text
        paid.append((auth, topup.json()))
    litecoind.rpc("sendmany", "", {t["deposit_address"]: t["deposit_amount"] for _a, t in paid})
    return paid


def _balances(shop: Shop, paid: list[tuple[dict[str, str], dict[str, Any]]]) -> list[float]:
    return [httpx.get(f"{shop.base}/account", headers=auth, timeout=30).json()["balance_usd"] for auth, _t in paid]


def test_sigkill_worker_mid_crediting(shop: Shop, cluster: PrivateCluster, litecoind: Litecoind) -> None:
    """SIGKILL the worker the moment it has credited the first payment of a block of twelve: the next
    worker credits the rest, and each payment exactly once."""
    paid = _pay_topups(shop, litecoind, 12)
    litecoind.mine(1)  # one confirmation of two: the watcher records the payments as seen
    until("the payments seen", lambda: sql(cluster, "SELECT COUNT(*) FROM topup_payments")[0][0] == 12, 60)
    litecoind.mine(1)
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{cluster.port}/drill", autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while not conn.execute("SELECT COUNT(*) FROM topup_payments WHERE status = 'credited'").fetchone()[0]:
            assert time.monotonic() < deadline, "no credit within 60 s"
            time.sleep(0.005)
        shop.kill_worker()
        at_kill = conn.execute("SELECT COUNT(*) FROM topup_payments WHERE status = 'credited'").fetchone()[0]
    print(f"payments credited when the worker was killed: {at_kill} of 12")
    # While no worker runs: /metrics shows the LTC watcher's last good pass standing still (the
    # "watcher stalled" alert) and only the payments credited before the kill; /health has nothing
    # to report (the node and the database answer).
    assert httpx.get(f"{shop.base}/health", timeout=10).json()["status"] == "ok"
    first = metrics(shop)
    time.sleep(2)  # four watch intervals
    dead = metrics(shop)
    last_pass = total(dead, "vpsshop_watcher_last_pass_timestamp_seconds", group="LTC")
    assert last_pass == total(first, "vpsshop_watcher_last_pass_timestamp_seconds", group="LTC") > 0, dead
    assert time.time() - last_pass >= 2, dead
    assert total(dead, "vpsshop_credited_usd_total", reason="topup") == 25 * at_kill, (at_kill, dead)
    shop.start_worker()
    until("every payment credited", lambda: _balances(shop, paid) == [25.0] * 12, 120)
    after = metrics(shop)  # the watcher passes again; each payment counted once
    assert total(after, "vpsshop_watcher_last_pass_timestamp_seconds", group="LTC") > last_pass, after
    assert total(after, "vpsshop_credited_usd_total", reason="topup") == 300, after
    assert total(after, "vpsshop_topups", coin="LTC", status="completed") == 12, after
    rows = sql(
        cluster,
        "SELECT p.credited_micros, COUNT(l.id) FROM topup_payments p JOIN ledger_entries l "
        "ON l.dedupe_key = 'topup:' || p.coin || ':' || p.identity GROUP BY p.id, p.credited_micros",
    )
    assert sorted(rows) == [(25_000_000, 1)] * 12, (at_kill, rows)
    ledger_matches_balances(cluster)


def test_postgresql_stops_under_load(shop: Shop, cluster: PrivateCluster) -> None:
    """PostgreSQL stops for a few seconds while clients read and order: /health says the database is
    down (503) meanwhile, no process dies, and afterwards every accepted order is served once."""
    _user, auth = shop.account(fund_usd=100)

    def load_failures(samples: dict[str, float]) -> float:
        """The 5xx answers /metrics counted on the routes the load calls."""
        return sum(
            total(samples, "vpsshop_http_requests_total", route=route, status=status)
            for route in ("/v1/account", "/v1/servers")
            for status in ("500", "503")
        )

    outcomes: list[int] = []
    accepted: list[int] = []
    running = True

    def load() -> None:
        with httpx.Client(base_url=shop.base, timeout=30) as client:
            n = 0
            while running:
                n += 1
                try:
                    if n % 10 == 0:
                        response = client.post(
                            "/servers", headers=auth, json={"plan": "pup", "location": "nl", "os": "debian-12"}
                        )
                        if response.status_code == 201:
                            accepted.append(response.json()["server"]["id"])
                    else:
                        response = client.get("/account", headers=auth)
                    outcomes.append(response.status_code)
                except httpx.TransportError:
                    outcomes.append(0)
                time.sleep(0.02)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        until("load running", lambda: len(outcomes) > 20, 30)
        cluster.stop()
        health = until(
            "/health to report the database down",
            lambda: (lambda r: r if r.status_code == 503 else None)(httpx.get(f"{shop.base}/health", timeout=10)),
            30,
        )
        assert health.json()["status"] == "down" and health.json()["database"]["ok"] is False
        during = len(outcomes)
        time.sleep(3)
        failed_during = [code for code in outcomes[during:] if code != 200]
        # /metrics while PostgreSQL is down: it still answers, with the requests that failed
        # meanwhile counted by status, and says the database is down
        outage = metrics(shop)
        print("/metrics during the outage:", {k: v for k, v in outage.items() if "_bucket" not in k})
        failed_counted = load_failures(outage)
        assert failed_counted > 0, outage
        cluster.start()
        until("/health ok again", lambda: httpx.get(f"{shop.base}/health", timeout=10).status_code == 200, 60)
        after = len(outcomes)
        until("requests succeed again", lambda: len(outcomes) > after + 20, 60)
    finally:
        running = False
        thread.join(60)
    # The database's outage is a 503 with the error body (never a 500), logged in one line, no traceback
    assert failed_during and all(code == 503 for code in failed_during), set(failed_during)
    api_log = (shop.workdir / "api.log").read_text()
    assert "database unavailable on GET /v1/account" in api_log and "Traceback" not in api_log
    assert all(code in (200, 201) for code in outcomes[after + 5 :]), set(outcomes[after + 5 :])
    assert shop.api.poll() is None and shop.worker.poll() is None  # both rode it out
    # After it: /metrics counted every failure the clients saw, once (the load is over, one API process)
    samples = metrics(shop)
    assert load_failures(samples) == sum(1 for code in outcomes if code in (500, 503)) >= failed_counted, samples
    for server_id in accepted:
        until(
            f"server {server_id} active",
            lambda server_id=server_id: (
                httpx.get(f"{shop.base}/servers/{server_id}", headers=auth, timeout=30).json()["status"] == "active"
            ),
            120,
        )
    servers = sql(cluster, "SELECT id FROM servers ORDER BY id")
    assert [row[0] for row in servers] == sorted(accepted)  # no order lost, none made twice
    assert sql(cluster, "SELECT COUNT(*) FROM ledger_entries WHERE amount_micros < 0")[0][0] == len(accepted)
    ledger_matches_balances(cluster)


def test_a_worker_started_while_postgresql_is_down_waits_for_it(shop: Shop, cluster: PrivateCluster) -> None:
    """A host boots vpsshop before its database, or PostgreSQL restarts as the worker starts: the
    worker waits, saying so in its log, and runs once the database answers (it used to exit with a
    traceback from the migration)."""
    shop.kill_worker()
    cluster.stop()
    log = shop.workdir / "worker.log"
    before = log.read_text()
    worker = shop.start_worker()
    until("the worker to say it waits", lambda: "waiting for the database" in log.read_text()[len(before) :], 60)
    time.sleep(2)
    assert worker.poll() is None, log.read_text()[len(before) :]
    cluster.start()
    until("the worker to run", lambda: "vpsshop worker: running" in log.read_text()[len(before) :], 60)
    assert worker.poll() is None and "Traceback" not in log.read_text()[len(before) :]


def test_chain_node_returns_behind_a_reorganised_tip(shop: Shop, cluster: PrivateCluster, litecoind: Litecoind) -> None:
    """litecoind stops with a payment one block deep; /health says LTC is not ready; it comes back,
    the block is replaced by a longer chain that holds the payment elsewhere: credited once."""
    paid = _pay_topups(shop, litecoind, 1)
    (first_block,) = litecoind.mine(1)
    until("the payment seen", lambda: sql(cluster, "SELECT 1 FROM topup_payments"), 60)
    lag = until(  # the watcher reports how far behind the node's tip it is, in blocks
        "the watcher's lag reported",
        lambda: [
            v
            for k, v in metrics(shop).items()
            if k.split("{")[0] == "vpsshop_watcher_lag_blocks" and 'group="LTC"' in k
        ],
        30,
    )
    assert 0 <= lag[0] <= 2, lag
    errors_before = total(metrics(shop), "vpsshop_node_errors_total", group="LTC")
    argv = _restartable(litecoind)
    litecoind.stop()
    health = until(
        "/health to report LTC",
        lambda: (lambda b: b if any(c["id"] == "LTC" and not c["ready"] for c in b["components"]) else None)(
            httpx.get(f"{shop.base}/health", timeout=10).json()
        ),
        30,
    )
    assert health["status"] == "degraded"
    # /metrics counts the node's errors while it is away, and the watcher's last good pass stands still
    until(
        "node errors counted",
        lambda: total(metrics(shop), "vpsshop_node_errors_total", group="LTC") > errors_before,
        30,
    )
    stalled = total(metrics(shop), "vpsshop_watcher_last_pass_timestamp_seconds", group="LTC")
    time.sleep(1.5)
    assert total(metrics(shop), "vpsshop_watcher_last_pass_timestamp_seconds", group="LTC") == stalled
    litecoind.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until("litecoind back", lambda: _answers(litecoind), 60)
    litecoind.rpc("loadwallet", "miner")
    litecoind.rpc("invalidateblock", first_block)  # the payment returns to the mempool
    litecoind.mine(3)  # a longer chain without the old block, the payment in its first block
    until("/health ok", lambda: httpx.get(f"{shop.base}/health", timeout=10).json()["status"] == "ok", 30)
    until("credited", lambda: _balances(shop, paid) == [25.0], 120)
    time.sleep(2)  # more watcher passes: nothing more
    assert _balances(shop, paid) == [25.0]
    rows = sql(cluster, "SELECT status, block_hash FROM topup_payments")
    assert len(rows) == 1 and rows[0][0] == "credited" and rows[0][1] != first_block
    ledger_matches_balances(cluster)
    after = metrics(shop)  # the watcher passes again, the payment counted once
    assert total(after, "vpsshop_watcher_last_pass_timestamp_seconds", group="LTC") > stalled, after
    assert total(after, "vpsshop_credited_usd_total", reason="topup") == 25, after


def _restartable(node: Litecoind) -> list[str]:
    return [
        shutil.which("litecoind") or "/usr/bin/litecoind",
        "-regtest",
        f"-datadir={node.datadir}",
        f"-rpcport={node.port}",
        f"-port={free_port()}",
        "-rpcbind=127.0.0.1",
        "-rpcallowip=127.0.0.1",
        f"-rpcuser={node.user}",
        f"-rpcpassword={node.password}",
        "-listen=0",
        "-server",
        "-fallbackfee=0.0002",
        "-printtoconsole=0",
    ]


def _answers(node: Litecoind) -> bool:
    try:
        node.rpc("getblockcount")
        return True
    except (OSError, RuntimeError):
        return False


# ---- libvirtd restarts during provisioning ----------------------------------------------------------


@pytest.fixture
def private_libvirtd() -> Iterator[tuple[PrivateLibvirtd, str, Path]]:
    """A libvirtd of this drill alone (tests/libvirt_peer.py), with a dir pool holding a blank base
    image: (daemon, pool name, pool directory)."""
    workdir = peer_workdir("drill-libvirtd")
    daemon = PrivateLibvirtd(workdir)
    directory = workdir / "pool"
    directory.mkdir()
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", str(directory / "debian-12-genericcloud-amd64.qcow2"), "1G"],
        check=True,
    )
    shutil.chown(directory, daemon.user.pw_uid, daemon.user.pw_gid)
    shutil.chown(directory / "debian-12-genericcloud-amd64.qcow2", daemon.user.pw_uid, daemon.user.pw_gid)
    xml = workdir / "pool.xml"
    xml.write_text(f"<pool type='dir'><name>drill</name><target><path>{directory}</path></target></pool>")
    created = daemon.virsh("pool-create", str(xml))
    assert created.returncode == 0, created.stderr
    yield daemon, "drill", directory
    daemon.close()
    remove_workdir(workdir)


def test_libvirtd_restarts_during_provisioning(
    tmp_path: Path,
    cluster: PrivateCluster,
    litecoind: Litecoind,
    private_libvirtd: tuple[PrivateLibvirtd, str, Path],
) -> None:
    """libvirtd is stopped while servers are being created and started again 5 s later (a real
    restart of a real libvirtd, the drill's own): /health says the hypervisor is not ready and
    /metrics shows the jobs waiting meanwhile; then every server is active with exactly one domain,
    charged once, and /metrics counts each job done once."""
    daemon, pool, directory = private_libvirtd
    running = Shop(
        tmp_path,
        cluster.url,
        litecoind,
        hypervisor=f"""[hypervisor]
backend = "libvirt"

[hypervisor.libvirt]
domain_type = "qemu"
shutdown_grace_seconds = 2
guest_reports = false  # a blank base image: no guest boots to report

[hypervisor.libvirt.locations.nl]
hosts = [{{ uri = "{daemon.uri}", name = "local", max_memory_mib = 8192 }}]
pool = "{pool}"
network = "user"
addresses = "198.51.100.10-198.51.100.40"
gateway = "198.51.100.1"
""",
    )
    try:
        orders = []
        for _ in range(3):
            _user, auth = running.account(fund_usd=10)
            response = httpx.post(
                f"{running.base}/servers",
                headers=auth,
                timeout=30,
                json={"plan": "pup", "location": "nl", "os": "debian-12"},
            )
            assert response.status_code == 201, response.text
            orders.append((auth, response.json()["server"]["id"]))
        until(
            "a domain named, the server still provisioning",
            lambda: sql(cluster, "SELECT id FROM servers WHERE domain IS NOT NULL AND status = 'provisioning'"),
            120,
        )
        daemon.stop()
        health = until(
            "/health to report the hypervisor",
            lambda: (
                lambda b: b if any(c["kind"] == "hypervisor" and not c["ready"] for c in b["components"]) else None
            )(httpx.get(f"{running.base}/health", timeout=30).json()),
            30,
        )
        assert health["status"] == "degraded"
        down = metrics(running)
        assert down["vpsshop_job_queue_depth"] >= 1 and total(down, "vpsshop_jobs", status="done") < 3, down
        time.sleep(5)
        daemon.start()
        for auth, server_id in orders:
            until(
                f"server {server_id} active",
                lambda auth=auth, server_id=server_id: (
                    httpx.get(f"{running.base}/servers/{server_id}", headers=auth, timeout=30).json()["status"]
                    == "active"
                ),
                240,
            )
        until(
            "/health ok again",
            lambda: httpx.get(f"{running.base}/health", timeout=30).json()["status"] == "ok",
            30,
        )
        jobs = sql(cluster, "SELECT server_id, kind, status, attempts FROM server_jobs ORDER BY id")
        print("jobs after the restart:", jobs)
        assert max(attempts for *_rest, attempts in jobs) > 1, jobs  # the restart did interrupt a provisioning
        domains = sql(cluster, "SELECT domain FROM servers ORDER BY id")
        ours = sorted(daemon.virsh("list", "--all", "--name").stdout.split())  # every domain it has
        assert ours == sorted(domain for (domain,) in domains)  # one domain per server, the one it records
        assert len(list(directory.glob("vps-*.qcow2"))) == 3
        assert sql(cluster, "SELECT COUNT(*) FROM ledger_entries WHERE amount_micros < 0")[0][0] == 3
        assert (
            sql(
                cluster,
                "SELECT server_id, COUNT(*) FROM server_events WHERE kind = 'provisioned' "
                "GROUP BY server_id HAVING COUNT(*) <> 1",
            )
            == []
        )
        ledger_matches_balances(cluster)
        after = metrics(running)
        assert total(after, "vpsshop_jobs", status="done") == 3 and total(after, "vpsshop_jobs") == 3, after
        assert after["vpsshop_job_queue_depth"] == 0 and after["vpsshop_orders_total"] == 3, after
    finally:
        running.close()
