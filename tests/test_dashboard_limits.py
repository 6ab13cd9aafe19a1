"""The dashboard keeps the API's limits and quotas (one count with the API), asks for a fresh
two-factor code before it hands out anything that reaches a server's root, and says true things:
relative times, what a sandbox top-up does, one price format and one late-payment rule. HTTP tests
on SQLite and PostgreSQL; the browser tests are in test_dashboard_browser*.py."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient
from test_dashboard import D, _code, _enable_totp, csrf_of, post_form, sign_in

from vpsshop.testing import create_test_account

STATIC = Path(__file__).resolve().parent.parent / "vpsshop" / "dashboard" / "static"
ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {
        "ratelimit": {
            "signups_per_client": 3,
            "writes_per_account": 6,
            "write_window_seconds": 60,
            "max_open_topups_per_account": 2,
            "max_servers_per_account": 1,
        }
    }


def _alert(html: str) -> str:
    found = re.findall(r'role="alert"[^>]*>(.*?)</', html, re.S)
    return unescape(" ".join(found))


# ---- limits: the same rules and the same counts as the API ---------------------------------------


def test_creating_accounts_in_the_dashboard_counts_against_the_api_signup_limit(vpsshop_client):
    client = vpsshop_client
    assert client.post("/v1/account").status_code == 201
    assert client.post("/v1/account").status_code == 201
    made = post_form(client, f"{D}/account", page=f"{D}/signin")
    assert made.status_code == 201  # the third of 3 per hour
    client.cookies.clear()
    refused = post_form(client, f"{D}/account", page=f"{D}/signin")
    assert refused.status_code == 429
    assert 0 < int(refused.headers["retry-after"]) <= 2 * 3600  # a sliding hour: until enough have slid out
    assert "Too many accounts created from your address. Try again in" in _alert(refused.text)
    assert "login-token" not in refused.text  # no account was made
    api = client.post("/v1/account")
    assert api.status_code == 429 and api.json()["error"] == "rate_limited"


def test_top_up_quota_refuses_the_third_open_top_up_in_words(vpsshop_client, vpsshop_account):
    client, account = vpsshop_client, vpsshop_account
    assert sign_in(client, account.login_token).status_code == 303
    refs = []
    for key in ("a", "b"):
        started = post_form(client, f"{D}/topups", {"amount": "30", "coin": "LTC", "idempotency_key": key})
        assert started.status_code == 303
        refs.append(started.headers["location"].rsplit("/", 1)[1])
    third = post_form(client, f"{D}/topups", {"amount": "30", "coin": "LTC", "idempotency_key": "c"})
    assert third.status_code == 429 and third.headers["retry-after"] == "3600"
    assert "2 open top-ups, the most one account may have (2); pay or cancel one first" in _alert(third.text)
    api = client.post("/v1/topups", headers=account.headers, json={"amount": 30, "coin": "LTC"})
    assert api.status_code == 429
    assert post_form(client, f"{D}/topups/{refs[0]}/cancel", page=f"{D}/topups/{refs[0]}").status_code == 303
    again = post_form(client, f"{D}/topups", {"amount": "30", "coin": "LTC", "idempotency_key": "d"})
    assert again.status_code == 303


def test_server_quota_refuses_an_order_past_it_and_charges_nothing(vpsshop_client, vpsshop_account):
    client, account = vpsshop_client, vpsshop_account
    account.credit(20)
    assert sign_in(client, account.login_token).status_code == 303
    assert post_form(client, f"{D}/servers", ORDER, page=f"{D}/servers/new").status_code == 303
    second = post_form(client, f"{D}/servers", {**ORDER, "idempotency_key": "2"}, page=f"{D}/servers/new")
    assert second.status_code == 429 and second.headers["retry-after"] == "3600"
    assert "the most one account may hold (1); delete one first" in _alert(second.text)
    assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 16.01  # one order only
    assert client.post("/v1/servers", headers=account.headers, json=ORDER).status_code == 429


def test_writes_share_the_api_count_and_the_page_says_when_to_retry(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account = vpsshop_client, vpsshop_account
    assert sign_in(client, account.login_token).status_code == 303
    assert post_form(client, f"{D}/keys", {"name": "one"}).status_code == 201  # 1
    assert client.post("/v1/keys", headers=account.headers).status_code == 201  # 2, through the API
    assert post_form(client, f"{D}/ssh-keys", {"name": "x", "public_key": "nonsense"}).status_code == 400  # 3
    assert client.post("/v1/keys", headers=account.headers).status_code == 201  # 4
    webhook = {"url": "http://127.0.0.1:9/hook", "event_types": "*"}
    assert post_form(client, f"{D}/webhooks", webhook).status_code == 201  # 5
    assert post_form(client, f"{D}/keys", {"name": "six"}).status_code == 201  # 6 of 6 a minute
    refused = post_form(client, f"{D}/keys", {"name": "seven"})
    assert refused.status_code == 429 and 0 < int(refused.headers["retry-after"]) <= 2 * 60  # a sliding minute
    assert "Too many changes from this account. Try again in" in _alert(refused.text)
    assert "seven" not in client.get(f"{D}/keys").text
    assert client.post("/v1/keys", headers=account.headers).status_code == 429  # the API sees the same count
    hooked = post_form(client, f"{D}/webhooks", webhook)
    assert hooked.status_code == 429 and "Too many changes" in _alert(hooked.text)
    # signing other browsers out is never held back by the write limit
    assert post_form(client, f"{D}/security/sessions/end-others", page=f"{D}/security").status_code == 303
    vpsshop_clock.advance(seconds=int(hooked.headers["retry-after"]))  # the last refusal's word holds
    assert post_form(client, f"{D}/keys", {"name": "seven"}).status_code == 201


# ---- two-factor before anything that reaches root ----------------------------------------------------


def test_with_totp_on_minting_a_key_asks_for_a_fresh_code(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account = vpsshop_client, vpsshop_account
    assert sign_in(client, account.login_token).status_code == 303
    secret, _ = _enable_totp(client, vpsshop_clock)
    before = client.get("/v1/keys", headers=account.headers).json()["keys"]
    page = client.get(f"{D}/keys").text
    assert 'id="code" name="code"' in page and "fresh code" in page
    for data in ({"name": "stolen"}, {"name": "stolen", "code": "000000"}):
        refused = post_form(client, f"{D}/keys", data)
        assert refused.status_code == 401 and "new-key" not in refused.text
    assert client.get("/v1/keys", headers=account.headers).json()["keys"] == before
    made = post_form(client, f"{D}/keys", {"name": "mine", "code": _code(secret, vpsshop_clock)})
    assert made.status_code == 201
    key = re.search(r'id="new-key" class="secret-value">(vpsk_[^<]+)<', made.text).group(1)
    assert client.get("/v1/account", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    # a code works once: the same code does not mint a second key
    again = post_form(client, f"{D}/keys", {"name": "again", "code": _code(secret, vpsshop_clock)})
    assert again.status_code == 401


# ---- what the pages say --------------------------------------------------------------------------------


def test_another_browser_used_a_moment_ago_reads_as_in_the_past(vpsshop_client, vpsshop_app, vpsshop_account):
    assert sign_in(vpsshop_client, vpsshop_account.login_token).status_code == 303
    other = TestClient(vpsshop_app)
    assert sign_in(other, vpsshop_account.login_token).status_code == 303
    security = vpsshop_client.get(f"{D}/security").text
    assert security.count("last used less than a minute ago") == 2
    assert "last used in" not in security


def test_relative_times_keep_their_sign(vpsshop_app, vpsshop_clock):
    from datetime import timedelta

    relative = vpsshop_app.state.dashboard.relative
    now = vpsshop_clock.now()
    assert relative(now - timedelta(milliseconds=400)) == "less than a minute ago"
    assert relative(now + timedelta(milliseconds=400)) == "in less than a minute"
    assert relative(now + timedelta(days=3, hours=1)) == "in 3 days"
    assert relative(now - timedelta(minutes=5)) == "5 minutes ago"
    assert relative(now + timedelta(seconds=2), past=True) == "less than a minute ago"  # another process's clock


def test_a_sandbox_top_up_says_no_chain_is_watched_and_how_funds_come(vpsshop_client, vpsshop_account):
    client = vpsshop_client
    assert sign_in(client, vpsshop_account.login_token).status_code == 303
    started = post_form(client, f"{D}/topups", {"amount": "30", "coin": "LTC"})
    page = unescape(client.get(started.headers["location"]).text)
    assert "checks the chain" not in page
    assert "no chain is watched for LTC" in page
    assert f"vpsshop admin credit {vpsshop_account.user_id} AMOUNT" in page


def test_page_and_script_state_the_same_late_payment_rule(vpsshop_client, vpsshop_account):
    rule = "at the exchange rate of the moment it is credited"
    assert rule in (STATIC / "dashboard.js").read_text()
    assert sign_in(vpsshop_client, vpsshop_account.login_token).status_code == 303
    started = post_form(vpsshop_client, f"{D}/topups", {"amount": "30", "coin": "LTC"})
    page = vpsshop_client.get(started.headers["location"]).text
    assert rule in page and "rate of the day" not in page and "moment it is confirmed" not in page
    assert "rate of the day" not in (STATIC / "dashboard.js").read_text()


def test_the_order_form_prices_have_one_format(vpsshop_client, vpsshop_account):
    """The script shows the server's texts: $1,499.90 before and after it updates the price."""
    assert sign_in(vpsshop_client, vpsshop_account.login_token).status_code == 303
    html = vpsshop_client.get(f"{D}/servers/new").text
    pricing = json.loads(unescape(re.search(r"data-pricing='([^']+)'", html).group(1)))
    assert pricing["wolfhound:nl"]["annual"] == "$1,499.90"
    assert pricing["pup:nl"]["monthly"] == "$3.99" and pricing["pup:nl"]["monthly_usd"] == "3.99"
    shown = post_form(
        vpsshop_client,
        f"{D}/servers",
        {"plan": "wolfhound", "location": "nl", "os": "debian-12", "cycle": "annual"},
        page=f"{D}/servers/new",
    )
    assert shown.status_code == 402  # no funds: the form comes back with its price as the server prints it
    assert re.search(r'id="price" data-field="price">\$1,499\.90<', shown.text)
    assert "textContent = entry[" in (STATIC / "dashboard.js").read_text()  # no formatting of its own


def test_csrf_token_of_another_session_is_refused_on_new_forms(vpsshop_client, vpsshop_app):
    """The new pages' forms go through the same CSRF check as every other."""
    account = create_test_account(vpsshop_client)
    assert sign_in(vpsshop_client, account.login_token).status_code == 303
    other = TestClient(vpsshop_app)
    assert sign_in(other, create_test_account(other).login_token).status_code == 303
    foreign = csrf_of(other.get(f"{D}/webhooks").text)
    for path, data in (
        (f"{D}/webhooks", {"url": "http://127.0.0.1:9/x", "event_types": "*"}),
        (f"{D}/ssh-keys", {"name": "k", "public_key": "ssh-ed25519 AAAA"}),
    ):
        refused = vpsshop_client.post(path, data={"csrf": foreign, **data}, follow_redirects=False)
        assert refused.status_code == 403 and "nothing was done" in refused.text
    assert vpsshop_client.get("/v1/webhooks", headers=account.headers).json()["webhooks"] == []
