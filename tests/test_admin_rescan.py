"""``vpsshop admin rescan`` (vpsshop/admin.py) on a real ``litecoind -regtest``: a payment in a block the
watcher's cursor has already passed is found and credited after the re-scan, once, however often the
range is scanned again, through the function, through the command and through the web console's
re-scan of a top-up."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from chain_nodes import Litecoind, balance, random_tpub, run_pass, running_litecoind
from served import VPSSHOP, shop_env
from test_console import console, csrf_of, sign_in  # noqa: F401 - console: the console app fixture

from vpsshop import admin, operators
from vpsshop.actors import Operator
from vpsshop.testing import create_test_account

OPERATOR = Operator("support@test")


@pytest.fixture(scope="module")
def litecoind() -> Iterator[Litecoind]:
    with running_litecoind("ltc-rescan") as node:
        yield node


@pytest.fixture
def ltc_xpub() -> str:
    """A fresh account key per test (tests on one chain never share an address)."""
    return random_tpub()


@pytest.fixture
def vpsshop_overrides(litecoind: Litecoind, ltc_xpub: str) -> dict[str, Any]:
    return {
        "coins": {"LTC": litecoind.settings(ltc_xpub, 2)},
        "topups": {"poll_min_seconds": 3600, "expiry_minutes": 60},  # no GET checks the chain here
    }


def _missed_payment(client, litecoind: Litecoind, headers: dict[str, str]) -> tuple[dict[str, Any], int]:
    """A top-up paid in a block, with the watcher's cursor then put past that block without having seen
    it (what a node that served an incomplete block, a restored cursor or a late-loaded key leaves)."""
    run_pass(client)
    topup = client.post("/v1/topups", json={"amount": 50, "coin": "LTC"}, headers=headers)
    assert topup.status_code == 201, topup.text
    txid = litecoind.pay(topup.json()["deposit_address"], topup.json()["deposit_amount"])
    [block] = litecoind.mine(1)
    litecoind.mine(2)
    paid_at = litecoind.rpc("getblock", block)["height"]
    assert txid in litecoind.rpc("getblock", block)["tx"]
    tip = litecoind.rpc("getblockcount")
    with client.app.state.ctx.db.engine.begin() as conn:
        moved = conn.execute(
            sa.text("UPDATE chain_scan_cursors SET cursor = :c WHERE scan_group = 'LTC'"),
            {"c": f"{tip}:{litecoind.rpc('getblockhash', tip)}"},
        ).rowcount
    assert moved == 1
    return topup.json(), paid_at


def test_rescan_credits_a_payment_the_cursor_passed_once(vpsshop_client, litecoind: Litecoind) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    topup, paid_at = _missed_payment(vpsshop_client, litecoind, h)
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 0  # the watcher does not look back

    ctx = vpsshop_client.app.state.ctx
    done = vpsshop_client.portal.call(
        admin.rescan, ctx, OPERATOR, "ltc", paid_at - 1, paid_at + 1, "customer paid, not credited"
    )
    assert "1 not known before" in done and "1 payment(s) credited" in done
    assert balance(vpsshop_client, h) == Decimal(50)
    assert vpsshop_client.get(f"/v1/topups/{topup['ref']}", headers=h).json()["status"] == "completed"
    # Again, and the whole way to the tip: found again, never credited twice.
    again = vpsshop_client.portal.call(admin.rescan, ctx, OPERATOR, "LTC", paid_at, None, "again")
    assert "1 payment(s) to the shop's addresses, 0 not known before" in again
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == Decimal(50)
    with ctx.db.engine.connect() as conn:
        audits = conn.execute(sa.text("SELECT action, target, detail FROM admin_audit ORDER BY id")).all()
    assert [(a, t) for a, t, _ in audits] == [("rescan", "scan_group:LTC")] * 2
    assert json.loads(audits[0][2])["from_height"] == paid_at - 1
    # What cannot be re-scanned says why.
    with pytest.raises(admin.AdminError, match="past the node's tip"):
        vpsshop_client.portal.call(admin.rescan, ctx, OPERATOR, "LTC", 10**9, None, "x")
    with pytest.raises(admin.AdminError, match="not enabled"):
        vpsshop_client.portal.call(admin.rescan, ctx, OPERATOR, "DOGE", 1, None, "x")


def test_rescan_command(vpsshop_client, vpsshop_database_url, litecoind: Litecoind, ltc_xpub: str, tmp_path) -> None:
    account = create_test_account(vpsshop_client)
    _, paid_at = _missed_payment(vpsshop_client, litecoind, account.headers)
    settings = litecoind.settings(ltc_xpub, 2)
    env = shop_env(
        vpsshop_database_url,
        **{f"VPSSHOP__COINS__LTC__{key.upper()}": str(value) for key, value in settings.items()},
    )
    done = subprocess.run(
        [VPSSHOP, "admin", "rescan", "LTC", str(paid_at), "--reason", "ticket 42"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "1 not known before" in done.stdout and "1 payment(s) credited" in done.stdout
    assert balance(vpsshop_client, account.headers) == Decimal(50)
    usage = subprocess.run([VPSSHOP, "admin", "rescan", "LTC"], env=env, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "from_height" in usage.stderr


def test_console_rescans_a_top_up_with_a_reason_after_a_confirmation(
    vpsshop_client,
    console,  # noqa: F811 - the fixture of test_console
    vpsshop_clock,
    litecoind: Litecoind,
) -> None:
    ctx = vpsshop_client.app.state.ctx
    account = create_test_account(vpsshop_client)
    h = account.headers
    topup, paid_at = _missed_payment(vpsshop_client, litecoind, h)
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 0
    bob = operators.add_operator(ctx, OPERATOR, "bob", "support", "support password 1")
    assert sign_in(console, vpsshop_clock, "bob", "support password 1", bob.secret).status_code == 303

    page = console.get(f"/accounts/{account.user_id}")
    assert f'<option value="{topup["ref"]}">{topup["ref"]} (LTC, ' in page.text
    url, csrf = f"/accounts/{account.user_id}/rescan", csrf_of(page.text)
    form = {
        "topup": topup["ref"],
        "from_height": str(paid_at - 1),
        "to_height": str(paid_at + 1),
        "reason": "ticket 7: paid, not credited",
    }
    for missing in ("reason", "from_height", "topup"):
        assert console.post(url, data={**form, missing: "", "csrf": csrf}).status_code == 400, missing
    assert console.post(url, data={**form, "from_height": "ten", "csrf": csrf}).status_code == 400
    assert console.post(url, data={**form, "confirm": "yes"}).status_code == 403  # no CSRF token: nothing

    confirm = console.post(url, data={**form, "csrf": csrf})
    assert confirm.status_code == 200 and "Confirm the re-scan" in confirm.text
    assert f"Re-scan blocks {paid_at - 1} to {paid_at + 1} of the chain that pays top-up {topup['ref']}" in confirm.text
    assert balance(vpsshop_client, h) == 0  # nothing happens before the confirmation
    done = console.post(url, data={**form, "confirm": "yes", "csrf": csrf_of(confirm.text)})
    assert done.status_code == 200 and "1 not known before" in done.text and "1 payment(s) credited" in done.text
    assert balance(vpsshop_client, h) == Decimal(50)
    assert vpsshop_client.get(f"/v1/topups/{topup['ref']}", headers=h).json()["status"] == "completed"

    [row] = [r for r in admin.audit_log(ctx) if r["action"] == "rescan"]
    assert (row["actor"], row["target"], row["reason"]) == ("console:bob", "scan_group:LTC", form["reason"])
    detail = json.loads(row["detail"])
    assert detail["topup"] == topup["ref"] and detail["from_height"] == paid_at - 1 and detail["credited"] == 1
    audit = console.get("/audit").text
    assert "console:bob" in audit and form["reason"] in audit and "scan_group:LTC" in audit

    # Another account's top-up, or blocks past the tip: refused, said why, nothing scanned or credited.
    other = create_test_account(vpsshop_client)
    refused = console.post(
        f"/accounts/{other.user_id}/rescan", data={**form, "confirm": "yes", "csrf": csrf_of(confirm.text)}
    )
    assert refused.status_code == 409 and "has no top-up" in refused.text
    past = console.post(
        url,
        data={**form, "from_height": "1000000000", "to_height": "", "confirm": "yes", "csrf": csrf_of(confirm.text)},
    )
    assert past.status_code == 409 and "past the node" in past.text
    assert [r["action"] for r in admin.audit_log(ctx)].count("rescan") == 1
    assert balance(vpsshop_client, h) == Decimal(50)
