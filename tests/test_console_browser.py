"""The operators' web console in a real browser (Debian's Chromium through Playwright) against the real
`vpsshop serve --admin-listen` (a sandbox on SQLite, a subprocess): an owner signs in with password
and TOTP, finds a customer by a deposit's transaction id and credits them with a reason; the
customer's balance, ledger, events and webhook show it; a `support` operator is refused a credit
above its limit; the audit log shows both. Every page is checked with axe-core and photographed at
desktop and phone width (``VPSSHOP_SCREENSHOTS=docs/images`` refreshes the ones docs/operations.md
shows). A second walk takes the other actions in the browser: disable a webhook, suspend, unsuspend,
terminate with a refund, cancel a job that failed long ago, revoke an account's access, each with a
reason and a confirmation and each ending on the "Done" page, which axe-core checks too."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pyotp
import pytest
from served import VPSSHOP, free_port, serve, shop_env
from test_dashboard_browser import (  # noqa: F401 - fixtures: the browser and the page checks
    axe_source,
    browser,
    check,
    context,
    shots,
)
from webhook_receiver import Receiver

pytestmark = pytest.mark.slow

TXID = "7f" * 32


def add_operator(folder: Path, env: dict[str, str], name: str, role: str, password: str) -> str:
    """`vpsshop admin operator add` as an owner runs it; returns the TOTP secret it prints."""
    done = subprocess.run(
        [VPSSHOP, "admin", "operator", "add", name, "--role", role, "--password-stdin"],
        input=password + "\n",
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found = re.search(r"TOTP secret: ([A-Z2-7]+)", done.stdout)
    assert found, done.stdout
    return found.group(1)


def sign_in(page, console: str, name: str, password: str, secret: str) -> None:
    page.goto(f"{console}/signin")
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Password", exact=True).fill(password)
    page.get_by_label("Code from your authenticator app").fill(pyotp.TOTP(secret).now())
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{console}/")


def test_an_owner_credits_a_customer_found_by_transaction_id_and_support_is_held_to_its_limit(
    tmp_path: Path,
    context,  # noqa: F811 - fixtures of test_dashboard_browser
    browser,  # noqa: F811
    check,  # noqa: F811
):
    database = tmp_path / "vpsshop.db"
    env = shop_env(f"sqlite:///{database}", VPSSHOP__EVENTS__INTERVAL_SECONDS="0.3")
    console_port = free_port()
    console = f"http://127.0.0.1:{console_port}"
    receiver = Receiver()
    with serve(tmp_path, env, "--admin-listen", f"127.0.0.1:{console_port}") as shop:
        root = shop.base.removesuffix("/v1")
        api = httpx.Client(base_url=shop.base, timeout=30)
        created = api.post("/account").json()
        customer = {"Authorization": f"Bearer {created['api_key']}"}
        hook = api.post("/webhooks", headers=customer, json={"url": receiver.url("/shop")})
        assert hook.status_code == 201, hook.text
        receiver.secrets["/shop"] = hook.json()["secret"]
        topup = api.post("/topups", headers=customer, json={"amount": 25, "coin": "BTC"}).json()
        with sqlite3.connect(database) as db:  # a payment as the chain watcher records it
            (topup_id,) = db.execute("SELECT id FROM topups WHERE ref = ?", (topup["ref"],)).fetchone()
            db.execute(
                "INSERT INTO topup_payments (coin, identity, topup_id, account_id, txid, amount_atomic, status, "
                "confirmations, late, first_seen_at) VALUES ('BTC', ?, ?, ?, ?, '1000', 'seen', 0, 0, "
                "'2026-01-01 00:00:00.000000')",
                (f"{TXID}:0", topup_id, created["user_id"], TXID),
            )
        owner = add_operator(tmp_path, env, "olga", "owner", "owner password 1")
        support = add_operator(tmp_path, env, "sam", "support", "support password 1")

        # The console is on its own port only.
        for path in ("/signin", "/audit", f"/accounts/{created['user_id']}"):
            assert httpx.get(root + path).status_code == 404
        assert httpx.get(f"{console}/v1/health").status_code == 404

        page = context.new_page()
        page.goto(f"{console}/signin")
        check(page, "operator-signin")
        sign_in(page, console, "olga", "owner password 1", owner)
        page.get_by_role("link", name="Search").click()
        page.get_by_label(re.compile("transaction id")).fill(TXID)
        page.get_by_role("button", name="Search").click()
        check(page, "operator-search")
        page.get_by_role("link", name=str(created["user_id"]), exact=True).click()
        check(page, "operator-account")
        page.get_by_label("Amount (USD)").fill("20")
        page.get_by_label("Reason (the customer sees it in the ledger)").fill("outage credit")
        page.get_by_role("button", name="Credit…").click()
        check(page, "operator-confirm")
        page.get_by_role("button", name="Confirm the credit").click()
        page.wait_for_url(re.compile(rf"/accounts/{created['user_id']}\?notice=credited"))
        assert page.locator("#balance").inner_text() == "$20.00"

        # What the customer sees: balance, the ledger on the dashboard, the event, the webhook.
        assert api.get("/account", headers=customer).json()["balance_usd"] == 20
        events = api.get("/events", headers=customer).json()["events"]
        credit = next(e for e in events if e["type"] == "ledger.credit")
        assert credit["data"]["memo"] == "outage credit" and credit["data"]["amount_usd"] == 20
        got = receiver.wait_for(lambda got: "ledger.credit" in {r.json()["type"] for r in got}, seconds=60)
        delivered = next(r for r in got if r.json()["type"] == "ledger.credit")
        assert delivered.verified and delivered.json()["id"] == credit["id"]
        dashboard = browser.new_context()
        customer_page = dashboard.new_page()
        customer_page.goto(f"{root}/dashboard/signin")
        customer_page.get_by_label("Login token", exact=True).fill(created["login_token"])
        customer_page.get_by_role("button", name="Sign in").click()
        customer_page.wait_for_url(f"{root}/dashboard/")
        assert "outage credit" in customer_page.content()
        dashboard.close()

        # a server of the customer's, as the operator sees it; what waits too long
        order = {"plan": "pup", "location": "nl", "os": "debian-12"}
        server_id = api.post("/servers", headers=customer, json=order).json()["server"]["id"]
        page.goto(f"{console}/servers/{server_id}")
        assert "pup" in page.locator("dl.facts.card").inner_text()
        assert page.get_by_role("heading", name="Traffic this period").is_visible()
        check(page, "operator-server")
        page.get_by_role("link", name="Needs attention").click()
        check(page, "operator-attention")
        page.get_by_role("link", name="Overview").click()
        assert "$20.00" in page.locator("#credited").inner_html() and "$3.99" in page.locator("#spent").inner_html()
        check(page, "operator-overview")

        # support: refused above [console] support_limit_usd (100 by default)
        other = browser.new_context()
        page = other.new_page()
        sign_in(page, console, "sam", "support password 1", support)
        page.goto(f"{console}/accounts/{created['user_id']}")
        page.get_by_label("Amount (USD)").fill("500")
        page.get_by_label("Reason (the customer sees it in the ledger)").fill("too generous")
        page.get_by_role("button", name="Credit…").click()
        page.get_by_role("button", name="Confirm the credit").click()
        assert "at most 100.00 USD" in page.locator("[role=alert]").inner_text()
        check(page, "operator-refused")
        assert api.get("/account", headers=customer).json()["balance_usd"] == 16.01  # 20 less the order

        page.get_by_role("link", name="Audit log").click()
        rows = page.locator("tbody tr").all_inner_texts()
        assert any("console:sam" in r and "admin_credit_refused" in r and "too generous" in r for r in rows)
        assert any("console:olga" in r and "admin_credit" in r and "outage credit" in r for r in rows)
        check(page, "operator-audit")
        other.close()
    receiver.close()


def confirm(page, check_page, button: str, name: str | None = None) -> str:
    """Press ``button``, then the confirmation page's own button: the "Done" page's message."""
    page.get_by_role("button", name=button, exact=True).click()
    page.get_by_role("button", name=re.compile("^Confirm")).click()
    message = page.locator("[role=status]").inner_text()
    assert page.locator("h1").inner_text() == "Done", message
    if name:
        check_page(page, name)
    return message


def test_an_owner_disables_a_webhook_acts_on_a_server_and_a_job_and_revokes_access(
    tmp_path: Path,
    context,  # noqa: F811 - fixtures of test_dashboard_browser
    check,  # noqa: F811
):
    database = tmp_path / "vpsshop.db"
    env = shop_env(f"sqlite:///{database}", VPSSHOP__HYPERVISOR__SIMULATOR__HOSTS='["sim-a", "sim-b"]')
    console_port = free_port()
    console = f"http://127.0.0.1:{console_port}"
    with serve(tmp_path, env, "--admin-listen", f"127.0.0.1:{console_port}") as shop:
        api = httpx.Client(base_url=shop.base, timeout=30)
        created = api.post("/account").json()
        account_id, customer = created["user_id"], {"Authorization": f"Bearer {created['api_key']}"}
        hook = api.post("/webhooks", headers=customer, json={"url": "https://hooks.example.net/shop"}).json()
        owner = add_operator(tmp_path, env, "olga", "owner", "owner password 1")
        with sqlite3.connect(database) as db:  # 10 USD, as `vpsshop admin credit` would leave it
            db.execute("UPDATE accounts SET balance_micros = 10000000 WHERE id = ?", (account_id,))
        order = {"plan": "pup", "location": "nl", "os": "debian-12"}
        server_id = api.post("/servers", headers=customer, json=order).json()["server"]["id"]

        def server_status() -> str:
            return str(api.get(f"/servers/{server_id}", headers=customer).json()["status"])

        deadline = time.monotonic() + 60
        while server_status() != "active" and time.monotonic() < deadline:
            time.sleep(0.3)
        assert server_status() == "active"
        with sqlite3.connect(database) as db:  # a job that failed an hour ago, as a worker leaves it
            job_id = db.execute(
                "INSERT INTO server_jobs (server_id, kind, status, attempts, run_after, created_at, finished_at, "
                "last_error) VALUES (?, 'reinstall', 'failed', 5, ?, ?, ?, 'the hypervisor did not answer')",
                (server_id, *["2026-01-01 00:00:00.000000"] * 3),
            ).lastrowid

        page = context.new_page()
        sign_in(page, console, "olga", "owner password 1", owner)
        page.goto(f"{console}/accounts/{account_id}")
        page.locator(f"#hook-reason-{hook['id']}").fill("its host bounces everything")
        assert "disabled" in confirm(page, check, "Disable…", "operator-done")
        assert api.get(f"/webhooks/{hook['id']}", headers=customer).json()["status"] == "disabled"

        for button, status in (("Suspend…", "suspended"), ("Unsuspend…", "active")):
            page.goto(f"{console}/servers/{server_id}")
            page.locator("#reason").fill(f"ticket 9: {button}")
            confirm(page, check, button)
            assert server_status() == status
        page.get_by_role("link", name="Hosts").click()
        check(page, "operator-hosts")
        images = page.locator("#images").inner_text()  # the simulator holds no base images: said plainly
        assert "Base images" in images and "cannot manage images" in images and "sim-a" not in images, images
        page.locator("#reason-1").fill("disk swap")  # sim-a, the server's host
        assert "host sim-a: drained" in confirm(page, check, "Drain sim-a…")
        page.goto(f"{console}/servers/{server_id}")
        page.locator("#host").select_option("sim-b")
        page.locator("#move-reason").fill("sim-a is drained for a disk swap")
        assert "(sim-a -> sim-b)" in confirm(page, check, "Move…")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with sqlite3.connect(database) as db:
                row = db.execute("SELECT host, status_reason FROM servers WHERE id = ?", (server_id,)).fetchone()
            if row == ("sim-b", None):
                break
            time.sleep(0.3)
        assert row == ("sim-b", None) and server_status() == "active", row

        page.goto(f"{console}/servers/{server_id}")
        page.locator("#reason").fill("the customer asked to leave")
        assert "refund" in confirm(page, check, "Terminate and refund the unused time…").lower()
        deadline = time.monotonic() + 30
        while server_status() not in ("terminated", "deleted") and time.monotonic() < deadline:
            time.sleep(0.3)
        assert server_status() in ("terminated", "deleted")
        assert api.get("/account", headers=customer).json()["balance_usd"] > 10 - 3.99  # the unused time back

        page.get_by_role("link", name="Needs attention").click()
        page.locator(f"#reason-{job_id}").fill("the reinstall is not wanted any more")
        assert f"job {job_id}: cancel done" in confirm(page, check, "Cancel…")
        with sqlite3.connect(database) as db:
            assert db.execute("SELECT status FROM server_jobs WHERE id = ?", (job_id,)).fetchone() == ("cancelled",)

        page.goto(f"{console}/accounts/{account_id}")
        page.locator("#revoke-reason").fill("the key leaked")
        assert "1 API key(s) revoked" in confirm(page, check, "Revoke every API key and dashboard session…")
        deadline = time.monotonic() + 30
        while api.get("/account", headers=customer).status_code != 401 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert api.get("/account", headers=customer).status_code == 401

        page.get_by_role("link", name="Audit log").click()
        rows = page.locator("tbody tr").all_inner_texts()
        actions = ("disable_webhook", "suspend", "unsuspend", "host_drain", "migrate", "refund", "cancel_job")
        for action in (*actions, "revoke_access"):
            assert any("console:olga" in r and action in r for r in rows), (action, rows)
