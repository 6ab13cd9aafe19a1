"""The dashboard's newer pages in a real browser (Debian's Chromium through Playwright, against the
real `vpsshop serve`, as in test_dashboard_browser.py): an SSH key added and ordered with, a
renewal for several months at its quoted price, a reinstall that shows the new password once, the
serial console streaming the guest's output, the server terminated with its hostname typed, a
webhook registered with its secret shown once and delivering to a real receiver, the events; each
page checked with axe-core and at phone width."""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from test_dashboard_browser import (  # noqa: F401 - fixtures: the served shop, the browser, the checks
    _bearer,
    _tab_to,
    axe_source,
    browser,
    check,
    context,
    create_account,
    expect_text,
    shop,
    shots,
)
from webhook_receiver import Receiver

pytestmark = pytest.mark.slow


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def public_key(comment: str) -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + f" {comment}"


def _stored_keys(shop, server_id: int) -> str | None:  # noqa: F811
    """What the shop wrote for cloud-init: the server row's keys (the sandbox's own SQLite file)."""
    with sqlite3.connect(shop.folder / "vpsshop.db") as db:
        return db.execute("SELECT ssh_keys FROM servers WHERE id = ?", (server_id,)).fetchone()[0]


def test_ssh_key_order_renewal_reinstall_and_console(shop, context, check):  # noqa: F811
    page = context.new_page()
    user_id, token, _ = create_account(page, shop)
    shop.credit(user_id, "100")
    api = _bearer(context, shop, token)

    # an SSH key, added on its page
    page.get_by_role("navigation").get_by_role("link", name="SSH keys").click()
    line = public_key("me@laptop")
    page.get_by_label("Name", exact=True).fill("laptop")
    page.get_by_label("Public key", exact=True).fill(line)
    page.get_by_role("button", name="Add key").click()
    expect_text(page.locator(".notice"), "The SSH key is stored")
    fingerprint = httpx.get(f"{shop.url}/v1/ssh-keys", headers=api).json()["ssh_keys"][0]["fingerprint"]
    assert fingerprint in page.content()
    check(page, "ssh-keys")

    # the order form: one price format before and after the script; the key ticked
    page.goto(f"{shop.base}/servers/new")
    price = page.locator("#price")
    page.get_by_label("Plan", exact=True).select_option("wolfhound")
    page.get_by_role("radio", name=re.compile("Annual")).check()
    expect_text(price, "$1,499.90")  # the server's format, not 1499.90
    page.get_by_label("Plan", exact=True).select_option("pup")
    page.get_by_role("radio", name=re.compile("Monthly")).check()
    expect_text(price, "$3.99")
    page.get_by_role("checkbox", name=re.compile("laptop")).check()
    page.get_by_label(re.compile("^User data")).fill("#cloud-config\npackages: [htop]\n")
    page.get_by_role("textbox", name=re.compile("Hostname")).fill("keyed")
    check(page, "order")
    page.get_by_role("button", name="Order and pay").click()
    page.wait_for_url(re.compile(r"/dashboard/servers/\d+"))
    server_id = int(re.search(r"/servers/(\d+)", page.url).group(1))
    expect_text(page.locator('[data-field="status"]'), "active", timeout=90_000)
    assert line.rsplit(" ", 1)[0] in _stored_keys(shop, server_id)

    # renewal for three months: the API's quote, shown before paying
    periods = page.get_by_label("Months to pay for", exact=True)
    periods.fill("3")
    expect_text(page.locator('[data-field="quote"]'), re.compile(r"^\$11\.97 for 3 months: paid until "))
    expect_text(page.get_by_role("button", name=re.compile("Renew now")), "Renew now for 3 months")
    assert "no DNS provider" in page.content()  # the sandbox has none: said, not hidden
    check(page, "server")
    page.get_by_role("button", name="Renew now for 3 months").click()
    expect_text(page.locator(".notice"), "Renewed")
    balance = httpx.get(f"{shop.url}/v1/account", headers=api).json()["balance_usd"]
    assert balance == 84.04  # 100 - 3.99 - 3 x 3.99

    # reinstall: another OS, the key, the new password shown once
    page.get_by_role("link", name="Reinstall…").click()
    page.get_by_label("Operating system", exact=True).select_option("debian-13")
    page.get_by_role("checkbox", name=re.compile("laptop")).check()
    page.get_by_role("checkbox", name=re.compile("everything on keyed's disk is erased")).check()
    check(page, "reinstall")
    page.get_by_role("button", name="Erase and reinstall").click()
    password = page.locator("#root-password").inner_text()
    assert len(password) == 20 and "shown here once" in page.content()
    check(page, "reinstalled")
    creds = httpx.get(f"{shop.url}/v1/servers/{server_id}/credentials", headers=api).json()
    assert creds["password"] == password
    assert httpx.get(f"{shop.url}/v1/servers/{server_id}", headers=api).json()["os"] == "debian-13"
    page.get_by_role("link", name="Back to keyed").click()
    assert password not in page.content()

    # the serial console: a ticket from the API, the WebSocket opened by console.js
    deadline = time.monotonic() + 60
    while True:  # the reinstall job boots the simulated guest again
        page.goto(f"{shop.base}/servers/{server_id}/console")
        page.get_by_role("button", name="Connect to the console").click()
        state = page.locator('[data-field="console-state"]')
        expect_text(state, re.compile(r"Connected|closed|Not connected"))
        if "Connected." in state.inner_text() or time.monotonic() > deadline:
            break
        time.sleep(1)
    output = page.locator("#console-output")
    expect_text(output, "keyed login:")
    assert "Linux version" in output.inner_text()
    page.get_by_label("Type a line", exact=True).fill("root")
    page.keyboard.press("Enter")
    expect_text(output, re.compile(r"login: root"))
    check(page, "console")

    # terminate: the hostname typed to confirm; the unused time credited, said on the server's page
    page.goto(f"{shop.base}/servers/{server_id}")
    page.get_by_role("link", name="Terminate…").click()
    assert "is credited to your balance" in page.content()
    check(page, "terminate")
    page.get_by_label(re.compile("Type the hostname")).fill("not-keyed")
    page.get_by_role("button", name="Terminate for good").click()
    expect_text(page.locator("#terminate-error"), "not this server's hostname")
    page.get_by_label(re.compile("Type the hostname")).fill("keyed")
    page.get_by_role("button", name="Terminate for good").click()
    expect_text(page.locator("#terminated-notice"), re.compile(r"keyed is terminated.*was credited", re.S))
    check(page, "terminated")
    server = httpx.get(f"{shop.url}/v1/servers/{server_id}", headers=api).json()
    assert server["status"] == "terminated"
    assert httpx.get(f"{shop.url}/v1/account", headers=api).json()["balance_usd"] > 84.04  # credited back


