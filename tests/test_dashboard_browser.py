"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against the real
`vpsshop serve` (a sandbox on a temporary SQLite database, a subprocess on a free port).

Every page visited is checked with axe-core (no serious or critical violation), at phone width
for content wider than the screen, and photographed at desktop and phone width. The photographs go
to a temporary folder, or to ``$VPSSHOP_SCREENSHOTS`` (``VPSSHOP_SCREENSHOTS=docs/images`` refreshes
the ones README.md shows).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyotp
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
VPSSHOP = str(Path(sys.executable).with_name("vpsshop"))
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
AXE = ROOT / ".peers" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Shop:
    """A `vpsshop serve` sandbox in its own folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base = f"{self.url}/dashboard"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
        self.log = open(folder / "serve.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [VPSSHOP, "serve", "--port", str(self.port)],
            cwd=folder,
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"vpsshop serve exited: {(self.folder / 'serve.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError("vpsshop serve did not answer within 90 s")

    def credit(self, user_id: int, usd: str) -> str:
        """Fund an account the way README says: `vpsshop admin credit`."""
        result = subprocess.run(
            [VPSSHOP, "admin", "credit", str(user_id), usd, "--reason", "browser test funds"],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    served = Shop(tmp_path_factory.mktemp("dashboard-shop"))
    try:
        served.wait()
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: scripts/deps/apt-dashboard.txt installs it"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    wanted = os.environ.get("VPSSHOP_SCREENSHOTS")
    folder = Path(wanted) if wanted else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def axe_source() -> str:
    assert AXE.is_file(), f"{AXE} is missing: scripts/deps/npm-dashboard.txt installs axe-core"
    return AXE.read_text()


@pytest.fixture
def check(axe_source, shots):
    """check(page, name): axe-core finds nothing serious, nothing is wider than a phone, photographs."""
    seen: list[str] = []

    def run(page, name: str) -> None:
        page.wait_for_load_state("load")
        page.evaluate(axe_source)
        violations = page.evaluate(
            "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
            ".filter(v => v.impact === 'serious' || v.impact === 'critical')"
            ".map(v => `${v.id} (${v.impact}): ${v.help} at ${v.nodes.map(n => n.target.join(' ')).join(', ')}`)"
        )
        assert violations == [], f"{name}: {violations}"
        page.screenshot(path=str(shots / f"{name}-desktop.png"), full_page=True)
        page.set_viewport_size(PHONE)
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{name}: {overflow}px wider than a phone screen"
        page.screenshot(path=str(shots / f"{name}-phone.png"), full_page=True)
        page.set_viewport_size(DESKTOP)
        seen.append(name)

    run.seen = seen  # type: ignore[attr-defined]
    return run


@pytest.fixture
def context(browser):
    ctx = browser.new_context(viewport=DESKTOP)
    ctx.set_default_timeout(15_000)
    yield ctx
    ctx.close()


def create_account(page, shop) -> tuple[int, str, str]:
    page.goto(f"{shop.base}/signin")
    page.get_by_role("button", name="Create an account").click()
    page.wait_for_url(f"{shop.base}/account")
    token = page.locator("#login-token").inner_text()
    key = page.locator("#api-key").inner_text()
    user_id = int(re.search(r"Account number (\d+)", page.content()).group(1))
    assert token.startswith("vpsl_") and key.startswith("vpsk_")
    return user_id, token, key


def sign_in(page, shop, token: str) -> None:
    page.goto(f"{shop.base}/signin")
    page.get_by_label("Login token", exact=True).fill(token)
    page.get_by_role("button", name="Sign in").click()


# ---- the journey: account, top-up, funding, order, credentials, keys, sign-out --------------------


def test_a_customer_does_everything_with_the_login_token(shop, context, check):
    page = context.new_page()
    page.goto(f"{shop.base}/signin")
    check(page, "signin")
    user_id, token, _ = create_account(page, shop)
    expect_visible(page.get_by_role("button", name="Copy login token"))
    assert "shown this once" in page.content()
    check(page, "account-created")

    # signing out and in again with the token alone
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/dashboard/signin"))
    sign_in(page, shop, token)
    page.wait_for_url(f"{shop.base}/")

    # a top-up: the deposit address, the amount, its QR code and the countdown
    page.get_by_role("link", name="Top up", exact=True).first.click()
    check(page, "topups")
    page.get_by_label("Amount in US dollars", exact=True).fill("30")
    page.get_by_role("radio", name=re.compile("Litecoin")).check()
    page.get_by_role("button", name="Get a payment address").click()
    page.wait_for_url(re.compile(r"/dashboard/topups/tp_"))
    qr = page.get_by_role("img", name=re.compile("QR code for your wallet"))
    assert qr.evaluate("img => img.complete && img.naturalWidth > 100")
    assert page.locator("#deposit-address").inner_text().startswith("tltc1")
    expect_text(page.locator("[data-countdown]"), re.compile(r"\d+:\d\d:\d\d left|\d+:\d\d left"))
    assert page.locator('[data-field="payment_status"]').inner_text() == "waiting for your payment"
    with page.expect_response(re.compile(r"/topups/tp_[^/]+/status$"), timeout=15_000) as polled:
        pass  # the open page asks for the status by itself (the chain's answer, through GET /v1/topups/{ref})
    assert polled.value.json()["payment_status"] == "awaiting_payment"
    check(page, "topup")
    ref = page.url.rsplit("/", 1)[1]
    api = httpx.get(f"{shop.url}/v1/topups/{ref}", headers=_bearer(context, shop, token))
    assert api.json()["deposit_address"] == page.locator("#deposit-address").inner_text()

    # USDC on Base is x402: the page says what a wallet needs
    page.goto(f"{shop.base}/topups")
    page.get_by_label("Amount in US dollars", exact=True).fill("25")
    page.get_by_role("radio", name=re.compile("USD Coin")).check()
    page.get_by_role("button", name="Get a payment address").click()
    assert "transferWithAuthorization" in page.content() and "25000000" in page.content()
    check(page, "topup-x402")

    # funds through `vpsshop admin credit`, as README shows
    assert "balance now 50.00 USD" in shop.credit(user_id, "50")
    page.goto(f"{shop.base}/")
    assert page.locator("#balance").inner_text() == "$50.00"
    assert "Credit from support" in page.content()

    # order with the live price, then watch it become active
    page.get_by_role("link", name="Servers").click()
    page.get_by_role("link", name="Order a server").click()
    price = page.locator("#price")
    assert price.inner_text() == "$3.99"
    page.get_by_label("Location", exact=True).select_option("ch")
    page.get_by_role("radio", name=re.compile("Annual")).check()
    expect_text(price, "$53.90")  # Zurich: 5.39 a month; a year costs 10 months
    page.get_by_role("radio", name=re.compile("Monthly")).check()
    expect_text(price, "$5.39")
    check(page, "order")
    page.get_by_role("textbox", name=re.compile("Hostname")).fill("web1")
    page.get_by_role("button", name="Order and pay").click()
    page.wait_for_url(re.compile(r"/dashboard/servers/\d+"))
    assert "Server ordered and paid" in page.content()
    expect_text(page.locator('[data-field="status"]'), "active", timeout=90_000)  # the page reloads itself
    assert re.match(r"\d+\.\d+\.\d+\.\d+", page.locator('[data-field="ip"]').inner_text())
    check(page, "server")

    # credentials only on an explicit action
    assert page.locator("#root-password").count() == 0
    page.get_by_role("button", name="Show root password").click()
    password = page.locator("#root-password").inner_text()
    assert len(password) == 20
    check(page, "server-credentials")
    server_id = int(page.url.rstrip("/").split("/")[-2])
    creds = httpx.get(f"{shop.url}/v1/servers/{server_id}/credentials", headers=_bearer(context, shop, token))
    assert creds.json()["password"] == password

    # power, auto-renew and renewal
    page.goto(f"{shop.base}/servers/{server_id}")
    page.get_by_role("button", name="Reboot").click()
    expect_text(page.locator(".notice"), "Reboot requested")
    page.get_by_role("button", name="Turn automatic renewal off").click()
    expect_text(page.locator(".notice"), "Automatic renewal is off")
    page.get_by_role("button", name=re.compile("Renew now")).click()
    expect_text(page.locator(".notice"), "Renewed")
    page.goto(f"{shop.base}/")
    assert page.locator("#balance").inner_text() == "$39.22"  # 50 - 5.39 (order) - 5.39 (renewal)
    assert "Server renewal" in page.content() and "Server order" in page.content()
    check(page, "overview")
    page.goto(f"{shop.base}/servers")
    check(page, "servers")

    # API keys: shown once, work at once, revoked at once
    page.get_by_role("link", name="API keys").click()
    page.get_by_role("textbox", name=re.compile("^Name")).fill("deploy script")
    page.get_by_role("button", name="Make key").click()
    key = page.locator("#new-key").inner_text()
    check(page, "keys")
    assert httpx.get(f"{shop.url}/v1/account", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    page.goto(f"{shop.base}/keys")
    assert key not in page.content()
    page.get_by_role("button", name=re.compile(r"Revoke key .*\(deploy script\)")).click()
    expect_text(page.locator(".notice"), "The key is revoked")
    assert httpx.get(f"{shop.url}/v1/account", headers={"Authorization": f"Bearer {key}"}).status_code == 401

    # a form whose CSRF token was taken out is refused, and nothing happens
    page.evaluate("() => document.querySelector('form[action$=\"/keys\"] input[name=csrf]').remove()")
    page.get_by_role("button", name="Make key").click()
    assert "nothing was done" in page.content()
    check(page, "refused")

    # sign out: the cookie that was signed out is refused from then on
    cookies = context.cookies()
    page.goto(f"{shop.base}/")
    page.get_by_role("button", name="Sign out").click()
    expect_text(page.locator(".notice"), "You are signed out.")
    replay = context.browser.new_context(viewport=DESKTOP)
    replay.add_cookies(cookies)
    stale = replay.new_page()
    stale.goto(f"{shop.base}/servers")
    assert stale.url.startswith(f"{shop.base}/signin")
    assert "Your session ended" in stale.content()
    replay.close()


def _bearer(context, shop, token: str) -> dict[str, str]:
    """A fresh API key for checks through the API (POST /v1/login with the same login token)."""
    cached = getattr(context, "_api_key", None)
    if cached is None:
        cached = httpx.post(f"{shop.url}/v1/login", json={"login_token": token}).json()["api_key"]
        context._api_key = cached
    return {"Authorization": f"Bearer {cached}"}


# ---- two-factor -------------------------------------------------------------------------------------


def test_two_factor_is_turned_on_with_a_qr_code_and_asked_at_sign_in(shop, context, check):
    page = context.new_page()
    _, token, key = create_account(page, shop)
    page.goto(f"{shop.base}/security")
    check(page, "security")
    page.get_by_role("button", name="Set up two-factor sign-in").click()
    qr = page.get_by_role("img", name=re.compile("QR code to add this account"))
    assert qr.evaluate("img => img.complete && img.naturalWidth > 100")
    check(page, "totp-setup")
    totp = pyotp.TOTP(page.locator("#totp-secret").inner_text())
    page.get_by_label("Code", exact=True).fill(totp.now())
    page.get_by_role("button", name="Turn two-factor on").click()
    codes = page.locator("#recovery-codes").inner_text().split()
    assert len(codes) == 10
    check(page, "recovery-codes")
    assert httpx.get(f"{shop.url}/v1/account", headers={"Authorization": f"Bearer {key}"}).json()["totp_enabled"]

    page.goto(f"{shop.base}/")
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, shop, token)
    page.wait_for_url(f"{shop.base}/signin/code")
    check(page, "signin-code")
    page.get_by_label("Code", exact=True).fill("000000")
    page.get_by_role("button", name="Continue").click()
    expect_text(page.get_by_role("alert"), "not right")
    # the code of the next 30-second step (the current one was used to turn two-factor on)
    page.get_by_label("Code", exact=True).fill(totp.at(time.time() + 30))
    page.get_by_role("button", name="Continue").click()
    page.wait_for_url(f"{shop.base}/")
    assert "Two-factor sign-in" in page.content() and page.locator(".stat .big").nth(2).inner_text() == "On"


# ---- the keyboard alone ---------------------------------------------------------------------------


def _tab_to(page, selector: str, limit: int = 30) -> None:
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("s => document.activeElement && document.activeElement.matches(s)", selector):
            outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
            assert outline != "none", f"{selector} has no visible focus"
            return
    raise AssertionError(f"Tab never reached {selector}")


def test_sign_in_and_ordering_work_with_the_keyboard_alone(shop, context):
    setup = context.new_page()
    user_id, token, key = create_account(setup, shop)
    setup.close()
    context.clear_cookies()
    shop.credit(user_id, "100")

    page = context.new_page()
    page.goto(f"{shop.base}/signin")
    _tab_to(page, "#login_token")
    page.keyboard.type(token)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{shop.base}/")

    _tab_to(page, 'nav a[href$="/servers"]')
    page.keyboard.press("Enter")
    page.wait_for_url(f"{shop.base}/servers")
    _tab_to(page, 'main a[href$="/servers/new"]')
    page.keyboard.press("Enter")
    page.wait_for_url(f"{shop.base}/servers/new")
    _tab_to(page, "#plan")
    page.keyboard.press("ArrowDown")  # the second plan
    _tab_to(page, "#location")
    _tab_to(page, "#os")
    _tab_to(page, 'input[name="cycle"]')
    page.keyboard.press("ArrowRight")  # annual
    _tab_to(page, "#hostname")
    page.keyboard.type("kbd")
    _tab_to(page, 'button[type="submit"].btn:not(.btn-link)')
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/dashboard/servers/\d+"))
    servers = httpx.get(f"{shop.url}/v1/servers", headers={"Authorization": f"Bearer {key}"}).json()["servers"]
    assert [(s["hostname"], s["cycle"]) for s in servers] == [("kbd", "annual")]
    plans = httpx.get(f"{shop.url}/v1/catalog").json()["plans"]
    assert servers[0]["plan"] == plans[1]["id"]


# ---- small helpers over Playwright's expectations ---------------------------------------------------


def expect_visible(locator) -> None:
    from playwright.sync_api import expect

    expect(locator).to_be_visible()


def expect_text(locator, text, timeout: int = 15_000) -> None:
    from playwright.sync_api import expect

    expect(locator).to_contain_text(text, timeout=timeout) if isinstance(text, str) else expect(locator).to_have_text(
        text, timeout=timeout
    )
