"""``GET /llms.txt``: what the shop sells, how to pay and the endpoints an agent needs, in Markdown.

Generated once per process from the catalog, the enabled coins and the OpenAPI description (so it
cannot drift from what the API serves), following the llms.txt convention: a title, a one-line
summary in a quote, then sections of links and short facts.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from vpsshop.api.spec import spec_of
from vpsshop.catalog import ANNUAL_MONTHS_CHARGED, price_cents
from vpsshop.coins import DepositCoin, X402Coin
from vpsshop.context import AppContext, StateKey
from vpsshop.money import MIN_TOPUP_CENTS
from vpsshop.payments import engine_for

PATH = "/llms.txt"
_TEXT = StateKey[bytes]("llms.txt")
_AGENT_PATHS = (
    ("get", "/catalog"),
    ("post", "/account"),
    ("get", "/account"),
    ("post", "/account/wallet-login"),
    ("post", "/topups"),
    ("get", "/topups/{ref}"),
    ("post", "/servers"),
    ("get", "/servers"),
    ("get", "/servers/{id}"),
    ("get", "/servers/{id}/credentials"),
    ("post", "/servers/{id}/renew"),
    ("post", "/servers/{id}/start"),
    ("post", "/servers/{id}/stop"),
    ("post", "/servers/{id}/reboot"),
)


def _usd(cents: int) -> str:
    return f"{cents / 100:.2f}"


def _endpoint(method: str, path: str, operation: dict[str, Any]) -> str:
    auth = " (API key)" if operation.get("security") else ""
    return f"- `{method.upper()} /v1{path}`: {operation.get('summary', '')}{auth}"


def render(ctx: AppContext) -> str:
    """The text of ``/llms.txt`` for this shop."""
    settings = ctx.settings
    api = settings.public_url.rstrip("/")
    data = ctx.catalog_data
    openapi: dict[str, Any] = spec_of(ctx).openapi
    x402_coins = [c for c in ctx.coins.values() if isinstance(c, X402Coin)]
    deposit_coins = [c for c in ctx.coins.values() if isinstance(c, DepositCoin)]
    lines = [
        f"# {settings.dashboard.shop_name}",
        "",
        "> Prepaid virtual private servers (VPS) sold over an HTTP API: no KYC, an account is an API key, the "
        "balance is topped up with cryptocurrency"
        + (" or paid per request with x402" if x402_coins else "")
        + ", and a server is ordered from the balance in one call.",
        "",
        f"API base URL: {api} (JSON; authenticate with `Authorization: Bearer <api key>`). "
        f"Full description: [{api}/openapi.json]({api}/openapi.json).",
    ]
    if settings.sandbox:
        lines += ["", "This deployment is a sandbox: servers are simulated and payments use test networks."]

    lines += [
        "",
        "## What is sold",
        "",
        f"Prices in USD per month (annual = {ANNUAL_MONTHS_CHARGED} months). "
        "Price = plan base price x location modifier. Live data: `GET /v1/catalog`.",
        "",
        "Plans:",
        "",
    ]
    for plan in data.plans:
        lines.append(
            f"- `{plan.id}` {plan.name}: {plan.vcpu} vCPU, {plan.memory_mib} MiB RAM, {plan.disk_gib} GiB "
            f"disk, {plan.bandwidth_tb} TB traffic; base price {_usd(plan.base_price_cents)} USD/month"
        )
    lines += ["", "Locations:", ""]
    # only where servers can be made: an order elsewhere is a 409
    locations = [loc for loc in data.locations if ctx.serves_location(loc.id)] or data.locations
    offered = {loc.id: ctx.orderable_systems(loc.id) for loc in locations}
    everywhere = [o.id for o in data.operating_systems if all(o.id in ids for ids in offered.values())]
    for loc in locations:
        extra = [os_id for os_id in offered[loc.id] if os_id not in everywhere]
        also = f"; also {', '.join(f'`{i}`' for i in extra)}" if extra else ""
        lines.append(f"- `{loc.id}` {loc.name} ({loc.country}), price x {loc.price_modifier}{also}")
    if everywhere:
        lines += ["", "Operating systems (every location above): " + ", ".join(f"`{i}`" for i in everywhere) + "."]
    cheapest = min((price_cents(p, loc, "monthly"), p.id, loc.id) for p in data.plans for loc in locations)
    lines += ["", f"Cheapest: `{cheapest[1]}` in `{cheapest[2]}` at {_usd(cheapest[0])} USD/month."]

    lines += ["", "## How to pay", ""]
    lines.append("1. `POST /v1/account` (no body, no key) creates an account and returns its `api_key` once.")
    if deposit_coins:
        codes = ", ".join(c.code for c in deposit_coins)
        default = engine_for(ctx).default_coin
        example = default if isinstance(ctx.coins.get(default or ""), DepositCoin) else deposit_coins[0].code
        lines.append(
            f'2. Top up the balance: `POST /v1/topups {{"amount": {MIN_TOPUP_CENTS // 100}, "coin": "{example}"}}` '
            f"returns a deposit address and amount (coins: {codes}); poll `GET /v1/topups/{{ref}}` until completed."
        )
    if x402_coins:
        coin = x402_coins[0]
        lines.append(
            f"{'3. Or pay' if deposit_coins else '2. Pay'} with x402 ({coin.code}, network {coin.network}): "
            "`POST /v1/servers` (and `POST /v1/servers/{id}/renew`) with a short balance answers 402 "
            "`insufficient_balance` with the x402 payment requirements for the deficit (body `accepts`, v1; "
            "header `PAYMENT-REQUIRED`, v2). Re-send the same request with `X-PAYMENT` or `PAYMENT-SIGNATURE`: "
            "the payment settles, is credited, and the server is ordered in the same call. A payment never buys "
            "twice; send `Idempotency-Key` (or the x402 `payment-identifier` extension) to retry safely. "
            f'`POST /v1/topups {{"amount": {MIN_TOPUP_CENTS // 100}, "coin": "{coin.code}"}}` pays a top-up the '
            "same way. No account yet? `POST /v1/servers` without a key is answered 402 for the whole price: "
            "paying it creates an account owned by the paying wallet and the answer's `account` carries its "
            "`api_key` once. A wallet that owns an account gets a new key by signing (x402 sign-in-with-x): "
            "`POST /v1/account/wallet-login`."
        )
    lines += ["", "Balances are in USD; an order or renewal is charged only when it succeeds."]

    lines += ["", "## Endpoints an agent needs", ""]
    paths = openapi.get("paths", {})
    for method, path in _AGENT_PATHS:
        operation = paths.get(path, {}).get(method)
        if operation is not None:
            lines.append(_endpoint(method, path, operation))
    others = [
        (m, p, op)
        for p, ops in paths.items()
        for m, op in ops.items()
        if isinstance(op, dict) and (m, p) not in _AGENT_PATHS and m in ("get", "post", "put", "patch", "delete")
    ]
    if others:
        lines += ["", "## Other endpoints", ""]
        lines += [_endpoint(m, p, op) for m, p, op in others]

    lines += [
        "",
        "## Optional",
        "",
        f"- [OpenAPI description]({api}/openapi.json): every endpoint, field and error code",
        f"- [Catalog]({api}/catalog): plans, locations, operating systems, prices, payment options",
    ]
    return "\n".join(lines) + "\n"


async def llms_txt(request: Request) -> Response:
    ctx: AppContext = request.app.state.ctx
    text = ctx.state(_TEXT, lambda ctx: render(ctx).encode())
    return Response(text, media_type="text/markdown; charset=utf-8", headers={"Cache-Control": "public, max-age=300"})
