"""Accounts and API keys, as the seed describes them."""

from __future__ import annotations

from datetime import datetime

from vpsshop.testing import create_test_account


def test_create_account_returns_credentials_once(vpsshop_client):
    response = vpsshop_client.post("/v1/account")
    assert response.status_code == 201
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["api_key"].startswith("vpsk_") and len(body["api_key"]) == 48
    assert body["login_token"].startswith("vpsl_")
    assert isinstance(body["user_id"], int)
    ctx = vpsshop_client.app.state.ctx
    from sqlmodel import select

    from vpsshop.models import Account, ApiKey

    with ctx.db.session() as session:
        key = session.exec(select(ApiKey)).one()
        account = session.exec(select(Account)).one()
    # Stored only as hashes: neither value appears in the database.
    assert body["api_key"] not in (key.key_hash, key.prefix)
    assert body["api_key"].startswith(key.prefix)
    assert account.login_hash.startswith("b2$") and len(account.login_hash) == 3 + 64
    assert body["login_token"] not in account.login_hash


def test_a_login_token_stored_with_argon2_still_signs_in_and_is_re_stored(vpsshop_client, vpsshop_account):
    """Tokens of accounts made before the keyed digest keep working; the first sign-in re-stores them."""
    from argon2 import PasswordHasher
    from sqlmodel import select

    from vpsshop.models import Account

    ctx = vpsshop_client.app.state.ctx
    with ctx.db.session() as session:
        account = session.exec(select(Account).where(Account.id == vpsshop_account.user_id)).one()
        account.login_hash = PasswordHasher().hash(vpsshop_account.login_token)
        session.add(account)
    wrong = vpsshop_account.login_token[:-4] + "AAAA"
    assert vpsshop_client.post("/v1/login", json={"login_token": wrong}).status_code == 401
    with ctx.db.session() as session:
        assert session.get(Account, vpsshop_account.user_id).login_hash.startswith("$argon2id$")
    assert vpsshop_client.post("/v1/login", json={"login_token": vpsshop_account.login_token}).status_code == 201
    with ctx.db.session() as session:
        assert session.get(Account, vpsshop_account.user_id).login_hash.startswith("b2$")
    assert vpsshop_client.post("/v1/login", json={"login_token": vpsshop_account.login_token}).status_code == 201


def test_get_account_fields_and_types(vpsshop_client, vpsshop_account):
    response = vpsshop_client.get("/v1/account", headers=vpsshop_account.headers)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"user_id", "balance_usd", "currency", "servers", "totp_enabled", "created_at"}
    assert body["user_id"] == vpsshop_account.user_id
    assert body["balance_usd"] == 0 and isinstance(body["balance_usd"], (int, float))
    assert body["currency"] == "USD"
    assert body["servers"] == 0
    assert body["totp_enabled"] is False
    assert datetime.fromisoformat(body["created_at"]).tzinfo is not None


def test_balance_reflects_ledger_credits(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("25.50")
    vpsshop_account.credit("0.000001")
    body = vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()
    assert body["balance_usd"] == 25.500001


def test_missing_and_bad_keys_are_401(vpsshop_client, vpsshop_account):
    for headers in (
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer vpsk_" + "A" * 43},
        {"Authorization": "Basic " + vpsshop_account.api_key},
        {"Authorization": "Bearer " + vpsshop_account.login_token},
        {"Authorization": vpsshop_account.api_key},
    ):
        response = vpsshop_client.get("/v1/account", headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["error"] == "unauthorized"
        assert response.json()["message"]


def test_keys_list_mint_revoke(vpsshop_client, vpsshop_account):
    h = vpsshop_account.headers
    listed = vpsshop_client.get("/v1/keys", headers=h).json()["keys"]
    assert [k["id"] for k in listed] == [vpsshop_account.key_id]
    assert set(listed[0]) == {"id", "prefix", "name", "created_at", "revoked_at"}
    assert listed[0]["revoked_at"] is None
    assert vpsshop_account.api_key.startswith(listed[0]["prefix"])

    minted = vpsshop_client.post("/v1/keys", headers=h, json={"name": "ci"})
    assert minted.status_code == 201 and minted.headers["cache-control"] == "no-store"
    new = minted.json()
    assert new["api_key"].startswith("vpsk_") and new["name"] == "ci"
    new_headers = {"Authorization": f"Bearer {new['api_key']}"}
    assert vpsshop_client.get("/v1/account", headers=new_headers).status_code == 200

    no_body = vpsshop_client.post("/v1/keys", headers=h)
    assert no_body.status_code == 201 and no_body.json()["name"] is None

    listed = vpsshop_client.get("/v1/keys", headers=h).json()["keys"]
    assert len(listed) == 3 and all("api_key" not in k for k in listed)

    revoked = vpsshop_client.delete(f"/v1/keys/{new['id']}", headers=h)
    assert revoked.status_code == 200 and revoked.json()["revoked"] is True
    # Refused at once, and gone from the listing.
    assert vpsshop_client.get("/v1/account", headers=new_headers).status_code == 401
    assert new["id"] not in [k["id"] for k in vpsshop_client.get("/v1/keys", headers=h).json()["keys"]]
    again = vpsshop_client.delete(f"/v1/keys/{new['id']}", headers=h)
    assert again.status_code == 404 and again.json()["error"] == "not_found"


def test_other_accounts_key_is_404(vpsshop_client, vpsshop_account):
    other = create_test_account(vpsshop_client)
    response = vpsshop_client.delete(f"/v1/keys/{other.key_id}", headers=vpsshop_account.headers)
    assert response.status_code == 404
    assert vpsshop_client.get("/v1/account", headers=other.headers).status_code == 200
    assert vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).json()["user_id"] != other.user_id


def test_key_name_validation(vpsshop_client, vpsshop_account):
    response = vpsshop_client.post("/v1/keys", headers=vpsshop_account.headers, json={"name": "x" * 65})
    assert response.status_code == 400 and response.json()["error"] == "invalid_name"
    response = vpsshop_client.post("/v1/keys", headers=vpsshop_account.headers, json={"nmae": "typo"})
    assert response.status_code == 400 and response.json()["error"] == "unknown_field"


def test_login_token_mints_a_key_and_recovers_access(vpsshop_client, vpsshop_account):
    h = vpsshop_account.headers
    assert vpsshop_client.delete(f"/v1/keys/{vpsshop_account.key_id}", headers=h).status_code == 200
    assert vpsshop_client.get("/v1/account", headers=h).status_code == 401
    response = vpsshop_client.post("/v1/login", json={"login_token": vpsshop_account.login_token})
    assert response.status_code == 201
    key = response.json()["api_key"]
    me = vpsshop_client.get("/v1/account", headers={"Authorization": f"Bearer {key}"}).json()
    assert me["user_id"] == vpsshop_account.user_id
    bad = vpsshop_client.post("/v1/login", json={"login_token": vpsshop_account.login_token[:-1] + "x"})
    assert bad.status_code == 401 and bad.json()["error"] == "unauthorized"
