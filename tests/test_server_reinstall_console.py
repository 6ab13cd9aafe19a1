"""Reinstall, the power state and the serial console through the API, on the simulator (SQLite and
PostgreSQL).

The real guest (tests/test_real_guest.py) does both on libvirtd with a booted Debian.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlmodel import select
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from vpsshop.api.console import CLOSE_BAD_TICKET, CLOSE_UNAVAILABLE
from vpsshop.events import delivery, outbox
from vpsshop.hypervisor import ServerHandle
from vpsshop.servers.console import TICKET_SECONDS
from vpsshop.servers.jobs import _prepare, run_jobs
from vpsshop.servers.models import ConsoleTicket, ServerEvent, ServerJob
from vpsshop.testing import create_test_account

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"boot_seconds": 0}}}


def _active_server(client, account) -> int:
    account.credit("20")
    order = client.post("/v1/servers", headers=account.headers, json=ORDER)
    assert order.status_code == 201, order.text
    assert asyncio.run(run_jobs(client.app.state.ctx))["done"] == 1
    sid = order.json()["server"]["id"]
    assert client.get(f"/v1/servers/{sid}", headers=account.headers).json()["status"] == "active"
    return sid


def test_reinstall_changes_os_keys_and_password(vpsshop_client, vpsshop_account):
    sid = _active_server(vpsshop_client, vpsshop_account)
    ctx = vpsshop_client.app.state.ctx
    line = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    key = vpsshop_client.post(
        "/v1/ssh-keys", headers=vpsshop_account.headers, json={"name": "k", "public_key": line}
    ).json()
    hook = vpsshop_client.post(
        "/v1/webhooks",
        headers=vpsshop_account.headers,
        json={"url": "http://127.0.0.1:9/hook", "event_types": ["server.*"]},
    ).json()
    old = vpsshop_client.get(f"/v1/servers/{sid}/credentials", headers=vpsshop_account.headers).json()["password"]
    balance = vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()["balance_usd"]
    response = vpsshop_client.post(
        f"/v1/servers/{sid}/reinstall",
        headers=vpsshop_account.headers,
        json={"os": "debian-13", "ssh_keys": [key["id"]]},
    )
    assert response.status_code == 202, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    new = body["root_password"]
    assert new and new != old and body["server"]["os"] == "debian-13" and body["server"]["status"] == "active"
    # Until the job is done, the server says it is reinstalling.
    shown = vpsshop_client.get(f"/v1/servers/{sid}", headers=vpsshop_account.headers).json()
    assert shown["status_reason"].startswith("Reinstalling debian-13") and body["server"] == shown
    again = vpsshop_client.post(
        f"/v1/servers/{sid}/reinstall", headers=vpsshop_account.headers, json={"os": "debian-13"}
    )
    assert again.status_code == 409 and again.json()["error"] == "reinstall_in_progress"
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    record = asyncio.run(ctx.hypervisor._state().get(_prepare(ctx, sid, "active")[1].name))
    assert record.data["os"] == "debian-13" and record.data["ssh_keys"] == 1
    creds = vpsshop_client.get(f"/v1/servers/{sid}/credentials", headers=vpsshop_account.headers).json()
    assert creds["password"] == new
    spec = _prepare(ctx, sid, "active")[1]
    assert spec.os_id == "debian-13" and spec.ssh_keys == (line,) and spec.root_password == new
    assert vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()["balance_usd"] == balance
    with ctx.db.session() as session:
        kinds = [e.kind for e in session.exec(select(ServerEvent).where(ServerEvent.server_id == sid))]
    assert kinds[-3:] == ["reinstall", "reinstalled", "ready"]  # the disk made, then the new system reported
    # Done: the reason is gone, the server runs, and server.reinstalled reaches GET /events and webhooks.
    shown = vpsshop_client.get(f"/v1/servers/{sid}", headers=vpsshop_account.headers).json()
    assert (shown["status_reason"], shown["power"], shown["os"]) == (None, "running", "debian-13")
    listed = vpsshop_client.get("/v1/events", headers=vpsshop_account.headers, params={"type": "server.*"}).json()
    assert [e["type"] for e in listed["events"]][-1] == "server.reinstalled"
    assert listed["events"][-1]["data"] == {"object": "server", **shown}
    outbox.publish_pending(ctx.db)
    delivery.fan_out(ctx)
    sent = vpsshop_client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=vpsshop_account.headers).json()
    assert "server.reinstalled" in [d["event_type"] for d in sent["deliveries"]]
    # A given password is not echoed back.
    given = vpsshop_client.post(
        f"/v1/servers/{sid}/reinstall",
        headers=vpsshop_account.headers,
        json={"os": "debian-12", "root_password": "Chosen-pass-123"},
    )
    assert given.status_code == 202 and given.json()["root_password"] is None


def test_a_reinstall_that_fails_says_so_on_the_server(vpsshop_client, vpsshop_account):
    sid = _active_server(vpsshop_client, vpsshop_account)
    ctx = vpsshop_client.app.state.ctx
    domain = _prepare(ctx, sid, "active")[1].name
    asyncio.run(ctx.hypervisor.destroy(ServerHandle("simulator", domain)))  # the domain vanished on the host
    response = vpsshop_client.post(
        f"/v1/servers/{sid}/reinstall", headers=vpsshop_account.headers, json={"os": "debian-13"}
    )
    assert response.status_code == 202
    for _ in range(ctx.settings.servers.provision_attempts):
        with ctx.db.session() as session:  # each retry due at once
            session.execute(sa.update(ServerJob).values(run_after=ctx.clock.now()))
        asyncio.run(run_jobs(ctx))
    shown = vpsshop_client.get(f"/v1/servers/{sid}", headers=vpsshop_account.headers).json()
    assert shown["status"] == "active" and shown["status_reason"].startswith("The reinstall of debian-13 did not")
    assert domain not in shown["status_reason"]  # the operator's error stays in the job, not on the resource
    assert "server.reinstalled" not in [
        e["type"] for e in vpsshop_client.get("/v1/events", headers=vpsshop_account.headers).json()["events"]
    ]


def test_reinstall_refusals(vpsshop_client, vpsshop_account):
    sid = _active_server(vpsshop_client, vpsshop_account)
    bad_os = vpsshop_client.post(f"/v1/servers/{sid}/reinstall", headers=vpsshop_account.headers, json={"os": "dos"})
    assert bad_os.status_code == 400 and bad_os.json()["error"] == "invalid_os"
    other = create_test_account(vpsshop_client)
    theirs = vpsshop_client.post(f"/v1/servers/{sid}/reinstall", headers=other.headers, json={"os": "debian-12"})
    assert theirs.status_code == 404
    order = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER).json()["server"]["id"]
    pending = vpsshop_client.post(
        f"/v1/servers/{order}/reinstall", headers=vpsshop_account.headers, json={"os": "debian-12"}
    )
    assert pending.status_code == 409 and pending.json()["error"] == "server_not_active"


def _ticket(client, account, sid) -> dict:
    response = client.post(f"/v1/servers/{sid}/console", headers=account.headers)
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    return response.json()


def test_console_ticket_is_single_use_and_streams_the_fake_console(vpsshop_client, vpsshop_account):
    sid = _active_server(vpsshop_client, vpsshop_account)
    ticket = _ticket(vpsshop_client, vpsshop_account, sid)
    assert ticket["url"] == f"/v1/servers/{sid}/console/ws?ticket={ticket['ticket']}"
    ctx = vpsshop_client.app.state.ctx
    with ctx.db.session() as session:  # only a digest is stored
        stored = session.exec(select(ConsoleTicket)).one()
    assert ticket["ticket"] not in stored.token_hash
    with vpsshop_client.websocket_connect(ticket["url"]) as ws:
        seen = b""
        while b"login: " not in seen:
            seen += ws.receive_bytes()
        assert b"Linux version" in seen and b"simulator" in seen
        ws.send_text("root\r")
        assert ws.receive_bytes() == b"root\r\n"
    with vpsshop_client.websocket_connect(ticket["url"]) as ws:  # used up
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
        assert closed.value.code == CLOSE_BAD_TICKET


def test_console_ticket_expires_and_is_bound_to_its_server(vpsshop_client, vpsshop_account, vpsshop_clock):
    sid = _active_server(vpsshop_client, vpsshop_account)
    other = create_test_account(vpsshop_client)
    assert vpsshop_client.post(f"/v1/servers/{sid}/console", headers=other.headers).status_code == 404
    ticket = _ticket(vpsshop_client, vpsshop_account, sid)
    second = _active_server(vpsshop_client, vpsshop_account)
    for url in (
        f"/v1/servers/{second}/console/ws?ticket={ticket['ticket']}",  # another server
        f"/v1/servers/{sid}/console/ws?ticket=forged",
        f"/v1/servers/{sid}/console/ws",
    ):
        with vpsshop_client.websocket_connect(url) as ws:
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_bytes()
            assert closed.value.code == CLOSE_BAD_TICKET
    vpsshop_clock.advance(seconds=TICKET_SECONDS + 1)
    with vpsshop_client.websocket_connect(ticket["url"]) as ws:
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_bytes()
        assert closed.value.code == CLOSE_BAD_TICKET


def test_a_backend_without_console_says_so(tmp_path):
    """libvirt's test:///default driver has no consoles: the API answers 501 not_supported."""
    from vpsshop.app import create_app
    from vpsshop.clock import FrozenClock
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path / 'shop.db'}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "hypervisor": {"backend": "libvirt"},
            "server": {"background": False, "access_log": False},
        },
    )
    with TestClient(create_app(settings, clock=FrozenClock(), background=False)) as client:
        assert "console" not in client.app.state.ctx.hypervisor.capabilities
        account = create_test_account(client)
        sid = _active_server(client, account)
        response = client.post(f"/v1/servers/{sid}/console", headers=account.headers)
        assert response.status_code == 409 and response.json()["error"] == "not_supported"
        assert "libvirt" in response.json()["message"]
        asyncio.run(run_jobs(client.app.state.ctx))


