"""The dashboard's webhook and event pages over HTTP, on SQLite and PostgreSQL: register (the secret
shown once), deliveries to a real receiver that verifies them with the `standardwebhooks` library,
the delivery log, redelivery, pausing, changing and deleting an endpoint, and the account's events."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from html import unescape

import pytest
from test_dashboard import D, post_form, sign_in
from webhook_receiver import Receiver

from vpsshop.events import delivery


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _alert(html: str) -> str:
    return unescape(" ".join(re.findall(r'role="alert"[^>]*>(.*?)</', html, re.S)))


def _deliver(client) -> None:
    asyncio.run(delivery.run_pass(client.app.state.ctx))


@pytest.fixture
def me(vpsshop_client, vpsshop_account):
    assert sign_in(vpsshop_client, vpsshop_account.login_token).status_code == 303
    return vpsshop_account


def _register(client, receiver: Receiver, path: str, *types: str) -> tuple[int, str, str]:
    """Register through the form: (endpoint id, secret, page html)."""
    page = client.get(f"{D}/webhooks").text
    assert 'name="event_types" value="*" checked' in page  # every event, unless the customer narrows it
    made = post_form(client, f"{D}/webhooks", {"url": receiver.url(path), "event_types": list(types or ["*"])})
    assert made.status_code == 201, _alert(made.text)
    secret = re.search(r'id="webhook-secret" class="secret-value">(whsec_[^<]+)<', made.text).group(1)
    endpoint = int(re.search(r'href="/dashboard/webhooks/(\d+)">Its delivery log', made.text).group(1))
    receiver.secrets[path] = secret
    return endpoint, secret, made.text


def test_register_shows_the_secret_once_and_events_arrive_signed(vpsshop_client, me, receiver):
    client = vpsshop_client
    endpoint, secret, page = _register(client, receiver, "/keys", "api_key.*", "ledger.credit")
    assert "shown this once" in page
    listed = client.get("/v1/webhooks", headers=me.headers).json()["webhooks"]
    assert [(w["id"], w["event_types"]) for w in listed] == [(endpoint, ["api_key.*", "ledger.credit"])]
    assert secret not in client.get(f"{D}/webhooks").text and secret not in client.get(f"{D}/webhooks/{endpoint}").text
    post_form(client, f"{D}/keys", {"name": "watched"})
    _deliver(client)
    got = receiver.wait_for(lambda got: len(got) >= 1)
    assert got[0].verified and got[0].json()["type"] == "api_key.created"
    log = client.get(f"{D}/webhooks/{endpoint}").text
    assert got[0].id in log and "succeeded" in log and "HTTP 200" in log


def test_register_refusals_are_said_in_words(vpsshop_client, me):
    client = vpsshop_client
    cases = [
        ({"url": "ftp://example.com/x", "event_types": "*"}, "URL: the URL must start with https://"),
        ({"url": "https://user:pw@example.com/x", "event_types": "*"}, "URL: the URL must not carry a user name"),
        ({"url": "http://10.1.2.3/x", "event_types": "*"}, "URL:"),
        ({"url": "http://127.0.0.1:9/x"}, "Choose at least one kind of event."),
    ]
    for data, said in cases:
        refused = post_form(client, f"{D}/webhooks", data)
        assert refused.status_code == 400 and said in _alert(refused.text), _alert(refused.text)
    assert client.get("/v1/webhooks", headers=me.headers).json()["webhooks"] == []
    kept = post_form(client, f"{D}/webhooks", {"url": "ftp://example.com/x", "event_types": "server.*"})
    assert 'value="ftp://example.com/x"' in kept.text and 'value="server.*" checked' in kept.text


def test_delivery_log_redeliver_pause_change_and_delete(vpsshop_client, me, receiver):
    client = vpsshop_client
    endpoint, _, _ = _register(client, receiver, "/all")
    page = f"{D}/webhooks/{endpoint}"
    post_form(client, f"{D}/keys", {"name": "one"})
    _deliver(client)
    got = receiver.wait_for(lambda got: len(got) >= 2)  # its own webhook.created, then the key
    first = next(r for r in got if r.json()["type"] == "api_key.created")
    again = post_form(client, f"{page}/redeliver", {"event_id": first.id}, page=page)
    assert again.headers["location"].endswith("notice=redelivery-queued")
    _deliver(client)
    got = receiver.wait_for(lambda got: len(got) >= 3)
    assert [r.id for r in got if r.json()["type"] == "api_key.created"] == [first.id, first.id]
    log = client.get(page).text
    assert "sent again" in log and log.count(f"Send again: api_key.created {first.id}") == 2
    unknown = post_form(client, f"{page}/redeliver", {"event_id": "evt_nope"}, page=page)
    assert unknown.status_code == 404 and "No such event on this account" in _alert(unknown.text)
    malformed = post_form(client, f"{page}/redeliver", {"event_id": "hello"}, page=page)
    assert malformed.status_code == 400 and "evt_" in _alert(malformed.text)

    paused = post_form(client, f"{page}/enabled", {"enabled": "off"}, page=page)
    assert paused.headers["location"].endswith("notice=webhook-disabled")
    assert client.get(f"/v1/webhooks/{endpoint}", headers=me.headers).json()["status"] == "disabled"
    refused = post_form(client, f"{page}/redeliver", {"event_id": first.id}, page=page)
    assert refused.status_code == 409 and "disabled" in _alert(refused.text)
    assert post_form(client, f"{page}/enabled", {"enabled": "on"}, page=page).status_code == 303

    changed = post_form(
        client, page, {"url": receiver.url("/moved"), "description": "moved", "event_types": ["server.*"]}
    )
    assert changed.headers["location"].endswith("notice=webhook-saved")
    hook = client.get(f"/v1/webhooks/{endpoint}", headers=me.headers).json()
    assert (hook["url"], hook["description"], hook["event_types"]) == (receiver.url("/moved"), "moved", ["server.*"])
    bad = post_form(client, page, {"url": "http://127.0.0.1:9/x"})
    assert bad.status_code == 400 and "Choose at least one kind of event." in _alert(bad.text)

    deleted = post_form(client, f"{page}/delete", page=page)
    assert deleted.headers["location"].endswith("notice=webhook-deleted")
    assert client.get("/v1/webhooks", headers=me.headers).json()["webhooks"] == []
    assert client.get(page).status_code == 404


def test_events_page_lists_the_accounts_events_newest_first(vpsshop_client, me, vpsshop_app):
    client = vpsshop_client
    me.credit("12.50", "support")
    for n in range(30):
        assert post_form(client, f"{D}/keys", {"name": f"k{n}"}).status_code == 201
    api = client.get("/v1/events?limit=100", headers=me.headers).json()["events"]
    newest_first = [e["id"] for e in reversed(api)]
    page = client.get(f"{D}/events").text
    shown = re.findall(r'<code class="wrap">(evt_[^<]+)</code>', page)
    assert shown == newest_first[:25]
    older = unescape(re.search(r'href="(/dashboard/events\?before=[^"]+)">Older events', page).group(1))
    rest = re.findall(r'<code class="wrap">(evt_[^<]+)</code>', client.get(older).text)
    assert rest == newest_first[25:50]
    assert "API key vpsk_" in page and "(k29)" in page
    credits = client.get(f"{D}/events?type=ledger.credit").text
    assert re.findall(r'<code class="wrap">(evt_[^<]+)</code>', credits) == [
        e["id"] for e in reversed(api) if e["type"] == "ledger.credit"
    ]
    assert "Credit from support: +$12.50, balance $12.50" in credits
    assert client.get(f"{D}/events?type=nonsense").status_code == 400
    other = client.get("/v1/account", headers=me.headers).json()["user_id"]
    assert f"Account number {other}" in client.get(f"{D}/events?type=account.*").text
