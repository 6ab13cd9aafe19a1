"""Rate limits and quotas of the shop, in the library (no rate-limiting proxy needed).

``[ratelimit]`` sets them; each refusal is ``429 rate_limited`` with ``Retry-After``. The operations
apply them themselves, so the REST API, the dashboard and the MCP tools count alike:

* **per client address**: creating an account (``signups_per_client`` per ``signup_window_seconds``,
  :func:`signup`) and failed API-key authentications (``auth_failures_per_client`` per
  ``auth_failure_window_seconds``: an Authorization header without a valid key, not a request
  without one; once over, that address's requests with an API key are refused for the Retry-After
  given: :func:`auth_blocked`, :func:`auth_failed`). Signing in with the login token
  has its own limit on failed sign-ins (``[signin]``, :mod:`vpsshop.signin`). The client address
  is the TCP peer, or ``X-Forwarded-For`` when the peer is one of ``[server] forwarded_allow_ips``
  (uvicorn rewrites the peer; nothing else reads the header).
* **per account**: every operation that changes something (top-ups, orders, renewals, key mints,
  power actions, reinstalls, console tickets, SSH keys, webhooks) and every quote counts against
  ``writes_per_account`` per ``write_window_seconds`` (:func:`count_write`);
* **quotas**: an account may hold at most ``max_servers_per_account`` servers that are not
  terminated and ``max_open_topups_per_account`` pending top-ups; the order or top-up past it is
  refused (``Retry-After`` is then a hint: the quota frees when a server ends or a top-up closes).

Where counts live (``backend``): ``auto`` counts in the database on PostgreSQL (every ``vpsshop
serve`` process and host of the shop shares them, one upsert per counted request) and in process
memory on SQLite (the sandbox: one process); ``database`` and ``memory`` force one or the other.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from vpsshop.context import AppContext, StateKey
from vpsshop.ratelimit import DatabaseRateLimiter, MemoryRateLimiter, RateLimited, RateLimiter, Rule

QUOTA_RETRY_AFTER = 3600


def _build_limiter(ctx: AppContext) -> RateLimiter:
    backend = ctx.settings.ratelimit.backend
    if backend == "auto":
        backend = "database" if ctx.db.dialect == "postgresql" else "memory"

    def clock() -> float:
        return ctx.clock.now().timestamp()

    return DatabaseRateLimiter(ctx.db, clock=clock) if backend == "database" else MemoryRateLimiter(clock)


_LIMITER = StateKey[RateLimiter]("request-limiter")
_BLOCKED = StateKey[dict[str, float]]("auth-blocked")
"""Client address -> when its authentication-failure block ends (``time.monotonic``)."""


def limiter(ctx: AppContext) -> RateLimiter:
    """The limiter of the shop's per-request limits (built once per context)."""
    return ctx.state(_LIMITER, _build_limiter)


def blocked_clients(ctx: AppContext) -> dict[str, float]:
    """The addresses this process has seen go over the failed-authentication limit, and until when."""
    return ctx.state(_BLOCKED, lambda _ctx: {})


def _hit(ctx: AppContext, rule: Rule, key: str, message: str) -> None:
    if not ctx.settings.ratelimit.enabled:
        return
    decision = limiter(ctx).hit(rule, key)
    if not decision.allowed:
        raise RateLimited(message, decision.retry_after)


def signup(ctx: AppContext, client: str) -> None:
    """Count one new account from ``client``. :raises RateLimited: over the limit."""
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


def auth_blocked(blocked: dict[str, float], client: str) -> None:
    """Refuse ``client`` while it is over the failed-authentication limit (a dictionary lookup: this
    process remembers the blocks it has seen, :func:`blocked_clients`; the count itself is shared)."""
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
        blocked = blocked_clients(ctx)
        if len(blocked) > 100_000:
            blocked.clear()
        blocked[client] = time.monotonic() + decision.retry_after
        raise RateLimited("Too many requests with unknown API keys from your address.", decision.retry_after)


def count_write(ctx: AppContext, account_id: int) -> None:
    """Count one change (or quote) of ``account_id``. :raises RateLimited: over the limit."""
    s = ctx.settings.ratelimit
    _hit(
        ctx,
        Rule("writes", s.writes_per_account, s.write_window_seconds),
        str(account_id),
        "Too many changes from this account.",
    )


def server_quota(ctx: AppContext, servers: int) -> None:
    """Refuse an order when the account already holds ``max_servers_per_account`` live servers."""
    if not ctx.settings.ratelimit.enabled:
        return
    cap = ctx.settings.ratelimit.max_servers_per_account
    if servers >= cap:
        raise RateLimited(
            f"This account has {servers} servers, the most one account may hold ({cap}); delete one first.",
            QUOTA_RETRY_AFTER,
        )


def topup_quota(ctx: AppContext, account_id: int) -> None:
    """Refuse a top-up when the account has ``max_open_topups_per_account`` pending ones."""
    if not ctx.settings.ratelimit.enabled:
        return
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


SIGNUP_LIMIT = (
    "rate_limited: too many accounts created from this client address ([ratelimit] signups_per_client); "
    "Retry-After says when to try again."
)
"""The 429 of creating an account, as the API describes it."""
AUTH_LIMIT = "rate_limited: too many requests with unknown API keys from this client address"
WRITE_LIMIT = "or this account made too many changes ([ratelimit] writes_per_account)"
SERVER_QUOTA = "or the account holds max_servers_per_account servers"
TOPUP_QUOTA = "or the account has max_open_topups_per_account pending top-ups"