def test_a_console_the_client_closes_logs_no_error(tmp_path):
    """A served shop (uvicorn, a real WebSocket client): sessions that the client ends, after reading
    or at once, leave no ERROR and no traceback in the process's log."""
    import time

    import httpx
    from served import active_server, serve, shop_env
    from websockets.sync.client import connect

    env = shop_env(
        f"sqlite:///{tmp_path}/shop.db",
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0",
    )
    with serve(tmp_path, env) as api:
        headers, sid = active_server(api, tmp_path, env, ORDER, "console")
        ws_base = api.base.replace("http://", "ws://").removesuffix("/v1")
        for read_first in (True, False):
            ticket = httpx.post(f"{api.base}/servers/{sid}/console", headers=headers).json()
            with connect(ws_base + ticket["url"]) as ws:
                if read_first:
                    seen = b""
                    while b"login: " not in seen:
                        seen += ws.recv(timeout=10)
                    ws.send("root\r")
                    assert ws.recv(timeout=10) == b"root\r\n"
        time.sleep(1)  # the server side notices the close
        assert httpx.get(f"{api.base}/health").status_code == 200
        log = api.output()
    assert "console/ws" in log  # the sessions reached the served process
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert not [line for line in log.splitlines() if '"level":"error"' in line], log


# ---- the power state -----------------------------------------------------------------------------


