"""The dashboard's server pages over HTTP, on SQLite and PostgreSQL: the SSH key store, ordering with
keys and user data, renewal for several cycles at the API's quoted price, reverse DNS (with a real
PowerDNS, and without a provider), reinstall and the serial console, each through the API's own
services (the browser drives the same flows in test_dashboard_browser_servers.py)."""

from __future__ import annotations

import asyncio
import json
import re
from decimal import Decimal
from html import unescape
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from test_dashboard import D, _code, _enable_totp, post_form, sign_in
from test_powerdns import ZONE, pdns_api, ptr_records  # noqa: F401 - pdns_api: a real pdns_server

from vpsshop.encryption import decrypt_text
from vpsshop.models import Server
from vpsshop.servers.jobs import run_jobs

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"boot_seconds": 0}}}


def public_key(comment: str = "me@laptop") -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + f" {comment}"


def _alert(html: str) -> str:
    return unescape(" ".join(re.findall(r'role="alert"[^>]*>(.*?)</', html, re.S)))


def _active(client, account, **form: Any) -> str:
    """Order through the dashboard form, run the provisioning job; the server page's path."""
    ordered = post_form(client, f"{D}/servers", {**ORDER, **form}, page=f"{D}/servers/new")
    assert ordered.status_code == 303, _alert(ordered.text)
    asyncio.run(run_jobs(client.app.state.ctx))
    return ordered.headers["location"].split("?")[0]


@pytest.fixture
def me(vpsshop_client, vpsshop_account):
    vpsshop_account.credit(50)
    assert sign_in(vpsshop_client, vpsshop_account.login_token).status_code == 303
    return vpsshop_account


# ---- SSH keys and ordering with them ------------------------------------------------------------------


def test_ssh_keys_are_added_listed_and_deleted_like_the_api(vpsshop_client, me):
    client = vpsshop_client
    line = public_key()
    added = post_form(client, f"{D}/ssh-keys", {"name": "laptop", "public_key": line + "\r\n"})
    assert added.status_code == 303 and added.headers["location"].endswith("notice=ssh-key-added")
    listed = client.get("/v1/ssh-keys", headers=me.headers).json()["ssh_keys"]
    assert [(k["name"], k["public_key"]) for k in listed] == [("laptop", line.rsplit(" ", 1)[0])]
    page = client.get(f"{D}/ssh-keys").text
    assert listed[0]["fingerprint"] in page and "ED25519 256" in page
    again = post_form(client, f"{D}/ssh-keys", {"name": "twice", "public_key": line})
    assert again.status_code == 409 and "already stores the key" in _alert(again.text)
    weak = post_form(client, f"{D}/ssh-keys", {"name": "dsa", "public_key": "ssh-dss AAAAB3NzaC1kc3MAAACBAP"})
    assert weak.status_code == 400 and "key type 'ssh-dss' is not accepted" in _alert(weak.text)
    assert 'value="dsa"' in weak.text  # the form keeps what was typed
    deleted = post_form(client, f"{D}/ssh-keys/{listed[0]['id']}/delete", page=f"{D}/ssh-keys")
    assert deleted.headers["location"].endswith("notice=ssh-key-deleted")
    assert client.get("/v1/ssh-keys", headers=me.headers).json()["ssh_keys"] == []
    foreign = post_form(client, f"{D}/ssh-keys/{listed[0]['id']}/delete", page=f"{D}/ssh-keys")
    assert foreign.status_code == 404


def test_an_order_carries_the_chosen_keys_and_user_data(vpsshop_client, me):
    client = vpsshop_client
    lines = [public_key("a"), public_key("b")]
    for n, line in enumerate(lines):
        assert post_form(client, f"{D}/ssh-keys", {"name": f"k{n}", "public_key": line}).status_code == 303
    keys = client.get("/v1/ssh-keys", headers=me.headers).json()["ssh_keys"]
    form = client.get(f"{D}/servers/new").text
    assert all(f'name="ssh_keys" value="{k["id"]}"' in form for k in keys)
    script = "#!/bin/sh\r\necho hello > /root/hello\r\n"  # a browser's textarea sends CRLF
    path = _active(client, me, ssh_keys=str(keys[1]["id"]), user_data=script)
    with client.app.state.ctx.db.session() as session:
        server = session.get(Server, int(path.rsplit("/", 1)[1]))
        assert json.loads(server.ssh_keys) == [keys[1]["public_key"]]
        assert (
            decrypt_text(client.app.state.ctx, server.user_data_enc, "user data")
            == "#!/bin/sh\necho hello > /root/hello\n"
        )
    bad = post_form(
        client, f"{D}/servers", {**ORDER, "user_data": "hello", "ssh_keys": str(keys[0]["id"])}, page=f"{D}/servers/new"
    )
    assert bad.status_code == 400 and "must start with '#cloud-config'" in _alert(bad.text)
    assert f'value="{keys[0]["id"]}" checked' in bad.text and "hello</textarea>" in bad.text
    foreign = post_form(client, f"{D}/servers", {**ORDER, "ssh_keys": "999999"}, page=f"{D}/servers/new")
    assert foreign.status_code == 400 and "Choose SSH keys from the list" in _alert(foreign.text)


