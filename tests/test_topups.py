"""Top-up endpoints on the sandbox (no config file, no node): addresses, QR codes, rates, errors,
idempotency, cancel, expiry, privacy. Chain flows are in test_bitcoin.py and test_monero.py."""

from __future__ import annotations

import base64
import shutil
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from vpsshop.hdkeys import decode_segwit_v0
from vpsshop.testing import create_test_account


def decode_qr(data_uri: str, tmp_path: Path) -> str:
    """Decode the QR code with zbar (Debian zbar-tools), as a wallet's camera would."""
    prefix = "data:image/png;base64,"
    assert data_uri.startswith(prefix)
    image = tmp_path / "qr.png"
    image.write_bytes(base64.b64decode(data_uri[len(prefix) :]))
    zbarimg = shutil.which("zbarimg")
    assert zbarimg, "zbar-tools is listed in scripts/deps/apt-topups.txt"
    out = subprocess.run([zbarimg, "--raw", "-q", str(image)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


SANDBOX_PRICES = {"BTC": Decimal(60000), "LTC": Decimal(80), "XMR": Decimal(150)}


@pytest.mark.parametrize(
    ("coin", "network", "scheme", "amount_key", "decimals"),
    [
        ("BTC", "bitcoin-testnet", "bitcoin", "amount", 8),
        ("LTC", "litecoin-testnet", "litecoin", "amount", 8),
        ("XMR", "monero-stagenet", "monero", "tx_amount", 12),
    ],
)
def test_sandbox_topup_per_classic_coin(
    vpsshop_client: TestClient, tmp_path: Path, coin: str, network: str, scheme: str, amount_key: str, decimals: int
) -> None:
    account = create_test_account(vpsshop_client)
    response = vpsshop_client.post("/v1/topups", json={"amount": 50, "coin": coin}, headers=account.headers)
    assert response.status_code == 201, response.text
    body = response.json()
    assert set(body) >= {
        "ref",
        "status",
        "amount_usd",
        "coin",
        "deposit_address",
        "deposit_amount",
        "deposit_coin",
        "deposit_network",
        "qr_data_uri",
        "expires_at",
    }
    assert (body["status"], body["coin"], body["deposit_coin"], body["amount_usd"]) == ("pending", coin, coin, 50)
    assert body["deposit_network"] == network
    address = body["deposit_address"]
    if coin == "BTC":
        assert len(decode_segwit_v0("tb", address)) == 20
    elif coin == "LTC":
        assert len(decode_segwit_v0("tltc", address)) == 20
    else:
        import sys

        sys.path.insert(0, str(Path(__file__).parents[1] / "plugins"))
        from vpsshop_monero.addresses import parse_address

        parsed = parse_address(address)
        assert (parsed.network, parsed.subaddress) == ("stagenet", True)
    # The amount is 50 USD at the locked (fixed) sandbox rate, rounded up to the coin's unit.
    expected = (Decimal(50) / SANDBOX_PRICES[coin]).quantize(Decimal(1).scaleb(-decimals), rounding="ROUND_CEILING")
    assert Decimal(body["deposit_amount"]) == expected
    uri = decode_qr(body["qr_data_uri"], tmp_path)
    assert uri.startswith(f"{scheme}:{address}?")
    params = dict(p.split("=", 1) for p in uri.split("?", 1)[1].split("&"))
    assert Decimal(params[amount_key]) == expected


def test_default_coin_is_btc_and_addresses_are_unique(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    first = vpsshop_client.post("/v1/topups", json={"amount": 25}, headers=account.headers).json()
    second = vpsshop_client.post("/v1/topups", json={"amount": 25}, headers=account.headers).json()
    assert first["coin"] == second["coin"] == "BTC"
    assert first["deposit_address"] != second["deposit_address"]
    assert first["ref"] != second["ref"] and len(first["ref"]) >= 20


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"amount": 24.99}, "amount_too_low"),
        ({"amount": 2000.01}, "amount_too_high"),
        ({"amount": 30, "coin": "DOGE"}, "invalid_coin"),
        ({"amount": 30, "coin": ""}, "invalid_coin"),
        ({"amount": 30, "coin": 7}, "invalid_coin"),
        ({"coin": "BTC"}, "invalid_amount"),
        ({"amount": "30"}, "invalid_amount"),
        ({"amount": True}, "invalid_amount"),
        ({"amount": 30.001}, "invalid_amount"),
        ({"amount": 30, "memo": "x"}, "unknown_field"),
    ],
)
def test_bad_bodies_are_400_with_a_code(vpsshop_client: TestClient, body: dict[str, Any], code: str) -> None:
    account = create_test_account(vpsshop_client)
    response = vpsshop_client.post("/v1/topups", json=body, headers=account.headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == code and response.json()["message"]


def test_bounds_are_inclusive_and_auth_required(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    for amount in (25, 2000):
        assert vpsshop_client.post("/v1/topups", json={"amount": amount}, headers=account.headers).status_code == 201
    assert vpsshop_client.post("/v1/topups", json={"amount": 30}).status_code == 401
    assert (
        vpsshop_client.post(
            "/v1/topups", content=b"[", headers={**account.headers, "Content-Type": "application/json"}
        ).json()["error"]
        == "invalid_json"
    )


def test_idempotency_key_returns_the_first_topup(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    headers = {**account.headers, "Idempotency-Key": "order-42"}
    first = vpsshop_client.post("/v1/topups", json={"amount": 40, "coin": "LTC"}, headers=headers)
    again = vpsshop_client.post("/v1/topups", json={"amount": 40, "coin": "LTC"}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.json()["ref"] == again.json()["ref"]
    assert first.json()["deposit_address"] == again.json()["deposit_address"]
    clash = vpsshop_client.post("/v1/topups", json={"amount": 41, "coin": "LTC"}, headers=headers)
    assert clash.status_code == 409 and clash.json()["error"] == "idempotency_key_reused"
    # Keys are per account: another account's same key makes its own top-up.
    other = create_test_account(vpsshop_client)
    theirs = vpsshop_client.post(
        "/v1/topups", json={"amount": 40, "coin": "LTC"}, headers={**other.headers, "Idempotency-Key": "order-42"}
    )
    assert theirs.json()["ref"] != first.json()["ref"]


def test_another_accounts_topup_is_404(vpsshop_client: TestClient) -> None:
    mine = create_test_account(vpsshop_client)
    theirs = create_test_account(vpsshop_client)
    ref = vpsshop_client.post("/v1/topups", json={"amount": 30}, headers=mine.headers).json()["ref"]
    assert vpsshop_client.get(f"/v1/topups/{ref}", headers=mine.headers).status_code == 200
    for response in (
        vpsshop_client.get(f"/v1/topups/{ref}", headers=theirs.headers),
        vpsshop_client.post(f"/v1/topups/{ref}/cancel", headers=theirs.headers),
        vpsshop_client.get("/v1/topups/tp_doesnotexist", headers=mine.headers),
    ):
        assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_cancel_and_expiry(vpsshop_client: TestClient, vpsshop_clock: Any) -> None:
    account = create_test_account(vpsshop_client)
    h = account.headers
    a = vpsshop_client.post("/v1/topups", json={"amount": 30}, headers=h).json()
    b = vpsshop_client.post("/v1/topups", json={"amount": 30}, headers=h).json()
    cancelled = vpsshop_client.post(f"/v1/topups/{a['ref']}/cancel", headers=h)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert vpsshop_client.post(f"/v1/topups/{a['ref']}/cancel", headers=h).json()["status"] == "cancelled"
    assert vpsshop_client.get(f"/v1/topups/{b['ref']}", headers=h).json()["status"] == "pending"
    vpsshop_clock.advance(minutes=59)
    assert vpsshop_client.get(f"/v1/topups/{b['ref']}", headers=h).json()["status"] == "pending"
    vpsshop_clock.advance(minutes=2)
    assert vpsshop_client.get(f"/v1/topups/{b['ref']}", headers=h).json()["status"] == "expired"
    assert vpsshop_client.get(f"/v1/topups/{a['ref']}", headers=h).json()["status"] == "cancelled"


def test_rate_is_locked_for_the_topup(vpsshop_client: TestClient) -> None:
    """Changing the price afterwards does not change an existing top-up's amount."""
    from vpsshop.payments import engine_for

    account = create_test_account(vpsshop_client)
    before = vpsshop_client.post("/v1/topups", json={"amount": 60, "coin": "BTC"}, headers=account.headers).json()
    ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
    ctx.rate_source.config.prices["BTC"] = Decimal(30000)
    engine_for(ctx).rates._quotes.clear()
    after = vpsshop_client.post("/v1/topups", json={"amount": 60, "coin": "BTC"}, headers=account.headers).json()
    assert before["deposit_amount"] == "0.00100000" and after["deposit_amount"] == "0.00200000"
    again = vpsshop_client.get(f"/v1/topups/{before['ref']}", headers=account.headers).json()
    assert again["deposit_amount"] == "0.00100000"


def test_openapi_documents_topups(vpsshop_client: TestClient) -> None:
    from openapi_spec_validator import validate

    spec = vpsshop_client.get("/v1/openapi.json").json()
    validate(spec)  # every path parameter, {ref} included, is declared
    assert {"/topups", "/topups/{ref}", "/topups/{ref}/cancel"} <= set(spec["paths"])
    post = spec["paths"]["/topups"]["post"]
    assert "402" in post["responses"] and "default" not in post.get("summary", "")
    assert "Default: BTC" in str(spec)


def test_node_down_never_breaks_reads(vpsshop_database_url: str, vpsshop_clock: Any) -> None:
    """A coin whose node does not answer: top-ups are still made and read (the chain check fails
    quietly), health says the coin is not ready, and the watcher pass goes on."""
    import socket

    import sqlalchemy as sa

    from vpsshop.app import create_app
    from vpsshop.payments import engine_for
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    settings = load_settings(
        None,
        environ={},
        overrides={
            "database_url": vpsshop_database_url,
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "topups": {"poll_min_seconds": 0},
            "coins": {
                "LTC": {
                    "xpub": "vpub5YvMuJNjRSYon44z9QmCfdf8SqJRVNvz6m55Qy5iVjZQxDfUgtiQjnc7CC1fAbED2tAGCZRERUf"
                    "vtn2DstZGU6HMns6dXXH2wujSc2wfi2x",
                    "network": "regtest",
                    "rpc_url": f"http://127.0.0.1:{closed}/",
                    "timeout_seconds": 2,
                }
            },
        },
    )
    with TestClient(create_app(settings, clock=vpsshop_clock, background=False)) as client:
        account = create_test_account(client)
        created = client.post("/v1/topups", json={"amount": 30, "coin": "LTC"}, headers=account.headers)
        assert created.status_code == 201
        read = client.get(f"/v1/topups/{created.json()['ref']}", headers=account.headers)
        assert read.status_code == 200 and read.json()["status"] == "pending"
        engine = engine_for(client.app.state.ctx)  # type: ignore[attr-defined]
        assert client.portal.call(engine.watcher.run_pass)["payments"] == 0  # type: ignore[union-attr]
        health = client.get("/v1/health").json()
        assert "did not answer" in str(health)

        # Expiry is a task of its own: with the node still down, the due top-up expires.
        ctx = client.app.state.ctx  # type: ignore[attr-defined]
        tasks = {t.name: t for batch in ctx.pm.hook.vpsshop_background_tasks(ctx=ctx) for t in batch}
        assert {"topup-watcher", "topup-expiry"} <= set(tasks)
        vpsshop_clock.advance(minutes=61)
        assert client.portal.call(tasks["topup-expiry"].run) == 1  # type: ignore[union-attr]
        with ctx.db.session() as session:  # read directly: a GET would expire it by itself
            status = session.execute(sa.text("SELECT status FROM topups WHERE ref = :r"), {"r": created.json()["ref"]})
            assert status.scalar_one() == "expired"
        assert client.portal.call(engine.watcher.run_pass)["payments"] == 0  # type: ignore[union-attr]


def test_watch_set_picks_up_out_of_order_commits(vpsshop_client: TestClient) -> None:
    """A top-up whose id is lower than one already loaded (committed later on PostgreSQL) is
    still added to the watched keys on the next refresh."""
    import sqlalchemy as sa

    from vpsshop.payments import engine_for
    from vpsshop.payments.models import Topup
    from vpsshop.payments.watcher import KeySet

    account = create_test_account(vpsshop_client)
    refs = [
        vpsshop_client.post("/v1/topups", json={"amount": 30, "coin": "LTC"}, headers=account.headers).json()
        for _ in range(3)
    ]
    engine = engine_for(vpsshop_client.app.state.ctx)  # type: ignore[attr-defined]
    with engine.ctx.db.session() as session:
        middle = session.execute(sa.select(Topup).where(Topup.ref == refs[1]["ref"])).scalar_one()
        saved = {c.name: getattr(middle, c.name) for c in Topup.__table__.columns}
        session.delete(middle)  # as if its transaction had not committed yet
    keys = KeySet(["LTC"])
    assert keys.load_new(engine) == 2 and refs[1]["deposit_address"] not in keys
    assert saved["id"] in keys.gaps
    with engine.ctx.db.session() as session:
        session.add(Topup(**saved))  # the late commit
    assert keys.load_new(engine) == 1 and refs[1]["deposit_address"] in keys and not keys.gaps


def test_payment_in_another_coin_of_the_group_is_credited_at_its_own_rate(vpsshop_client: TestClient) -> None:
    """As ETH and USDT share one scan: a coin's scan reports a payment in coin B to the address of
    a coin-A top-up. It is credited to that account, valued at B's current rate."""
    from vpsshop.coins import DetectedPayment
    from vpsshop.payments import engine_for

    account = create_test_account(vpsshop_client)
    ltc = vpsshop_client.post("/v1/topups", json={"amount": 80, "coin": "LTC"}, headers=account.headers).json()
    engine = engine_for(vpsshop_client.app.state.ctx)  # type: ignore[attr-defined]
    from sqlmodel import select

    from vpsshop.payments.models import Topup

    with engine.ctx.db.session() as session:
        topup = session.exec(select(Topup).where(Topup.ref == ltc["ref"])).one()
    payment = DetectedPayment("ab" * 32 + ":0", topup.watch_key, 10_000, "ab" * 32, 6, 100, "00" * 32)
    ids = engine.record_payments([("BTC", payment)], {}, {topup.watch_key: topup.id})
    assert len(ids) == 1
    btc = engine.ctx.coins["BTC"]
    assert vpsshop_client.portal.call(engine.credit_confirmed, btc) == 1  # type: ignore[union-attr]
    read = vpsshop_client.get(f"/v1/topups/{ltc['ref']}", headers=account.headers).json()
    assert (read["status"], read["credited_usd"]) == ("completed", 6)  # 10,000 sat at 60,000 USD/BTC
    assert read["amount_received"] == "0.00000000"  # no LTC arrived
    assert vpsshop_client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 6
