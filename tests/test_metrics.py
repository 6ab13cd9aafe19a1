"""GET /metrics (vpsshop/metrics.py) through the shipped commands: every figure moves, figures of the
``vpsshop worker`` process show on the ``vpsshop serve`` port, access is guarded, and a real
Prometheus scrapes it."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from chain_nodes import Litecoind, random_tpub, running_litecoind
from prometheus_client.parser import text_string_to_metric_families
from served import TEST_ENCRYPTION_KEY as TEST_KEY
from served import VPSSHOP, free_port, serve, shop_env, stop, worker

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
METRICS_TOKEN = "metrics-token-for-the-test-0123456789"


def scrape(base: str, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(base.removesuffix("/v1") + "/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait(read: Callable[[], Any], done: Callable[[Any], bool], timeout: float, *logs: Any) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if done(got):
            return got
        assert time.monotonic() < deadline, f"still {got!r}\n" + "\n".join(p.output() for p in logs)
        time.sleep(0.3)


def test_every_figure_moves_through_serve_and_worker(vpsshop_database_url, tmp_path: Path):
    dead_node = free_port()  # nothing listens here: every watcher pass of BTC fails (a node error)
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0.5",
        VPSSHOP__COINS__BTC__RPC_URL=f"http://127.0.0.1:{dead_node}/",
        VPSSHOP__TOPUPS__WATCH_INTERVAL_SECONDS="0.5",
        VPSSHOP__METRICS__TOKEN=METRICS_TOKEN,
        VPSSHOP__METRICS__MULTIPROCESS_DIR=str(tmp_path / "metrics"),
    )
    with serve(tmp_path, env, "--no-worker") as api:
        before = scrape(api.base)
        created = httpx.post(f"{api.base}/account")
        assert created.status_code == 201
        account = created.json()
        headers = {"Authorization": f"Bearer {account['api_key']}"}
        credit = subprocess.run(
            [VPSSHOP, "admin", "credit", str(account["user_id"]), "40", "--reason", "metrics"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert credit.returncode == 0, credit.stderr
        assert httpx.post(f"{api.base}/topups", headers=headers, json={"amount": 25, "coin": "BTC"}).status_code == 201
        order = httpx.post(f"{api.base}/servers", headers=headers, json=ORDER)
        assert order.status_code in (201, 202), order.text
        sid = order.json()["server"]["id"]
        time.sleep(1.1)
        waiting = scrape(api.base)  # no worker yet: the create job waits in the queue
        assert value(waiting, "vpsshop_job_queue_depth") == 1
        assert value(waiting, "vpsshop_job_oldest_age_seconds") >= 1
        assert value(waiting, "vpsshop_jobs", status="queued") == 1
        with worker(tmp_path, env) as w:
            wait(
                lambda: httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()["status"],
                lambda s: s == "active",
                60,
                api,
                w,
            )
            renewed = httpx.post(f"{api.base}/servers/{sid}/renew", headers=headers, json={"periods": 2})
            assert renewed.status_code in (200, 201, 202), renewed.text
            after = wait(
                lambda: scrape(api.base),
                lambda s: any(k[0] == "vpsshop_node_errors_total" and v > 0 for k, v in s.items()),
                60,
                w,
            )
        _record_x402_settlement(vpsshop_database_url, account["user_id"])
        settling = scrape(api.base)
        _record_x402_settlement(vpsshop_database_url, account["user_id"], settled=True)
        final = scrape(api.base)

        # Requests by route template (not by id) and status, with latency histograms.
        assert value(final, "vpsshop_http_requests_total", route="/v1/account", method="POST", status="201") == 1
        assert value(final, "vpsshop_http_requests_total", route="/v1/servers/{id}", method="GET", status="200") >= 1
        assert value(final, "vpsshop_http_request_duration_seconds_count", route="/v1/topups", method="POST") == 1
        assert not any(f"/servers/{sid}" in str(k) for k in final)
        # Top-ups by coin and state; USD credited; orders and renewals (from the database).
        assert value(final, "vpsshop_topups", coin="BTC", status="pending") == 1
        assert value(before, "vpsshop_credited_usd_total", reason="admin_credit") == 0
        assert value(final, "vpsshop_credited_usd_total", reason="admin_credit") == 40
        assert value(final, "vpsshop_orders_total") == 1 and value(before, "vpsshop_orders_total") == 0
        assert value(final, "vpsshop_renewals_total") == 1  # one renewal ...
        assert value(final, "vpsshop_renewed_periods_total") == 2  # ... of two periods
        # Jobs: the queue drained (its depth and age back to 0), the create job done.
        assert value(final, "vpsshop_job_queue_depth") == 0 and value(final, "vpsshop_job_oldest_age_seconds") == 0
        assert value(final, "vpsshop_jobs", status="done") >= 1
        # Counted in the worker process, shown on the serve port: node errors of the BTC scan group.
        assert sum(v for k, v in after.items() if k[0] == "vpsshop_node_errors_total") > 0
        # x402 settlements: in flight is a gauge that falls; final outcomes a counter that never does.
        assert value(settling, "vpsshop_x402_settling") == 1
        assert value(settling, "vpsshop_x402_settlements_total", outcome="settled") == 0
        assert value(final, "vpsshop_x402_settling") == 0
        assert value(final, "vpsshop_x402_settlements_total", outcome="settled") == 1
        assert not any(k[0] == "vpsshop_x402_settlements_total" and ("outcome", "settling") in k[1] for k in final)
        # Components as GET /v1/health reports them: the simulated hypervisor is ready, the BTC coin
        # whose node does not answer is not (the "node down" alert).
        assert value(final, "vpsshop_component_ready", kind="hypervisor", component="simulator") == 1
        assert ("vpsshop_component_ready", (("component", "BTC"), ("kind", "coin"))) in final
        assert value(final, "vpsshop_component_ready", kind="coin", component="BTC") == 0

        _access_rules(api.base)
        _prometheus_scrapes(api.base, tmp_path)


def _record_x402_settlement(database_url: str, account_id: int, settled: bool = False) -> None:
    """An x402 payment as the x402 code records it (a row of x402_payments on a top-up): first
    ``settling``, then (``settled``) its outcome known."""
    engine = sa.create_engine(database_url)
    try:
        with engine.begin() as conn:
            if settled:
                conn.execute(sa.text("UPDATE x402_payments SET status = 'settled' WHERE nonce = '0x01'"))
                return
            topup_id = conn.execute(sa.text("SELECT id FROM topups WHERE account_id = :a"), {"a": account_id}).scalar()
            conn.execute(
                sa.text(
                    "INSERT INTO x402_payments (coin, payer, nonce, topup_id, status, amount_atomic, header, "
                    "requirements, created_at) VALUES ('USDCBASE', '0xpayer', '0x01', :t, 'settling', '1', '{}', "
                    "'{}', :now)"
                ),
                {"t": topup_id, "now": "2026-11-23 00:00:00"},
            )
    finally:
        engine.dispose()


def _access_rules(base: str) -> None:
    url = base.removesuffix("/v1") + "/metrics"
    # From loopback, straight to the service: open. Through a proxy (X-Forwarded-For): the token is needed.
    assert httpx.get(url).status_code == 200
    assert httpx.get(url, headers={"X-Forwarded-For": "203.0.113.9"}).status_code == 404
    wrong = {"X-Forwarded-For": "203.0.113.9", "Authorization": "Bearer wrong"}
    assert httpx.get(url, headers=wrong).status_code == 404
    assert (
        httpx.get(
            url, headers={"X-Forwarded-For": "203.0.113.9", "Authorization": f"Bearer {METRICS_TOKEN}"}
        ).status_code
        == 200
    )
    # Not part of the API: not in the OpenAPI document.
    assert "/metrics" not in httpx.get(f"{base}/openapi.json").json()["paths"]


def _prometheus_scrapes(base: str, tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    assert prometheus, "Debian package prometheus (scripts/deps/apt-ops.txt)"
    target = base.removeprefix("http://").removesuffix("/v1")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: vpsshop\n"
        f"    authorization: {{type: Bearer, credentials: {METRICS_TOKEN}}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def query() -> list[Any]:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "vpsshop_orders_total"})
                return answer.json()["data"]["result"] if answer.status_code == 200 else []
            except httpx.TransportError:
                return []

        deadline = time.monotonic() + 60
        while not query():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert query()[0]["value"][1] == "1"
        up = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "up"}).json()["data"]["result"]
        assert up[0]["value"][1] == "1"
    finally:
        stop(proc)  # type: ignore[arg-type]


def test_two_shops_on_one_host_never_share_a_metrics_directory(tmp_path: Path, monkeypatch):
    """The default directory hashes the database's absolute location and the config file: two sandboxes
    (the same relative sqlite:///./vpsshop.db) in two directories get two directories; one shop's serve
    and worker, whichever way they name the config, get the same one."""
    from vpsshop.metrics import multiprocess_dir
    from vpsshop.settings import load_settings

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    sandbox = {"VPSSHOP_MODE": "sandbox", "VPSSHOP_SECRET_KEY": "k", "VPSSHOP_ENCRYPTION_KEY": TEST_KEY}
    dirs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        settings = load_settings(None, environ=sandbox)
        assert settings.database_url == "sqlite:///./vpsshop.db"
        dirs.append(multiprocess_dir(settings))
    assert dirs[0] != dirs[1]
    config = tmp_path / "one" / "shop.toml"
    config.write_text(f'mode = "sandbox"\ndatabase_url = "sqlite:///{tmp_path / "one" / "vpsshop.db"}"\n')
    monkeypatch.chdir(tmp_path / "one")
    by_flag = multiprocess_dir(load_settings("shop.toml", environ=sandbox))
    monkeypatch.chdir(tmp_path)
    by_env = multiprocess_dir(load_settings(None, environ={**sandbox, "VPSSHOP_CONFIG": str(config)}))
    assert by_flag == by_env != dirs[0]  # a config file with the same database is another shop


@pytest.fixture(scope="module")
def litecoind() -> Iterator[Litecoind]:
    with running_litecoind("ltc-metrics") as node:
        yield node


def test_watcher_figures_move_and_the_worker_logs_json(vpsshop_database_url, tmp_path: Path, litecoind: Litecoind):
    """A worker watching LTC on a real litecoind: it follows the node by push (``vpsshop_watcher_push``
    1), the last-pass time moves on when a block arrives, the lag follows the tip, and every line the
    worker writes (its start line too) is JSON."""
    coin = litecoind.settings(random_tpub(), 2)
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__TOPUPS__WATCH_INTERVAL_SECONDS="0.5",
        VPSSHOP__METRICS__MULTIPROCESS_DIR=str(tmp_path / "metrics"),
        **{f"VPSSHOP__COINS__LTC__{k.upper()}": str(v) for k, v in coin.items()},
    )
    last_pass = "vpsshop_watcher_last_pass_timestamp_seconds"
    with serve(tmp_path, env, "--no-worker") as api, worker(tmp_path, env) as w:
        first = wait(lambda: value(scrape(api.base), last_pass, group="LTC"), lambda v: v > 0, 60, api, w)
        wait(lambda: value(scrape(api.base), "vpsshop_watcher_push", group="LTC"), lambda v: v == 1, 30, w)
        litecoind.mine(1)
        later = wait(lambda: value(scrape(api.base), last_pass, group="LTC"), lambda v: v > first, 30, w)
        assert later - first < 30
        assert value(scrape(api.base), "vpsshop_watcher_lag_blocks", group="LTC") == 0
    lines = [line for line in w.output().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # every line is JSON
    assert any(p.get("msg", "").startswith("vpsshop worker: running") for p in parsed)
