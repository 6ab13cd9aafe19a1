"""Servers that are ready when they say so: ``active`` once the guest reports, its host keys, a first
boot with errors reported instead of passed as ready (SQLite and PostgreSQL).

The guest's side runs for real in ``tests/test_real_guest.py`` (a Debian guest under QEMU, its
report read over a virtio-serial channel, the SSH banner timed from the host). Here the simulator
plays the hypervisor; where a test needs a report the simulator does not make (errors, SSH off,
no report yet), the backend's ``guest_report`` is replaced by ``GuestSays``, which answers what a
guest would have written on its channel, parsed by the libvirt plugin's own parser.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
from typing import Any

import pytest
from served import VPSSHOP as VPSSHOP_CMD
from sqlmodel import select
from test_admin_support import _ctx, _order

from vpsshop import GuestReport, HostKey
from vpsshop.models import Server
from vpsshop.servers.jobs import BOOT_ERRORS, BOOTING, SSH_OFF, run_jobs
from vpsshop.servers.models import ServerEvent, ServerJob
from vpsshop.testing import create_test_account
from vpsshop_libvirt import parse_report, reporter

ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
"""A real key: its fingerprint is what ``ssh-keygen -lf`` prints (checked below)."""


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"boot_seconds": 0}}, "servers": {"boot_timeout_seconds": 600}}


class GuestSays:
    """The guest's report as it would arrive on its channel: ``lines`` are what the guest writes,
    one per call of ``guest_report`` (None: nothing written yet), parsed by the libvirt plugin."""

    def __init__(self, *lines: dict | None) -> None:
        self.lines = list(lines)
        self.calls = 0

    async def __call__(self, handle: Any, wait_seconds: float) -> GuestReport | None:
        self.calls += 1
        line = self.lines.pop(0) if len(self.lines) > 1 else self.lines[0]
        return None if line is None else parse_report(json.dumps(line).encode())


def _report(**fields: Any) -> dict:
    return {"vpsshop_guest": 1, "ssh": True, "host_keys": [ED25519], "errors": [], **fields}


def _server(client, account, sid: int) -> dict:
    return client.get(f"/v1/servers/{sid}", headers=account.headers).json()


def _event_types(client, account) -> list[str]:
    return [e["type"] for e in client.get("/v1/events", headers=account.headers).json()["events"]]


def test_active_only_once_the_guest_reports(vpsshop_client, monkeypatch):
    client, ctx = vpsshop_client, _ctx(vpsshop_client)
    account = create_test_account(client)
    account.credit("20")
    guest = GuestSays(None, _report())
    monkeypatch.setattr(ctx.hypervisor, "guest_report", guest)
    sid = _order(client, account)

    assert asyncio.run(run_jobs(ctx)) == {"done": 0, "retry": 1, "failed": 0}
    waiting = _server(client, account, sid)
    assert waiting["status"] == "provisioning" and waiting["status_reason"] == BOOTING
    assert waiting["ready_at"] is None and waiting["host_keys"] == []
    with ctx.db.session() as session:  # waiting for a guest is not a failed attempt
        job = session.exec(select(ServerJob).where(ServerJob.server_id == sid)).one()
        assert job.attempts == 0 and job.status == "queued"
    assert "server.active" not in _event_types(client, account)

    ctx.clock.advance(seconds=1)
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    ready = _server(client, account, sid)
    assert ready["status"] == "active" and ready["status_reason"] is None and ready["ready_at"]
    assert ready["host_keys"] == [
        {"type": "ssh-ed25519", "key": ED25519.split()[1], "fingerprint": HostKey.parse(ED25519).fingerprint}
    ]
    assert _event_types(client, account).count("server.active") == 1
    with ctx.db.session() as session:
        kinds = [e.kind for e in session.exec(select(ServerEvent).where(ServerEvent.server_id == sid))]
    assert "ready" in kinds


def test_a_first_boot_with_errors_is_reported_not_ready(vpsshop_client, monkeypatch):
    client, ctx = vpsshop_client, _ctx(vpsshop_client)
    account = create_test_account(client)
    account.credit("20")
    error = "('scripts_user', RuntimeError('Runparts: 1 failures (part-001) in 1 attempted commands'))"
    monkeypatch.setattr(ctx.hypervisor, "guest_report", GuestSays(_report(errors=[error])))
    sid = _order(client, account)
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    server = _server(client, account, sid)
    assert server["status"] == "active" and server["ready_at"] is None
    assert server["status_reason"] == BOOT_ERRORS.format(errors=error)
    assert server["host_keys"][0]["fingerprint"] == HostKey.parse(ED25519).fingerprint
    types = _event_types(client, account)
    assert "server.boot_failed" in types and "server.active" not in types
    assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 16.01  # not refunded


def test_user_data_that_turns_ssh_off_is_ready_not_failed(vpsshop_client, monkeypatch):
    client, ctx = vpsshop_client, _ctx(vpsshop_client)
    account = create_test_account(client)
    account.credit("20")
    monkeypatch.setattr(ctx.hypervisor, "guest_report", GuestSays(_report(ssh=False)))
    sid = _order(client, account)
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    server = _server(client, account, sid)
    assert server["status"] == "active" and server["ready_at"] and server["status_reason"] == SSH_OFF
    assert "server.active" in _event_types(client, account)


def test_a_guest_that_never_reports_fails_its_attempts_and_is_refunded(vpsshop_client, monkeypatch):
    client, ctx = vpsshop_client, _ctx(vpsshop_client)
    account = create_test_account(client)
    account.credit("20")
    guest = GuestSays(None)
    monkeypatch.setattr(ctx.hypervisor, "guest_report", guest)
    sid = _order(client, account)
    assert asyncio.run(run_jobs(ctx))["retry"] == 1
    attempts = ctx.settings.servers.provision_attempts
    for _ in range(attempts):
        ctx.clock.advance(hours=2)  # past boot_timeout_seconds and every retry's back-off
        asyncio.run(run_jobs(ctx))
    server = _server(client, account, sid)
    assert server["status"] == "terminated", server
    assert "has not reported a finished boot" in server["status_reason"] and "refunded" in server["status_reason"]
    assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 20


def test_reinstall_waits_for_the_new_system_and_replaces_the_host_keys(vpsshop_client, monkeypatch):
    client, ctx = vpsshop_client, _ctx(vpsshop_client)
    account = create_test_account(client)
    account.credit("20")
    sid = _order(client, account)
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    first = _server(client, account, sid)
    assert first["ready_at"] and len(first["host_keys"]) == 1  # the simulator's guest's own key

    reinstall = client.post(f"/v1/servers/{sid}/reinstall", headers=account.headers, json={"os": "debian-12"})
    assert reinstall.status_code == 202, reinstall.text
    simulated = ctx.hypervisor.guest_report
    monkeypatch.setattr(ctx.hypervisor, "guest_report", GuestSays(None))
    ctx.clock.advance(seconds=1)
    assert asyncio.run(run_jobs(ctx))["retry"] == 1
    waiting = _server(client, account, sid)
    assert waiting["status_reason"].startswith("Reinstalling") and waiting["ready_at"] is None
    assert waiting["host_keys"] == []

    monkeypatch.setattr(ctx.hypervisor, "guest_report", simulated)
    ctx.clock.advance(seconds=1)
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    done = _server(client, account, sid)
    assert done["status_reason"] is None and done["ready_at"] and done["ready_at"] > first["ready_at"]
    assert done["host_keys"] and done["host_keys"] != first["host_keys"]
    with ctx.db.session() as session:  # the job ran twice; the disk was made once
        made = session.exec(select(ServerEvent).where(ServerEvent.server_id == sid, ServerEvent.kind == "reinstalled"))
        assert len(made.all()) == 1
        assert session.get(Server, sid).host_keys is not None
    assert _event_types(client, account).count("server.reinstalled") == 1


def test_host_key_fingerprint_is_what_ssh_keygen_prints(tmp_path):
    path = tmp_path / "key.pub"
    path.write_text(ED25519 + " comment\n")
    printed = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)], capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr
    key = HostKey.parse(ED25519 + " comment")
    assert printed.stdout.split()[1] == key.fingerprint
    assert key.known_hosts_line("203.0.113.7") == f"203.0.113.7 {ED25519}"


@pytest.mark.parametrize(
    "line",
    [
        "ssh-dss AAAAB3NzaC1kc3MAAACBAP",  # not a type sshd serves by default
        "ssh-rsa " + ED25519.split()[1],  # the blob is an ed25519 key
        "ssh-ed25519 not*base64*at*all*",
        "ssh-ed25519",
        "",
    ],
)
def test_host_key_parse_refuses_what_is_not_a_host_key(line):
    with pytest.raises(ValueError):
        HostKey.parse(line)


def test_a_guest_report_is_checked_like_any_input():
    assert parse_report(b"not json") is None
    assert parse_report(b'{"something": "else"}') is None
    report = parse_report(
        json.dumps(
            {"vpsshop_guest": 1, "ssh": "yes", "host_keys": [ED25519, "ssh-rsa AAAA", 7], "errors": ["x" * 1000]}
        ).encode()
    )
    assert report is not None and report.ssh is False  # only true is true
    assert [k.type for k in report.host_keys] == ["ssh-ed25519"]  # the malformed keys are dropped
    assert report.errors == ("x" * 300,)


def test_the_reporter_answers_each_request_until_the_host_says_ok():
    """reporter.py's protocol over a socket pair standing in for the virtio-serial port."""
    host, guest = socket.socketpair()
    answers = []

    def make() -> dict:
        answers.append(1)
        return _report()

    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(reporter.serve(guest.fileno(), make, 20)))
    thread.start()
    reader = host.makefile("rb")
    for _ in range(2):  # a worker that restarted asks again, and gets the same report
        host.sendall(b"report\n")
        assert parse_report(reader.readline()) == GuestReport(host_keys=(HostKey.parse(ED25519),))
    host.sendall(b"noise\nok\n")
    thread.join(10)
    assert result == [True] and answers == [1]  # made once, on the first request
    host.close()
    guest.close()