# ---- renewal for several cycles ------------------------------------------------------------------------------


def test_renewal_for_several_cycles_charges_the_quoted_price(vpsshop_client, me):
    client = vpsshop_client
    path = _active(client, me)
    sid = int(path.rsplit("/", 1)[1])
    page = unescape(client.get(path).text)
    assert "$3.99 for 1 month: paid until" in page and "Renew now for 1 month" in page
    api_quote = client.post(f"/v1/servers/{sid}/renew/quote", headers=me.headers, json={"periods": 3}).json()
    quote = client.get(f"{path}/renew/quote?periods=3").json()
    assert quote["ok"] and quote["periods"] == 3 and quote["label"] == "Renew now for 3 months"
    assert quote["text"].startswith("$11.97 for 3 months: paid until")
    assert api_quote["price_usd"] == 11.97
    # the count changed but its price was not shown yet: nothing is charged, the page shows the price
    unseen = post_form(client, f"{path}/renew", {"periods": "3", "quoted": "1"}, page=path)
    assert (
        unseen.status_code == 200
        and "Check the price:" in unseen.text
        and "$11.97 for 3 months" in unescape(unseen.text)
    )
    assert 'name="quoted" value="3"' in unseen.text
    assert client.get("/v1/account", headers=me.headers).json()["balance_usd"] == 46.01
    expires = client.get(f"/v1/servers/{sid}", headers=me.headers).json()["expires_at"]
    renewed = post_form(client, f"{path}/renew", {"periods": "3", "quoted": "3"}, page=path)
    assert renewed.status_code == 303 and renewed.headers["location"].endswith("notice=renewed")
    after = client.get(f"/v1/servers/{sid}", headers=me.headers).json()
    assert after["expires_at"] == api_quote["expires_at"] and after["expires_at"] != expires
    assert client.get("/v1/account", headers=me.headers).json()["balance_usd"] == 34.04  # 46.01 - 11.97
    too_many = client.get(f"{path}/renew/quote?periods=120")
    assert (
        too_many.status_code == 400
        and "At most" in too_many.json()["text"]
        and "prepay horizon" in too_many.json()["text"]
    )
    refused = post_form(client, f"{path}/renew", {"periods": "120", "quoted": "120"}, page=path)
    assert refused.status_code == 400 and "prepay horizon" in _alert(refused.text)
    word = post_form(client, f"{path}/renew", {"periods": "lots", "quoted": "lots"}, page=path)
    assert word.status_code == 400 and "whole number" in _alert(word.text)
    assert client.get("/v1/account", headers=me.headers).json()["balance_usd"] == 34.04
    poor = post_form(client, f"{path}/renew", {"periods": "9", "quoted": "9"}, page=path)
    assert poor.status_code == 402 and "does not cover the price of $35.91" in _alert(poor.text)
    assert "Top up at least $1.87" in poor.text


def test_the_server_page_shows_the_power_state_and_only_the_actions_that_fit(vpsshop_client, me):
    path = _active(vpsshop_client, me)
    page = vpsshop_client.get(path).text
    assert "<dt>Power</dt><dd>on</dd>" in page
    assert 'value="stop"' in page and 'value="start"' not in page
    assert post_form(vpsshop_client, f"{path}/power", {"action": "stop"}, page=path).status_code == 303
    asyncio.run(run_jobs(vpsshop_client.app.state.ctx))
    page = vpsshop_client.get(path).text
    assert "<dt>Power</dt><dd>off (stopped)</dd>" in page
    assert 'value="start"' in page and 'value="stop"' not in page and "Serial console" not in page


# ---- reverse DNS ------------------------------------------------------------------------------------------------


