"""The dashboard's server pages: ordering (with SSH keys and user data), a server's page (power,
renewal for one or more cycles at the API's quoted price, automatic renewal, the root login, reverse
DNS), reinstalling, the serial console, terminating (confirmed with the hostname), and the SSH key
store.

Each action calls the operation the API calls (:mod:`vpsshop.servers`), with its limits and events.
What reaches into a server (its root password, a reinstall that shows a new one, the console)
asks for a fresh two-factor code when two-factor is on, as credentials do; so does terminating, whose
operation checks the code itself (the API asks for it too).
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.responses import JSONResponse, Response

from vpsshop import accounts
from vpsshop.dashboard.web import Page, format_usd, whole_number
from vpsshop.dashboard.words import cycles, friendly, renewal_words
from vpsshop.errors import ApiError, BadRequest
from vpsshop.hypervisor import (
    CAPABILITY_CONSOLE,
    CAPABILITY_FIREWALL,
    CAPABILITY_REINSTALL,
    CAPABILITY_RESIZE,
    CAPABILITY_SNAPSHOTS,
)
from vpsshop.inputs import parse
from vpsshop.ledger import InsufficientBalance
from vpsshop.servers import console, control, orders, renewals, resource, sshkeys, termination
from vpsshop.servers import credentials as server_credentials
from vpsshop.servers import firewall as firewalls
from vpsshop.servers import reinstall as reinstalls
from vpsshop.servers import resize as resizes
from vpsshop.servers import snapshots as snapshot_ops
from vpsshop.servers.control import POWER_ACTIONS, ServerChange
from vpsshop.servers.orders import OrderInput
from vpsshop.servers.reinstall import ReinstallInput
from vpsshop.servers.renewals import RenewInput
from vpsshop.servers.resize import ResizeInput, ResizeQuoteOut
from vpsshop.servers.sshkeys import SshKeyInput
from vpsshop.servers.termination import TerminateInput

# ---- the list and the order form -------------------------------------------------------------------


async def servers_page(page: Page) -> Response:
    servers = await resource.list_servers(page.ctx, page.customer)
    return page.render("servers.html", title="Servers", servers=servers.servers)


def _pricing(page: Page) -> dict[str, dict[str, str]]:
    """Each plan and location's price per cycle as the page prints it (the script shows these texts
    as they are, so the price has one format)."""
    return {
        f"{p.plan}:{p.location}": {
            "monthly": format_usd(p.monthly_usd),
            "annual": format_usd(p.annual_usd),
            "monthly_usd": str(p.monthly_usd),
            "annual_usd": str(p.annual_usd),
        }
        for p in page.ctx.catalog.pricing
    }


async def order_form(
    page: Page,
    *,
    error: str | None = None,
    deficit: Any = None,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> Response:
    account = await accounts.get_account(page.ctx, page.customer)
    keys = await sshkeys.list_keys(page.ctx, page.customer)
    catalog = page.ctx.catalog
    form = {
        "plan": catalog.plans[0].id,
        "location": (_orderable(page) or catalog.locations)[0].id,
        "os": _orderable_systems(page)[0].id,
        "cycle": "monthly",
        **page.form,
    }
    price = next((p for p in catalog.pricing if p.plan == form["plan"] and p.location == form["location"]), None)
    shown = None if price is None else price.annual_usd if form.get("cycle") == "annual" else price.monthly_usd
    return page.render(
        "order.html",
        status,
        headers,
        title="Order a server",
        account=account,
        locations=_orderable(page),
        systems=_orderable_systems(page),
        catalog=catalog,
        form=form,
        ssh_keys=keys.ssh_keys,
        chosen_keys=set(page.values("ssh_keys")),
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
    if page.values("ssh_keys"):
        data["ssh_keys"] = [whole_number(v) for v in page.values("ssh_keys")]
    if page.text("user_data").strip():
        data["user_data"] = page.text("user_data")
    key = form.get("idempotency_key") or None
    try:
        body = parse(OrderInput, data)
        done = await orders.place_order(
            page.ctx, page.customer, body, idempotency_key=f"dashboard:{key}" if key else None
        )
    except InsufficientBalance as exc:
        page.form.pop("root_password", None)
        return await order_form(page, error=friendly(exc), deficit=exc.extra.get("deficit"), status=402)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        page.form.pop("root_password", None)
        return await order_form(page, error=friendly(exc), status=exc.status, headers=exc.headers)
    return page.redirect(f"servers/{done.order.server.id}", "ordered")


# ---- a server's page ---------------------------------------------------------------------------------


def _names(page: Page) -> dict[str, str]:
    data = page.ctx.catalog_data
    return {
        **{p.id: p.name for p in data.plans},
        **{f"loc:{loc.id}": loc.name for loc in data.locations},
        **{f"os:{o.id}": o.name for o in data.operating_systems},
    }


def _server_id(page: Page) -> int:
    return int(page.request.path_params["id"])


def _orderable(page: Page) -> list[Any]:
    """The catalog's locations the hypervisor serves (an order elsewhere is refused with 409)."""
    return [loc for loc in page.ctx.catalog.locations if page.ctx.serves_location(loc.id)]


