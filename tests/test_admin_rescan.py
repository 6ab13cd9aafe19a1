"""``vpsshop admin rescan`` (vpsshop/admin.py) on a real ``litecoind -regtest``: a payment in a block the
watcher's cursor has already passed is found and credited after the re-scan, once, however often the
range is scanned again, through the function and through the command."""

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

from vpsshop import admin
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
