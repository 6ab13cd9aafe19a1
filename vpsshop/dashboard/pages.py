"""The dashboard's pages: sign-in, account, overview, top-ups, API keys and security, and the
routes of every page (servers and SSH keys are in :mod:`~vpsshop.dashboard.server_pages`, webhooks
and events in :mod:`~vpsshop.dashboard.event_pages`).

Each handler takes a :class:`~vpsshop.dashboard.web.Page` and calls :class:`~vpsshop.dashboard.shop.Shop`,
which calls the same services as the API, with the API's limits. Errors the customer can fix
re-render the form with the problem said in words (and the API's status and ``Retry-After``);
others become the error page with the API's message.
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

import vpsshop.dashboard.event_pages as event_pages
import vpsshop.dashboard.server_pages as server_pages
from vpsshop.coins import DepositCoin, X402Coin
from vpsshop.dashboard.web import Dashboard, Page, format_usd
from vpsshop.dashboard.words import LEDGER_REASONS, friendly
from vpsshop.errors import ApiError, NotFound, Unauthorized
from vpsshop.ratelimit import RateLimited
from vpsshop.twofactor import InvalidCode

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
    try:
        created = await page.shop.create_account(page.client)
    except RateLimited as exc:  # the sign-up limit of POST /v1/account, on the same count
        return page.render("signin.html", 429, exc.headers, title="Sign in", signup_error=exc.message)
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
            requirements = await page.shop.x402_requirements(page.account_id, coin, body)
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
        return await topup_form(page, error=friendly(exc), status=exc.status, headers=exc.headers)
    return page.redirect(f"topups/{topup.ref}")


async def show_topup(page: Page) -> Response:
    topup = await page.shop.topup(page.account_id, _ref(page))
    coin = page.shop.ctx.coins.get(topup.coin)
    return page.render(
        "topup.html",
        title=f"Top-up of {topup.amount_usd} USD",
        topup=topup,
        coin_name=getattr(coin, "name", topup.coin),
        watched=page.shop.watched(topup.coin),
        topup_account=page.account_id,
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
            "credited_text": format_usd(topup.credited_usd),
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


# ---- API keys ---------------------------------------------------------------------------------------------


async def keys_page(page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any) -> Response:
    keys = await page.shop.keys(page.account_id)
    account = await page.shop.account(page.account_id)
    return page.render("keys.html", status, headers, title="API keys", keys=keys.keys, account=account, **extra)


async def keys(page: Page) -> Response:
    return await keys_page(page)


async def mint_key(page: Page) -> Response:
    """A key can read root passwords through the API: with two-factor on, minting one asks for a
    fresh code, as revealing a password here does."""
    name = page.form.get("name", "").strip() or None
    account = await page.shop.account(page.account_id)
    refused = await page.fresh_code(account.totp_enabled)
    if refused is not None:
        return await keys_page(page, status=refused.status, headers=refused.headers, code_error=refused.message)
    try:
        created = await page.shop.mint_key(page.account_id, name)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await keys_page(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return await keys_page(page, status=201, created=created)


async def revoke_key(page: Page) -> Response:
    try:
        await page.shop.revoke_key(page.account_id, page.request.path_params["id"])
    except RateLimited as exc:
        return await keys_page(page, status=exc.status, headers=exc.headers, error=exc.message)
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
    servers, events = server_pages, event_pages
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
        Route("/servers", e(servers.servers_page), methods=["GET"]),
        Route("/servers", e(servers.place_order), methods=["POST"]),
        Route("/servers/new", e(servers.order_page), methods=["GET"]),
        Route("/servers/{id:id}", e(servers.show_server), methods=["GET"]),
        Route("/servers/{id:id}/status", e(servers.server_status), methods=["GET"]),
        Route("/servers/{id:id}/power", e(servers.power), methods=["POST"]),
        Route("/servers/{id:id}/renew", e(servers.renew), methods=["POST"]),
        Route("/servers/{id:id}/renew/quote", e(servers.renew_quote), methods=["GET"]),
        Route("/servers/{id:id}/auto-renew", e(servers.auto_renew), methods=["POST"]),
        Route("/servers/{id:id}/credentials", e(servers.credentials), methods=["POST"]),
        Route("/servers/{id:id}/reverse-dns", e(servers.reverse_dns), methods=["POST"]),
        Route("/servers/{id:id}/reinstall", e(servers.reinstall_page), methods=["GET"]),
        Route("/servers/{id:id}/reinstall", e(servers.reinstall), methods=["POST"]),
        Route("/servers/{id:id}/console", e(servers.console_page), methods=["GET"]),
        Route("/servers/{id:id}/console", e(servers.open_console), methods=["POST"]),
        Route("/ssh-keys", e(servers.ssh_keys_page), methods=["GET"]),
        Route("/ssh-keys", e(servers.add_ssh_key), methods=["POST"]),
        Route("/ssh-keys/{id:id}/delete", e(servers.delete_ssh_key), methods=["POST"]),
        Route("/webhooks", e(events.webhooks_page), methods=["GET"]),
        Route("/webhooks", e(events.create_webhook), methods=["POST"]),
        Route("/webhooks/{id:id}", e(events.webhook_page), methods=["GET"]),
        Route("/webhooks/{id:id}", e(events.change_webhook), methods=["POST"]),
        Route("/webhooks/{id:id}/enabled", e(events.enable_webhook), methods=["POST"]),
        Route("/webhooks/{id:id}/delete", e(events.delete_webhook), methods=["POST"]),
        Route("/webhooks/{id:id}/redeliver", e(events.redeliver), methods=["POST"]),
        Route("/events", e(events.events_page), methods=["GET"]),
        Route("/keys", e(keys), methods=["GET"]),
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