def _orderable_systems(page: Page) -> list[Any]:
    """The catalog's systems some orderable location holds the image of (an order elsewhere is a 409)."""
    offered = {os_id for loc in _orderable(page) for os_id in page.ctx.orderable_systems(loc.id)}
    return [o for o in page.ctx.catalog.operating_systems if o.id in offered] or page.ctx.catalog.operating_systems


def _periods(text: str) -> int:
    """The form's number of periods, checked as the API checks ``periods`` (a whole number, 1 to 120)."""
    return parse(RenewInput, {"periods": whole_number(text.strip() or "1")}).periods


async def server_page(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, periods: int = 1, **extra: Any
) -> Response:
    """A server's page; ``extra`` carries what an action adds (an error in its section, the password)."""
    server_id = _server_id(page)
    server = await resource.get_server(page.ctx, page.customer, server_id)
    account = await accounts.get_account(page.ctx, page.customer)
    quote, quote_text = None, None
    if server.status in ("active", "suspended"):
        try:
            quote = await renewals.quote_renewal(page.ctx, page.customer, server_id, RenewInput(periods=periods))
            quote_text = renewal_words(quote, server.cycle)
        except ApiError as exc:  # the prepay horizon is reached: the API's words say so
            if exc.status >= 500:
                raise
            quote_text = friendly(exc)
    return page.render(
        "server.html",
        status,
        headers,
        title=f"Server {server.hostname}",
        server=server,
        account=account,
        names=_names(page),
        quote=quote,
        quote_text=quote_text,
        renew_label=f"Renew now for {cycles(quote.periods, server.cycle)}" if quote else None,
        horizon_days=page.ctx.settings.servers.max_prepay_days,
        unit="years" if server.cycle == "annual" else "months",
        has_dns=page.ctx.dns is not None,
        can_reinstall=page.can(CAPABILITY_REINSTALL),
        can_resize=page.can(CAPABILITY_RESIZE),
        can_console=page.can(CAPABILITY_CONSOLE),
        **extra,
    )


async def show_server(page: Page) -> Response:
    return await server_page(page)


async def server_status(page: Page) -> Response:
    server = await resource.get_server(page.ctx, page.customer, _server_id(page))
    return JSONResponse({"status": server.status, "ip": server.ip}, headers={"Cache-Control": "no-store"})


async def power(page: Page) -> Response:
    action = page.form.get("action", "")
    if action not in POWER_ACTIONS:
        raise BadRequest("invalid_action", "Choose start, stop or reboot.")
    server_id = _server_id(page)
    try:
        await control.power(page.ctx, page.customer, server_id, action)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await server_page(page, status=exc.status, headers=exc.headers, power_error=friendly(exc))
    return page.redirect(f"servers/{server_id}", f"power-{action}")


