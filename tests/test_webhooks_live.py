"""Webhooks as a shop runs them: `vpsshop worker` and `vpsshop serve` processes, a real HTTP
receiver that verifies every request with the `standardwebhooks` library, a real litecoind for
the top-up, and a reseller plugin loaded by `[plugins] modules` (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from chain_nodes import Litecoind, free_port
from test_bitcoin import litecoind, random_tpub  # noqa: F401 - litecoind -regtest, the session fixture
from webhook_receiver import Receiver

from vpsshop.db import Database
from vpsshop.events.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

pytestmark = pytest.mark.slow
VPSSHOP = str(Path(sys.executable).with_name("vpsshop"))


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def write_config(path: Path, database_url: str, mode: str = "sandbox", **sections: dict[str, Any]) -> Path:
    lines = [
        f'mode = "{mode}"',
        f"database_url = {json.dumps(database_url)}",
        f'secret_key = "{TEST_SECRET_KEY}"',
        f'encryption_key = "{TEST_ENCRYPTION_KEY}"',
        'public_url = "https://shop.example/v1"',
    ]
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


FAST = {
    "interval_seconds": 0.2,
    "retry_base_seconds": 0.2,
    "retry_max_delay_seconds": 2,
    "timeout_seconds": 5,
    "lease_seconds": 6,
}


class Process:
    """A `vpsshop` command in the background, its output in a log file, stopped by its own pid."""

    def __init__(self, args: list[str], cwd: Path, name: str, env: dict[str, str] | None = None) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
        environ.update(env or {})
        self.log = cwd / f"{name}.log"
        self.out = self.log.open("w")
        self.proc = subprocess.Popen([VPSSHOP, *args], cwd=cwd, env=environ, stdout=self.out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for_output(self, needle: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while needle not in self.text():
            assert self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, f"{needle!r} never appeared:\n{self.text()}"
            time.sleep(0.1)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.out.close()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def worker(processes: list[Process], config: Path, name: str = "worker") -> Process:
    process = Process(["worker", "--config", str(config)], config.parent, name)
    processes.append(process)
    process.wait_for_output("vpsshop worker: running")
    return process


def seed(
    database_url: str,
    receiver: Receiver,
    path: str,
    keys: int,
    types: str = '["api_key.created"]',
    url: str | None = None,
) -> tuple[int, int]:
    """An account with an endpoint at ``path`` and ``keys`` api_key.created events after it, written
    through the app (in this process); the worker processes deliver them. Returns (account, endpoint)."""
    from starlette.testclient import TestClient

    from vpsshop import create_app
    from vpsshop.settings import load_settings

    settings = load_settings(
        None,
        environ={},
        overrides={
            "database_url": database_url,
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "server": {"background": False},
        },
    )
    with TestClient(create_app(settings, background=False)) as client:
        created = client.post("/v1/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        hook = client.post(
            "/v1/webhooks", headers=headers, json={"url": receiver.url(path), "event_types": json.loads(types)}
        )
        assert hook.status_code == 201, hook.text
        receiver.secrets[path] = hook.json()["secret"]
        if url is not None:  # written past the API's checks, as if the name had resolved elsewhere then
            with client.app.state.ctx.db.session() as session:
                session.execute(
                    sa.update(WebhookEndpoint).where(WebhookEndpoint.id == hook.json()["id"]).values(url=url)
                )
        for _ in range(keys):
            assert client.post("/v1/keys", headers=headers).status_code == 201
    return created["user_id"], hook.json()["id"]


def rows(database_url: str, model: Any) -> list[Any]:
    db = Database(database_url)
    try:
        with db.session() as session:
            return list(session.exec(sa.select(model)).scalars().all())
    finally:
        db.dispose()


def test_a_receiver_failing_n_times_gets_each_event_accepted_exactly_once(
    vpsshop_database_url: str, tmp_path: Path, receiver: Receiver, processes: list[Process]
) -> None:
    fails = 3
    receiver.plan = lambda path, msg_id, seen: (503 if seen < fails else 200, {}, 0.0)
    Database(vpsshop_database_url).migrate()
    seed(vpsshop_database_url, receiver, "/flaky", keys=5)
    worker(processes, write_config(tmp_path / "shop.toml", vpsshop_database_url, events=FAST))
    receiver.wait_for(lambda got: len([r for r in got if r.status == 200]) == 5)
    time.sleep(2)  # anything still scheduled would arrive now
    got = list(receiver.received)
    assert all(r.verified for r in got), [r.error for r in got]
    per_event = Counter((r.id, r.status) for r in got)
    ids = {r.id for r in got}
    assert len(ids) == 5
    assert all(per_event[(i, 503)] == fails and per_event[(i, 200)] == 1 for i in ids), per_event
    deliveries = rows(vpsshop_database_url, WebhookDelivery)
    assert sorted((d.status, d.attempts) for d in deliveries) == [("succeeded", fails + 1)] * 5
    attempts = rows(vpsshop_database_url, WebhookAttempt)
    assert Counter(a.outcome for a in attempts) == {"rejected": 5 * fails, "accepted": 5}


def test_a_worker_killed_mid_delivery_redelivers(
    vpsshop_database_url: str, tmp_path: Path, receiver: Receiver, processes: list[Process]
) -> None:
    receiver.plan = lambda path, msg_id, seen: (200, {}, 30.0 if seen == 0 else 0.0)  # holds the first request
    Database(vpsshop_database_url).migrate()
    seed(vpsshop_database_url, receiver, "/slow", keys=1)
    config = write_config(tmp_path / "shop.toml", vpsshop_database_url, events=FAST)
    first = worker(processes, config, "worker-1")
    receiver.wait_for(lambda got: len(got) == 1)
    first.kill()  # SIGKILL while the request is open: no outcome is ever recorded by it
    [delivery] = rows(vpsshop_database_url, WebhookDelivery)
    assert (delivery.status, delivery.attempts) == ("delivering", 1)
    worker(processes, config, "worker-2")
    got = receiver.wait_for(lambda got: len(got) == 2, seconds=60)
    assert got[0].id == got[1].id and all(r.verified for r in got)  # the same event, signed anew
    assert int(got[1].headers["webhook-timestamp"]) >= int(got[0].headers["webhook-timestamp"])
    deadline = time.monotonic() + 30
    while rows(vpsshop_database_url, WebhookDelivery)[0].status != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    [delivery] = rows(vpsshop_database_url, WebhookDelivery)
    assert delivery.attempts == 2
    assert [(a.number, a.outcome) for a in rows(vpsshop_database_url, WebhookAttempt)] == [(2, "accepted")]


def test_two_workers_never_deliver_one_attempt_twice(
    vpsshop_database_url: str, tmp_path: Path, receiver: Receiver, processes: list[Process]
) -> None:
    receiver.plan = lambda path, msg_id, seen: (200, {}, 0.05)
    Database(vpsshop_database_url).migrate()
    events = 60
    seed(vpsshop_database_url, receiver, "/many", keys=events)
    config = write_config(
        tmp_path / "shop.toml", vpsshop_database_url, events={**FAST, "concurrency": 3, "batch_size": 6}
    )
    a = Process(["worker", "--config", str(config)], tmp_path, "worker-a")
    b = Process(["worker", "--config", str(config)], tmp_path, "worker-b")
    processes += [a, b]
    receiver.wait_for(lambda got: len(got) >= events, seconds=120)
    time.sleep(2)
    got = list(receiver.received)
    assert len(got) == events and len({r.id for r in got}) == events and all(r.verified for r in got)
    attempts = rows(vpsshop_database_url, WebhookAttempt)
    assert len(attempts) == events and {a.number for a in attempts} == {1}
    print("deliveries per worker:", Counter(a.worker for a in attempts))


PRODUCTION = {
    "rates": {"source": "fixed", "fixed": {"prices": {"BTC": "60000"}}},
    "hypervisor": {
        "backend": "libvirt",
        "libvirt": {
            "domain_type": "test",
            "locations": {
                "*": {
                    "hosts": [{"uri": "test:///default", "name": "test", "max_memory_mib": 1048576}],
                    "pool": "default-pool",
                    "network": "network:default",
                    "addresses": "10.99.0.0/16",
                    "gateway": "10.99.0.1",
                }
            },
        },
    },
}


def test_a_production_worker_refuses_internal_destinations_and_redirects(
    vpsshop_database_url: str, tmp_path: Path, receiver: Receiver, processes: list[Process]
) -> None:
    """Endpoints written straight to the database (as if their name resolved elsewhere when they were
    registered): the production worker resolves and checks each one at delivery and refuses it."""
    Database(vpsshop_database_url).migrate()
    port = receiver.port
    internal = {
        "/loopback": f"http://127.0.0.1:{port}/loopback",
        "/name": f"http://localhost:{port}/name",
        "/v6": f"http://[::1]:{port}/v6",
        "/metadata": "http://169.254.169.254/latest/meta-data/",
    }
    endpoints = []
    for path, url in internal.items():
        endpoints.append(seed(vpsshop_database_url, receiver, path, keys=1, url=url)[1])
    strict = write_config(
        tmp_path / "strict.toml",
        vpsshop_database_url,
        mode="production",
        events={**FAST, "require_https": False},
        **PRODUCTION,
    )
    first = worker(processes, strict, "strict")
    deadline = time.monotonic() + 60
    while len({a.endpoint_id for a in rows(vpsshop_database_url, WebhookAttempt)}) < len(internal):
        assert time.monotonic() < deadline, first.text()
        time.sleep(0.2)
    first.stop()
    attempts = rows(vpsshop_database_url, WebhookAttempt)
    assert {a.outcome for a in attempts} == {"refused"}
    assert all("may not reach" in a.error for a in attempts)
    assert receiver.received == []

    # A receiver the shop allows (allowed_networks) that redirects elsewhere: the redirect is not followed.
    target = Receiver()
    try:
        receiver.plan = lambda path, msg_id, seen: (307, {"Location": target.url("/internal")}, 0.0)
        db = Database(vpsshop_database_url)
        with db.session() as session:
            session.execute(sa.update(WebhookEndpoint).values(deleted_at=sa.func.now()))
        db.dispose()
        seed(vpsshop_database_url, receiver, "/redirect", keys=1)
        allowing = write_config(
            tmp_path / "allowing.toml",
            vpsshop_database_url,
            mode="production",
            events={**FAST, "require_https": False, "allowed_networks": ["127.0.0.1/32"]},
            **PRODUCTION,
        )
        worker(processes, allowing, "allowing")
        receiver.wait_for(lambda got: len(got) >= 1)
        time.sleep(1)
        assert target.received == []
        redirected = [a for a in rows(vpsshop_database_url, WebhookAttempt) if a.status_code == 307]
        assert redirected and "not followed" in redirected[0].error
    finally:
        target.close()


# ---- the whole story: a customer's top-up and order, a reseller's plugin -------------------------

RESELLER_PLUGIN = '''
"""A reseller's one-file plugin: appends every event it is given to a file (think: mail, chat, books)."""
import json
import os