def test_without_a_dns_provider_the_page_says_reverse_dns_cannot_be_set(vpsshop_client, me):
    path = _active(vpsshop_client, me)
    page = vpsshop_client.get(path).text
    assert "This shop has no DNS provider, so reverse DNS cannot be set" in page
    assert 'name="reverse_dns"' not in page
    refused = post_form(vpsshop_client, f"{path}/reverse-dns", {"reverse_dns": "mail.example.com"}, page=path)
    assert refused.status_code == 409 and "no DNS provider" in _alert(refused.text)


def test_reverse_dns_is_set_and_cleared_through_the_shops_dns_provider(vpsshop_database_url, pdns_api):  # noqa: F811
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
            "database_url": vpsshop_database_url,
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "server": {"background": False, "access_log": False},
            "hypervisor": {
                "simulator": {"boot_seconds": 0, "addresses": "198.51.100.30-198.51.100.40", "gateway": "198.51.100.1"}
            },
            "dns": {"provider": "powerdns", "powerdns": {**pdns_api, "zones": [ZONE]}},
        },
    )
    with TestClient(create_app(settings, clock=FrozenClock(), background=False)) as client:
        account = create_test_account(client)
        account.credit(10)
        assert sign_in(client, account.login_token).status_code == 303
        path = _active(client, account)
        sid = int(path.rsplit("/", 1)[1])
        ip = client.get(f"/v1/servers/{sid}", headers=account.headers).json()["ip"]
        owner = f"{ip.split('.')[3]}.100.51.198.in-addr.arpa."
        page = client.get(path).text
        assert f'<label for="reverse_dns">Name of {ip}</label>' in page
        bad = post_form(client, f"{path}/reverse-dns", {"reverse_dns": "not a name"}, page=path)
        assert bad.status_code == 400 and "full domain name like mail.example.com" in _alert(bad.text)
        assert 'value="not a name"' in bad.text
        saved = post_form(client, f"{path}/reverse-dns", {"reverse_dns": "Mail.Example.com."}, page=path)
        assert saved.headers["location"].endswith("notice=rdns-set")
        assert client.get(f"/v1/servers/{sid}", headers=account.headers).json()["reverse_dns"] == "mail.example.com"
        asyncio.run(run_jobs(client.app.state.ctx))
        assert ptr_records(pdns_api, owner) == ["mail.example.com."]
        assert "mail.example.com" in client.get(path).text
        cleared = post_form(client, f"{path}/reverse-dns", {"reverse_dns": ""}, page=path)
        assert cleared.headers["location"].endswith("notice=rdns-cleared")
        asyncio.run(run_jobs(client.app.state.ctx))
        assert ptr_records(pdns_api, owner) == []


# ---- reinstall ---------------------------------------------------------------------------------------------------


def test_reinstall_shows_the_new_password_once_and_uses_the_chosen_key(vpsshop_client, me):
    client = vpsshop_client
    line = public_key()
    post_form(client, f"{D}/ssh-keys", {"name": "laptop", "public_key": line})
    key_id = client.get("/v1/ssh-keys", headers=me.headers).json()["ssh_keys"][0]["id"]
    path = _active(client, me)
    sid = int(path.rsplit("/", 1)[1])
    old = client.get(f"/v1/servers/{sid}/credentials", headers=me.headers).json()["password"]
    form_page = client.get(f"{path}/reinstall").text
    assert "Everything on the server's disk is erased" in form_page
    unconfirmed = post_form(client, f"{path}/reinstall", {"os": "debian-13"}, page=f"{path}/reinstall")
    assert unconfirmed.status_code == 400 and "Tick the box" in _alert(unconfirmed.text)
    done = post_form(
        client,
        f"{path}/reinstall",
        {"os": "debian-13", "ssh_keys": str(key_id), "confirm": "yes"},
        page=f"{path}/reinstall",
    )
    assert done.status_code == 202 and done.headers["cache-control"] == "no-store"
    new = re.search(r'id="root-password" class="secret-value">([^<]+)<', done.text).group(1)
    assert unescape(new) != old and "shown here once" in done.text
    assert client.get(f"/v1/servers/{sid}/credentials", headers=me.headers).json()["password"] == unescape(new)
    assert client.get(f"/v1/servers/{sid}", headers=me.headers).json()["os"] == "debian-13"
    with client.app.state.ctx.db.session() as session:
        assert json.loads(session.get(Server, sid).ssh_keys) == [line.rsplit(" ", 1)[0]]
    busy = post_form(client, f"{path}/reinstall", {"os": "debian-12", "confirm": "yes"}, page=f"{path}/reinstall")
    assert busy.status_code == 409 and "already under way" in _alert(busy.text)
    assert new not in client.get(path).text


