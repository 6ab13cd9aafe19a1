"""Prometheus metrics of a shop: ``GET /metrics`` on every ``vpsshop serve`` port.

Two kinds of figures, so that every process of a host shows the same numbers:

* **Counted in the processes** (``prometheus-client`` multiprocess mode): HTTP requests by route,
  method and status with a latency histogram, chain node errors, the chain watcher's lag and the
  time of its last pass. Every ``vpsshop serve`` worker and ``vpsshop worker`` of one host write
  their values to files in one directory (``[metrics] multiprocess_dir``); ``/metrics`` adds them up.
* **Read from the database when scraped**: top-ups by coin and status, USD credited, orders,
  renewals and the periods they bought, provisioning jobs by status, queue depth and the age of the
  oldest waiting job, x402 settlements by final outcome and those still settling. These are exact
  whichever process answers and survive restarts; while the database does not answer they are left
  out and ``/metrics`` serves the rest.
* **Checked when scraped**: each component's readiness (``vpsshop_component_ready``, as
  ``GET /v1/health`` shows it) and the figures it reports for alerting
  (``vpsshop_component_figure``: the x402 relayer's gas, say).

Who may read it (``[metrics]``): with ``token`` set, any client sending
``Authorization: Bearer <token>``; without the token, only TCP peers in ``allow_ips`` (default
loopback) and only when the request came straight to the service (a request carrying
``X-Forwarded-For`` or ``Forwarded`` passed a proxy and needs the token). Anyone else gets 404.

``prometheus_client`` chooses multiprocess mode when its first metric is built, from
``PROMETHEUS_MULTIPROC_DIR``; :func:`configure` sets that variable (from the settings) before
any metric exists, so it runs first in ``create_app`` and in ``vpsshop worker``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import tempfile
import time
from bisect import bisect_left
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

if TYPE_CHECKING:  # pragma: no cover
    from starlette.requests import Request
    from starlette.responses import Response

    from vpsshop.component import Readiness
    from vpsshop.context import AppContext, LoadedComponent
    from vpsshop.settings import MetricsSettings, Settings

log = logging.getLogger("vpsshop.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
READY_BUCKETS = (5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0)


def shop_identity(settings: Settings) -> str:
    """What tells this shop from another on the same host: the database's absolute location (a SQLite
    path resolved against the working directory, so two sandboxes in two directories differ; a server
    URL without its password) and the config file's absolute path."""
    url = settings.database_url
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        where = url
    else:
        if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
            where = "sqlite:///" + str(Path(parsed.database).resolve())
        else:
            where = parsed.set(password=None).render_as_string(hide_password=False)
    config = str(settings.config_path.resolve()) if settings.config_path else ""
    return f"{where}\n{config}"