def _power(client, account, sid) -> str | None:
    return client.get(f"/v1/servers/{sid}", headers=account.headers).json()["power"]


def test_power_follows_the_jobs_through_the_servers_life(vpsshop_client, vpsshop_account, vpsshop_clock):
    from datetime import datetime, timedelta

    from vpsshop.servers.lifecycle import run_lifecycle

    client, account = vpsshop_client, vpsshop_account
    ctx = client.app.state.ctx
    account.credit("20")
    sid = client.post("/v1/servers", headers=account.headers, json=ORDER).json()["server"]["id"]
    assert _power(client, account, sid) is None  # provisioning: nothing runs yet
    asyncio.run(run_jobs(ctx))
    assert _power(client, account, sid) == "running"
    for action, after in (("stop", "stopped"), ("stop", "stopped"), ("start", "running"), ("stop", "stopped")):
        assert client.post(f"/v1/servers/{sid}/{action}", headers=account.headers).status_code == 202
        asyncio.run(run_jobs(ctx))
        shown = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
        assert (shown["status"], shown["power"]) == ("active", after)  # the billing status stays
    assert client.post(f"/v1/servers/{sid}/reboot", headers=account.headers).status_code == 202
    asyncio.run(run_jobs(ctx))
    assert _power(client, account, sid) == "running"
    # Expiry unrenewed: suspended and stopped; renewed: active and running; the grace over: no power at all.
    client.patch(f"/v1/servers/{sid}", headers=account.headers, json={"auto_renew": False})
    expires = datetime.fromisoformat(client.get(f"/v1/servers/{sid}", headers=account.headers).json()["expires_at"])
    vpsshop_clock.set(expires + timedelta(minutes=1))
    asyncio.run(run_lifecycle(ctx))
    asyncio.run(run_jobs(ctx))
    shown = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
    assert (shown["status"], shown["power"]) == ("suspended", "stopped")
    assert client.post(f"/v1/servers/{sid}/renew", headers=account.headers).status_code == 200
    asyncio.run(run_jobs(ctx))
    assert _power(client, account, sid) == "running"
    vpsshop_clock.advance(days=80)
    asyncio.run(run_lifecycle(ctx))
    asyncio.run(run_lifecycle(ctx))
    asyncio.run(run_jobs(ctx))
    shown = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
    assert (shown["status"], shown["power"]) == ("terminated", None)
    # Every server event carries it too.
    data = [
        e["data"]
        for e in client.get("/v1/events", headers=account.headers).json()["events"]
        if e["type"] == "server.active"
    ]
    assert data[0]["power"] == "running"


