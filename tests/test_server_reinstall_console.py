"""Reinstall and the serial console through the API, on the simulator (SQLite and PostgreSQL).

The real guest (tests/test_real_guest.py) does both on libvirtd with a booted Debian.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlmodel import select
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from vpsshop.servers.console import CLOSE_BAD_TICKET, TICKET_SECONDS
from vpsshop.servers.jobs import _prepare, run_jobs
from vpsshop.servers.models import ConsoleTicket, ServerEvent
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
    assert kinds[-2:] == ["reinstall", "reinstalled"]
    # A given password is not echoed back.
    given = vpsshop_client.post(
        f"/v1/servers/{sid}/reinstall",
        headers=vpsshop_account.headers,
        json={"os": "debian-12", "root_password": "Chosen-pass-123"},
    )
    assert given.status_code == 202 and given.json()["root_password"] is None


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