def test_the_reporter_runs_on_the_oldest_python_a_guest_may_have():
    """It is copied into guests as a script: it must not need this project (stdlib only)."""
    with open(reporter.__file__) as fh:
        source = fh.read()
    assert "import vpsshop" not in source and "from vpsshop" not in source
    compile(source, reporter.__file__, "exec", flags=0, dont_inherit=True)
    assert os.access(reporter.__file__, os.R_OK)


def test_a_served_shop_runs_a_queued_job_at_once_not_at_its_interval(tmp_path):
    """``vpsshop serve`` with its worker: the order's job is claimed as soon as the order commits,
    though the jobs task's interval is 30 s (the simulator boots at once and reports)."""
    import time

    import httpx
    from served import serve, shop_env

    config = tmp_path / "shop.toml"
    config.write_text("[servers]\njobs_interval_seconds = 30\n[hypervisor.simulator]\nboot_seconds = 0\n")
    env = shop_env(f"sqlite:///{tmp_path / 'shop.db'}", VPSSHOP_CONFIG=str(config))
    with serve(tmp_path, env) as served:
        time.sleep(1)  # the jobs task's first pass (at start-up) is over: the next one is 30 s away
        created = httpx.post(f"{served.base}/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        credit = [VPSSHOP_CMD, "admin", "credit", str(created["user_id"]), "10", "--reason", "test"]
        assert subprocess.run(credit, cwd=tmp_path, env=env, capture_output=True, timeout=60).returncode == 0
        order = httpx.post(
            f"{served.base}/servers", headers=headers, json={"plan": "pup", "location": "nl", "os": "debian-12"}
        )
        assert order.status_code == 201, order.text
        ordered = time.monotonic()
        sid = order.json()["server"]["id"]
        while (server := httpx.get(f"{served.base}/servers/{sid}", headers=headers).json())["status"] != "active":
            assert time.monotonic() - ordered < 10, (server, served.output()[-2000:])
            time.sleep(0.05)
        assert server["ready_at"] and server["host_keys"], server


def test_a_server_ended_while_it_boots_keeps_its_reason(vpsshop_client, monkeypatch):
    """DELETE while the job waits for the guest: the order is refunded with its reason, and the job's
    next run leaves the server as it is (no "Booting" written over the reason)."""
    client, ctx = vpsshop_client, _ctx(vpsshop_client)
    account = create_test_account(client)
    account.credit("20")
    monkeypatch.setattr(ctx.hypervisor, "guest_report", GuestSays(None))
    sid = _order(client, account)
    assert asyncio.run(run_jobs(ctx))["retry"] == 1
    assert client.request("DELETE", f"/v1/servers/{sid}", headers=account.headers).status_code == 200
    ended = _server(client, account, sid)["status_reason"]
    ctx.clock.advance(seconds=1)
    asyncio.run(run_jobs(ctx))
    server = _server(client, account, sid)
    assert server["status"] == "terminated" and server["status_reason"] == ended != BOOTING
    assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 20  # the whole order back