def test_resize_shows_each_plans_quote_and_charges_it(vpsshop_client, me):
    client = vpsshop_client
    path = _active(client, me)
    sid = int(path.rsplit("/", 1)[1])
    assert f"{path}/resize" in client.get(path).text
    form_page = unescape(client.get(f"{path}/resize").text)
    quote = client.post(f"/v1/servers/{sid}/resize/quote", headers=me.headers, json={"plan": "beagle"}).json()
    shown = re.search(r'value="beagle".*?Pay \$([0-9.]+) now', form_page, re.S)  # the page writes 8.00, JSON 8.0
    assert shown and Decimal(shown[1]) == Decimal(str(quote["price_usd"])), form_page
    balance = client.get("/v1/account", headers=me.headers).json()["balance_usd"]
    done = post_form(client, f"{path}/resize", {"plan": "beagle"}, page=f"{path}/resize")
    assert done.status_code == 303, _alert(done.text)
    shown = client.get(f"/v1/servers/{sid}", headers=me.headers).json()
    assert shown["plan"] == "beagle" and shown["status_reason"].startswith("Resizing")
    after = client.get("/v1/account", headers=me.headers).json()["balance_usd"]
    assert round(balance - after, 6) == quote["price_usd"]
    shrink = post_form(client, f"{path}/resize", {"plan": "pup"}, page=f"{path}/resize")
    assert shrink.status_code == 409 and "never shrunk" in _alert(shrink.text)


def test_with_totp_on_reinstall_and_console_ask_for_a_fresh_code(vpsshop_client, me, vpsshop_clock):
    client = vpsshop_client
    path = _active(client, me)
    secret, _ = _enable_totp(client, vpsshop_clock)
    refused = post_form(client, f"{path}/reinstall", {"os": "debian-12", "confirm": "yes"}, page=f"{path}/reinstall")
    assert refused.status_code == 401 and "root-password" not in refused.text
    assert "reinstall" not in _server_events(client, path)
    console = post_form(client, f"{path}/console", {"code": "000000"}, page=f"{path}/console")
    assert console.status_code == 401 and "data-console" not in console.text
    opened = post_form(client, f"{path}/console", {"code": _code(secret, vpsshop_clock)}, page=f"{path}/console")
    assert opened.status_code == 200 and "data-console=" in opened.text
    vpsshop_clock.advance(seconds=30)
    done = post_form(
        client,
        f"{path}/reinstall",
        {"os": "debian-12", "confirm": "yes", "code": _code(secret, vpsshop_clock)},
        page=f"{path}/reinstall",
    )
    assert done.status_code == 202


def _server_events(client, path: str) -> list[str]:
    from sqlmodel import select

    from vpsshop.servers.models import ServerEvent

    sid = int(path.rsplit("/", 1)[1])
    with client.app.state.ctx.db.session() as session:
        return [e.kind for e in session.exec(select(ServerEvent).where(ServerEvent.server_id == sid))]


# ---- the serial console ------------------------------------------------------------------------------------------


def test_the_console_page_gets_a_ticket_that_opens_the_stream(vpsshop_client, me):
    client = vpsshop_client
    path = _active(client, me)
    page = client.get(f"{path}/console")
    assert page.status_code == 200 and "Connect to the console" in page.text and "data-console" not in page.text
    assert "<script>" not in page.text and "console.js" not in page.text
    opened = post_form(client, f"{path}/console", page=f"{path}/console")
    assert opened.status_code == 200
    assert re.search(r'<script src="/dashboard/static/console\.js\?v=\w+" defer>', opened.text)
    url = unescape(re.search(r'data-console="([^"]+)"', opened.text).group(1))
    assert url.startswith(f"/v1/servers/{path.rsplit('/', 1)[1]}/console/ws?ticket=")
    with client.websocket_connect(url) as ws:
        seen = b""
        while b"login: " not in seen:
            seen += ws.receive_bytes()
    assert b"Linux version" in seen
    js = client.get(f"{D}/static/console.js")
    assert js.status_code == 200 and "new WebSocket(" in js.text
    csp = opened.headers["content-security-policy"]
    assert "connect-src 'self'" in csp and "unsafe-inline" not in csp
    provisioning = post_form(client, f"{D}/servers", {**ORDER, "idempotency_key": "p"}, page=f"{D}/servers/new")
    pending = provisioning.headers["location"].split("?")[0]
    refused = post_form(client, f"{pending}/console", page=f"{pending}/console")
    assert refused.status_code == 409 and "needs an active server" in _alert(refused.text)
