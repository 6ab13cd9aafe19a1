"""The operators' web console (vpsshop/backoffice) in process, beside the API on the same database:
operators and their sign-in, the credit action and its limit, the audit log, and the overview's
charts against the ledger. The real `vpsshop serve --admin-listen` in a browser is in
tests/test_console_browser.py."""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from starlette.testclient import TestClient

from vpsshop import operators
from vpsshop.actors import Operator
from vpsshop.admin import AdminError, audit_log
from vpsshop.backoffice.charts import BAR_HEIGHT
from vpsshop.twofactor import current_code

OWNER_PASSWORD = "correct horse battery"
SHELL = Operator("root")


@pytest.fixture
def ctx(vpsshop_client):
    return vpsshop_client.app.state.ctx


@pytest.fixture
def console(vpsshop_settings, vpsshop_clock, vpsshop_client):
    from vpsshop.app import create_console_app

    with TestClient(create_console_app(vpsshop_settings, clock=vpsshop_clock), raise_server_exceptions=False) as c:
        yield c


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, html[:500]
    return found.group(1)


def sign_in(console: TestClient, clock, name: str, password: str, secret: str, code: str | None = None):
    clock.advance(seconds=30)  # a code works once: each sign-in in its own step
    form = console.get("/signin")
    return console.post(
        "/signin",
        data={
            "csrf": csrf_of(form.text),
            "name": name,
            "password": password,
            "code": code or current_code(secret, clock.now().timestamp()),
        },
        follow_redirects=False,
    )


def test_operator_sign_in_needs_password_and_a_fresh_code_and_ends_when_disabled(ctx, console, vpsshop_clock):
    with pytest.raises(AdminError, match="12 to 500"):
        operators.add_operator(ctx, SHELL, "ann", "owner", "short")
    ann = operators.add_operator(ctx, SHELL, "ann", "owner", OWNER_PASSWORD)
    assert ann.uri.startswith("otpauth://totp/") and ann.secret in ann.uri
    stored = ctx.db.engine.connect().execute(sa.text("SELECT password_hash, totp_secret_enc FROM operators")).one()
    assert stored[0].startswith("$argon2id$") and ann.secret not in stored[1]

    assert console.get("/", follow_redirects=False).headers["location"] == "/signin"
    assert sign_in(console, vpsshop_clock, "ann", "wrong password here", ann.secret).status_code == 401
    assert sign_in(console, vpsshop_clock, "ann", OWNER_PASSWORD, ann.secret, code="000000").status_code in (401,)
    signed = sign_in(console, vpsshop_clock, "ann", OWNER_PASSWORD, ann.secret)
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    page = console.get("/")
    assert page.status_code == 200 and "Overview" in page.text
    for header in ("content-security-policy", "x-frame-options", "x-content-type-options", "cache-control"):
        assert header in page.headers
    assert "script-src 'self'" in page.headers["content-security-policy"] and "<script" not in page.text

    # the same code again, even with the right password, is refused (replay)
    code = current_code(ann.secret, vpsshop_clock.now().timestamp())
    form = console.get("/signin")
    again = console.post(
        "/signin",
        data={"csrf": csrf_of(form.text), "name": "ann", "password": OWNER_PASSWORD, "code": code},
        follow_redirects=False,
    )
    assert again.status_code == 401

    # a form without the session's CSRF token does nothing
    assert console.post("/signout", data={"csrf": "x" * 43}).status_code == 403

    listed = {row["name"]: row for row in operators.list_operators(ctx)}
    assert listed["ann"]["role"] == "owner" and listed["ann"]["last_signin_at"] is not None
    assert operators.disable_operator(ctx, SHELL, "ann", "left the company") == 1
    assert console.get("/", follow_redirects=False).headers["location"].startswith("/signin")
    assert sign_in(console, vpsshop_clock, "ann", OWNER_PASSWORD, ann.secret).status_code == 401

    renewed = operators.reset_operator(ctx, SHELL, "ann", "another good password", "came back")
    assert renewed.secret != ann.secret
    assert sign_in(console, vpsshop_clock, "ann", "another good password", renewed.secret).status_code == 303
    assert sign_in(console, vpsshop_clock, "ann", "another good password", renewed.secret).status_code == 303
    with ctx.db.engine.connect() as conn:  # signing in again ended the session it replaced
        live = conn.execute(sa.text("SELECT count(*) FROM operator_sessions WHERE ended_at IS NULL")).scalar()
    assert live == 1
    actions = [row["action"] for row in audit_log(ctx)]
    assert actions[:3] == ["operator_reset", "operator_disable", "operator_add"]


