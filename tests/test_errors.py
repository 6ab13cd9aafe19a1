"""Every failure is the seed's error body with a clear code, never a 500."""

from __future__ import annotations


def _is_error_body(response, status, code):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code
    assert isinstance(body["message"], str) and body["message"]
    return body


def test_unknown_route(vpsshop_client):
    _is_error_body(vpsshop_client.get("/v1/nope"), 404, "not_found")
    _is_error_body(vpsshop_client.get("/"), 404, "not_found")
    _is_error_body(vpsshop_client.get("/v1/keys/abc"), 404, "not_found")


def test_wrong_method_keeps_allow_header(vpsshop_client):
    response = vpsshop_client.put("/v1/account")
    _is_error_body(response, 405, "method_not_allowed")
    assert set(response.headers["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


def test_bad_json_and_wrong_shapes(vpsshop_client, vpsshop_account):
    h = {**vpsshop_account.headers, "Content-Type": "application/json"}
    _is_error_body(vpsshop_client.post("/v1/keys", headers=h, content=b"{not json"), 400, "invalid_json")
    _is_error_body(vpsshop_client.post("/v1/keys", headers=h, content=b"\xff\xfe"), 400, "invalid_json")
    _is_error_body(vpsshop_client.post("/v1/keys", headers=h, content=b"[1,2]"), 400, "invalid_request")
    _is_error_body(vpsshop_client.post("/v1/keys", headers=h, json={"name": 5}), 400, "invalid_name")
    _is_error_body(vpsshop_client.post("/v1/login", json={}), 400, "invalid_login_token")
    _is_error_body(vpsshop_client.post("/v1/login"), 400, "invalid_request")


def test_oversized_body_by_length_and_by_stream(vpsshop_client, vpsshop_account):
    limit = vpsshop_client.app.state.ctx.settings.server.max_body_bytes
    big = b'{"name": "' + b"x" * limit + b'"}'
    _is_error_body(vpsshop_client.post("/v1/keys", headers=vpsshop_account.headers, content=big), 413, "body_too_large")

    def chunks():
        for _ in range(limit // 1000 + 2):
            yield b" " * 1000

    _is_error_body(
        vpsshop_client.post("/v1/keys", headers=vpsshop_account.headers, content=chunks()), 413, "body_too_large"
    )


def test_huge_path_id_is_404_not_500(vpsshop_client, vpsshop_account):
    for value in ("9" * 19, "99999999999999999999999999", "-1", "1.5"):
        _is_error_body(vpsshop_client.delete(f"/v1/keys/{value}", headers=vpsshop_account.headers), 404, "not_found")


def test_insufficient_balance_body_carries_numbers(vpsshop_client, vpsshop_account):
    from vpsshop import ledger

    ctx = vpsshop_client.app.state.ctx
    vpsshop_account.credit("3.50")
    try:
        with ctx.db.session() as session:
            ledger.post(session, vpsshop_account.user_id, -5_000_000, "order")
    except ledger.InsufficientBalance as exc:
        body = exc.body()
    else:
        raise AssertionError("a debit above the balance must fail")
    assert body["error"] == "insufficient_balance"
    assert (body["price"], body["balance"], body["deficit"]) == (5, 3.5, 1.5) or (
        str(body["price"]),
        str(body["balance"]),
        str(body["deficit"]),
    ) == ("5.00", "3.50", "1.50")


def test_a_database_outage_is_told_apart_from_a_bug():
    """A database that does not answer becomes a 503 (and one log line); an SQL error stays a 500."""
    import sqlite3

    import psycopg
    import sqlalchemy as sa

    from vpsshop.db import unavailable

    locked = sa.exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked"))
    assert unavailable(locked) == "OperationalError: database is locked"
    refused = sa.exc.OperationalError("SELECT 1", {}, psycopg.OperationalError("connection failed: refused"))
    assert unavailable(refused) and unavailable(psycopg.OperationalError("connection failed"))
    assert unavailable(sa.exc.OperationalError("SELECT x", {}, sqlite3.OperationalError("no such column: x"))) is None
    assert unavailable(sa.exc.IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE"))) is None
    assert unavailable(ValueError("not a database error")) is None
