"""The dashboard's pages: sign-in, account, overview, top-ups, servers, API keys and security.

Each handler takes a :class:`~vpsshop.dashboard.web.Page` and calls :class:`~vpsshop.dashboard.shop.Shop`,
which calls the same services as the API. Errors the customer can fix re-render the form with the
problem said in words; others become the error page with the API's message.
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from vpsshop.coins import DepositCoin, X402Coin
from vpsshop.dashboard.web import Dashboard, Page, format_usd
from vpsshop.errors import ApiError, NotFound, Unauthorized
from vpsshop.ledger import InsufficientBalance
from vpsshop.ratelimit import RateLimited
from vpsshop.twofactor import InvalidCode

LEDGER_REASONS = {
    "topup": "Top-up",
    "admin_credit": "Credit from support",
    "admin_debit": "Debit by support",
    "order": "Server order",
    "renewal": "Server renewal",
    "refund": "Refund",
}
FIELD_NAMES = {
    "plan": "Plan",
    "location": "Location",
    "os": "Operating system",
    "cycle": "Billing cycle",
    "hostname": "Hostname",
    "root_password": "Root password",
    "amount": "Amount",
    "coin": "Coin",
}
FRIENDLY = {
    "amount_too_low": "The smallest top-up is $25.",
    "amount_too_high": "The largest top-up is $2,000.",
    "invalid_amount": "Enter the amount in US dollars, like 30 or 30.50 (at most two decimals).",
    "invalid_hostname": "A hostname is 1 to 63 letters, digits and hyphens, not starting or ending with a hyphen.",
    "invalid_root_password": "A root password is 10 to 128 printable characters (letters, digits, symbols, "
    "spaces); leave it empty to have one generated.",
}


def _friendly(exc: ApiError) -> str:
    return FRIENDLY.get(exc.error, exc.message)


# ---- sign-in, sign-out, new account ---------------------------------------------------------------


async def signin_form(page: Page) -> Response:
    if page.session is not None and not page.session.pending_totp:
        return page.redirect("")
    return page.render("signin.html", title="Sign in")


async def signin(page: Page) -> Response:
    token = page.form.get("login_token", "").strip()
    try:
        if not token:
            raise Unauthorized("Enter your login token.")
        account_id, totp = await page.shop.check_login_token(token, page.client)
    except RateLimited as exc:
        return page.render("signin.html", 429, exc.headers, title="Sign in", error=exc.message)
    except Unauthorized as exc:
        message = (
            exc.message
            if not token
            else (
                "That login token is not valid. It starts with vpsl_ and was shown once, when the account was created."
            )
        )
        return page.render("signin.html", 401, title="Sign in", error=message)
    if page.session is not None:  # a browser signing in again leaves no older session behind
        await page.shop.end_session(page.session.account_id, page.session.id)
    session_token = await page.shop.start_session(
        account_id, pending_totp=totp, user_agent=page.request.headers.get("user-agent")
    )
    response = page.redirect("signin/code" if totp else "")
    page.dash.sign_in(response, session_token)
    return response


async def code_form(page: Page) -> Response:
    return page.render("signin_code.html", title="Two-factor code")


async def code(page: Page) -> Response:
    pending = page.session
    assert pending is not None
    try:
        await page.shop.check_second_factor(pending.account_id, page.form.get("code"), page.client)
    except (InvalidCode, RateLimited) as exc:
        status = 429 if isinstance(exc, RateLimited) else 401
        return page.render("signin_code.html", status, exc.headers, title="Two-factor code", error=exc.message)
    except ApiError as exc:  # totp_required: the field was empty
        return page.render("signin_code.html", 400, title="Two-factor code", error=exc.message)
    response = page.redirect("")
    page.dash.sign_in(response, await page.shop.complete_second_factor(pending))
    return response


async def signout(page: Page) -> Response:
    if page.session is not None:
        await page.shop.end_session(page.session.account_id, page.session.id)
    response = page.redirect("signin", "signed-out")
    page.dash.sign_out(response)
    return response


async def create_account(page: Page) -> Response:
    created = await page.shop.create_account()
    if page.session is not None:
        await page.shop.end_session(page.session.account_id, page.session.id)
    session_token = await page.shop.start_session(
        created.user_id, pending_totp=False, user_agent=page.request.headers.get("user-agent")
    )
    page.adopt(session_token)
    response = page.render("created.html", 201, title="Your new account", created=created)
    page.dash.sign_in(response, session_token)
    return response


# ---- overview -------------------------------------------------------------------------------------------


async def overview(page: Page) -> Response:
    account = await page.shop.account(page.account_id)
    servers = await page.shop.servers(page.account_id)
    ledger = await page.shop.ledger(page.account_id)
    return page.render(
        "overview.html",
        title="Overview",
        account=account,
        servers=servers.servers,
        ledger=ledger,
        reasons=LEDGER_REASONS,
    )


# ---- top-ups --------------------------------------------------------------------------------------------


async def topup_form(
    page: Page, *, error: str | None = None, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    account = await page.shop.account(page.account_id)
    recent = await page.shop.recent_topups(page.account_id)
    catalog = page.shop.catalog
    default_coin = page.shop.topup_coin(None).code if catalog.payment_options else None
    return page.render(
        "topups.html",
        status,
        headers,
        title="Top up",
        account=account,
        recent=recent,
        options=catalog.payment_options,
        limits=catalog.topup_limits,
        error=error,
        form=page.form,
        default_coin=page.form.get("coin") or default_coin,
        idempotency_key=secrets.token_urlsafe(16),
    )


async def topup_page(page: Page) -> Response:
    return await topup_form(page)


async def start_topup(page: Page) -> Response:
    try:
        body = page.shop.topup_body(page.form.get("amount", ""), page.form.get("coin"))
        coin = page.shop.topup_coin(body.coin)
        if isinstance(coin, X402Coin):
            requirements = page.shop.x402_requirements(coin, body)
            return page.render(
                "topup_x402.html", title="Pay with x402", coin=coin, amount=body.amount, requirements=requirements
            )
        if not isinstance(coin, DepositCoin):
            raise ApiError(400, "invalid_coin", f"Coin {coin.code} cannot be paid to a deposit address.")
        key = page.form.get("idempotency_key") or None
        topup = await page.shop.create_topup(page.account_id, coin, body, f"dashboard:{key}" if key else None)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await topup_form(page, error=_friendly(exc), status=exc.status, headers=exc.headers)
    return page.redirect(f"topups/{topup.ref}")


async def show_topup(page: Page) -> Response:
    topup = await page.shop.topup(page.account_id, _ref(page))
    coin = page.shop.ctx.coins.get(topup.coin)
    return page.render(
        "topup.html",
        title=f"Top-up of {topup.amount_usd} USD",
        topup=topup,
        coin_name=getattr(coin, "name", topup.coin),
    )


async def topup_status(page: Page) -> Response:
    topup = await page.shop.topup(page.account_id, _ref(page))
    return JSONResponse(
        {
            "status": topup.status,
            "payment_status": topup.payment_status,
            "amount_received": topup.amount_received,
            "confirmations": topup.confirmations,
            "confirmations_required": topup.confirmations_required,
            "credited_usd": str(topup.credited_usd),
            "expires_at": topup.expires_at.isoformat() if topup.expires_at else None,
        },
        headers={"Cache-Control": "no-store"},
    )


async def cancel_topup(page: Page) -> Response:
    ref = _ref(page)
    await page.shop.cancel_topup(page.account_id, ref)
    return page.redirect(f"topups/{ref}", "topup-cancelled")


def _ref(page: Page) -> str:
    ref = page.request.path_params["ref"]
    if not (1 <= len(ref) <= 40):
        raise NotFound("top-up")
    return ref


# ---- servers ----------------------------------------------------------------------------------------------


async def servers_page(page: Page) -> Response:
    servers = await page.shop.servers(page.account_id)
    return page.render("servers.html", title="Servers", servers=servers.servers)


def _pricing(page: Page) -> dict[str, dict[str, str]]:
    return {
        f"{p.plan}:{p.location}": {"monthly": str(p.monthly_usd), "annual": str(p.annual_usd)}
        for p in page.shop.catalog.pricing
    }


async def order_form(page: Page, *, error: str | None = None, deficit: Any = None, status: int = 200) -> Response:
    account = await page.shop.account(page.account_id)
    catalog = page.shop.catalog
    form = {
        "plan": catalog.plans[0].id,
        "location": catalog.locations[0].id,
        "os": catalog.operating_systems[0].id,
        "cycle": "monthly",
        **page.form,
    }
    price = next((p for p in catalog.pricing if p.plan == form["plan"] and p.location == form["location"]), None)
    shown = None if price is None else price.annual_usd if form.get("cycle") == "annual" else price.monthly_usd
    return page.render(
        "order.html",
        status,
        title="Order a server",
        account=account,
        catalog=catalog,
        form=form,
        error=error,
        deficit=deficit,
        pricing=_pricing(page),
        price=shown,
        idempotency_key=page.form.get("idempotency_key") or secrets.token_urlsafe(16),
    )


async def order_page(page: Page) -> Response:
    return await order_form(page)


async def place_order(page: Page) -> Response:
    form = page.form
    data: dict[str, Any] = {
        "plan": form.get("plan", ""),
        "location": form.get("location", ""),
        "os": form.get("os", ""),
        "cycle": form.get("cycle") or "monthly",
    }
    if form.get("hostname", "").strip():
        data["hostname"] = form["hostname"].strip()
    if form.get("root_password", ""):
        data["root_password"] = form["root_password"]
    key = form.get("idempotency_key") or None
    try:
        body = page.shop.order_body(data)
        done = await page.shop.order(page.account_id, body, f"dashboard:{key}" if key else None)
    except InsufficientBalance as exc:
        page.form.pop("root_password", None)
        message = (
            f"Your balance of {format_usd(exc.extra['balance'])} does not cover the price of "
            f"{format_usd(exc.extra['price'])}. Nothing was charged."
        )
        return await order_form(page, error=message, deficit=exc.extra.get("deficit"), status=402)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        page.form.pop("root_password", None)
        field = exc.error.removeprefix("invalid_")
        message = _friendly(exc)
        if field in FIELD_NAMES and exc.error not in FRIENDLY:
            message = f"{FIELD_NAMES[field]}: {exc.message.split(': ', 1)[-1]}"
        return await order_form(page, error=message, status=exc.status)
    return page.redirect(f"servers/{done.order.server.id}", "ordered")


async def show_server(page: Page) -> Response:
    server = await page.shop.server(page.account_id, page.request.path_params["id"])
    account = await page.shop.account(page.account_id)
    names = _names(page)
    return page.render("server.html", title=f"Server {server.hostname}", server=server, account=account, names=names)


def _names(page: Page) -> dict[str, str]:
    data = page.shop.ctx.catalog_data
    return {
        **{p.id: p.name for p in data.plans},
        **{f"loc:{loc.id}": loc.name for loc in data.locations},
        **{f"os:{o.id}": o.name for o in data.operating_systems},
    }


async def server_status(page: Page) -> Response:
    server = await page.shop.server(page.account_id, page.request.path_params["id"])
    return JSONResponse({"status": server.status, "ip": server.ip}, headers={"Cache-Control": "no-store"})


async def power(page: Page) -> Response:
    action = page.form.get("action", "")
    if action not in ("start", "stop", "reboot"):
        raise ApiError(400, "invalid_action", "Choose start, stop or reboot.")
    server_id = page.request.path_params["id"]
    await page.shop.power(page.account_id, server_id, action)
    return page.redirect(f"servers/{server_id}", f"power-{action}")


async def renew(page: Page) -> Response:
    server_id = page.request.path_params["id"]
    result = await page.shop.renew(page.account_id, server_id)
    return page.redirect(f"servers/{server_id}", "renewed" if result.charged_usd else "renew-none")


async def auto_renew(page: Page) -> Response:
    server_id = page.request.path_params["id"]
    on = page.form.get("auto_renew") == "on"
    await page.shop.set_auto_renew(page.account_id, server_id, on)
    return page.redirect(f"servers/{server_id}", "auto-renew-on" if on else "auto-renew-off")


async def credentials(page: Page) -> Response:
    server_id = page.request.path_params["id"]
    account = await page.shop.account(page.account_id)
    if account.totp_enabled:
        try:
            await page.shop.verify_totp(page.account_id, page.form.get("code"))
        except ApiError as exc:
            if exc.status >= 500:
                raise
            server = await page.shop.server(page.account_id, server_id)
            return page.render(
                "server.html",
                429 if isinstance(exc, RateLimited) else 401,
                exc.headers,
                title=f"Server {server.hostname}",
                server=server,
                account=account,
                names=_names(page),
                credentials_error=exc.message,
            )
    creds = await page.shop.credentials(page.account_id, server_id)
    server = await page.shop.server(page.account_id, server_id)
    return page.render(
        "server.html",
        title=f"Server {server.hostname}",
        server=server,
        account=account,
        names=_names(page),
        credentials=creds,
        headers={"Pragma": "no-cache"},
    )


# ---- API keys ---------------------------------------------------------------------------------------------


async def keys_page(page: Page) -> Response:
    keys = await page.shop.keys(page.account_id)
    return page.render("keys.html", title="API keys", keys=keys.keys)


async def mint_key(page: Page) -> Response:
    name = page.form.get("name", "").strip() or None
    if name is not None and len(name) > 64:
        keys = await page.shop.keys(page.account_id)
        return page.render(
            "keys.html", 400, title="API keys", keys=keys.keys, error="A key name is at most 64 characters."
        )
    created = await page.shop.mint_key(page.account_id, name)
    keys = await page.shop.keys(page.account_id)
    return page.render("keys.html", 201, title="API keys", keys=keys.keys, created=created)


async def revoke_key(page: Page) -> Response:
    await page.shop.revoke_key(page.account_id, page.request.path_params["id"])
    return page.redirect("keys", "key-revoked")


# ---- security: two-factor and sessions ---------------------------------------------------------------


async def security_page(
    page: Page, *, error: str | None = None, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    account = await page.shop.account(page.account_id)
    left = await page.shop.recovery_codes_left(page.account_id) if account.totp_enabled else 0
    live = await page.shop.live_sessions(page.account_id)
    limits = page.shop.ctx.settings.dashboard
    idle = limits.session_idle_minutes
    return page.render(
        "security.html",
        status,
        headers,
        title="Security",
        account=account,
        codes_left=left,
        sessions=live,
        current_id=page.session.id if page.session else None,
        error=error,
        settings_idle=f"{idle // 60} hours" if idle % 60 == 0 and idle > 60 else f"{idle} minutes",
        settings_max=f"{limits.session_max_hours} hours",
    )


async def security(page: Page) -> Response:
    return await security_page(page)


async def totp_start(page: Page) -> Response:
    await page.shop.begin_totp(page.account_id)
    return page.redirect("security/totp")


async def totp_enrol(
    page: Page, *, error: str | None = None, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    account = await page.shop.account(page.account_id)
    if account.totp_enabled:
        return page.redirect("security")
    enrolment = await page.shop.begin_totp(page.account_id)
    return page.render(
        "totp.html", status, headers, title="Set up two-factor sign-in", enrolment=enrolment, error=error
    )


async def totp_enrol_page(page: Page) -> Response:
    return await totp_enrol(page)


async def totp_confirm(page: Page) -> Response:
    try:
        codes = await page.shop.confirm_totp(page.account_id, page.form.get("code", ""))
    except (InvalidCode, RateLimited) as exc:
        return await totp_enrol(page, error=exc.message, status=exc.status, headers=exc.headers)
    await page.shop.end_other_sessions(page.account_id, page.session.id if page.session else None)
    return page.render("recovery_codes.html", title="Your recovery codes", codes=codes, first=True)


async def totp_disable(page: Page) -> Response:
    try:
        await page.shop.disable_totp(page.account_id, page.form.get("code", ""))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await security_page(page, error=exc.message, status=exc.status, headers=exc.headers)
    return page.redirect("security", "totp-off")


async def recovery_codes(page: Page) -> Response:
    try:
        codes = await page.shop.new_recovery_codes(page.account_id, page.form.get("code", ""))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await security_page(page, error=exc.message, status=exc.status, headers=exc.headers)
    return page.render("recovery_codes.html", title="Your recovery codes", codes=codes, first=False)


async def end_session(page: Page) -> Response:
    session_id = page.request.path_params["id"]
    await page.shop.end_session(page.account_id, session_id)
    if page.session is not None and session_id == page.session.id:
        response = page.redirect("signin", "signed-out")
        page.dash.sign_out(response)
        return response
    return page.redirect("security", "session-gone")


async def end_other_sessions(page: Page) -> Response:
    await page.shop.end_other_sessions(page.account_id, page.session.id if page.session else None)
    return page.redirect("security", "sessions-ended")


# ---- static files ------------------------------------------------------------------------------------


def static_endpoint(dash: Dashboard):  # type: ignore[no-untyped-def]
    types = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}

    async def static(request: Any) -> Response:
        name = request.path_params["name"]
        body = dash.static.get(name)
        if body is None:
            raise NotFound("file")
        return Response(
            body,
            headers={
                "Content-Type": types[name.rsplit(".", 1)[1]],
                "Cache-Control": "public, max-age=86400",
                "X-Content-Type-Options": "nosniff",
            },
        )

    return static


def routes(dash: Dashboard) -> list[BaseRoute]:
    """The dashboard's routes, relative to its mount point."""
    e = dash.endpoint
    return [
        Route("/", e(overview), methods=["GET"]),
        Route("/signin", e(signin_form, auth=False), methods=["GET"]),
        Route("/signin", e(signin, auth=False), methods=["POST"]),
        Route("/signin/code", e(code_form, pending=True), methods=["GET"]),
        Route("/signin/code", e(code, pending=True), methods=["POST"]),
        Route("/signout", e(signout, auth=False), methods=["POST"]),
        Route("/account", e(create_account, auth=False), methods=["POST"]),
        Route("/topups", e(topup_page), methods=["GET"]),
        Route("/topups", e(start_topup), methods=["POST"]),
        Route("/topups/{ref}", e(show_topup), methods=["GET"]),
        Route("/topups/{ref}/status", e(topup_status), methods=["GET"]),
        Route("/topups/{ref}/cancel", e(cancel_topup), methods=["POST"]),
        Route("/servers", e(servers_page), methods=["GET"]),
        Route("/servers", e(place_order), methods=["POST"]),
        Route("/servers/new", e(order_page), methods=["GET"]),
        Route("/servers/{id:id}", e(show_server), methods=["GET"]),
        Route("/servers/{id:id}/status", e(server_status), methods=["GET"]),
        Route("/servers/{id:id}/power", e(power), methods=["POST"]),
        Route("/servers/{id:id}/renew", e(renew), methods=["POST"]),
        Route("/servers/{id:id}/auto-renew", e(auto_renew), methods=["POST"]),
        Route("/servers/{id:id}/credentials", e(credentials), methods=["POST"]),
        Route("/keys", e(keys_page), methods=["GET"]),
        Route("/keys", e(mint_key), methods=["POST"]),
        Route("/keys/{id:id}/revoke", e(revoke_key), methods=["POST"]),
        Route("/security", e(security), methods=["GET"]),
        Route("/security/totp", e(totp_enrol_page), methods=["GET"]),
        Route("/security/totp/start", e(totp_start), methods=["POST"]),
        Route("/security/totp/confirm", e(totp_confirm), methods=["POST"]),
        Route("/security/totp/disable", e(totp_disable), methods=["POST"]),
        Route("/security/recovery-codes", e(recovery_codes), methods=["POST"]),
        Route("/security/sessions/{id:id}/end", e(end_session), methods=["POST"]),
        Route("/security/sessions/end-others", e(end_other_sessions), methods=["POST"]),
        Route("/static/{name}", static_endpoint(dash), methods=["GET"]),
    ]
