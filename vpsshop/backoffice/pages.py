"""The console's pages. Each reads through :mod:`vpsshop.shopview` or acts through :mod:`vpsshop.admin`,
the functions ``vpsshop admin`` calls, with the signed-in operator as the actor."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

from anyio import to_thread
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from vpsshop import admin, images, operators, shopview
from vpsshop.backoffice.charts import bar_chart
from vpsshop.backoffice.web import Console, operator_of
from vpsshop.dashboard.pages import static_endpoint
from vpsshop.dashboard.web import Page, format_usd
from vpsshop.money import micros_to_usd, usd_to_micros


def _usd(micros: int) -> str:
    return format_usd(micros_to_usd(micros))


async def signin_form(page: Page) -> Response:
    if page.session is not None:
        return page.redirect("")
    return page.render("signin.html", title="Operator sign-in")


async def signin(page: Page) -> Response:
    form = page.form
    try:
        token = await operators.sign_in(
            page.ctx,
            form.get("name", ""),
            form.get("password", ""),
            form.get("code", ""),
            page.client,
            page.request.headers.get("user-agent"),
        )
    except operators.SigninRefused as exc:
        return page.render("signin.html", 401, title="Operator sign-in", error=str(exc), name=form.get("name", ""))
    if page.session is not None:  # a browser signing in again leaves no older session behind
        await operators.sign_out(page.ctx, operator_of(page))
    response = page.redirect("")
    page.dash.sign_in(response, token)
    return response


async def signout(page: Page) -> Response:
    await operators.sign_out(page.ctx, operator_of(page))
    response = page.redirect("signin", "signed-out")
    page.dash.sign_out(response)
    return response


async def overview(page: Page) -> Response:
    found = await shopview.overview(page.ctx)
    days = found.days
    series: list[tuple[str, str, list[tuple[str, int]], Callable[[int], str]]] = [
        ("credited", "Credited per day (USD)", [(str(d.day), d.credited_micros) for d in days], _usd),
        ("spent", "Spent per day (USD)", [(str(d.day), d.spent_micros) for d in days], _usd),
        ("orders", "Orders per day", [(str(d.day), d.orders) for d in days], str),
        ("renewals", "Renewals per day", [(str(d.day), d.renewals) for d in days], str),
    ]
    charts = [(title, bar_chart(chart_id, title, bars, show)) for chart_id, title, bars, show in series]
    return page.render(
        "overview.html", title="Overview", found=found, charts=charts, held=_usd(found.balances_held_micros)
    )


async def search(page: Page) -> Response:
    query = page.request.query_params.get("q", "")
    result = await to_thread.run_sync(shopview.search, page.ctx, query) if query.strip() else None
    return page.render("search.html", title="Search", query=query, result=result)


async def account(page: Page) -> Response:
    account_id = int(page.request.path_params["account_id"])
    found = await to_thread.run_sync(shopview.account_page, page.ctx, account_id)
    if found is None:
        return page.dash.error_page(page, 404, f"There is no account {account_id}.")
    return page.render("account.html", title=f"Account {account_id}", found=found, operator=operator_of(page))


async def adjust(page: Page) -> Response:
    """Credit or debit: the form, then a confirmation page, then the change (``confirm=yes``)."""
    account_id = int(page.request.path_params["number"])
    kind = page.request.path_params["action"]
    form = page.form
    reason = form.get("reason", "").strip()[:500]
    try:
        micros = usd_to_micros(Decimal(form.get("amount", "").strip()))
    except (InvalidOperation, ValueError):
        micros = 0
    if micros <= 0 or not reason:
        return page.dash.error_page(page, 400, "Give a positive USD amount and the reason for it.")
    if form.get("confirm") != "yes":
        to_from = "to" if kind == "credit" else "from"
        return page.render(
            "confirm.html",
            title=f"Confirm the {kind}",
            summary=f"{kind.capitalize()} {_usd(micros)} {to_from} account {account_id}.",
            url=f"/accounts/{account_id}/{kind}",
            fields={"amount": form["amount"].strip(), "reason": reason},
            reason=reason,
            back=f"/accounts/{account_id}",
        )
    signed = micros if kind == "credit" else -micros
    try:
        await to_thread.run_sync(admin.adjust_balance, page.ctx, operator_of(page).actor, account_id, signed, reason)
    except admin.AdminError as exc:
        return _refused(page, exc)
    return page.redirect(f"/accounts/{account_id}", "credited")


async def rescan(page: Page) -> Response:
    """Re-scan the chain for one of the account's top-ups (``vpsshop admin rescan`` of its coin): the
    blocks and a reason, a confirmation page, then the scan and the pass that credits what it found."""
    account_id = int(page.request.path_params["number"])
    form = page.form
    ref, reason = form.get("topup", "").strip()[:40], form.get("reason", "").strip()[:500]
    try:
        first = int(form.get("from_height", "").strip())
        last = int(form["to_height"]) if form.get("to_height", "").strip() else None
    except ValueError:
        first, last = -1, None
    if not ref or not reason or first < 0:
        return page.dash.error_page(page, 400, "Give the top-up, the first block to read again and the reason.")
    if form.get("confirm") != "yes":
        blocks = f"blocks {first} to {last}" if last is not None else f"blocks from {first} to the node's tip"
        return page.render(
            "confirm.html",
            title="Confirm the re-scan",
            summary=f"Re-scan {blocks} of the chain that pays top-up {ref} of account {account_id}, then credit "
            "what has its confirmations (a payment is never credited twice).",
            url=f"/accounts/{account_id}/rescan",
            fields={"topup": ref, "from_height": str(first), "to_height": "" if last is None else str(last)},
            reason=reason,
            back=f"/accounts/{account_id}",
        )
    actor = operator_of(page).actor
    try:
        done = await admin.rescan_topup(page.ctx, actor, account_id, ref, first, last, reason)
    except admin.AdminError as exc:
        return _refused(page, exc)
    return page.render("done.html", title="Done", message=done, back=f"/accounts/{account_id}")


SERVER_ACTIONS = {
    "suspend": "Suspend",
    "unsuspend": "Unsuspend",
    "terminate": "Terminate (no refund)",
    "refund": "Terminate and refund the unused time",
}
JOB_ACTIONS = {"retry": "Retry", "cancel": "Cancel"}
ACTIONS = {
    "servers": {**SERVER_ACTIONS, "migrate": ""},
    "jobs": JOB_ACTIONS,
    "accounts": {
        "revoke-access": "Revoke every API key and dashboard session",
        "credit": "",
        "debit": "",
        "rescan": "",
    },
    "webhooks": {"disable": "Disable the webhook endpoint"},
}


async def server(page: Page) -> Response:
    server_id = int(page.request.path_params["server_id"])
    found = await to_thread.run_sync(shopview.server_page, page.ctx, server_id)
    if found is None:
        return page.dash.error_page(page, 404, f"There is no server {server_id}.")
    row = found["server"]
    hosts = [h for h in await _hosts(page) if row["location"] in h["locations"] and h["host"] != row["host"]]
    movable = row["status"] in ("active", "suspended") and bool(row["host"])
    return page.render(
        "server.html",
        title=f"Server {server_id}",
        found=found,
        actions=SERVER_ACTIONS,
        move_to=hosts if movable else [],
    )


async def _hosts(page: Page) -> list[dict[str, Any]]:
    """The hosts of the served locations, or none when the hypervisor backend cannot move servers."""
    try:
        return await to_thread.run_sync(admin.hosts_overview, page.ctx)
    except admin.AdminError:
        return []


HOST_ACTIONS = {
    "drain": "Drain: place no new server there",
    "undrain": "Undrain: place new servers there again",
    "evacuate": "Evacuate: drain and move every server away",
}


async def hosts(page: Page) -> Response:
    try:
        found = await to_thread.run_sync(admin.hosts_overview, page.ctx)
    except admin.AdminError as exc:
        return page.render("hosts.html", title="Hosts", hosts=[], unsupported=str(exc), actions=HOST_ACTIONS)
    traffic = await to_thread.run_sync(shopview.host_traffic, page.ctx)
    timeout = images.STATUS_TIMEOUT_SECONDS
    by_location: dict[str, list[images.ImageStatus] | None] = {}
    no_images: str | None = None
    try:
        by_location = await images.status_within(page.ctx, timeout)
    except images.ImageError as exc:
        no_images = str(exc)
    held: dict[tuple[str, str], dict[str, images.ImageStatus]] = {}
    for location, rows in by_location.items():
        for row in rows or []:
            held.setdefault((location, row.host), {})[row.os_id] = row
    image_rows = [
        {
            "host": h["host"],
            "location": location,
            "answered": by_location[location] is not None,
            "states": held.get((location, h["host"]), {}),
        }
        for h in found
        for location in h["locations"]
        if location in by_location
    ]
    return page.render(
        "hosts.html",
        title="Hosts",
        hosts=found,
        unsupported=None,
        actions=HOST_ACTIONS,
        traffic=traffic,
        no_images=no_images,
        image_rows=image_rows,
        systems=[os_.id for os_ in page.ctx.catalog_data.operating_systems],
        timeout=timeout,
    )


async def host_action(page: Page) -> Response:
    """Drain, undrain or evacuate a host: a reason, a confirmation page, then the change (``confirm=yes``)."""
    host, action = page.request.path_params["host"], page.request.path_params["action"]
    if action not in HOST_ACTIONS:
        return page.dash.error_page(page, 404, f"There is no page at {page.request.url.path}.")
    reason = page.form.get("reason", "").strip()[:500]
    if not reason:
        return page.dash.error_page(page, 400, "Say why: the reason is kept in the audit log.")
    if page.form.get("confirm") != "yes":
        return page.render(
            "confirm.html",
            title=f"Confirm: {action} {host}",
            summary=f"{HOST_ACTIONS[action]}: host {host}.",
            url=f"/hosts/{quote(host, safe='')}/{action}",
            fields={"reason": reason},
            reason=reason,
            back="/hosts",
        )
    actor = operator_of(page).actor
    try:
        if action == "evacuate":
            done = "; ".join(await to_thread.run_sync(admin.evacuate_host, page.ctx, actor, host, reason))
        else:
            done = await to_thread.run_sync(
                lambda: admin.drain_host(page.ctx, actor, host, reason, drained=action == "drain")
            )
    except admin.AdminError as exc:
        return _refused(page, exc)
    return page.render("done.html", title="Done", message=done, back="/hosts")


async def migrate(page: Page) -> Response:
    """Move a server to another host of its location (``host`` empty: the first undrained one)."""
    server_id = int(page.request.path_params["number"])
    host = page.form.get("host", "").strip() or None
    reason = page.form.get("reason", "").strip()[:500]
    if not reason:
        return page.dash.error_page(page, 400, "Say why: the reason is kept in the audit log.")
    if page.form.get("confirm") != "yes":
        target = f"host {host}" if host else "the first other undrained host of its location"
        return page.render(
            "confirm.html",
            title="Confirm: move",
            summary=f"Move server {server_id} to {target}: it is stopped, its disk copied, and started there "
            "with the same address.",
            url=f"/servers/{server_id}/migrate",
            fields={"reason": reason, "host": host or ""},
            reason=reason,
            back=f"/servers/{server_id}",
        )
    actor = operator_of(page).actor
    try:
        done = await to_thread.run_sync(admin.migrate_server, page.ctx, actor, server_id, host, reason)
    except admin.AdminError as exc:
        return _refused(page, exc)
    return page.render("done.html", title="Done", message=done, back=f"/servers/{server_id}")


async def attention(page: Page) -> Response:
    minutes = 30.0
    found = await to_thread.run_sync(admin.stuck, page.ctx, minutes)
    hooks = await to_thread.run_sync(shopview.failing_webhooks, page.ctx)
    odd = await to_thread.run_sync(shopview.topups_to_check, page.ctx)
    return page.render(
        "attention.html",
        title="Needs attention",
        found=found,
        minutes=minutes,
        actions=JOB_ACTIONS,
        hooks=hooks,
        odd_topups=odd,
    )


async def act(page: Page) -> Response:
    """A server's or a job's action: a reason, a confirmation page, then the change (``confirm=yes``)."""
    what, number = page.request.path_params["what"], page.request.path_params["number"]
    action = page.request.path_params["action"]
    names = ACTIONS.get(what, {})
    if action not in names:
        return page.dash.error_page(page, 404, f"There is no page at {page.request.url.path}.")
    if action in ("credit", "debit"):
        return await adjust(page)
    if action == "rescan":
        return await rescan(page)
    if action == "migrate":
        return await migrate(page)
    back = {"servers": f"/servers/{number}", "accounts": f"/accounts/{number}"}.get(what, "/attention")
    reason = page.form.get("reason", "").strip()[:500]
    if not reason:
        return page.dash.error_page(page, 400, "Say why: the reason is kept in the audit log.")
    thing = f"{what.removesuffix('s')} {number}"
    if page.form.get("confirm") != "yes":
        summary = f"{names[action]}: {thing}."
        return page.render(
            "confirm.html",
            title=f"Confirm: {names[action].lower()}",
            summary=summary,
            url=f"/{what}/{number}/{action}",
            fields={"reason": reason},
            reason=reason,
            back=back,
        )
    actor = operator_of(page).actor
    try:
        if what == "servers":
            state = "terminate" if action == "refund" else action
            done = await to_thread.run_sync(
                lambda: admin.set_server_state(page.ctx, actor, number, state, reason, refund_unused=action == "refund")
            )
        elif what == "jobs":
            done = await to_thread.run_sync(admin.job_action, page.ctx, actor, number, action, reason)
        elif what == "accounts":
            done = await to_thread.run_sync(admin.revoke_access, page.ctx, actor, number, reason)
        else:
            done = await to_thread.run_sync(admin.disable_webhook, page.ctx, actor, number, reason)
    except admin.AdminError as exc:
        return _refused(page, exc)
    return page.render(
        "done.html", title="Done", message=done, back=f"/{what}/{number}" if what == "servers" else "/attention"
    )


def _refused(page: Page, exc: admin.AdminError) -> Response:
    text = str(exc)
    status = 403 if "operator may" in text else 409
    return page.dash.error_page(page, status, text[:1].upper() + text[1:] + ".")


async def audit(page: Page) -> Response:
    rows = await to_thread.run_sync(admin.audit_log, page.ctx, 200)
    return page.render("audit.html", title="Audit log", rows=rows)


def routes(console: Console) -> list[BaseRoute]:
    e = console.endpoint
    return [
        Route("/", e(overview), methods=["GET"]),
        Route("/signin", e(signin_form, auth=False), methods=["GET"]),
        Route("/signin", e(signin, auth=False), methods=["POST"]),
        Route("/signout", e(signout), methods=["POST"]),
        Route("/search", e(search), methods=["GET"]),
        Route("/accounts/{account_id:int}", e(account), methods=["GET"]),
        Route("/audit", e(audit), methods=["GET"]),
        Route("/attention", e(attention), methods=["GET"]),
        Route("/servers/{server_id:int}", e(server), methods=["GET"]),
        Route("/hosts", e(hosts), methods=["GET"]),
        Route("/hosts/{host:str}/{action:str}", e(host_action), methods=["POST"]),
        Route("/{what:str}/{number:int}/{action:str}", e(act), methods=["POST"]),
        Route("/static/{name}", static_endpoint(console), methods=["GET"]),
    ]