def test_the_console_of_a_stopped_server_is_refused_in_plain_words(vpsshop_client, vpsshop_account):
    client, account = vpsshop_client, vpsshop_account
    ctx = client.app.state.ctx
    sid = _active_server(client, account)
    early = _ticket(client, account, sid)  # taken while it ran
    assert client.post(f"/v1/servers/{sid}/stop", headers=account.headers).status_code == 202
    asyncio.run(run_jobs(ctx))
    refused = client.post(f"/v1/servers/{sid}/console", headers=account.headers)
    assert refused.status_code == 409 and refused.json()["error"] == "server_stopped"
    assert "powered off" in refused.json()["message"] and f"/servers/{sid}/start" in refused.json()["message"]
    domain = _prepare(ctx, sid, "active")[1].name
    with client.websocket_connect(early["url"]) as ws, pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_bytes()
    assert closed.value.code == CLOSE_UNAVAILABLE
    assert "powered off" in closed.value.reason and f"/v1/servers/{sid}/start" in closed.value.reason
    assert domain not in closed.value.reason and "simulator" not in closed.value.reason  # no internal handle
    assert client.post(f"/v1/servers/{sid}/start", headers=account.headers).status_code == 202
    asyncio.run(run_jobs(ctx))
    with client.websocket_connect(_ticket(client, account, sid)["url"]) as ws:
        assert b"Linux version" in ws.receive_bytes()