async def renew(page: Page) -> Response:
    """Renew for ``periods`` cycles. The form carries the period count its shown price was quoted for
    (``quoted``; the script keeps it current): when they differ, nothing is charged and the page
    shows the price of the new count first."""
    server_id = _server_id(page)
    try:
        periods = _periods(page.form.get("periods", "1"))
    except ApiError as exc:
        return await server_page(page, status=exc.status, renew_error=friendly(exc))
    if page.form.get("quoted", "1") != str(periods):
        try:
            await renewals.quote_renewal(page.ctx, page.customer, server_id, RenewInput(periods=periods))
        except ApiError as exc:
            if exc.status >= 500:
                raise
            return await server_page(page, status=exc.status, renew_error=friendly(exc))
        return await server_page(page, periods=periods, renew_confirm=True)
    try:
        result = (await renewals.renew_server(page.ctx, page.customer, server_id, RenewInput(periods=periods))).renewal
    except InsufficientBalance as exc:
        return await server_page(
            page, status=402, periods=periods, renew_error=friendly(exc), renew_deficit=exc.extra.get("deficit")
        )
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await server_page(page, status=exc.status, headers=exc.headers, periods=1, renew_error=friendly(exc))
    return page.redirect(f"servers/{server_id}", "renewed" if result.charged_usd else "renew-none")


async def renew_quote(page: Page) -> Response:
    """The price of a renewal for ``?periods=``, for the page's script: the API's quote, in the
    page's words."""
    server_id = _server_id(page)
    try:
        periods = _periods(page.request.query_params.get("periods", "1")[:6])
        server = await resource.get_server(page.ctx, page.customer, server_id)
        quote = await renewals.quote_renewal(page.ctx, page.customer, server_id, RenewInput(periods=periods))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return JSONResponse({"ok": False, "text": friendly(exc)}, exc.status, headers={"Cache-Control": "no-store"})
    return JSONResponse(
        {
            "ok": True,
            "periods": periods,
            "text": renewal_words(quote, server.cycle),
            "sufficient": quote.sufficient,
            "label": f"Renew now for {cycles(periods, server.cycle)}",
        },
        headers={"Cache-Control": "no-store"},
    )


async def auto_renew(page: Page) -> Response:
    server_id = _server_id(page)
    on = page.form.get("auto_renew") == "on"
    try:
        await control.change_server(page.ctx, page.customer, server_id, ServerChange(auto_renew=on))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await server_page(page, status=exc.status, headers=exc.headers, renew_error=friendly(exc))
    return page.redirect(f"servers/{server_id}", "auto-renew-on" if on else "auto-renew-off")


async def credentials(page: Page) -> Response:
    server_id = _server_id(page)
    account = await accounts.get_account(page.ctx, page.customer)
    refused = await page.fresh_code(account.totp_enabled)
    if refused is not None:
        return await server_page(
            page, status=refused.status, headers=refused.headers, credentials_error=refused.message
        )
    creds = await server_credentials.reveal_credentials(page.ctx, page.customer, server_id)
    return await server_page(page, headers={"Pragma": "no-cache"}, credentials=creds)


async def reverse_dns(page: Page) -> Response:
    server_id = _server_id(page)
    name = page.form.get("reverse_dns", "").strip().rstrip(".") or None
    try:
        await control.change_server(page.ctx, page.customer, server_id, parse(ServerChange, {"reverse_dns": name}))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await server_page(page, status=exc.status, headers=exc.headers, rdns_error=friendly(exc), rdns=name)
    return page.redirect(f"servers/{server_id}", "rdns-set" if name else "rdns-cleared")


# ---- firewall ----------------------------------------------------------------------------------------------