def multiprocess_dir(settings: Settings) -> Path:
    """The shared directory of this shop's processes on this host."""
    configured = settings.metrics.multiprocess_dir or os.environ.get(MULTIPROC_ENV, "")
    if configured:
        return Path(configured)
    digest = hashlib.sha256(shop_identity(settings).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"vpsshop-metrics-{digest}"


_state: dict[str, Any] = {}


def configure(settings: Settings) -> None:
    """Point ``prometheus_client`` at the shared directory (first call in a process wins).

    Files that dead processes left for "live" gauges are removed; their counters stay, so totals
    do not fall when a process restarts.
    """
    if "dir" in _state:
        return
    path = multiprocess_dir(settings)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(path)
    from prometheus_client import multiprocess, values

    values.ValueClass = values.get_value_class()  # in case prometheus_client was imported before
    for pid in _dead_pids(path):
        multiprocess.mark_process_dead(pid, str(path))
    _state["dir"] = path


def _dead_pids(path: Path) -> set[int]:
    pids = set()
    for file in path.glob("*.db"):
        try:
            pid = int(file.stem.rsplit("_", 1)[1])
        except (IndexError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            pids.add(pid)
        except PermissionError:
            pass
    return pids


class _Metrics:
    """The process-counted metrics, built once per process after :func:`configure`."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.requests = Counter(
            "vpsshop_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
        )
        self.latency = Histogram(
            "vpsshop_http_request_duration_seconds",
            "Time from request to the end of the response, by route template and method.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
        )
        self.node_errors = Counter(
            "vpsshop_node_errors",
            "Failed watcher passes of a scan group (the chain node or its plugin failed).",
            ["group"],
        )
        self.watcher_lag = Gauge(
            "vpsshop_watcher_lag_blocks",
            "Blocks between the node's tip and the block the "
            "watcher has scanned, per scan group (when the coin plugin reports heights).",
            ["group"],
            multiprocess_mode="mostrecent",
        )
        self.ready = Histogram(
            "vpsshop_server_ready_seconds",
            "Seconds from an order (after=order) or a reinstall request (after=reinstall) to the guest's "
            "report that it booted and answers SSH, as the worker saw it.",
            ["after"],
            buckets=READY_BUCKETS,
        )
        self.watcher_push = Gauge(
            "vpsshop_watcher_push",
            "1 while the watcher follows a scan group's node by its push channel, 0 while it polls.",
            ["group"],
            multiprocess_mode="mostrecent",
        )
        self.watcher_pass = Gauge(
            "vpsshop_watcher_last_pass_timestamp_seconds",
            "Unix time of the last successful watcher pass of a scan group.",
            ["group"],
            multiprocess_mode="max",
        )


def _metrics() -> _Metrics | None:
    if "dir" not in _state:
        return None
    metrics = _state.get("metrics")
    if metrics is None:
        metrics = _state["metrics"] = _Metrics()
    return metrics


# Requests are counted in plain dictionaries and written to the multiprocess files at most every
# FLUSH_SECONDS (and before this process renders /metrics): each write to a multiprocess value takes
# a lock, checks the pid and writes the mmap, which cost about a fifth of an authenticated GET
# /v1/account when done per request. Another process's scrape sees this one's requests at most
# FLUSH_SECONDS late; a process that exits loses at most that much of its request counts.
FLUSH_SECONDS = 0.5
_pending_requests: dict[tuple[str, str, int], int] = {}
_pending_latency: dict[tuple[str, str], list[float]] = {}  # a count per bucket (+Inf last), then the sum
_next_flush = 0.0


def observe_request(route: str, method: str, status: int, seconds: float) -> None:
    """Count one answered request (called on the event loop by the access log middleware)."""
    global _next_flush
    key = (route, method, status)
    _pending_requests[key] = _pending_requests.get(key, 0) + 1
    latency = _pending_latency.get((route, method))
    if latency is None:
        latency = _pending_latency[(route, method)] = [0.0] * (len(LATENCY_BUCKETS) + 2)
    latency[bisect_left(LATENCY_BUCKETS, seconds)] += 1
    latency[-1] += seconds
    now = time.monotonic()
    if now >= _next_flush:
        _next_flush = now + FLUSH_SECONDS
        flush_requests()


def flush_requests() -> None:
    """Write the counted requests to the metrics (on the event loop, like :func:`observe_request`)."""
    global _pending_requests, _pending_latency
    requests, latencies = _pending_requests, _pending_latency
    _pending_requests, _pending_latency = {}, {}
    metrics = _metrics()
    if metrics is None:
        return
    for (route, method, status), count in requests.items():
        metrics.requests.labels(route, method, str(status)).inc(count)
    for (route, method), latency in latencies.items():
        child = metrics.latency.labels(route, method)
        # prometheus-client keeps one value per bucket (non-cumulative) and the sum; observe() adds
        # one observation to each, these add the batch.
        child._sum.inc(latency[-1])
        for bucket, observed in zip(child._buckets, latency[:-1], strict=True):
            if observed:
                bucket.inc(observed)


def node_error(group: str) -> None:
    """A watcher pass of ``group`` failed (called by the core watcher)."""
    metrics = _metrics()
    if metrics is not None:
        metrics.node_errors.labels(group).inc()


def server_ready(after: str, seconds: float) -> None:
    """A server became ready ``seconds`` after its order (``after="order"``) or reinstall request
    (``"reinstall"``); called by the worker's provisioning job."""
    metrics = _metrics()
    if metrics is not None:
        metrics.ready.labels(after).observe(max(0.0, seconds))


def watcher_pass(group: str, *, tip: int | None = None, scanned: int | None = None) -> None:
    """A watcher pass of ``group`` ended well; ``tip`` and ``scanned`` heights give the lag when known."""
    metrics = _metrics()
    if metrics is not None:
        metrics.watcher_pass.labels(group).set(time.time())
        if tip is not None and scanned is not None:
            metrics.watcher_lag.labels(group).set(max(0, tip - scanned))


def watcher_mode(group: str, *, push: bool) -> None:
    """The watcher follows ``group`` by push (True) or polls it (False)."""
    metrics = _metrics()
    if metrics is not None:
        metrics.watcher_push.labels(group).set(1 if push else 0)


# -- figures read from the database at scrape time --------------------------------------------------------


class DatabaseCollector:
    """Reads the business figures from the database on each scrape (a few grouped counts)."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Any]:
        # Read every figure before yielding one: while the database does not answer, /metrics still
        # serves the process-counted figures (the failing requests among them) without these.
        try:
            families = list(self._read())
        except sa.exc.DBAPIError as exc:
            log.warning("metrics: database figures left out, the database did not answer (%s)", type(exc).__name__)
            return
        yield from families

    def _read(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        engine = self.ctx.db.engine
        now = datetime.now(UTC)
        with engine.connect() as conn:
            topups = GaugeMetricFamily("vpsshop_topups", "Top-ups by coin and status.", labels=["coin", "status"])
            for coin, status, count in conn.execute(
                sa.text("SELECT coin, status, count(*) FROM topups GROUP BY coin, status")
            ):
                topups.add_metric([coin, status], count)
            yield topups
            ledger = {
                reason: (int(total or 0), int(count))
                for reason, total, count in conn.execute(
                    sa.text("SELECT reason, sum(amount_micros), count(*) FROM ledger_entries GROUP BY reason")
                )
            }
            credited = CounterMetricFamily(
                "vpsshop_credited_usd",
                "USD credited to balances, by reason (topup: crypto payments; admin_credit; refund).",
                labels=["reason"],
            )
            for reason in ("topup", "admin_credit", "refund"):
                credited.add_metric([reason], ledger.get(reason, (0, 0))[0] / 1_000_000)
            yield credited
            yield CounterMetricFamily(
                "vpsshop_orders", "Servers bought (ledger order entries).", value=ledger.get("order", (0, 0))[1]
            )
            yield CounterMetricFamily(
                "vpsshop_renewals",
                "Renewals charged (ledger renewal entries; a renewal paying several periods counts once).",
                value=ledger.get("renewal", (0, 0))[1],
            )
            # Each renewal charged price x periods of its server (the price is fixed at the order).
            periods = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(-l.amount_micros / s.price_micros), 0) FROM ledger_entries l "
                    "JOIN servers s ON l.ref = 'server:' || CAST(s.id AS VARCHAR(20)) "
                    "WHERE l.reason = 'renewal' AND s.price_micros > 0"
                )
            ).scalar_one()
            yield CounterMetricFamily(
                "vpsshop_renewed_periods",
                "Billing periods bought by renewals (a renewal of 3 periods counts 3).",
                value=int(periods),
            )
            jobs = GaugeMetricFamily("vpsshop_jobs", "Provisioning jobs by status.", labels=["status"])
            for status, count in conn.execute(sa.text("SELECT status, count(*) FROM server_jobs GROUP BY status")):
                jobs.add_metric([status], count)
            yield jobs
            depth, oldest = conn.execute(
                sa.text("SELECT count(*), min(created_at) FROM server_jobs WHERE status IN ('queued', 'running')")
            ).one()
            yield GaugeMetricFamily("vpsshop_job_queue_depth", "Provisioning jobs queued or running.", value=depth)
            age = 0.0
            if oldest is not None:
                age = max(0.0, (now - as_utc(oldest)).total_seconds())
            yield GaugeMetricFamily(
                "vpsshop_job_oldest_age_seconds",
                "Age of the oldest queued or running provisioning job (0 when none).",
                value=age,
            )
            traffic = CounterMetricFamily(
                "vpsshop_traffic_bytes",
                "Network traffic of the servers, as their hypervisors counted it, by host and direction "
                "(in: received by the servers, out: sent), every traffic period of every server summed.",
                labels=["host", "direction"],
            )
            for host, received, sent in conn.execute(
                sa.text(
                    "SELECT coalesce(s.host, ''), sum(t.in_bytes), sum(t.out_bytes) FROM server_traffic t "
                    "JOIN servers s ON s.id = t.server_id GROUP BY coalesce(s.host, '')"
                )
            ):
                traffic.add_metric([host, "in"], int(received or 0))
                traffic.add_metric([host, "out"], int(sent or 0))
            yield traffic
            x402 = CounterMetricFamily(
                "vpsshop_x402_settlements",
                "x402 settlements by final outcome (settled, rejected); never falls.",
                labels=["outcome"],
            )
            try:
                with conn.begin_nested():
                    rows: dict[str, int] = dict(
                        conn.execute(sa.text("SELECT status, count(*) FROM x402_payments GROUP BY status")).all()
                    )
            except sa.exc.DBAPIError:  # the x402 table is absent: no settlements to show
                rows = {}
            for outcome in ("settled", "rejected"):
                x402.add_metric([outcome], int(rows.get(outcome, 0)))
            yield x402
            yield GaugeMetricFamily(
                "vpsshop_x402_settling",
                "x402 settlements in flight: recorded, outcome not known yet (resolved by a retry or the "
                "x402 task; one staying here means the relayer or the chain is not answering).",
                value=int(rows.get("settling", 0)),
            )


class ComponentCollector:
    """Each loaded component's readiness and the figures it reports (:class:`vpsshop.Readiness`),
    from checks made when scraped (shared with ``GET /v1/health`` for a few seconds)."""

    def __init__(self, checked: list[tuple[LoadedComponent, Readiness]], sandbox: bool) -> None:
        self.checked = checked
        self.sandbox = sandbox

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from vpsshop.readiness import ready_in_mode

        ready = GaugeMetricFamily(
            "vpsshop_component_ready",
            "1 when a component (a coin, the hypervisor, the catalog source, the rates source) is ready for "
            "what this mode promises, as GET /v1/health reports it; 0 when not (its node does not answer, the "
            "x402 relayer has no gas, ...). The API's log says why.",
            labels=["kind", "component"],
        )
        figures = GaugeMetricFamily(
            "vpsshop_component_figure",
            "A figure a component reports for alerting, by name (the name ends in its unit), e.g. "
            'name="relayer_gas_wei" for the USDCBASE coin\'s x402 relayer.',
            labels=["kind", "component", "name"],
        )
        for item, readiness in self.checked:
            ready.add_metric([item.kind, item.key], 1 if ready_in_mode(readiness, self.sandbox) else 0)
            for name, value in sorted(readiness.figures.items()):
                figures.add_metric([item.kind, item.key, name], float(value))
        yield ready
        yield figures


def as_utc(value: datetime | str) -> datetime:
    """A timestamp read outside the ORM: SQLite gives naive UTC text, PostgreSQL aware datetimes."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _peer_allowed(peer: str | None, allow: list[str]) -> bool:
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    for entry in allow:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def allowed(request: Request, settings: MetricsSettings) -> bool:
    """Whether ``request`` may read /metrics (see the module docstring)."""
    token = settings.token.get_secret_value()
    header = request.headers.get("authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
        return True
    if request.headers.get("x-forwarded-for") or request.headers.get("forwarded"):
        return False
    raw_peer = request.scope.get("vpsshop.peer") or (request.client.host if request.client else None)
    return _peer_allowed(raw_peer, settings.allow_ips)


async def metrics_endpoint(request: Request) -> Response:
    from anyio import to_thread
    from starlette.responses import PlainTextResponse, Response

    ctx: AppContext = request.app.state.ctx
    settings = ctx.settings.metrics
    if not settings.enabled or not allowed(request, settings):
        return PlainTextResponse("Not Found", status_code=404)
    flush_requests()  # this process's requests so far, before it reads every process's files
    from vpsshop.readiness import component_readiness

    checked = await component_readiness(ctx)

    def render() -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        registry = CollectorRegistry()
        if "dir" in _state:
            multiprocess.MultiProcessCollector(registry, path=str(_state["dir"]))
        registry.register(DatabaseCollector(ctx))
        registry.register(ComponentCollector(checked, ctx.settings.sandbox))
        return generate_latest(registry)

    from prometheus_client import CONTENT_TYPE_LATEST

    body = await to_thread.run_sync(render)
    return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})