def test_the_api_port_does_not_serve_the_console(vpsshop_client):
    for path in ("/signin", "/audit", "/search", "/accounts/1", "/static/console.css"):
        assert vpsshop_client.get(path, follow_redirects=False).status_code in (303, 404), path
        assert "Operator sign-in" not in vpsshop_client.get(path).text


def _deposit(client, account, txid: str) -> str:
    """A top-up, and a payment to it as the chain watcher records it (the watchers have tests of their
    own); returns its deposit address."""
    made = client.post("/v1/topups", headers=account.headers, json={"amount": 25, "coin": "BTC"})
    assert made.status_code == 201, made.text
    ctx = client.app.state.ctx
    with ctx.db.engine.begin() as conn:
        topup = conn.execute(sa.text("SELECT id FROM topups WHERE ref = :r"), {"r": made.json()["ref"]}).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO topup_payments (coin, identity, topup_id, account_id, txid, amount_atomic, status, "
                "confirmations, late, first_seen_at) VALUES ('BTC', :id, :t, :a, :tx, '25000', 'seen', 0, false, :now)"
            ),
            {"id": f"{txid}:0", "t": topup, "a": account.user_id, "tx": txid, "now": ctx.clock.now()},
        )
    return str(made.json()["deposit_address"])


def balance_becomes(client, headers, usd: int) -> None:
    """The API's balance, once PostgreSQL has told its authentication cache of the console's change
    (vpsshop/authcache.py: another process's write arrives by NOTIFY, in milliseconds)."""
    deadline = time.monotonic() + 10
    while (seen := client.get("/v1/account", headers=headers).json()["balance_usd"]) != usd:
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)


def test_search_by_transaction_id_credit_with_reason_and_the_support_limit(
    ctx, console, vpsshop_client, vpsshop_account, vpsshop_clock
):
    owner = operators.add_operator(ctx, SHELL, "olga", "owner", OWNER_PASSWORD)
    support = operators.add_operator(ctx, SHELL, "sam", "support", "support password 1")
    txid = "ab" * 32
    _deposit(vpsshop_client, vpsshop_account, txid)
    sign_in(console, vpsshop_clock, "olga", OWNER_PASSWORD, owner.secret)

    found = console.get("/search", params={"q": txid.upper()})
    assert f'href="/accounts/{vpsshop_account.user_id}"' in found.text and "tx hash" in found.text
    page = console.get(f"/accounts/{vpsshop_account.user_id}")
    assert txid in page.text
    form = {"csrf": csrf_of(page.text), "amount": "150", "reason": "outage credit"}
    confirm = console.post(f"/accounts/{vpsshop_account.user_id}/credit", data=form)
    assert confirm.status_code == 200 and "Confirm the credit" in confirm.text
    assert vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()["balance_usd"] == 0
    done = console.post(
        f"/accounts/{vpsshop_account.user_id}/credit", data={**form, "confirm": "yes"}, follow_redirects=False
    )
    assert done.status_code == 303

    customer = vpsshop_account.headers
    balance_becomes(vpsshop_client, customer, 150)
    events = vpsshop_client.get("/v1/events", headers=customer).json()["events"]
    credit = next(e for e in events if e["type"] == "ledger.credit")
    assert credit["data"]["amount_usd"] == 150 and credit["data"]["memo"] == "outage credit"

    console.cookies.clear()
    sign_in(console, vpsshop_clock, "sam", "support password 1", support.secret)
    page = console.get(f"/accounts/{vpsshop_account.user_id}")
    over = {"csrf": csrf_of(page.text), "amount": "100.01", "reason": "too generous", "confirm": "yes"}
    refused = console.post(f"/accounts/{vpsshop_account.user_id}/credit", data=over)
    assert refused.status_code == 403 and "at most 100.00 USD" in refused.text
    within = {**over, "amount": "5", "reason": "small goodwill"}
    assert console.post(f"/accounts/{vpsshop_account.user_id}/credit", data=within).status_code == 200
    balance_becomes(vpsshop_client, customer, 155)

    rows = audit_log(ctx)
    assert [(r["actor"], r["action"]) for r in rows[:3]] == [
        ("console:sam", "admin_credit"),
        ("console:sam", "admin_credit_refused"),
        ("console:olga", "admin_credit"),
    ]
    assert json.loads(rows[2]["detail"]) == {
        "amount_micros": 150_000_000,
        "balance_before_micros": 0,
        "balance_after_micros": 150_000_000,
    }
    shown = console.get("/audit").text
    assert "admin_credit_refused" in shown and "outage credit" in shown and "too generous" in shown