def rule_lines(rules: list[resource.FirewallRuleOut]) -> str:
    """The rules one a line, as the firewall form takes them: ``tcp 8000-8100 198.51.100.0/24``."""
    return "\n".join(" ".join(p for p in (r.protocol, r.ports or "", r.source or "") if p) for r in rules)


def parse_rule_lines(text: str) -> list[dict[str, str]]:
    """The form's lines as the operation's rules: ``<protocol> [ports] [source]`` (a source has a dot
    or a colon, so ``tcp 10.0.0.0/8`` is every TCP port from that prefix); blank lines and ``#``
    comments are skipped.

    :raises BadRequest: invalid_rule, naming the line.
    """
    rules = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        rule = {"protocol": words[0].lower()}
        for word in words[1:]:
            key = "source" if ("." in word or ":" in word) else "ports"
            if key in rule:
                raise BadRequest("invalid_rule", f"Line {n}: write the protocol, then ports, then a source.")
            rule[key] = word
        rules.append(rule)
    return rules


async def firewall_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    server = await resource.get_server(page.ctx, page.customer, _server_id(page))
    return page.render(
        "firewall.html",
        status,
        headers,
        title=f"Firewall of {server.hostname}",
        server=server,
        rules_text=extra.pop("rules_text", rule_lines(server.firewall)),
        most=page.ctx.settings.servers.firewall_max_rules,
        can_firewall=page.can(CAPABILITY_FIREWALL),
        **extra,
    )


async def firewall_page(page: Page) -> Response:
    return await firewall_form(page)


async def set_firewall(page: Page) -> Response:
    server_id = _server_id(page)
    text = page.form.get("rules", "")
    try:
        body = parse(firewalls.FirewallIn, {"rules": parse_rule_lines(text)})
        await firewalls.set_firewall(page.ctx, page.customer, server_id, body)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await firewall_form(page, status=exc.status, headers=exc.headers, error=friendly(exc), rules_text=text)
    return page.redirect(f"servers/{server_id}/firewall", "firewall-set")


# ---- snapshots ---------------------------------------------------------------------------------------------


async def snapshots_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    server_id = _server_id(page)
    server = await resource.get_server(page.ctx, page.customer, server_id)
    held = await snapshot_ops.list_snapshots(page.ctx, page.customer, server_id)
    return page.render(
        "snapshots.html",
        status,
        headers,
        title=f"Snapshots of {server.hostname}",
        server=server,
        held=held,
        price=format_usd(held.monthly_price_usd),
        can_snapshot=page.can(CAPABILITY_SNAPSHOTS),
        **extra,
    )


async def snapshots_page(page: Page) -> Response:
    return await snapshots_form(page)


async def _snapshot_action(page: Page, action: Any, notice: str) -> Response:
    server_id = _server_id(page)
    try:
        await action(server_id)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await snapshots_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return page.redirect(f"servers/{server_id}/snapshots", notice)


async def take_snapshot(page: Page) -> Response:
    async def take(server_id: int) -> None:
        body = parse(snapshot_ops.SnapshotIn, {"name": page.form.get("name", "").strip() or None})
        await snapshot_ops.create_snapshot(page.ctx, page.customer, server_id, body)

    return await _snapshot_action(page, take, "snapshot-taken")


async def restore_snapshot(page: Page) -> Response:
    snapshot_id = int(page.request.path_params["snapshot_id"])

    async def restore(server_id: int) -> None:
        await snapshot_ops.restore_snapshot(page.ctx, page.customer, server_id, snapshot_id)

    return await _snapshot_action(page, restore, "snapshot-restoring")


async def delete_snapshot(page: Page) -> Response:
    snapshot_id = int(page.request.path_params["snapshot_id"])

    async def delete(server_id: int) -> None:
        await snapshot_ops.delete_snapshot(page.ctx, page.customer, server_id, snapshot_id)

    return await _snapshot_action(page, delete, "snapshot-deleted")


# ---- reinstall ---------------------------------------------------------------------------------------------


