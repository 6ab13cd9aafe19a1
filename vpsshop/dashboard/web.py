"""What every dashboard page shares: the session cookie, CSRF, form parsing, security headers and
rendering.

* **Session**: the cookie holds a random token (:mod:`vpsshop.sessions`); HttpOnly, SameSite=Lax,
  Path=/, and when ``public_url`` is https also Secure with the ``__Host-`` name prefix.
* **CSRF**: every form carries a token. Signed in, it is a keyed digest of the session, so it dies
  with the session; before sign-in (the sign-in and create-account forms) it is a random value
  also set in a cookie (double submit). A POST whose token does not match, or that the browser
  marks ``Sec-Fetch-Site: cross-site``, is refused with 403 before anything runs.
* **Headers**: a Content-Security-Policy that allows no inline script or style and no framing,
  ``nosniff``, ``no-store`` (pages show balances and credentials), ``same-origin`` referrers.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from importlib.resources import files
from typing import Any
from urllib.parse import parse_qsl, quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from vpsshop import sessions, twofactor
from vpsshop.actors import Customer
from vpsshop.auth import keyed_digest
from vpsshop.context import AppContext
from vpsshop.errors import ApiError, PluginError
from vpsshop.money import micros_to_usd
from vpsshop.sessions import ActiveSession, token_digest

log = logging.getLogger("vpsshop.dashboard")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}
MAX_FORM_BYTES = 60 * 1024
"""Largest form body: user data (16 KiB of text) URL-encoded, with the other fields (under the server's 64 KiB)."""
MAX_FORM_FIELDS = 100

# Messages shown after a redirect, by key: the query string never carries free text.
NOTICES = {
    "signed-out": "You are signed out.",
    "session-ended": "Your session ended. Sign in again with your login token.",
    "ordered": "Server ordered and paid.",  # the status below says whether it is still being created
    "renewed": "Renewed: the server is paid until the date shown below.",
    "renew-none": "That period was already renewed; nothing more was charged.",
    "auto-renew-on": "Automatic renewal is on.",
    "auto-renew-off": "Automatic renewal is off: the server stops at its expiry unless you renew it.",
    "power-start": "Start requested. It runs on the host within seconds.",
    "power-stop": "Stop requested. It runs on the host within seconds.",
    "power-reboot": "Reboot requested. It runs on the host within seconds.",
    "key-revoked": "The key is revoked: it stops working from its next request.",
    "wallet-removed": "The wallet is removed: it no longer signs in to this account.",
    "ssh-key-added": "The SSH key is stored. Choose it when you order or reinstall a server.",
    "ssh-key-deleted": "The SSH key is deleted. Servers made with it keep it until they are reinstalled.",
    "resized": "Resize paid. The server restarts with its new plan within a minute; its disk grows at that boot.",
    "rdns-set": "Reverse DNS saved. The shop's DNS is updated within seconds.",
    "rdns-cleared": "Reverse DNS removed. The shop's DNS is updated within seconds.",
    "firewall-set": "Firewall saved. The host applies it within seconds.",
    "snapshot-taken": "The snapshot is being taken: it is ready within seconds.",
    "snapshot-restoring": "The server is being restored to the snapshot: it runs again within seconds.",
    "snapshot-deleted": "The snapshot is being deleted: it is no longer billed.",
    "webhook-deleted": "The webhook endpoint is deleted: nothing more is sent to it.",
    "webhook-saved": "The webhook endpoint is changed.",
    "webhook-enabled": "The webhook endpoint is on again: pending deliveries resume.",
    "webhook-disabled": "The webhook endpoint is paused: events that happen now are not queued for it.",
    "redelivery-queued": "The event is queued to be sent again within seconds. Its delivery is at the top of the log.",
    "topup-cancelled": "The top-up is cancelled. A payment that still arrives to its address is credited anyway.",
    "totp-off": "Two-factor sign-in is off.",
    "sessions-ended": "Every other session is signed out.",
    "session-gone": "That session is signed out.",
}


@dataclass
class Page:
    """One dashboard request: the session, the parsed form and what templates need."""

    request: Request
    dash: Dashboard
    session: ActiveSession | None
    form: dict[str, str] = field(default_factory=dict)
    """The form's fields (the last value of a repeated one)."""
    lists: dict[str, list[str]] = field(default_factory=dict)
    """Every value of each field, in order (checkboxes sharing a name)."""
    csrf: str = ""
    new_csrf_cookie: str | None = None
    signed_in_now: bool = False
    """A session was opened by this request (a new account): its pages show the signed-in view."""

    def adopt(self, session_token: str) -> None:
        """This request opened a session: its forms carry that session's CSRF token."""
        self.csrf = self.dash.csrf_for_digest(token_digest(self.dash.ctx, session_token))
        self.signed_in_now = True

    @property
    def account_id(self) -> int:
        assert self.session is not None, "page declared auth=False"
        return self.session.account_id

    @property
    def ctx(self) -> AppContext:
        return self.dash.ctx

    @property
    def customer(self) -> Customer:
        """The account of the session: what the page's operations act for."""
        return Customer(self.account_id)

    def can(self, capability: str) -> bool:
        """Whether the shop's hypervisor backend has ``capability`` (``reinstall``, ``console``)."""
        backend = self.ctx.hypervisor
        return backend is not None and capability in backend.capabilities

    @property
    def client(self) -> str:
        return self.request.client.host if self.request.client else "unknown"

    async def fresh_code(self, totp_enabled: bool) -> ApiError | None:
        """With two-factor on, check the form's ``code`` (a code works once): None when it passes or
        two-factor is off, else the refusal to show (401 wrong or missing, 429 too many)."""
        if not totp_enabled:
            return None
        try:
            await twofactor.verify(self.ctx, self.customer, self.form.get("code"))
        except ApiError as exc:
            if exc.status >= 500:
                raise
            if exc.status == 400:  # totp_required: the field was empty
                return ApiError(401, exc.error, exc.message)
            return exc
        return None

    def values(self, name: str) -> list[str]:
        """Every value the form sent for ``name`` (empty when none)."""
        return self.lists.get(name, [])

    def text(self, name: str) -> str:
        """A multi-line field as the API takes it: the browser's CRLF line ends made LF (a script with
        CR at its line ends would not run)."""
        return self.form.get(name, "").replace("\r\n", "\n").replace("\r", "\n")

    def render(
        self, template: str, status: int = 200, headers: dict[str, str] | None = None, **context: Any
    ) -> Response:
        return self.dash.render(self, template, status, headers, **context)

    def redirect(self, path: str, notice: str | None = None) -> Response:
        return self.dash.redirect(path, notice)


Handler = Callable[[Page], Awaitable[Response]]


class Dashboard:
    """The pages of one shop under ``base`` (``[dashboard] path``, default ``/dashboard``)."""

    def __init__(self, ctx: AppContext, base: str) -> None:
        self.ctx = ctx
        self.base = base
        self.secure = ctx.settings.behind_tls
        prefix = "__Host-" if self.secure else ""
        self.notices = NOTICES
        self.session_cookie = f"{prefix}vpsshop_session"
        self.csrf_cookie = f"{prefix}vpsshop_csrf"
        self.env = Environment(
            loader=PackageLoader("vpsshop.dashboard", "templates"),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            usd=format_usd,
            when=format_when,
            relative=self.relative,
            signed=format_signed,
            micros=lambda value: format_usd(micros_to_usd(int(value))),
            data_size=format_data_size,
        )
        self.static = {
            name: (files("vpsshop.dashboard") / "static" / name).read_bytes()
            for name in ("dashboard.css", "dashboard.js", "console.js")
        }
        self.static_version = hashlib.sha256(b"".join(self.static.values())).hexdigest()[:12]
        self.env.globals.update(
            base=base,
            static_version=self.static_version,
            mode=ctx.settings.mode,
            shop_name=ctx.settings.dashboard.shop_name,
        )

    # ---- responses --------------------------------------------------------------------------------

    def render(
        self, page: Page, template: str, status: int = 200, headers: dict[str, str] | None = None, **context: Any
    ) -> Response:
        notice = self.notices.get(page.request.query_params.get("notice", ""))
        signed_in = page.signed_in_now or (page.session is not None and not page.session.pending_totp)
        html = self.env.get_template(template).render(
            csrf=page.csrf,
            signed_in=signed_in,
            notice=notice,
            path=page.request.url.path,
            api_base=self.api_base(page.request),
            **context,
        )
        return HTMLResponse(html, status, headers=headers)

    def api_base(self, request: Request) -> str:
        """Where the API is, as the pages tell it: ``public_url``; in a sandbox, which serves on any
        port, the address this page was asked on."""
        if self.ctx.settings.sandbox:
            return f"{request.url.scheme}://{request.url.netloc}/v1"
        return self.ctx.settings.public_url.rstrip("/")

    def redirect(self, path: str, notice: str | None = None) -> Response:
        target = path if path.startswith("/") else f"{self.base}/{path}"
        if notice:
            target += ("&" if "?" in target else "?") + "notice=" + quote(notice)
        return RedirectResponse(target, 303)

    def finish(self, page: Page, response: Response) -> None:
        if page.new_csrf_cookie and not isinstance(response, JSONResponse):
            self.set_cookie(response, self.csrf_cookie, page.new_csrf_cookie, max_age=None)
        secure_headers(response, self.secure)

    def set_cookie(self, response: Response, name: str, value: str, max_age: int | None) -> None:
        response.set_cookie(name, value, max_age=max_age, path="/", secure=self.secure, httponly=True, samesite="lax")

    def sign_in(self, response: Response, token: str) -> None:
        hours = self.ctx.settings.dashboard.session_max_hours
        self.set_cookie(response, self.session_cookie, token, max_age=hours * 3600)

    def sign_out(self, response: Response) -> None:
        response.delete_cookie(self.session_cookie, path="/", secure=self.secure, httponly=True, samesite="lax")

    def relative(self, when: datetime | None, past: bool = False) -> str:
        """``in 3 days`` or ``5 minutes ago``. ``past``: the time cannot be ahead of now (a last use):
        a moment ahead, as another process's clock may give, reads as less than a minute ago."""
        if when is None:
            return ""
        delta = (when - self.ctx.clock.now()).total_seconds()
        future = delta > 0 and not past
        seconds = int(abs(delta)) if not (past and delta > 0) else 0
        for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if seconds >= size:
                count = seconds // size
                text = f"{count} {unit}{'s' if count != 1 else ''}"
                break
        else:
            text = "less than a minute"
        return f"in {text}" if future else f"{text} ago"

    # ---- the request pipeline -----------------------------------------------------------------------

    def csrf_for(self, session: ActiveSession) -> str:
        return self.csrf_for_digest(session.token_hash)

    def csrf_for_digest(self, token_hash: str) -> str:
        return keyed_digest(self.ctx.settings.secret_key_bytes(), "dashboard csrf", token_hash)[:43]

    def endpoint(
        self, handler: Handler, *, auth: bool = True, pending: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        """A Starlette endpoint running ``handler`` with the session, CSRF and header rules.

        :param auth: the page needs a signed-in session (else: to the sign-in page).
        :param pending: the page is the two-factor step: it needs a session waiting for its code.
        """

        async def serve(request: Request) -> Response:
            session = await sessions.resolve(self.ctx, request.cookies.get(self.session_cookie))
            page = Page(request, self, session)
            response = await self._run(page, handler, auth, pending)
            self.finish(page, response)
            return response

        serve.__name__ = handler.__name__
        return serve

    async def _run(self, page: Page, handler: Handler, auth: bool, pending: bool) -> Response:
        request, session = page.request, page.session
        if pending:
            if session is None or not session.pending_totp:
                return self.redirect("signin", "session-ended")
        elif auth and session is not None and session.pending_totp:
            return self.redirect("signin/code")  # the login token was right; the code is still to come
        elif auth and session is None:
            if self.session_cookie not in request.cookies:
                return self.redirect("signin")
            response = self.redirect("signin", "session-ended")  # signed out, revoked or expired
            self.sign_out(response)
            return response
        if session is not None:
            page.csrf = self.csrf_for(session)
        else:
            page.csrf = request.cookies.get(self.csrf_cookie) or ""
            if len(page.csrf) != 43:
                page.csrf = page.new_csrf_cookie = secrets.token_urlsafe(32)
        if request.method == "POST":
            refused = await self._read_form(page)
            if refused is not None:
                return refused
        try:
            return await handler(page)
        except ApiError as exc:
            return self.error_page(page, exc.status, exc.message, exc.headers)
        except PluginError as exc:
            log.error("plugin failure on %s %s: %s", request.method, request.url.path, exc)
            # The plugin's text (node addresses, setting names) stays in the operator's log.
            return self.error_page(
                page, 503, "A service this page needs is not available right now. Try again in a minute."
            )
        except Exception:
            log.exception("dashboard failure on %s %s", request.method, request.url.path)
            return self.error_page(page, 500, "The server failed; try again shortly.")

    async def _read_form(self, page: Page) -> Response | None:
        request = page.request
        if request.headers.get("sec-fetch-site") == "cross-site":
            return self.error_page(page, 403, "This form was sent from another site, so it was refused.")
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/x-www-form-urlencoded":
            return self.error_page(page, 415, "The dashboard takes forms sent by its own pages only.")
        raw = await request.body()
        if len(raw) > MAX_FORM_BYTES:
            return self.error_page(page, 413, "The form is too large.")
        try:
            pairs = parse_qsl(
                raw.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS, strict_parsing=False
            )
        except (UnicodeDecodeError, ValueError):
            return self.error_page(page, 400, "The form could not be read.")
        page.form = dict(pairs)
        for name, value in pairs:
            page.lists.setdefault(name, []).append(value)
        sent = page.form.pop("csrf", "")
        if not page.csrf or not hmac.compare_digest(sent.encode(), page.csrf.encode()):
            return self.error_page(
                page,
                403,
                "This form has expired or did not come from this dashboard, so nothing "
                "was done. Reload the page and send it again.",
            )
        return None

    def http_error_page(self, request: Request, status: int) -> Response:
        """The page for a path or method the dashboard does not have (the app's 404 and 405)."""
        page = Page(request, self, None)
        message = {
            404: f"There is no page at {request.url.path}.",
            405: "That address does not take this kind of request.",
        }.get(status, "The request was refused.")
        response = self.error_page(page, status, message)
        secure_headers(response, self.secure)
        return response

    def error_page(self, page: Page, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        titles = {
            400: "That did not work",
            401: "Not signed in",
            402: "Balance too low",
            403: "Refused",
            404: "Not found",
            409: "Not possible now",
            410: "Gone",
            429: "Too many attempts",
            503: "Temporarily unavailable",
        }
        return self.render(
            page,
            "error.html",
            status,
            headers,
            title=titles.get(status, "Something went wrong"),
            message=message,
            code=status,
        )


def whole_number(text: str) -> int | str:
    """A form field's whole number as a number: forms send text, and the API's models take a number
    only as a JSON number (``"3"`` and ``true`` are refused). Other text is returned as it is, for the
    model to refuse in its own words."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else text


def secure_headers(response: Response, secure: bool) -> None:
    for name, value in PAGE_HEADERS.items():
        response.headers.setdefault(name, value)
    if secure:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")


def format_data_size(value: int) -> str:
    """Bytes in decimal units, as the catalog sells traffic: ``1.23 GB``, ``2 TB``, ``512 kB``."""
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value} B"


def format_usd(value: Decimal | int | float | None) -> str:
    if value is None:
        return ""
    amount = Decimal(str(value))
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    text = f"{amount:,.2f}" if amount == amount.quantize(Decimal("0.01")) else f"{amount:,.6f}".rstrip("0")
    return f"{sign}${text}"


def format_signed(value: Decimal) -> str:
    return ("+" if value > 0 else "") + format_usd(value)


def format_when(value: datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
