"""Ordering, credentials, idempotency and validation of POST /v1/servers (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlmodel import select

from vpsshop import ledger
from vpsshop.models import LedgerEntry, Server
from vpsshop.servers.models import ServerJob
from vpsshop.testing import create_test_account

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def _balance(client, account) -> float:
    return client.get("/v1/account", headers=account.headers).json()["balance_usd"]


def test_order_charges_catalog_price_and_returns_password_once(vpsshop_client, vpsshop_account, vpsshop_clock):
    vpsshop_account.credit("10")
    response = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json={**ORDER, "hostname": "Web-1"})
    assert response.status_code == 201, response.text
    body = response.json()
    server = body["server"]
    assert server["price_usd"] == 3.99  # pup base 399 cents x nl 1.00
    assert server["status"] == "provisioning" and server["ip"] is None and server["username"] == "root"
    assert server["cycle"] == "monthly" and server["hostname"] == "web-1"
    created = datetime.fromisoformat(server["created_at"])
    assert created == vpsshop_clock.now()
    expires = datetime.fromisoformat(server["expires_at"])
    assert timedelta(days=28) <= expires - created <= timedelta(days=31)
    password = body["root_password"]
    assert len(password) == 20 and password.isalnum()
    assert _balance(vpsshop_client, vpsshop_account) == 6.01
    me = vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()
    assert me["servers"] == 1

    shown = vpsshop_client.get(f"/v1/servers/{server['id']}", headers=vpsshop_account.headers).json()
    assert shown == server
    assert "root_password" not in shown
    listed = vpsshop_client.get("/v1/servers", headers=vpsshop_account.headers).json()["servers"]
    assert listed == [server]

    creds = vpsshop_client.get(f"/v1/servers/{server['id']}/credentials", headers=vpsshop_account.headers)
    assert creds.status_code == 200
    assert creds.headers["cache-control"] == "no-store"
    assert creds.json()["username"] == "root" and creds.json()["password"] == password

    ctx = vpsshop_client.app.state.ctx
    with ctx.db.session() as session:
        row = session.get(Server, server["id"])
        entries = session.exec(select(LedgerEntry).where(LedgerEntry.reason == "order")).all()
        jobs = session.exec(select(ServerJob)).all()
        assert ledger.balance_from_entries(session, vpsshop_account.user_id) == 6_010_000
    # Encrypted at rest: neither the password nor the key is in the row.
    assert password not in (row.root_password_enc or "") and row.root_password_enc.startswith("gAAAA")
    assert ctx.settings.encryption_key.get_secret_value() not in row.root_password_enc
    assert [(e.amount_micros, e.ref) for e in entries] == [(-3_990_000, f"server:{server['id']}")]
    assert [(j.kind, j.status) for j in jobs] == [("provision", "queued")]


def test_annual_price_and_customer_password(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("100")
    response = vpsshop_client.post(
        "/v1/servers",
        headers=vpsshop_account.headers,
        json={
            "plan": "terrier",
            "location": "ro",
            "os": "ubuntu-24.04",
            "cycle": "annual",
            "root_password": "correct horse 1",
        },
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["root_password"] is None
    assert body["server"]["price_usd"] == 58.40  # 649 x 0.90 = 584.1 -> 584 cents monthly; x 10
    creds = vpsshop_client.get(
        f"/v1/servers/{body['server']['id']}/credentials", headers=vpsshop_account.headers
    ).json()
    assert creds["password"] == "correct horse 1"


@pytest.mark.parametrize(
    "change, code",
    [
        ({"plan": "poodle"}, "invalid_plan"),
        ({"location": "xx"}, "invalid_location"),
        ({"os": "windows-11"}, "invalid_os"),
        ({"cycle": "weekly"}, "invalid_cycle"),
        ({"hostname": "-bad"}, "invalid_hostname"),
        ({"hostname": "a.b"}, "invalid_hostname"),
        ({"hostname": "x" * 64}, "invalid_hostname"),
        ({"root_password": "short"}, "invalid_root_password"),
        ({"root_password": "tab\tinside-it"}, "invalid_root_password"),
        ({"plan": None}, "invalid_plan"),
        ({"colour": "red"}, "unknown_field"),
    ],
)
def test_each_bad_field_has_its_code(vpsshop_client, vpsshop_account, change, code):
    vpsshop_account.credit("50")
    response = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json={**ORDER, **change})
    assert response.status_code == 400, response.text
    assert response.json()["error"] == code and response.json()["message"]
    assert _balance(vpsshop_client, vpsshop_account) == 50


def test_insufficient_balance_is_402_with_deficit(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("1.50")
    response = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER)
    assert response.status_code == 402
    body = response.json()
    assert body["error"] == "insufficient_balance"
    assert (body["price"], body["balance"], body["deficit"]) == (3.99, 1.5, 2.49)
    assert vpsshop_client.get("/v1/servers", headers=vpsshop_account.headers).json()["servers"] == []
    assert _balance(vpsshop_client, vpsshop_account) == 1.5


def test_idempotency_key_returns_the_first_server(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("20")
    h = {**vpsshop_account.headers, "Idempotency-Key": "order-7f3a"}
    first = vpsshop_client.post("/v1/servers", headers=h, json=ORDER)
    again = vpsshop_client.post("/v1/servers", headers=h, json=ORDER)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert _balance(vpsshop_client, vpsshop_account) == 16.01
    other_body = vpsshop_client.post("/v1/servers", headers=h, json={**ORDER, "location": "fr"})
    assert other_body.status_code == 409 and other_body.json()["error"] == "idempotency_key_reused"
    # The key is per account: another account may use the same key for its own order.
    other = create_test_account(vpsshop_client)
    other.credit("5")
    theirs = vpsshop_client.post("/v1/servers", headers={**other.headers, "Idempotency-Key": "order-7f3a"}, json=ORDER)
    assert theirs.status_code == 201 and theirs.json()["server"]["id"] != first.json()["server"]["id"]
    bad = vpsshop_client.post(
        "/v1/servers", headers={**vpsshop_account.headers, "Idempotency-Key": "x" * 201}, json=ORDER
    )
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_idempotency_key"


def test_another_accounts_server_is_404(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("10")
    server_id = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER).json()["server"]["id"]
    other = create_test_account(vpsshop_client)
    for path in (f"/v1/servers/{server_id}", f"/v1/servers/{server_id}/credentials"):
        response = vpsshop_client.get(path, headers=other.headers)
        assert response.status_code == 404 and response.json()["error"] == "not_found"
    for action in ("renew", "start", "stop", "reboot"):
        assert vpsshop_client.post(f"/v1/servers/{server_id}/{action}", headers=other.headers).status_code == 404
    assert vpsshop_client.get("/v1/servers", headers=other.headers).json()["servers"] == []
    assert vpsshop_client.get("/v1/servers/999999", headers=vpsshop_account.headers).status_code == 404
    assert vpsshop_client.get("/v1/servers", headers={}).status_code == 401


def test_openapi_documents_the_server_endpoints(vpsshop_client):
    doc = vpsshop_client.get("/v1/openapi.json").json()
    paths = doc["paths"]
    for path in (
        "/servers",
        "/servers/{id}",
        "/servers/{id}/credentials",
        "/servers/{id}/renew",
        "/servers/{id}/start",
        "/servers/{id}/stop",
        "/servers/{id}/reboot",
    ):
        assert path in paths, path
    assert paths["/servers/{id}"]["delete"]["operationId"] == "terminateServer"
    assert "Idempotency-Key" in paths["/servers"]["post"]["description"]
    assert "monthly" in paths["/servers"]["post"]["description"]
    assert "InsufficientBalanceBody" in str(paths["/servers"]["post"]["responses"]["402"])
    assert "InsufficientBalanceBody" in str(paths["/servers/{id}/renew"]["post"]["responses"]["402"])
    from openapi_spec_validator import validate

    validate(doc)


def test_migrations_create_the_servers_tables_as_modelled(vpsshop_client):
    """Migration 0003 gives SQLite and PostgreSQL exactly the tables the models describe."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    import vpsshop.servers.models  # noqa: F401

    ours = {"servers", "server_jobs", "server_events", "ip_leases"}

    def table_of(diff) -> str | None:
        item = diff[0] if isinstance(diff, list) else diff
        for part in item[1:]:
            name = getattr(part, "name", None) if not isinstance(part, str) else part
            table = getattr(part, "table", None)
            if table is not None:
                return table.name
            if name in ours:
                return name
        return None

    with vpsshop_client.app.state.ctx.db.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), SQLModel.metadata)
    assert [d for d in diffs if table_of(d) in ours] == []
    with vpsshop_client.app.state.ctx.db.engine.connect() as conn:
        import sqlalchemy as sa

        assert ours <= set(sa.inspect(conn).get_table_names())