async def reinstall_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    server = await resource.get_server(page.ctx, page.customer, _server_id(page))
    account = await accounts.get_account(page.ctx, page.customer)
    keys = await sshkeys.list_keys(page.ctx, page.customer)
    return page.render(
        "reinstall.html",
        status,
        headers,
        title=f"Reinstall {server.hostname}",
        server=server,
        account=account,
        catalog=page.ctx.catalog,
        ssh_keys=keys.ssh_keys,
        chosen_keys=set(page.values("ssh_keys")),
        form={"os": server.os, **page.form},
        can_reinstall=page.can(CAPABILITY_REINSTALL),
        **extra,
    )


async def reinstall_page(page: Page) -> Response:
    return await reinstall_form(page)


async def reinstall(page: Page) -> Response:
    """``POST /v1/servers/{id}/reinstall``: the disk erased and made anew; a new password shown once."""
    server_id = _server_id(page)
    account = await accounts.get_account(page.ctx, page.customer)
    if page.form.get("confirm") != "yes":
        page.form.pop("root_password", None)
        return await reinstall_form(
            page, status=400, error="Tick the box to confirm that everything on the disk may be erased."
        )
    refused = await page.fresh_code(account.totp_enabled)
    if refused is not None:
        page.form.pop("root_password", None)
        return await reinstall_form(page, status=refused.status, headers=refused.headers, code_error=refused.message)
    data: dict[str, Any] = {"os": page.form.get("os", "")}
    if page.values("ssh_keys"):
        data["ssh_keys"] = [whole_number(v) for v in page.values("ssh_keys")]
    if page.form.get("root_password", ""):
        data["root_password"] = page.form["root_password"]
    if page.text("user_data").strip():
        data["user_data"] = page.text("user_data")
    try:
        body = parse(ReinstallInput, data)
        done = await reinstalls.reinstall_server(page.ctx, page.customer, server_id, body)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        page.form.pop("root_password", None)
        return await reinstall_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return page.render(
        "reinstalled.html",
        202,
        {"Pragma": "no-cache"},
        title=f"Reinstalling {done.server.hostname}",
        server=done.server,
        password=done.root_password,
        os_name=_names(page).get(f"os:{done.server.os}", done.server.os),
    )


# ---- resize ------------------------------------------------------------------------------------------------


async def resize_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    """The plans the server may move to, each with the API's quote (or why it cannot)."""
    server_id = _server_id(page)
    server = await resource.get_server(page.ctx, page.customer, server_id)
    choices: list[tuple[Any, ResizeQuoteOut | None, str | None]] = []
    if page.can(CAPABILITY_RESIZE) and server.status == "active":
        for plan in page.ctx.catalog_data.plans:
            if plan.id == server.plan:
                continue
            try:
                quote = await resizes.quote_resize(page.ctx, page.customer, server_id, ResizeInput(plan=plan.id))
                choices.append((plan, quote, None))
            except ApiError as exc:
                if exc.status >= 500:
                    raise
                choices.append((plan, None, friendly(exc)))
    return page.render(
        "resize.html",
        status,
        headers,
        title=f"Resize {server.hostname}",
        server=server,
        choices=choices,
        can_resize=page.can(CAPABILITY_RESIZE),
        **extra,
    )


async def resize_page(page: Page) -> Response:
    return await resize_form(page)


async def resize(page: Page) -> Response:
    """``POST /v1/servers/{id}/resize``: the difference charged, then the VM restarted with the new plan."""
    server_id = _server_id(page)
    try:
        body = parse(ResizeInput, {"plan": page.form.get("plan", "")})
        await resizes.resize_server(page.ctx, page.customer, server_id, body)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await resize_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return page.redirect(f"servers/{server_id}", "resized")


# ---- terminate ---------------------------------------------------------------------------------------------


