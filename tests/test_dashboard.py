"""The dashboard over HTTP, on SQLite and PostgreSQL: sessions, CSRF, headers, two-factor, limits,
and that each page does what the API does (the browser tests, test_dashboard_browser.py, drive
the real `vpsshop serve` in Chromium)."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from vpsshop import twofactor
from vpsshop.testing import create_test_account

D = "/dashboard"


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "the page has no form with a CSRF token"
    return match.group(1)


def post_form(client, path: str, data: dict | None = None, page: str | None = None, **kwargs):
    """POST a form the way its page does: with the CSRF token read from ``page`` (default: ``path``)."""
    html = client.get(page or path).text
    return client.post(path, data={"csrf": csrf_of(html), **(data or {})}, follow_redirects=False, **kwargs)


def sign_in(client, token: str):
    return post_form(client, f"{D}/signin", {"login_token": token})


@pytest.fixture
def signed_in(vpsshop_client, vpsshop_account):
    response = sign_in(vpsshop_client, vpsshop_account.login_token)
    assert response.status_code == 303 and response.headers["location"] == f"{D}/"
    return vpsshop_account


def _secret_of(html: str) -> str:
    match = re.search(r'id="totp-secret" class="secret-value">([A-Z2-7]+)<', html)
    assert match
    return match.group(1)


def _code(secret: str, clock) -> str:
    return twofactor.current_code(secret, clock.now().timestamp())


def _enable_totp(client, clock) -> tuple[str, list[str]]:
    assert post_form(client, f"{D}/security/totp/start", page=f"{D}/security").status_code == 303
    secret = _secret_of(client.get(f"{D}/security/totp").text)
    done = post_form(client, f"{D}/security/totp/confirm", {"code": _code(secret, clock)}, page=f"{D}/security/totp")
    assert done.status_code == 200, done.text
    codes = re.search(r'<pre class="codes" id="recovery-codes">(.*?)</pre>', done.text, re.S).group(1).split()
    assert len(codes) == 10
    clock.advance(seconds=30)  # the next code is a new one: a code works once
    return secret, codes


# ---- where things are --------------------------------------------------------------------------


def test_pages_need_a_session_and_root_leads_browsers_there(vpsshop_client):
    response = vpsshop_client.get(f"{D}/", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == f"{D}/signin"
    browser = vpsshop_client.get("/", headers={"Accept": "text/html,*/*"}, follow_redirects=False)
    assert browser.status_code == 303 and browser.headers["location"] == f"{D}/"
    api = vpsshop_client.get("/nope")
    assert api.status_code == 404 and api.json()["error"] == "not_found"
    assert f"{D}/" in api.json()["message"] and "/v1/openapi.json" in api.json()["message"]
    unknown = vpsshop_client.get("/v1/nope").json()["message"]
    assert "/v1/openapi.json" in unknown and "dashboard" not in unknown
    page = vpsshop_client.get(f"{D}/nope")
    assert page.status_code == 404 and "text/html" in page.headers["content-type"]
    assert "There is no page at /dashboard/nope" in page.text


def test_dashboard_can_be_turned_off(vpsshop_settings):
    from starlette.testclient import TestClient

    from vpsshop import create_app

    settings = vpsshop_settings.model_copy(
        update={"dashboard": vpsshop_settings.dashboard.model_copy(update={"enabled": False})}
    )
    with TestClient(create_app(settings, background=False)) as client:
        assert client.get(f"{D}/signin").status_code == 404
        assert "dashboard" not in client.get("/nope").json()["message"]


def test_pages_carry_security_headers_and_the_cookie_is_httponly(vpsshop_client, vpsshop_account):
    page = vpsshop_client.get(f"{D}/signin")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["cache-control"] == "no-store"
    assert "<script>" not in page.text and " style=" not in page.text  # nothing inline for the CSP to block
    response = sign_in(vpsshop_client, vpsshop_account.login_token)
    cookie = next(v for k, v in response.headers.multi_items() if k == "set-cookie" and "vpsshop_session=" in v)
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain-http sandbox
    js = vpsshop_client.get(f"{D}/static/dashboard.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")


def test_behind_tls_the_cookie_is_secure_and_host_prefixed(vpsshop_settings):
    from starlette.testclient import TestClient

    from vpsshop import create_app

    settings = vpsshop_settings.model_copy(update={"public_url": "https://shop.example/v1"})
    with TestClient(create_app(settings, background=False), base_url="https://shop.example") as client:
        account = create_test_account(client)
        response = sign_in(client, account.login_token)
        cookie = next(v for k, v in response.headers.multi_items() if k == "set-cookie" and "session" in v)
        assert cookie.startswith("__Host-vpsshop_session=") and "Secure" in cookie
        assert response.headers["strict-transport-security"].startswith("max-age=")
        assert client.get(f"{D}/").status_code == 200


# ---- signing in and out ----------------------------------------------------------------------------


def test_sign_in_shows_the_account_and_sign_out_ends_the_session_at_once(vpsshop_client, signed_in):
    signed_in.credit("12.50", "support credit")
    overview = vpsshop_client.get(f"{D}/")
    assert overview.status_code == 200 and "$12.50" in overview.text and "Credit from support" in overview.text
    cookie = vpsshop_client.cookies.get("vpsshop_session")
    assert post_form(vpsshop_client, f"{D}/signout", page=f"{D}/").headers["location"].endswith("notice=signed-out")
    vpsshop_client.cookies.set("vpsshop_session", cookie)  # the signed-out cookie, sent again
    again = vpsshop_client.get(f"{D}/", follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"].startswith(f"{D}/signin")


def test_an_api_key_does_not_sign_in_and_the_login_token_is_no_bearer_key(vpsshop_client, vpsshop_account):
    refused = sign_in(vpsshop_client, vpsshop_account.api_key)
    assert refused.status_code == 401 and "not valid" in refused.text
    assert (
        vpsshop_client.get(
            "/v1/account", headers={"Authorization": f"Bearer {vpsshop_account.login_token}"}
        ).status_code
        == 401
    )


def test_sessions_expire_when_idle_and_can_be_revoked_from_another_browser(
    vpsshop_client, vpsshop_app, vpsshop_account, vpsshop_clock
):
    from starlette.testclient import TestClient

    assert sign_in(vpsshop_client, vpsshop_account.login_token).status_code == 303
    other = TestClient(vpsshop_app)
    assert sign_in(other, vpsshop_account.login_token).status_code == 303
    security = vpsshop_client.get(f"{D}/security").text
    assert security.count("Another browser") == 1
    assert post_form(vpsshop_client, f"{D}/security/sessions/end-others", page=f"{D}/security").status_code == 303
    assert other.get(f"{D}/", follow_redirects=False).status_code == 303  # revoked at once
    assert vpsshop_client.get(f"{D}/").status_code == 200
    vpsshop_clock.advance(minutes=61)  # [dashboard] session_idle_minutes = 60
    assert vpsshop_client.get(f"{D}/", follow_redirects=False).status_code == 303


def test_a_form_without_its_csrf_token_is_refused(vpsshop_client, signed_in):
    before = vpsshop_client.get("/v1/keys", headers=signed_in.headers).json()["keys"]
    for data in ({"name": "x"}, {"name": "x", "csrf": "forged"}):
        refused = vpsshop_client.post(f"{D}/keys", data=data, follow_redirects=False)
        assert refused.status_code == 403 and "nothing was done" in refused.text
    token = csrf_of(vpsshop_client.get(f"{D}/keys").text)
    cross = vpsshop_client.post(f"{D}/keys", data={"csrf": token}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403
    assert vpsshop_client.get("/v1/keys", headers=signed_in.headers).json()["keys"] == before
    # before sign-in too: the sign-in form needs the token of its own page (no login CSRF)
    vpsshop_client.cookies.clear()
    assert vpsshop_client.post(f"{D}/signin", data={"login_token": signed_in.login_token}).status_code == 403


def test_failed_sign_ins_are_limited_per_client_on_the_dashboard_and_the_api(vpsshop_settings, vpsshop_clock):
    from starlette.testclient import TestClient

    from vpsshop import create_app

    settings = vpsshop_settings.model_copy(
        update={
            "signin": vpsshop_settings.signin.model_copy(
                update={"failures_per_client": 3, "client_window_seconds": 600}
            )
        }
    )
    with TestClient(create_app(settings, clock=vpsshop_clock, background=False)) as client:
        account = create_test_account(client)
        for _ in range(2):
            assert sign_in(client, "vpsl_wrongwrongwr.nope").status_code == 401
        api = client.post("/v1/login", json={"login_token": "vpsl_wrongwrongwr.nope"})
        assert api.status_code == 401  # the third failure, through the API: one shared count
        limited = sign_in(client, account.login_token)  # even the right token waits now
        assert limited.status_code == 429 and "Too many failed sign-ins" in limited.text
        assert int(limited.headers["retry-after"]) > 0
        api = client.post("/v1/login", json={"login_token": account.login_token})
        assert api.status_code == 429 and api.json()["error"] == "rate_limited" and api.headers["retry-after"]
        # a sliding window: after the wait Retry-After names, the right token gets in again
        vpsshop_clock.advance(seconds=int(api.headers["retry-after"]))
        assert sign_in(client, account.login_token).status_code == 303


# ---- two-factor ----------------------------------------------------------------------------------------


def test_totp_signs_in_with_a_code_once_and_login_needs_it(vpsshop_client, signed_in, vpsshop_clock, vpsshop_app):
    client, clock = vpsshop_client, vpsshop_clock
    assert vpsshop_client.get("/v1/account", headers=signed_in.headers).json()["totp_enabled"] is False
    secret, codes = _enable_totp(client, clock)
    assert vpsshop_client.get("/v1/account", headers=signed_in.headers).json()["totp_enabled"] is True
    assert client.get(f"{D}/").status_code == 200  # this browser stays signed in
    # at rest: the secret only encrypted, the recovery codes only as digests
    with vpsshop_app.state.ctx.db.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT totp_secret_enc FROM accounts")).scalar()
        hashes = [r[0] for r in conn.execute(sa.text("SELECT code_hash FROM recovery_codes"))]
    assert secret not in stored and len(hashes) == 10
    assert not any(c.replace("-", "") in h for c in codes for h in hashes)

    post_form(client, f"{D}/signout", page=f"{D}/")
    step = sign_in(client, signed_in.login_token)
    assert step.headers["location"] == f"{D}/signin/code"
    assert client.get(f"{D}/", follow_redirects=False).status_code == 303  # the token alone opens nothing
    wrong = post_form(client, f"{D}/signin/code", {"code": "000000"})
    assert wrong.status_code == 401 and "not right" in wrong.text
    code = _code(secret, clock)
    assert post_form(client, f"{D}/signin/code", {"code": code}).headers["location"] == f"{D}/"
    assert client.get(f"{D}/").status_code == 200

    # the API's sign-in asks for the code too; the same code is not taken twice
    login = client.post("/v1/login", json={"login_token": signed_in.login_token})
    assert login.status_code == 401 and login.json()["error"] == "totp_required"
    reused = client.post("/v1/login", json={"login_token": signed_in.login_token, "totp_code": code})
    assert reused.status_code == 401 and reused.json()["error"] == "invalid_totp_code"
    clock.advance(seconds=30)
    assert (
        client.post(
            "/v1/login", json={"login_token": signed_in.login_token, "totp_code": _code(secret, clock)}
        ).status_code
        == 201
    )
    # Bearer keys keep working: two-factor guards sign-in, not keys already made
    assert client.get("/v1/account", headers=signed_in.headers).status_code == 200

    # a recovery code works once, in place of the app
    post_form(client, f"{D}/signout", page=f"{D}/")
    sign_in(client, signed_in.login_token)
    assert post_form(client, f"{D}/signin/code", {"code": codes[0].upper()}).status_code == 303
    post_form(client, f"{D}/signout", page=f"{D}/")
    sign_in(client, signed_in.login_token)
    assert post_form(client, f"{D}/signin/code", {"code": codes[0]}).status_code == 401

    # turning it off needs a code
    sign_in(client, signed_in.login_token)
    clock.advance(seconds=30)
    post_form(client, f"{D}/signin/code", {"code": _code(secret, clock)})
    assert post_form(client, f"{D}/security/totp/disable", {"code": "123456"}, page=f"{D}/security").status_code == 401
    assert post_form(client, f"{D}/security/totp/disable", {"code": codes[1]}, page=f"{D}/security").status_code == 303
    assert vpsshop_client.get("/v1/account", headers=signed_in.headers).json()["totp_enabled"] is False


def test_wrong_codes_are_limited_per_account(vpsshop_client, signed_in, vpsshop_clock):
    secret, _ = _enable_totp(vpsshop_client, vpsshop_clock)
    for _ in range(5):  # [signin] totp_failures_per_account = 5
        response = vpsshop_client.post("/v1/login", json={"login_token": signed_in.login_token, "totp_code": "000000"})
        assert response.json()["error"] == "invalid_totp_code"
    right = vpsshop_client.post(
        "/v1/login", json={"login_token": signed_in.login_token, "totp_code": _code(secret, vpsshop_clock)}
    )
    assert right.status_code == 429 and right.json()["error"] == "rate_limited"
    vpsshop_clock.advance(seconds=int(right.headers["Retry-After"]))  # a sliding window: the wait it names
    assert (
        vpsshop_client.post(
            "/v1/login", json={"login_token": signed_in.login_token, "totp_code": _code(secret, vpsshop_clock)}
        ).status_code
        == 201
    )


def test_credentials_need_a_fresh_code_when_totp_is_on(vpsshop_client, signed_in, vpsshop_clock):
    signed_in.credit(10)
    form = {"plan": "pup", "location": "nl", "os": "debian-12", "root_password": "correct horse battery"}
    ordered = post_form(vpsshop_client, f"{D}/servers", form, page=f"{D}/servers/new")
    server = ordered.headers["location"].split("?")[0]
    shown = post_form(vpsshop_client, f"{server}/credentials", page=server)
    assert shown.status_code == 200 and "correct horse battery" in shown.text
    assert shown.headers["cache-control"] == "no-store"
    secret, _ = _enable_totp(vpsshop_client, vpsshop_clock)
    asked = post_form(vpsshop_client, f"{server}/credentials", {"code": "111111"}, page=server)
    assert asked.status_code == 401 and "correct horse battery" not in asked.text
    shown = post_form(vpsshop_client, f"{server}/credentials", {"code": _code(secret, vpsshop_clock)}, page=server)
    assert shown.status_code == 200 and "correct horse battery" in shown.text


# ---- the same services as the API ----------------------------------------------------------------


def test_keys_are_minted_once_and_revoked_like_the_api(vpsshop_client, signed_in):
    made = post_form(vpsshop_client, f"{D}/keys", {"name": "backup script"})
    assert made.status_code == 201 and "shown this once" in made.text
    key = re.search(r'id="new-key" class="secret-value">(vpsk_[^<]+)<', made.text).group(1)
    headers = {"Authorization": f"Bearer {key}"}
    assert vpsshop_client.get("/v1/account", headers=headers).json()["user_id"] == signed_in.user_id
    listed = {k["name"]: k for k in vpsshop_client.get("/v1/keys", headers=headers).json()["keys"]}
    assert key not in vpsshop_client.get(f"{D}/keys").text  # only the prefix from now on
    revoked = post_form(vpsshop_client, f"{D}/keys/{listed['backup script']['id']}/revoke", page=f"{D}/keys")
    assert revoked.headers["location"].endswith("notice=key-revoked")
    assert vpsshop_client.get("/v1/account", headers=headers).status_code == 401
    other = create_test_account(vpsshop_client)
    foreign = post_form(vpsshop_client, f"{D}/keys/{other.key_id}/revoke", page=f"{D}/keys")
    assert foreign.status_code == 404  # another account's key is not yours to revoke
    assert vpsshop_client.get("/v1/account", headers=other.headers).status_code == 200


def test_the_keys_page_shows_the_wallets_and_removes_them_like_the_api(vpsshop_client, signed_in):
    from eth_account import Account
    from test_x402_signup import challenge_of, signed

    wallet = Account.create()
    challenge = challenge_of(vpsshop_client.post("/v1/account/wallets", headers=signed_in.headers))
    linked = vpsshop_client.post(
        "/v1/account/wallets", headers={**signed_in.headers, "SIGN-IN-WITH-X": signed(wallet, challenge)}
    )
    assert linked.status_code == 201, linked.text
    page = vpsshop_client.get(f"{D}/keys").text
    assert wallet.address.lower() in page
    other = create_test_account(vpsshop_client)
    other_wallet = vpsshop_client.post(
        "/v1/account/wallets",
        headers={
            **other.headers,
            "SIGN-IN-WITH-X": signed(
                Account.create(), challenge_of(vpsshop_client.post("/v1/account/wallets", headers=other.headers))
            ),
        },
    ).json()
    foreign = post_form(vpsshop_client, f"{D}/wallets/{other_wallet['id']}/remove", page=f"{D}/keys")
    assert foreign.status_code == 404  # another account's wallet is not yours to remove
    removed = post_form(vpsshop_client, f"{D}/wallets/{linked.json()['id']}/remove", page=f"{D}/keys")
    assert removed.headers["location"].endswith("notice=wallet-removed")
    assert vpsshop_client.get("/v1/account/wallets", headers=signed_in.headers).json() == {"wallets": []}
    assert wallet.address.lower() not in vpsshop_client.get(f"{D}/keys").text
    assert len(vpsshop_client.get("/v1/account/wallets", headers=other.headers).json()["wallets"]) == 1


def test_wallet_sign_in_asks_for_the_second_factor_like_the_login_token(vpsshop_client, signed_in, vpsshop_clock):
    from eth_account import Account
    from test_x402_signup import challenge_of, signed

    wallet = Account.create()
    challenge = challenge_of(vpsshop_client.post("/v1/account/wallets", headers=signed_in.headers))
    linked = vpsshop_client.post(
        "/v1/account/wallets", headers={**signed_in.headers, "SIGN-IN-WITH-X": signed(wallet, challenge)}
    )
    assert linked.status_code == 201, linked.text
    _, recovery = _enable_totp(vpsshop_client, vpsshop_clock)

    def wallet_login(body):
        header = signed(wallet, challenge_of(vpsshop_client.post("/v1/account/wallet-login")))
        return vpsshop_client.post("/v1/account/wallet-login", json=body, headers={"SIGN-IN-WITH-X": header})

    missing = wallet_login({})
    assert missing.status_code == 401 and missing.json()["error"] == "totp_required", missing.text
    wrong = wallet_login({"totp_code": "000000"})
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_totp_code", wrong.text
    done = wallet_login({"totp_code": recovery[0]})
    assert done.status_code == 201 and done.json()["user_id"] == signed_in.user_id, done.text


def test_top_up_form_uses_the_api_limits_and_shows_the_deposit(vpsshop_client, signed_in):
    low = post_form(vpsshop_client, f"{D}/topups", {"amount": "10", "coin": "LTC"})
    assert low.status_code == 400 and "The smallest top-up is $25." in low.text
    bad = post_form(vpsshop_client, f"{D}/topups", {"amount": "lots", "coin": "LTC"})
    assert bad.status_code == 400 and "US dollars" in bad.text
    started = post_form(vpsshop_client, f"{D}/topups", {"amount": "30", "coin": "LTC", "idempotency_key": "k1"})
    assert started.status_code == 303
    ref = started.headers["location"].rsplit("/", 1)[1]
    api = vpsshop_client.get(f"/v1/topups/{ref}", headers=signed_in.headers).json()
    page = vpsshop_client.get(started.headers["location"]).text
    assert api["deposit_address"] in page and api["deposit_amount"] in page and api["qr_data_uri"] in page
    status = vpsshop_client.get(f"{D}/topups/{ref}/status").json()
    assert status["status"] == "pending" and status["payment_status"] == "awaiting_payment"
    again = post_form(
        vpsshop_client, f"{D}/topups", {"amount": "30", "coin": "LTC", "idempotency_key": "k1"}, page=f"{D}/topups"
    )
    assert again.headers["location"] == started.headers["location"]  # a re-sent form makes no second top-up
    cancelled = post_form(vpsshop_client, f"{D}/topups/{ref}/cancel", page=started.headers["location"])
    assert cancelled.status_code == 303
    assert vpsshop_client.get(f"/v1/topups/{ref}", headers=signed_in.headers).json()["status"] == "cancelled"
    x402 = post_form(vpsshop_client, f"{D}/topups", {"amount": "25", "coin": "USDCBASE"})
    assert x402.status_code == 200 and "transferWithAuthorization" in x402.text and "25000000" in x402.text


def test_ordering_renewal_and_power_go_through_the_api_services(vpsshop_client, signed_in):
    poor = post_form(
        vpsshop_client, f"{D}/servers", {"plan": "pup", "location": "nl", "os": "debian-12"}, page=f"{D}/servers/new"
    )
    assert poor.status_code == 402 and "does not cover the price of $3.99" in poor.text
    assert "Top up at least $3.99" in poor.text
    signed_in.credit(20)
    bad = post_form(
        vpsshop_client,
        f"{D}/servers",
        {"plan": "pup", "location": "nl", "os": "debian-12", "hostname": "-bad-"},
        page=f"{D}/servers/new",
    )
    assert bad.status_code == 400 and "A hostname is 1 to 63 letters" in bad.text
    form = {
        "plan": "pup",
        "location": "nl",
        "os": "debian-12",
        "cycle": "monthly",
        "hostname": "web1",
        "idempotency_key": "order-1",
    }
    ordered = post_form(vpsshop_client, f"{D}/servers", form, page=f"{D}/servers/new")
    assert ordered.status_code == 303
    again = post_form(vpsshop_client, f"{D}/servers", form, page=f"{D}/servers/new")
    assert again.headers["location"] == ordered.headers["location"]  # the same order, charged once
    servers = vpsshop_client.get("/v1/servers", headers=signed_in.headers).json()["servers"]
    assert [s["hostname"] for s in servers] == ["web1"]
    assert vpsshop_client.get("/v1/account", headers=signed_in.headers).json()["balance_usd"] == 16.01
    page = ordered.headers["location"].split("?")[0]
    assert "provisioning" in vpsshop_client.get(ordered.headers["location"]).text
    refused = post_form(vpsshop_client, f"{page}/power", {"action": "reboot"}, page=page)
    assert refused.status_code == 409 and "active server" in refused.text  # the API's rule, in words
    assert post_form(vpsshop_client, f"{page}/auto-renew", {"auto_renew": "off"}, page=page).status_code == 303
    server = vpsshop_client.get(f"/v1/servers/{servers[0]['id']}", headers=signed_in.headers).json()
    assert server["auto_renew"] is False
    overview = vpsshop_client.get(f"{D}/").text
    assert "web1" in overview and "Server order" in overview and "-$3.99" in overview


def test_deposit_addresses_page_gives_the_api_address_with_its_qr_code(vpsshop_client, signed_in):
    empty = vpsshop_client.get(f"{D}/deposit-addresses").text
    assert 'value="LTC"' in empty and "Get my address" in empty
    bad = post_form(vpsshop_client, f"{D}/deposit-addresses", {"coin": "USDCBASE"})
    assert bad.status_code == 400 and 'role="alert"' in bad.text
    made = post_form(vpsshop_client, f"{D}/deposit-addresses", {"coin": "LTC"})
    assert made.status_code == 303 and made.headers["location"].endswith("/deposit-addresses")
    api = vpsshop_client.post("/v1/deposit-addresses", headers=signed_in.headers, json={"coin": "LTC"}).json()
    page = vpsshop_client.get(f"{D}/deposit-addresses").text
    assert api["address"] in page and api["qr_data_uri"] in page
    assert 'value="LTC"' not in page  # one address per coin: LTC is no longer offered
    again = post_form(vpsshop_client, f"{D}/deposit-addresses", {"coin": "LTC"}, page=f"{D}/topups")
    assert again.status_code == 303
    listed = vpsshop_client.get("/v1/deposit-addresses", headers=signed_in.headers).json()["deposit_addresses"]
    assert [a["address"] for a in listed if a["coin"] == "LTC"] == [api["address"]]