def test_the_overview_charts_draw_the_ledgers_sums_per_day(ctx, console, vpsshop_client, vpsshop_clock):
    from vpsshop import ledger
    from vpsshop.testing import create_test_account

    accounts = [create_test_account(vpsshop_client).user_id for _ in range(2)]
    amounts = [(0, 40), (0, -3), (1, 12), (3, 7), (3, -5), (3, 1)]  # (days back, USD)
    start = vpsshop_clock.now()
    for back, usd in sorted(amounts, key=lambda item: -item[0]):
        vpsshop_clock.set(start - timedelta(days=back))
        with ctx.db.session() as session:
            reason = "admin_credit" if usd > 0 else "admin_debit"
            for account_id in accounts:
                ledger.post(
                    session, account_id, usd * 1_000_000 + account_id, reason, memo="chart", now=vpsshop_clock.now()
                )
    vpsshop_clock.set(start)
    owner = operators.add_operator(ctx, SHELL, "cara", "owner", OWNER_PASSWORD)
    sign_in(console, vpsshop_clock, "cara", OWNER_PASSWORD, owner.secret)
    html = console.get("/").text

    # the ledger's own sums, per UTC day, computed here from its rows
    credited: dict[str, int] = defaultdict(int)
    spent: dict[str, int] = defaultdict(int)
    with ctx.db.engine.connect() as conn:
        for created_at, amount in conn.execute(sa.text("SELECT created_at, amount_micros FROM ledger_entries")):
            if isinstance(created_at, datetime):  # PostgreSQL; SQLite gives the stored UTC text
                created_at = created_at.astimezone(UTC).isoformat()
            day = created_at[:10]
            if amount > 0:
                credited[day] += amount
            else:
                spent[day] -= amount

    def bars(chart: str) -> dict[str, tuple[int, float]]:
        svg = re.search(rf'<svg class="chart" id="{chart}".*?</svg>', html, re.S)
        assert svg, chart
        found = re.findall(r'height="([\d.]+)" fill="[^"]+" data-label="([\d-]+)" data-value="(\d+)"', svg.group(0))
        return {label: (int(value), float(height)) for height, label, value in found}

    for chart, sums in (("credited", credited), ("spent", spent)):
        drawn = bars(chart)
        assert len(drawn) == 14
        assert {day: value for day, (value, _) in drawn.items() if value} == dict(sums)
        tallest = max(value for value, _ in drawn.values())
        for value, height in drawn.values():  # each bar's height is its value's share of the tallest
            assert height == pytest.approx(BAR_HEIGHT * value / tallest, abs=0.01)
    assert sum(credited.values()) > 0 and len(spent) == 2


def test_the_migration_makes_the_operator_tables_as_modelled(ctx):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    ours = {"operators", "operator_sessions"}
    with ctx.db.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), SQLModel.metadata)
        assert ours <= set(sa.inspect(conn).get_table_names())
    assert [
        d for d in diffs if any(getattr(part, "name", part) in ours for part in (d if isinstance(d, tuple) else d[0]))
    ] == []