async def terminate_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    server_id = _server_id(page)
    server = await resource.get_server(page.ctx, page.customer, server_id)
    account = await accounts.get_account(page.ctx, page.customer)
    return page.render(
        "terminate.html",
        status,
        headers,
        title=f"Terminate {server.hostname}",
        server=server,
        account=account,
        credit=await termination.quote_termination(page.ctx, page.customer, server_id),
        idempotency_key=page.form.get("idempotency_key") or secrets.token_urlsafe(16),
        **extra,
    )


async def terminate_page(page: Page) -> Response:
    return await terminate_form(page)


async def terminate(page: Page) -> Response:
    """``DELETE /v1/servers/{id}``, confirmed by typing the hostname (and a fresh two-factor code
    when it is on, which the operation checks)."""
    server_id = _server_id(page)
    hostname = page.form.get("hostname", "").strip()
    if not hostname:
        return await terminate_form(page, status=400, error="Type the server's hostname to confirm.")
    data: dict[str, Any] = {"confirm_hostname": hostname}
    if page.form.get("code", "").strip():
        data["totp_code"] = page.form["code"]
    key = page.form.get("idempotency_key") or None
    try:
        body = parse(TerminateInput, data)
        done = await termination.terminate_server(
            page.ctx, page.customer, server_id, body, idempotency_key=f"dashboard:{key}" if key else None
        )
    except ApiError as exc:
        if exc.status >= 500:
            raise
        if exc.error in ("totp_required", "invalid_totp_code"):
            return await terminate_form(page, status=exc.status, headers=exc.headers, code_error=friendly(exc))
        return await terminate_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return await server_page(page, terminated=done.server)


# ---- the serial console ---------------------------------------------------------------------------------


async def console_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, **extra: Any
) -> Response:
    server = await resource.get_server(page.ctx, page.customer, _server_id(page))
    account = await accounts.get_account(page.ctx, page.customer)
    return page.render(
        "console.html",
        status,
        headers,
        title=f"Console of {server.hostname}",
        server=server,
        account=account,
        can_console=page.can(CAPABILITY_CONSOLE),
        scripts=["console.js"] if extra.get("ticket") else [],
        **extra,
    )


async def console_page(page: Page) -> Response:
    return await console_form(page)


async def open_console(page: Page) -> Response:
    """A ticket from ``POST /v1/servers/{id}/console``; the page's script opens the WebSocket with it."""
    account = await accounts.get_account(page.ctx, page.customer)
    refused = await page.fresh_code(account.totp_enabled)
    if refused is not None:
        return await console_form(page, status=refused.status, headers=refused.headers, code_error=refused.message)
    try:
        ticket = await console.open_console(page.ctx, page.customer, _server_id(page))
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await console_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return await console_form(page, ticket=ticket)


# ---- SSH keys -----------------------------------------------------------------------------------------------


async def ssh_keys_form(
    page: Page, *, status: int = 200, headers: dict[str, str] | None = None, error: str | None = None
) -> Response:
    keys = await sshkeys.list_keys(page.ctx, page.customer)
    return page.render(
        "ssh_keys.html", status, headers, title="SSH keys", keys=keys.ssh_keys, error=error, form=page.form
    )


async def ssh_keys_page(page: Page) -> Response:
    return await ssh_keys_form(page)


async def add_ssh_key(page: Page) -> Response:
    try:
        await sshkeys.add_key(
            page.ctx,
            page.customer,
            parse(
                SshKeyInput, {"name": page.form.get("name", "").strip(), "public_key": page.text("public_key").strip()}
            ),
        )
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return await ssh_keys_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return page.redirect("ssh-keys", "ssh-key-added")


async def delete_ssh_key(page: Page) -> Response:
    try:
        await sshkeys.delete_key(page.ctx, page.customer, int(page.request.path_params["id"]))
    except ApiError as exc:
        if exc.status >= 500 or exc.status == 404:
            raise
        return await ssh_keys_form(page, status=exc.status, headers=exc.headers, error=friendly(exc))
    return page.redirect("ssh-keys", "ssh-key-deleted")