def test_webhook_registered_with_its_secret_once_and_events(shop, context, check, receiver):  # noqa: F811
    page = context.new_page()
    _, token, _ = create_account(page, shop)
    api = _bearer(context, shop, token)
    page.get_by_role("navigation").get_by_role("link", name="Webhooks").click()
    check(page, "webhooks")
    page.get_by_label("URL", exact=True).fill(receiver.url("/hook"))
    page.get_by_label(re.compile("^Description")).fill("my receiver")
    page.get_by_role("checkbox", name=re.compile("Every event")).uncheck()
    page.locator("summary", has_text="API keys").click()  # open the group
    page.get_by_role("checkbox", name=re.compile(r"^api_key\.created")).check()
    page.get_by_role("button", name="Register endpoint").click()
    secret = page.locator("#webhook-secret").inner_text()
    assert secret.startswith("whsec_") and "shown this once" in page.content()
    check(page, "webhook-created")
    receiver.secrets["/hook"] = secret
    page.goto(f"{shop.base}/webhooks")
    assert secret not in page.content() and "my receiver" in page.content()

    # an event: the shop's worker delivers it, signed; the log shows it and sends it again
    httpx.post(f"{shop.url}/v1/keys", headers=api, json={"name": "watched"})
    got = receiver.wait_for(lambda got: any(r.verified for r in got), seconds=30)
    assert got[0].json()["type"] == "api_key.created" and got[0].json()["data"]["name"] == "watched"
    page.get_by_role("link", name=receiver.url("/hook")).click()
    expect_text(page.locator("table"), "succeeded")
    page.get_by_role("button", name=f"Send again: api_key.created {got[0].id}").click()
    expect_text(page.locator(".notice"), "queued to be sent again")
    again = receiver.wait_for(lambda got: len(got) >= 2, seconds=30)
    assert again[1].id == got[0].id and again[1].verified
    page.reload()
    check(page, "webhook")

    page.get_by_role("navigation").get_by_role("link", name="Events").click()
    assert got[0].id in page.content() and "API key" in page.content()
    page.locator("summary", has_text=f"Show data of {got[0].id}").click()
    assert '"name": "watched"' in page.locator("pre.json").first.inner_text()
    check(page, "events")


def test_ssh_keys_and_webhooks_with_the_keyboard_alone(shop, context, receiver):  # noqa: F811
    page = context.new_page()
    _, token, _ = create_account(page, shop)
    api = _bearer(context, shop, token)
    page.goto(f"{shop.base}/ssh-keys")
    _tab_to(page, "#name")
    page.keyboard.type("typed")
    _tab_to(page, "#public_key")
    page.keyboard.type(public_key("kbd"))
    _tab_to(page, 'main button[type="submit"]')
    page.keyboard.press("Enter")
    expect_text(page.locator(".notice"), "The SSH key is stored")
    assert [k["name"] for k in httpx.get(f"{shop.url}/v1/ssh-keys", headers=api).json()["ssh_keys"]] == ["typed"]

    page.goto(f"{shop.base}/webhooks")
    _tab_to(page, "#url")
    page.keyboard.type(receiver.url("/kbd"))
    _tab_to(page, 'main button[type="submit"]', limit=60)
    page.keyboard.press("Enter")
    assert page.locator("#webhook-secret").inner_text().startswith("whsec_")
    hooks = httpx.get(f"{shop.url}/v1/webhooks", headers=api).json()["webhooks"]
    assert [(w["url"], w["event_types"]) for w in hooks] == [(receiver.url("/kbd"), ["*"])]