from vpsshop import hookimpl


@hookimpl
def vpsshop_event(event):
    with open(os.environ["RESELLER_EVENTS_FILE"], "a") as out:
        out.write(json.dumps({"id": event.id, "type": event.type, "account_id": event.account_id}) + "\\n")
'''


def test_customer_gets_signed_events_for_a_topup_and_an_order_and_a_plugin_sees_them(
    vpsshop_database_url: str,
    tmp_path: Path,
    receiver: Receiver,
    processes: list[Process],
    litecoind: Litecoind,  # noqa: F811
) -> None:
    (tmp_path / "reseller_log.py").write_text(textwrap.dedent(RESELLER_PLUGIN))
    seen_file = tmp_path / "reseller-events.jsonl"
    config = write_config(
        tmp_path / "shop.toml",
        vpsshop_database_url,
        events=FAST,
        plugins={"modules": ["reseller_log"]},
        coins={"LTC": litecoind.settings(random_tpub(), confirmations=2)},
        topups={"watch_interval_seconds": 0.5, "poll_min_seconds": 0},
        servers={"jobs_interval_seconds": 0.2},
    )
    env = {"PYTHONPATH": str(tmp_path), "RESELLER_EVENTS_FILE": str(seen_file)}
    port = free_port()
    serve = Process(["serve", "--config", str(config), "--port", str(port), "--no-worker"], tmp_path, "serve", env)
    processes.append(serve)
    serve.wait_for_output("Uvicorn running", seconds=90)
    work = Process(["worker", "--config", str(config)], tmp_path, "worker", env)
    processes.append(work)
    work.wait_for_output("vpsshop worker: running")
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=30)

    account = api.post("/account").json()
    headers = {"Authorization": f"Bearer {account['api_key']}"}
    hook = api.post("/webhooks", headers=headers, json={"url": receiver.url("/shop")})
    assert hook.status_code == 201, hook.text
    receiver.secrets["/shop"] = hook.json()["secret"]

    topup = api.post("/topups", headers=headers, json={"amount": 50, "coin": "LTC"}).json()
    litecoind.pay(topup["deposit_address"], topup["deposit_amount"])
    receiver.wait_for(lambda got: "topup.payment_seen" in {r.json()["type"] for r in got}, seconds=90)
    litecoind.mine(2)
    receiver.wait_for(lambda got: "topup.completed" in {r.json()["type"] for r in got}, seconds=90)
    order = api.post("/servers", headers=headers, json={"plan": "pup", "location": "nl", "os": "debian-12"})
    assert order.status_code == 201, order.text
    server_id = order.json()["server"]["id"]
    expected = [
        "webhook.created",  # the endpoint's own registration is its first event
        "topup.created",
        "topup.payment_seen",
        "topup.payment_confirmed",
        "ledger.credit",
        "topup.completed",
        "server.provisioning",
        "ledger.debit",
        "server.active",
    ]
    receiver.wait_for(lambda got: set(expected) <= {r.json()["type"] for r in got}, seconds=90)
    time.sleep(1)  # nothing else, and nothing twice, arrives
    got = list(receiver.received)

    assert all(r.verified for r in got), [r.error for r in got]
    bodies = [r.json() for r in got]
    kinds = [b["type"] for b in bodies]
    assert Counter(kinds) == Counter(expected), kinds  # each once, accepted once
    by_type = {b["type"]: b for b in bodies}
    assert by_type["topup.completed"]["data"]["ref"] == topup["ref"]
    assert by_type["topup.completed"]["data"]["status"] == "completed"
    assert by_type["topup.payment_confirmed"]["data"]["payment"]["credited_usd"] == 50
    assert by_type["ledger.credit"]["data"]["balance_after_usd"] == 50
    active = by_type["server.active"]["data"]
    assert active == {"object": "server", **api.get(f"/servers/{server_id}", headers=headers).json()}
    assert active["status"] == "active" and active["ip"]

    listed = api.get("/events", headers=headers, params={"limit": 100}).json()["events"]
    assert {b["id"] for b in bodies} <= {e["id"] for e in listed}
    deadline = time.monotonic() + 30
    while True:  # the last answer reached the receiver a moment before the worker recorded it
        log = api.get(f"/webhooks/{hook.json()['id']}/deliveries", headers=headers).json()["deliveries"]
        if all(d["status"] == "succeeded" for d in log) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(log) == len(bodies) and [d["status"] for d in log] == ["succeeded"] * len(bodies)
    assert all(len(d["log"]) == 1 and d["log"][0]["status_code"] == 200 for d in log)

    deadline = time.monotonic() + 60
    while True:  # the reseller's plugin sees the same events, in the worker, without polling the API
        lines = seen_file.read_text().splitlines() if seen_file.exists() else []
        plugin_ids = {json.loads(line)["id"] for line in lines}
        if {b["id"] for b in bodies} <= plugin_ids:
            break
        assert time.monotonic() < deadline, work.text()
        time.sleep(0.2)
    plugin_types = [json.loads(line)["type"] for line in seen_file.read_text().splitlines()]
    assert "account.created" in plugin_types and "api_key.created" in plugin_types
    assert account["api_key"] not in serve.text() + work.text()
