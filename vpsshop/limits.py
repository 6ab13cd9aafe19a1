"""Rate limits and quotas of the API, in the library (no rate-limiting proxy needed).

``[ratelimit]`` sets them; each answer over a limit is ``429 rate_limited`` with ``Retry-After``:

* **per client address**: ``POST /v1/account`` (``signups_per_client`` per ``signup_window_seconds``)
  and failed API-key authentications (``auth_failures_per_client`` per
  ``auth_failure_window_seconds``: an Authorization header without a valid key; once over, that
  address's requests with an API key are refused for the Retry-After given). ``POST /v1/login``
  has its own limit on failed sign-ins (``[signin]``).
  The client address is the TCP peer, or ``X-Forwarded-For`` when the peer is one of
  ``[server] forwarded_allow_ips`` (uvicorn rewrites the peer; nothing else reads the header).
* **per account**: every authenticated write (``POST``, ``PUT``, ``PATCH``, ``DELETE``: top-ups,
  orders, key mints, power actions) counts against ``writes_per_account`` per
  ``write_window_seconds``;
* **quotas**: an account may hold at most ``max_servers_per_account`` servers that are not
  terminated and ``max_open_topups_per_account`` pending top-ups; the order or top-up past it is
  refused (``Retry-After`` is then a hint: the quota frees when a server ends or a top-up closes).

Where counts live (``backend``): ``auto`` counts in the database on PostgreSQL (every ``vpsshop
serve`` process and host of the shop shares them, one upsert per counted request) and in process
memory on SQLite (the sandbox: one process); ``database`` and ``memory`` force one or the other.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field

from vpsshop.ratelimit import DatabaseRateLimiter, MemoryRateLimiter, RateLimited, RateLimiter, Rule

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext
    from vpsshop.routing import ApiRoute

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
QUOTA_RETRY_AFTER = 3600


class RateLimitSettings(BaseModel):
    """``[ratelimit]``: see :mod:`vpsshop.limits`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="false: no rate limits or quotas (benchmarks; a proxy limits instead).")
    backend: Literal["auto", "database", "memory"] = Field(
        "auto", description="auto: the database on PostgreSQL (shared by all processes), memory on SQLite."
    )
    signups_per_client: int = Field(
        30, ge=1, le=1_000_000, description="POST /v1/account per client address per window."
    )
    signup_window_seconds: int = Field(3600, ge=1, le=86_400)
    auth_failures_per_client: int = Field(
        100,
        ge=1,
        le=1_000_000,
        description="Requests with an unknown or revoked API key per client address per window.",
    )
    auth_failure_window_seconds: int = Field(600, ge=1, le=86_400)
    writes_per_account: int = Field(300, ge=1, le=1_000_000, description="Authenticated writes per account per window.")
    write_window_seconds: int = Field(60, ge=1, le=86_400)
    max_servers_per_account: int = Field(100, ge=1, le=100_000, description="Servers not terminated per account.")
    max_open_topups_per_account: int = Field(20, ge=1, le=100_000, description="Pending top-ups per account.")


def limiter(ctx: AppContext) -> RateLimiter:
    """The limiter of the API's per-request limits (built once per context)."""
    cached = ctx.request_limiter
    if cached is None:
        backend = ctx.settings.ratelimit.backend
        if backend == "auto":
            backend = "database" if ctx.db.dialect == "postgresql" else "memory"

        def clock() -> float:
            return ctx.clock.now().timestamp()

        cached = DatabaseRateLimiter(ctx.db, clock=clock) if backend == "database" else MemoryRateLimiter(clock)
        ctx.request_limiter = cached
    return cached


def _hit(ctx: AppContext, rule: Rule, key: str, message: str) -> None:
    if not ctx.settings.ratelimit.enabled:
        return
    decision = limiter(ctx).hit(rule, key)
    if not decision.allowed:
        raise RateLimited(message, decision.retry_after)


def client_address(request: object) -> str:
    client = getattr(request, "client", None)
    return client.host if client else "unknown"


def signup(ctx: AppContext, client: str) -> None:
    """Count one ``POST /v1/account`` from ``client``. :raises RateLimited: over the limit."""
    s = ctx.settings.ratelimit
    _hit(
        ctx,
        Rule("signup", s.signups_per_client, s.signup_window_seconds),
        client,
        "Too many accounts created from your address.",
    )


