"""The dashboard's pages: sign-in, account, overview, top-ups, API keys and security, and the
routes of every page (servers and SSH keys are in :mod:`~vpsshop.dashboard.server_pages`, webhooks
and events in :mod:`~vpsshop.dashboard.event_pages`).

Each handler takes a :class:`~vpsshop.dashboard.web.Page` and calls the shop's operations, the ones
the API calls, with the customer of the session: the same checks, limits, errors and events. Errors
the customer can fix re-render the form with the problem said in words (and the API's status and
``Retry-After``); others become the error page with the API's message.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

import vpsshop.dashboard.event_pages as event_pages
import vpsshop.dashboard.server_pages as server_pages
from vpsshop import accounts, deposits, sessions, topups, twofactor, wallets
from vpsshop.accounts import NewKeyInput
from vpsshop.dashboard.web import Dashboard, Page, format_usd
from vpsshop.dashboard.words import LEDGER_REASONS, friendly
from vpsshop.errors import ApiError, BadRequest, NotFound, Unauthorized
from vpsshop.inputs import parse
from vpsshop.ledger import recent_entries
from vpsshop.ratelimit import RateLimited
from vpsshop.servers import resource
from vpsshop.signin import check_login_token, check_second_factor
from vpsshop.topups import TopupInput
from vpsshop.twofactor import InvalidCode
from vpsshop.x402.offers import PaymentRequired

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
        account_id, totp = await check_login_token(page.ctx, token, client=page.client)
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
        await sessions.end(page.ctx, page.session.account_id, page.session.id)
    session_token = await sessions.start(
        page.ctx, account_id, pending_totp=totp, user_agent=page.request.headers.get("user-agent")
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
        await check_second_factor(page.ctx, pending.account_id, page.form.get("code"), client=page.client)
    except (InvalidCode, RateLimited) as exc:
        status = 429 if isinstance(exc, RateLimited) else 401
        return page.render("signin_code.html", status, exc.headers, title="Two-factor code", error=exc.message)
    except ApiError as exc:  # totp_required: the field was empty
        return page.render("signin_code.html", 400, title="Two-factor code", error=exc.message)
    response = page.redirect("")
    page.dash.sign_in(response, await sessions.complete_second_factor(page.ctx, pending))
    return response


async def signout(page: Page) -> Response:
    if page.session is not None:
        await sessions.end(page.ctx, page.session.account_id, page.session.id)
    response = page.redirect("signin", "signed-out")
    page.dash.sign_out(response)
    return response


async def create_account(page: Page) -> Response:
    try:
        created = await accounts.create_account(page.ctx, client=page.client)
    except RateLimited as exc:  # the sign-up limit of POST /v1/account, on the same count
        return page.render("signin.html", 429, exc.headers, title="Sign in", signup_error=exc.message)
    if page.session is not None:
        await sessions.end(page.ctx, page.session.account_id, page.session.id)
    session_token = await sessions.start(
        page.ctx, created.user_id, pending_totp=False, user_agent=page.request.headers.get("user-agent")
    )
    page.adopt(session_token)
    response = page.render("created.html", 201, title="Your new account", created=created)
    page.dash.sign_in(response, session_token)
    return response


# ---- overview -------------------------------------------------------------------------------------------


async def overview(page: Page) -> Response:
    account = await accounts.get_account(page.ctx, page.customer)
    servers = await resource.list_servers(page.ctx, page.customer)
    ledger = await recent_entries(page.ctx, page.customer, 15)
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
    account = await accounts.get_account(page.ctx, page.customer)
    recent = await topups.recent_topups(page.ctx, page.customer)
    catalog = page.ctx.catalog
    default_coin = topups.coin_of(page.ctx, None).code if catalog.payment_options else None
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
        body = _topup_input(page.form.get("amount", ""), page.form.get("coin"))
        key = page.form.get("idempotency_key") or None
        started = await topups.start_topup(
            page.ctx, page.customer, body, idempotency_key=f"dashboard:{key}" if key else None
        )
    except PaymentRequired as asked:  # an x402 coin: the wallet signs these requirements in the browser
        return page.render(
            "topup_x402.html",
            title="Pay with x402",
            coin=asked.offer.coin,
            amount=body.amount,
            requirements=asked.offer.accepts,
        )
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await topup_form(page, error=friendly(exc), status=exc.status, headers=exc.headers)
    return page.redirect(f"topups/{started.topup.ref}")


def _topup_input(amount: str, coin: str | None) -> TopupInput:
    """The form's amount (``30``, ``$30.50``, ``1,000``) and coin, validated by the API's own input model."""
    try:
        value: Any = Decimal(amount.strip().lstrip("$").replace(",", ""))
    except ArithmeticError:
        raise BadRequest("invalid_amount", "amount: enter a number of US dollars, like 30 or 30.50.") from None
    return parse(TopupInput, {"amount": value, "coin": coin or None})


async def show_topup(page: Page) -> Response:
    topup = await topups.get_topup(page.ctx, page.customer, _ref(page))
    coin = page.ctx.coins.get(topup.coin)
    return page.render(
        "topup.html",
        title=f"Top-up of {topup.amount_usd} USD",
        topup=topup,
        coin_name=getattr(coin, "name", topup.coin),
        watched=topups.watches_chain(page.ctx, topup.coin),
        topup_account=page.account_id,
    )


async def topup_status(page: Page) -> Response:
    topup = await topups.get_topup(page.ctx, page.customer, _ref(page))
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
    await topups.cancel_topup(page.ctx, page.customer, ref)
    return page.redirect(f"topups/{ref}", "topup-cancelled")


# ---- standing deposit addresses ------------------------------------------------------------------------


async def deposit_page(
    page: Page, *, error: str | None = None, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    listed = await deposits.list_deposit_addresses(page.ctx, page.customer, qr=True)
    have = {a.coin for a in listed.deposit_addresses}
    options = [o for o in page.ctx.catalog.payment_options if o.coin in deposits.standing_coins(page.ctx)]
    return page.render(
        "deposit_addresses.html",
        status,
        headers,
        title="Deposit addresses",
        addresses=listed.deposit_addresses,
        options=[o for o in options if o.coin not in have],
        error=error,
    )


async def request_deposit_address(page: Page) -> Response:
    try:
        body = parse(deposits.DepositAddressInput, {"coin": page.form.get("coin", "")})
        await deposits.request_deposit_address(page.ctx, page.customer, body)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await deposit_page(page, error=friendly(exc), status=exc.status, headers=exc.headers)
    return page.redirect("deposit-addresses")


def _ref(page: Page) -> str:
    return str(page.request.path_params["ref"])


# ---- API keys ---------------------------------------------------------------------------------------------


async def keys_page(page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any) -> Response:
    keys = await accounts.list_keys(page.ctx, page.customer)
    account = await accounts.get_account(page.ctx, page.customer)
    owned = await wallets.list_wallets(page.ctx, page.customer)
    return page.render(
        "keys.html", status, headers, title="API keys", keys=keys.keys, account=account, wallets=owned.wallets, **extra
    )


async def keys(page: Page) -> Response:
    return await keys_page(page)


async def mint_key(page: Page) -> Response:
    """A key can read root passwords through the API: with two-factor on, minting one asks for a
    fresh code, as revealing a password here does."""
    name = page.form.get("name", "").strip() or None
    account = await accounts.get_account(page.ctx, page.customer)
    refused = await page.fresh_code(account.totp_enabled)
    if refused is not None:
        return await keys_page(page, status=refused.status, headers=refused.headers, code_error=refused.message)
    try:
        created = await accounts.create_key(
            page.ctx, page.customer, parse(NewKeyInput, {} if name is None else {"name": name})
        )
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await keys_page(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return await keys_page(page, status=201, created=created)


async def revoke_key(page: Page) -> Response:
    try:
        await accounts.revoke_key(page.ctx, page.customer, page.request.path_params["id"])
    except RateLimited as exc:
        return await keys_page(page, status=exc.status, headers=exc.headers, error=exc.message)
    return page.redirect("keys", "key-revoked")


async def remove_wallet(page: Page) -> Response:
    try:
        await wallets.unlink_wallet(page.ctx, page.customer, page.request.path_params["id"])
    except (RateLimited, NotFound) as exc:
        return await keys_page(page, status=exc.status, headers=exc.headers, error=exc.message)
    return page.redirect("keys", "wallet-removed")


# ---- security: two-factor and sessions ---------------------------------------------------------------


async def security_page(
    page: Page, *, error: str | None = None, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    account = await accounts.get_account(page.ctx, page.customer)
    left = await twofactor.recovery_codes_left(page.ctx, page.customer) if account.totp_enabled else 0
    live = await sessions.live(page.ctx, page.customer)
    limits = page.ctx.settings.dashboard
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
    await twofactor.begin_enrolment(page.ctx, page.customer)
    return page.redirect("security/totp")


async def totp_enrol(
    page: Page, *, error: str | None = None, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    account = await accounts.get_account(page.ctx, page.customer)
    if account.totp_enabled:
        return page.redirect("security")
    enrolment = await twofactor.begin_enrolment(page.ctx, page.customer)
    return page.render(
        "totp.html", status, headers, title="Set up two-factor sign-in", enrolment=enrolment, error=error
    )


async def totp_enrol_page(page: Page) -> Response:
    return await totp_enrol(page)


async def totp_confirm(page: Page) -> Response:
    try:
        codes = await twofactor.confirm_enrolment(page.ctx, page.customer, page.form.get("code", ""))
    except (InvalidCode, RateLimited) as exc:
        return await totp_enrol(page, error=exc.message, status=exc.status, headers=exc.headers)
    await sessions.end_others(page.ctx, page.customer, page.session.id if page.session else None)
    return page.render("recovery_codes.html", title="Your recovery codes", codes=codes, first=True)


async def totp_disable(page: Page) -> Response:
    try:
        await twofactor.disable(page.ctx, page.customer, page.form.get("code", ""))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await security_page(page, error=exc.message, status=exc.status, headers=exc.headers)
    return page.redirect("security", "totp-off")


async def recovery_codes(page: Page) -> Response:
    try:
        codes = await twofactor.regenerate_recovery_codes(page.ctx, page.customer, page.form.get("code", ""))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await security_page(page, error=exc.message, status=exc.status, headers=exc.headers)
    return page.render("recovery_codes.html", title="Your recovery codes", codes=codes, first=False)


async def end_session(page: Page) -> Response:
    session_id = page.request.path_params["id"]
    await sessions.end(page.ctx, page.account_id, session_id)
    if page.session is not None and session_id == page.session.id:
        response = page.redirect("signin", "signed-out")
        page.dash.sign_out(response)
        return response
    return page.redirect("security", "session-gone")


async def end_other_sessions(page: Page) -> Response:
    await sessions.end_others(page.ctx, page.customer, page.session.id if page.session else None)
    return page.redirect("security", "sessions-ended")


# ---- static files ------------------------------------------------------------------------------------


def static_endpoint(dash: Dashboard) -> Callable[[Request], Awaitable[Response]]:
    types = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}

    async def static(request: Request) -> Response:
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
        Route("/deposit-addresses", e(deposit_page), methods=["GET"]),
        Route("/deposit-addresses", e(request_deposit_address), methods=["POST"]),
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
        Route("/servers/{id:id}/firewall", e(servers.firewall_page), methods=["GET"]),
        Route("/servers/{id:id}/firewall", e(servers.set_firewall), methods=["POST"]),
        Route("/servers/{id:id}/snapshots", e(servers.snapshots_page), methods=["GET"]),
        Route("/servers/{id:id}/snapshots", e(servers.take_snapshot), methods=["POST"]),
        Route("/servers/{id:id}/snapshots/{snapshot_id:id}/restore", e(servers.restore_snapshot), methods=["POST"]),
        Route("/servers/{id:id}/snapshots/{snapshot_id:id}/delete", e(servers.delete_snapshot), methods=["POST"]),
        Route("/servers/{id:id}/reinstall", e(servers.reinstall_page), methods=["GET"]),
        Route("/servers/{id:id}/reinstall", e(servers.reinstall), methods=["POST"]),
        Route("/servers/{id:id}/resize", e(servers.resize_page), methods=["GET"]),
        Route("/servers/{id:id}/resize", e(servers.resize), methods=["POST"]),
        Route("/servers/{id:id}/terminate", e(servers.terminate_page), methods=["GET"]),
        Route("/servers/{id:id}/terminate", e(servers.terminate), methods=["POST"]),
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
        Route("/wallets/{id:id}/remove", e(remove_wallet), methods=["POST"]),
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
