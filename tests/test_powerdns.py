"""Reverse DNS: the PowerDNS plugin against a real pdns_server, and PATCH /servers/{id} reverse_dns.

``pdns_api`` starts Debian's ``pdns_server`` (``pdns-server`` and ``pdns-backend-sqlite3`` in
scripts/deps/apt-servers.txt) with the gsqlite3 backend in a temporary directory and its HTTP API
on loopback, on free ports, and stops it afterwards.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from vpsshop_powerdns import PowerDnsProvider

from vpsshop import PluginError
from vpsshop.servers.jobs import run_jobs
from vpsshop.servers.lifecycle import run_lifecycle

SCHEMA = Path("/usr/share/doc/pdns-backend-sqlite3/schema.sqlite3.sql")
ZONE = "100.51.198.in-addr.arpa."
ZONE6 = "0.0.0.0.5.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa."  # 2001:db8:5::/64
ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def pdns_api(tmp_path_factory) -> Iterator[dict[str, str]]:
    directory = tmp_path_factory.mktemp("pdns")
    database = directory / "pdns.sqlite3"
    with sqlite3.connect(database) as db:
        db.executescript(SCHEMA.read_text())
    key, port = secrets.token_hex(16), _free_port()
    process = subprocess.Popen(
        [
            "pdns_server",
            "--no-config",
            "--launch=gsqlite3",
            f"--gsqlite3-database={database}",
            "--api=yes",
            f"--api-key={key}",
            "--webserver=yes",
            "--webserver-address=127.0.0.1",
            f"--webserver-port={port}",
            "--webserver-allow-from=127.0.0.1",
            f"--local-address=127.0.0.1:{_free_port()}",
            f"--socket-dir={directory}",
            "--guardian=no",
            "--daemon=no",
            "--disable-syslog",
            "--write-pid=no",
            "--loglevel=3",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {"X-API-Key": key}
    for _ in range(100):
        try:
            if httpx.get(f"{url}/api/v1/servers/localhost", headers=headers).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert process.poll() is None, process.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        time.sleep(0.1)
    for zone in (ZONE, ZONE6):
        created = httpx.post(
            f"{url}/api/v1/servers/localhost/zones",
            headers=headers,
            json={"name": zone, "kind": "Native", "nameservers": ["ns1.example.com."]},
        )
        assert created.status_code == 201, created.text
    yield {"api_url": url, "api_key": key}
    process.terminate()
    process.wait(10)


def ptr_records(pdns: dict[str, str], owner: str, zone_name: str = ZONE) -> list[str]:
    zone = httpx.get(
        f"{pdns['api_url']}/api/v1/servers/localhost/zones/{zone_name}", headers={"X-API-Key": pdns["api_key"]}
    ).json()
    return [
        r["content"]
        for rrset in zone["rrsets"]
        if rrset["name"] == owner and rrset["type"] == "PTR"
        for r in rrset["records"]
    ]


def _provider(pdns: dict[str, str]) -> PowerDnsProvider:
    return PowerDnsProvider.from_settings(
        {**pdns, "zones": [ZONE.rstrip(".")]},
        sandbox=False,  # type: ignore[return-value]
        where="dns.powerdns",
    )


def test_set_replace_and_clear_a_ptr_record(pdns_api):
    provider = _provider(pdns_api)
    owner = "10.100.51.198.in-addr.arpa."
    asyncio.run(provider.set_ptr("198.51.100.10", "mail.example.com"))
    assert ptr_records(pdns_api, owner) == ["mail.example.com."]
    asyncio.run(provider.set_ptr("198.51.100.10", "web.example.com"))  # replaces, never two names
    assert ptr_records(pdns_api, owner) == ["web.example.com."]
    asyncio.run(provider.clear_ptr("198.51.100.10"))
    assert ptr_records(pdns_api, owner) == []
    asyncio.run(provider.clear_ptr("198.51.100.10"))  # nothing there: nothing to do
    assert asyncio.run(provider.check_ready()).ok


def test_refusals_name_the_setting_or_the_api(pdns_api):
    provider = _provider(pdns_api)
    with pytest.raises(PluginError, match=r"dns\.powerdns\.zones"):
        asyncio.run(provider.set_ptr("203.0.113.5", "x.example.com"))
    assert provider.holds("198.51.100.5") and not provider.holds("2001:db8:5::100")
    assert not provider.holds("203.0.113.5") and not provider.holds("not an address")
    wrong_key = _provider({**pdns_api, "api_key": "wrong"})
    with pytest.raises(PluginError, match="PowerDNS refused"):
        asyncio.run(wrong_key.set_ptr("198.51.100.11", "x.example.com"))


@pytest.fixture
def vpsshop_overrides(pdns_api) -> dict[str, Any]:
    return {
        "hypervisor": {
            "simulator": {
                "boot_seconds": 0,
                "addresses": "198.51.100.10-198.51.100.20",
                "gateway": "198.51.100.1",
                "ipv6": "2001:db8:5::/64",
                "ipv6_gateway": "2001:db8:5::1",
            }
        },
        "dns": {"provider": "powerdns", "powerdns": {**pdns_api, "zones": [ZONE, ZONE6]}},
        "servers": {"grace_days": 0},
    }


def test_reverse_dns_follows_the_server(vpsshop_client, vpsshop_account, vpsshop_clock, pdns_api):
    ctx = vpsshop_client.app.state.ctx
    vpsshop_account.credit("10")
    order = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER).json()["server"]
    sid, h = order["id"], vpsshop_account.headers
    early = vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"reverse_dns": "mail.example.com"})
    assert early.status_code == 409 and early.json()["error"] == "server_not_active"
    asyncio.run(run_jobs(ctx))
    active = vpsshop_client.get(f"/v1/servers/{sid}", headers=h).json()
    ip, ipv6 = active["ip"], active["ipv6"]
    owner = f"{ip.split('.')[3]}.100.51.198.in-addr.arpa."
    assert ipv6 == "2001:db8:5::100" and active["ipv6_prefix"] is None, active
    owner6 = "0.0.1.0.0.0.0.0.0.0.0.0.0.0.0.0." + ZONE6  # ::100
    for bad in ("-x.example.com", "no_underscores.example.com", "single", "a" * 64 + ".example.com"):
        response = vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"reverse_dns": bad})
        assert response.status_code == 400 and response.json()["error"] == "invalid_reverse_dns", bad
    patched = vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"reverse_dns": "Mail.Example.com"})
    assert patched.status_code == 200 and patched.json()["reverse_dns"] == "mail.example.com"
    assert patched.json()["auto_renew"] is True  # untouched
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    assert ptr_records(pdns_api, owner) == ["mail.example.com."]
    assert ptr_records(pdns_api, owner6, ZONE6) == ["mail.example.com."]  # the IPv6 address too

    # Terminated (not renewed, no grace): the destroy job clears the record before the address is reused.
    assert vpsshop_client.patch(f"/v1/servers/{sid}", headers=h, json={"auto_renew": False}).status_code == 200
    vpsshop_clock.advance(days=40)
    for _ in range(2):
        asyncio.run(run_lifecycle(ctx))
        asyncio.run(run_jobs(ctx))
    server = vpsshop_client.get(f"/v1/servers/{sid}", headers=h).json()
    assert server["status"] == "terminated" and server["reverse_dns"] is None
    assert server["ip"] is None and server["ipv6"] is None
    assert ptr_records(pdns_api, owner) == [] and ptr_records(pdns_api, owner6, ZONE6) == []


def test_without_a_dns_provider_reverse_dns_is_not_supported(tmp_path):
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.clock import FrozenClock
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, create_test_account

    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path / 'shop.db'}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "hypervisor": {"simulator": {"boot_seconds": 0}},
            "server": {"background": False, "access_log": False},
        },
    )
    with TestClient(create_app(settings, clock=FrozenClock(), background=False)) as client:
        assert client.app.state.ctx.dns is None
        account = create_test_account(client)
        account.credit("10")
        sid = client.post("/v1/servers", headers=account.headers, json=ORDER).json()["server"]["id"]
        asyncio.run(run_jobs(client.app.state.ctx))
        response = client.patch(f"/v1/servers/{sid}", headers=account.headers, json={"reverse_dns": "a.example.com"})
        assert response.status_code == 409 and response.json()["error"] == "not_supported"
        empty = client.patch(f"/v1/servers/{sid}", headers=account.headers, json={})
        assert empty.status_code == 200 and empty.json()["id"] == sid  # nothing given: nothing changes
        still = client.patch(f"/v1/servers/{sid}", headers=account.headers, json={"auto_renew": False})
        assert still.status_code == 200 and still.json()["auto_renew"] is False