def _auth_rule(ctx: AppContext) -> Rule:
    s = ctx.settings.ratelimit
    return Rule("auth-failures", s.auth_failures_per_client, s.auth_failure_window_seconds)


def auth_blocked(ctx: AppContext, client: str) -> None:
    """Refuse ``client`` while it is over the failed-authentication limit (a dictionary lookup: this
    process remembers the blocks it has seen; the count itself is shared)."""
    blocked = ctx.auth_blocked
    until = blocked.get(client) if blocked else None
    if until is None:
        return
    left = until - time.monotonic()
    if left <= 0:
        blocked.pop(client, None)
        return
    raise RateLimited("Too many requests with unknown API keys from your address.", max(1, int(left) + 1))


def auth_failed(ctx: AppContext, client: str) -> None:
    """Count one failed authentication of ``client``; past the limit, block it for the window's rest."""
    if not ctx.settings.ratelimit.enabled:
        return
    decision = limiter(ctx).hit(_auth_rule(ctx), client)
    if not decision.allowed:
        blocked = ctx.auth_blocked
        if len(blocked) > 100_000:
            blocked.clear()
        blocked[client] = time.monotonic() + decision.retry_after
        raise RateLimited("Too many requests with unknown API keys from your address.", decision.retry_after)


def account_write(ctx: AppContext, account_id: int) -> None:
    """Count one authenticated write of ``account_id``. :raises RateLimited: over the limit."""
    s = ctx.settings.ratelimit
    _hit(
        ctx,
        Rule("writes", s.writes_per_account, s.write_window_seconds),
        str(account_id),
        "Too many changes from this account.",
    )


def server_quota(ctx: AppContext, servers: int) -> None:
    """Refuse an order when the account already holds ``max_servers_per_account`` live servers."""
    cap = ctx.settings.ratelimit.max_servers_per_account
    if servers >= cap:
        raise RateLimited(
            f"This account has {servers} servers, the most one account may hold ({cap}); delete one first.",
            QUOTA_RETRY_AFTER,
        )


def topup_quota(ctx: AppContext, account_id: int) -> None:
    """Refuse a top-up when the account has ``max_open_topups_per_account`` pending ones."""
    cap = ctx.settings.ratelimit.max_open_topups_per_account
    with ctx.db.engine.connect() as conn:
        open_topups = conn.execute(
            sa.text("SELECT count(*) FROM topups WHERE account_id = :a AND status = 'pending'"), {"a": account_id}
        ).scalar()
    if int(open_topups or 0) >= cap:
        raise RateLimited(
            f"This account has {open_topups} open top-ups, the most one account may have ({cap}); "
            "pay or cancel one first.",
            QUOTA_RETRY_AFTER,
        )


def enforce(ctx: AppContext, route: ApiRoute, account_id: int, servers: int) -> None:
    """The per-account limits of an authenticated request to ``route`` (called by the router)."""
    if route.method.upper() not in WRITE_METHODS or not ctx.settings.ratelimit.enabled:
        return
    account_write(ctx, account_id)
    if route.method.upper() == "POST" and route.path == "/servers":
        server_quota(ctx, servers)
    elif route.method.upper() == "POST" and route.path == "/topups":
        topup_quota(ctx, account_id)


def describe(route: ApiRoute) -> str | None:
    """When ``route`` answers 429, for the OpenAPI description (None: never)."""
    method = route.method.upper()
    if method == "POST" and route.path == "/account":
        return (
            "rate_limited: too many accounts created from this client address ([ratelimit] "
            "signups_per_client); Retry-After says when to try again."
        )
    if method == "POST" and route.path == "/login":
        return "rate_limited: too many failed sign-ins from this client address ([signin]); see Retry-After."
    if not route.auth:
        return None
    text = "rate_limited: too many requests with unknown API keys from this client address"
    if method in WRITE_METHODS:
        text += "; or this account made too many changes ([ratelimit] writes_per_account)"
    if method == "POST" and route.path == "/servers":
        text += "; or the account holds max_servers_per_account servers"
    if method == "POST" and route.path == "/topups":
        text += "; or the account has max_open_topups_per_account pending top-ups"
    return text + ". Retry-After says when to try again."