def test_admin_operator_commands(vpsshop_database_url, tmp_path, monkeypatch, capsys):
    import io

    from vpsshop.cli import main
    from vpsshop.db import Database

    db = Database(vpsshop_database_url)
    db.migrate()
    db.dispose()
    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("VPSSHOP")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("VPSSHOP_DATABASE_URL", vpsshop_database_url)
    monkeypatch.setenv("VPSSHOP_SECRET_KEY", "test-secret-key-not-for-production")
    monkeypatch.setenv("VPSSHOP_ENCRYPTION_KEY", "3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
    monkeypatch.setenv("VPSSHOP_MODE", "sandbox")
    monkeypatch.setattr("sys.stdin", io.StringIO("a long enough password\n"))
    assert main(["admin", "operator", "add", "Dora", "--role", "support", "--password-stdin"]) == 0
    out = capsys.readouterr().out
    assert "operator dora (support)" in out and re.search(r"TOTP secret: [A-Z2-7]{32}", out)
    assert main(["admin", "operator", "add", "dora", "--role", "owner", "--password-stdin"]) == 1
    assert main(["admin", "operator", "disable", "dora", "--reason", "test"]) == 0
    capsys.readouterr()
    assert main(["admin", "operator", "list"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["name"] == "dora" and listed["disabled_at"] is not None


def test_server_page_what_needs_attention_and_the_actions_only_an_owner_may_take(
    ctx, console, vpsshop_client, vpsshop_account, vpsshop_clock
):
    vpsshop_account.credit("10")
    order = {"plan": "pup", "location": "nl", "os": "debian-12"}
    ordered = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=order)
    assert ordered.status_code == 201, ordered.text
    server_id = ordered.json()["server"]["id"]
    vpsshop_clock.advance(minutes=31)  # no worker runs here: its provisioning job waits
    support = operators.add_operator(ctx, SHELL, "sue", "support", "support password 1")
    owner = operators.add_operator(ctx, SHELL, "otto", "owner", OWNER_PASSWORD)

    sign_in(console, vpsshop_clock, "sue", "support password 1", support.secret)
    page = console.get(f"/servers/{server_id}")
    assert page.status_code == 200 and "provisioning" in page.text and "create" in page.text
    waiting = console.get("/attention")
    job_id = int(re.search(r'action="/jobs/(\d+)/retry"', waiting.text).group(1))
    csrf = csrf_of(waiting.text)
    asked = console.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf, "reason": "stuck"})
    assert asked.status_code == 200 and "Confirm: cancel" in asked.text
    refused = console.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf, "reason": "stuck", "confirm": "yes"})
    assert refused.status_code == 403 and "may not cancel job" in refused.text
    refused = console.post(f"/servers/{server_id}/refund", data={"csrf": csrf, "reason": "x", "confirm": "yes"})
    assert refused.status_code == 403
    assert console.post(f"/servers/{server_id}/reboot", data={"csrf": csrf, "reason": "x"}).status_code == 404

    console.cookies.clear()
    sign_in(console, vpsshop_clock, "otto", OWNER_PASSWORD, owner.secret)
    csrf = csrf_of(console.get("/attention").text)
    done = console.post(f"/jobs/{job_id}/cancel", data={"csrf": csrf, "reason": "stuck", "confirm": "yes"})
    assert done.status_code == 200 and "order refunded" in done.text
    balance_becomes(vpsshop_client, vpsshop_account.headers, 10)
    server = vpsshop_client.get(f"/v1/servers/{server_id}", headers=vpsshop_account.headers).json()
    assert server["status"] == "terminated"
    assert [(r["actor"], r["action"]) for r in audit_log(ctx)[:3]] == [
        ("console:otto", "cancel_job"),
        ("console:sue", "refund_refused"),
        ("console:sue", "cancel_job_refused"),
    ]


def test_revoking_an_accounts_access_and_disabling_a_webhook(
    ctx, console, vpsshop_client, vpsshop_account, vpsshop_clock
):
    headers = vpsshop_account.headers
    hook = vpsshop_client.post("/v1/webhooks", headers=headers, json={"url": "https://example.com/hook"}).json()
    support = operators.add_operator(ctx, SHELL, "sid", "support", "support password 1")
    sign_in(console, vpsshop_clock, "sid", "support password 1", support.secret)
    page = console.get(f"/accounts/{vpsshop_account.user_id}")
    assert f'action="/webhooks/{hook["id"]}/disable"' in page.text
    csrf = csrf_of(page.text)
    asked = console.post(f"/webhooks/{hook['id']}/disable", data={"csrf": csrf, "reason": "spam target"})
    assert "Confirm: disable the webhook endpoint" in asked.text
    done = console.post(
        f"/webhooks/{hook['id']}/disable", data={"csrf": csrf, "reason": "spam target", "confirm": "yes"}
    )
    assert done.status_code == 200 and "disabled" in done.text
    shown = vpsshop_client.get(f"/v1/webhooks/{hook['id']}", headers=headers).json()
    assert shown["status"] == "disabled" and "spam target" in shown["disabled_reason"]
    assert "Webhook endpoints failing or disabled" in console.get("/attention").text

    form = {"csrf": csrf, "reason": "key leaked on a forum", "confirm": "yes"}
    done = console.post(f"/accounts/{vpsshop_account.user_id}/revoke-access", data=form)
    assert done.status_code == 200 and "1 API key(s) revoked" in done.text
    deadline = time.monotonic() + 10  # the API's cache hears of it by NOTIFY on PostgreSQL
    while vpsshop_client.get("/v1/account", headers=headers).status_code != 401:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with ctx.db.engine.connect() as conn:
        kinds = list(conn.execute(sa.text("SELECT type FROM events ORDER BY id")).scalars())
    assert "webhook.disabled" in kinds and "api_key.revoked" in kinds
    assert [r["action"] for r in audit_log(ctx)[:2]] == ["revoke_access", "disable_webhook"]


def test_attention_lists_topups_paid_late_or_other_amounts(
    ctx, console, vpsshop_client, vpsshop_account, vpsshop_clock
):
    _deposit(vpsshop_client, vpsshop_account, "cd" * 32)
    _deposit(vpsshop_client, vpsshop_account, "ef" * 32)
    with ctx.db.engine.begin() as conn:  # as the watcher leaves them once credited: 30 and 25 USD of 25 asked
        for txid, micros, late in (("cd" * 32, 30_000_000, True), ("ef" * 32, 25_000_000, False)):
            conn.execute(
                sa.text(
                    "UPDATE topup_payments SET status = 'credited', credited_micros = :m, late = :late, "
                    "credited_at = :now WHERE txid = :tx"
                ),
                {"m": micros, "late": late, "now": ctx.clock.now(), "tx": txid},
            )
    owner = operators.add_operator(ctx, SHELL, "tia", "owner", OWNER_PASSWORD)
    sign_in(console, vpsshop_clock, "tia", OWNER_PASSWORD, owner.secret)
    listed = shopview_rows(console.get("/attention").text, "paid late, too little or too much")
    assert len(listed) == 1 and "late, overpaid" in listed[0] and "$30.00" in listed[0]


def shopview_rows(html: str, heading: str) -> list[str]:
    section = html[html.index(heading) :].split("</section>")[0]
    return re.findall(r"<tr>(.*?)</tr>", section, re.S)[1:]


def test_serve_refuses_the_console_beside_several_workers(tmp_path, monkeypatch, capsys):
    from vpsshop.cli import main

    monkeypatch.chdir(tmp_path)
    for name in [n for n in __import__("os").environ if n.startswith("VPSSHOP")]:
        monkeypatch.delenv(name)
    assert main(["serve", "--admin-listen", "127.0.0.1:8081", "--workers", "2"]) == 2
    assert "process of its own" in capsys.readouterr().err
