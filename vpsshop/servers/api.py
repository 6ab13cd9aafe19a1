"""The server endpoints, and the service functions behind them: order, list, show, credentials,
auto-renew, renew and power actions.

The service functions (:func:`place_order`, :func:`servers_of`, :func:`server_of`,
:func:`reveal_credentials`, :func:`set_auto_renew`, :func:`renew_now`, :func:`power_action`) are
synchronous and raise :class:`~vpsshop.errors.ApiError`; the endpoints run them in the thread pool,
and the dashboard (:mod:`vpsshop.dashboard`) calls the same functions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field, StrictBool
from pydantic.json_schema import SkipJsonSchema
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from vpsshop import events, ledger
from vpsshop.catalog import price_cents
from vpsshop.cloudinit import MAX_DEPTH, MAX_EXPANDED_CHARS, MAX_USER_DATA_BYTES, InvalidInput, check_user_data
from vpsshop.context import AppContext
from vpsshop.encryption import encrypt_text
from vpsshop.errors import ApiError, BadRequest, Conflict, NotFound
from vpsshop.ledger import InsufficientBalance
from vpsshop.models import Account, Server
from vpsshop.money import MICROS_PER_CENT, UsdAmount, micros_to_usd
from vpsshop.routing import ApiModel, ApiRoute, Call, Header, JsonInt, Reply, idempotency_header, idempotency_key
from vpsshop.servers.credentials import decrypt_password, encrypt_password, generate_root_password
from vpsshop.servers.lifecycle import (
    DEFAULT_CYCLE,
    RenewalRaced,
    check_not_admin_suspended,
    enqueue,
    max_periods,
    period_end,
    policy,
    record,
    renew,
    renewal_terms,
)
from vpsshop.servers.models import ServerEvent, ServerJob
from vpsshop.servers.resource import ServerOut, server_out
from vpsshop.servers.sshkeys import MAX_KEYS_PER_SERVER, SshKeyId, keys_for_server
from vpsshop.x402 import headers as x402_headers
from vpsshop.x402 import orders as x402_orders

TAG = ("servers",)
_HOSTNAME = r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
_PRINTABLE = r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$"  # printable ASCII, not only spaces


class OrderBody(ApiModel):
    """Body of ``POST /servers``. Each bad field has its own code: ``invalid_<field>``."""

    plan: str = Field(
        min_length=1,
        max_length=32,
        description="A plan id from GET /catalog (invalid_plan).",
        json_schema_extra={"x-catalog": "plans"},
    )
    location: str = Field(
        min_length=1,
        max_length=32,
        description="A location id (invalid_location).",
        json_schema_extra={"x-catalog": "locations"},
    )
    os: str = Field(
        min_length=1,
        max_length=32,
        description="An operating system id (invalid_os).",
        json_schema_extra={"x-catalog": "operating_systems"},
    )
    cycle: Literal["monthly", "annual"] = Field(
        DEFAULT_CYCLE, description="Billing cycle, default monthly; annual costs 10 monthly prices (invalid_cycle)."
    )
    hostname: str | None = Field(
        None,
        max_length=63,
        pattern=_HOSTNAME,
        description="A DNS label: 1-63 letters, digits and hyphens, not starting or ending with a hyphen; "
        "stored lower-case. Default vps-<id> (invalid_hostname).",
    )
    root_password: str | None = Field(
        None,
        min_length=10,
        max_length=128,
        pattern=_PRINTABLE,
        description="10 to 128 printable ASCII characters, not all spaces. "
        "Omit it to have a 20-character password generated "
        "and returned once in this response (invalid_root_password).",
    )
    ssh_keys: list[SshKeyId] | None = Field(
        None,
        max_length=MAX_KEYS_PER_SERVER,
        description=f"Ids of the caller's stored keys (POST /ssh-keys), at most {MAX_KEYS_PER_SERVER}: cloud-init "
        "writes them to root's authorized_keys. The root password is set as well (invalid_ssh_keys).",
    )
    user_data: str | None = Field(
        None,
        max_length=MAX_USER_DATA_BYTES,
        description=f"cloud-init user data, at most {MAX_USER_DATA_BYTES} bytes: '#cloud-config' followed by a "
        "YAML mapping, or a script starting with '#!' (run once at the end of the first boot). It is combined "
        "with vpsshop's own cloud-config, which keeps the hostname, the root password, password login and the "
        "SSH keys: those keys of a customer cloud-config are replaced, and its ssh_authorized_keys, write_files, "
        "runcmd and bootcmd lists are extended (they must be lists; ssh_authorized_keys may be one key as a string). "
        f"YAML anchors and aliases may not expand it past {MAX_EXPANDED_CHARS} characters, nor nest it more than "
        f"{MAX_DEPTH} levels. The network configuration is a separate file it cannot change (invalid_user_data). "
        "Stored encrypted.",
    )


class QuoteBody(OrderBody):
    """Body of ``POST /servers/quote``: the body of the order to price, exactly as it would be sent to
    ``POST /servers``. Only plan, location, os and cycle change the price; the other fields are
    checked as the order checks them, and change nothing."""


class RenewBody(ApiModel):
    """Optional body of ``POST /servers/{id}/renew`` and ``POST /servers/{id}/renew/quote``."""

    periods: JsonInt = Field(
        1,
        ge=1,
        le=120,
        description="Billing cycles to pay for at once, default 1; capped by the "
        "prepay horizon (servers.max_prepay_days, default 1100 days) (invalid_periods).",
    )


class QuoteOut(BaseModel):
    """What an order or a renewal would charge now, and whether the balance covers it. Writes nothing."""

    price_usd: UsdAmount = Field(description="What ordering or renewing would charge now (all periods).")
    periods: int = Field(description="Billing cycles priced (1 for an order).")
    period_price_usd: UsdAmount = Field(description="The price of one cycle.")
    balance_usd: UsdAmount = Field(description="The caller's balance now.")
    deficit_usd: UsdAmount = Field(description="How much to top up before the charge succeeds (0 when covered).")
    sufficient: bool = Field(description="True when the balance covers price_usd.")
    expires_at: datetime = Field(description="expires_at after the order or renewal, if made now.")
    max_periods: int | None = Field(None, description="Renewals: the most periods the prepay horizon allows now.")


_FQDN = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"


class ServerPatch(ApiModel):
    """Body of ``PATCH /servers/{id}``: the fields given change, the others stay."""

    auto_renew: StrictBool | SkipJsonSchema[None] = Field(
        None,
        description="false: the server is not renewed automatically and is "
        "suspended at expires_at unless renewed by hand; absent: unchanged. Only true or false: a string, a "
        "number or null is refused (invalid_auto_renew).",
        json_schema_extra=lambda schema: schema.pop("default", None),  # absent means unchanged
    )
    reverse_dns: str | None = Field(
        None,
        max_length=253,
        pattern=_FQDN,
        description="The name the server's address resolves back to (its PTR record): a fully qualified domain "
        "name without the trailing dot, e.g. mail.example.com; null removes it (invalid_reverse_dns). Set by a job "
        "through the shop's DNS provider within seconds; cleared when the server is terminated.",
    )


class OrderOut(BaseModel):
    """Response of ``POST /servers``."""

    server: ServerOut
    root_password: str | None = Field(
        description="The generated root password when the order gave none (null otherwise). Shown here once; "
        "GET /servers/{id}/credentials reveals it later."
    )


class ServerList(BaseModel):
    servers: list[ServerOut] = Field(description="The caller's servers, terminated ones included, oldest first.")


class CredentialsOut(BaseModel):
    """Response of ``GET /servers/{id}/credentials``: sensitive, never cached."""

    server_id: int
    username: str = Field(description="root")
    password: str = Field(description="The root password as set at first boot.")
    ip: str | None
    hostname: str


class RenewOut(BaseModel):
    server: ServerOut
    charged_usd: UsdAmount = Field(description="What this renewal charged from the balance.")


class PowerActionOut(BaseModel):
    server_id: int
    action: Literal["start", "stop", "reboot"]
    job_id: int = Field(description="The queued hypervisor job.")
    status: Literal["queued"] = "queued"


# ---- ordering ------------------------------------------------------------------------------------


def _digest(body: OrderBody) -> str:
    # Fields added later (ssh_keys, user_data) count only when given, so an order made before they
    # existed still replays.
    data = body.model_dump(mode="json", exclude={k for k in ("ssh_keys", "user_data") if getattr(body, k) is None})
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Ordered:
    """What :func:`place_order` did: the order, and whether it is the replay of an earlier one."""

    order: OrderOut
    replayed: bool = False


def _replay(ctx: AppContext, session: Session, account_id: int, key: str, body: OrderBody) -> Ordered | None:
    server = session.exec(select(Server).where(Server.account_id == account_id, Server.idempotency_key == key)).first()
    if server is None:
        return None
    if server.request_digest != _digest(body):
        raise Conflict(
            "idempotency_key_reused",
            "This Idempotency-Key was used for a different order by this account; use a new key for a new order.",
            server_id=server.id,
        )
    generated = None
    if body.root_password is None and server.root_password_enc is not None:
        # Same body as the first order, which gave no password: the first response carried the
        # generated one, and so does its replay (the credentials endpoint reveals it anyway).
        generated = decrypt_password(ctx, server.root_password_enc)
    return Ordered(OrderOut(server=server_out(server), root_password=generated), replayed=True)


def _resolve(ctx: AppContext, body: OrderBody | QuoteBody) -> int:
    data = ctx.catalog_data
    plan = next((p for p in data.plans if p.id == body.plan), None)
    if plan is None:
        raise BadRequest("invalid_plan", f"No plan {body.plan!r}; GET /catalog lists the plans.")
    location = next((loc for loc in data.locations if loc.id == body.location), None)
    if location is None:
        raise BadRequest("invalid_location", f"No location {body.location!r}; GET /catalog lists the locations.")
    if not ctx.serves_location(location.id):
        raise Conflict(
            "location_unavailable",
            f"Servers cannot be ordered in {location.name} ({location.id}) at the moment: this shop has no "
            "hosts there. Nothing was charged; choose another location.",
        )
    if not any(o.id == body.os for o in data.operating_systems):
        raise BadRequest("invalid_os", f"No operating system {body.os!r}; GET /catalog lists them.")
    return price_cents(plan, location, body.cycle) * MICROS_PER_CENT


def _writers(ctx: AppContext) -> Any:
    """On SQLite, one order transaction at a time per process.

    SQLite has one writer at a time anyway (``BEGIN IMMEDIATE``); threads that find the database
    locked wait in SQLite's busy handler, which sleeps in growing steps. Queueing them on a Python
    lock instead hands the write lock straight to the next order (see docs/performance.md).
    """
    if ctx.db.dialect != "sqlite":
        return contextlib.nullcontext()
    return ctx.sqlite_order_lock


def _insert_order_pg(values: dict[str, Any], default_hostname: bool, detail: str, now: datetime) -> Any:
    """PostgreSQL: the server row, its ``ordered`` event and its ``provision`` job in one statement.

    The id is drawn from the table's sequence first, so the default hostname ``vps-<id>`` goes into
    the same insert (elsewhere it takes an insert and an update).
    """
    servers, events, jobs = Server.__table__, ServerEvent.__table__, ServerJob.__table__  # type: ignore[attr-defined]
    fields = {k: v for k, v in values.items() if not (default_hostname and k == "hostname")}
    seq = sa.select(sa.func.nextval(sa.func.pg_get_serial_sequence("servers", "id")).label("n")).cte("n")
    columns: list[Any] = [seq.c.n, *(sa.literal(v, servers.c[k].type) for k, v in fields.items())]
    names = ["id", *fields]
    if default_hostname:
        columns.append(sa.literal("vps-") + sa.cast(seq.c.n, sa.String))
        names.append("hostname")
    server = sa.insert(servers).from_select(names, sa.select(*columns)).returning(servers.c.id).cte("s")
    event = (
        sa.insert(events)
        .from_select(
            ["server_id", "kind", "detail", "created_at"],
            sa.select(
                server.c.id, sa.literal("ordered"), sa.literal(detail), sa.literal(now, events.c.created_at.type)
            ),
        )
        .cte("e")
    )
    job = (
        sa.insert(jobs)
        .from_select(
            ["server_id", "kind", "status", "attempts", "run_after", "created_at"],
            sa.select(
                server.c.id,
                sa.literal("provision"),
                sa.literal("queued"),
                sa.literal(0),
                sa.literal(now, jobs.c.run_after.type),
                sa.literal(now, jobs.c.created_at.type),
            ),
        )
        .cte("j")
    )
    return sa.select(server.c.id).add_cte(event).add_cte(job)


def place_order(ctx: AppContext, account_id: int, body: OrderBody, key: str | None) -> Ordered:
    """Charge one cycle and create the server (provisioning), atomically; ``key`` makes it idempotent.

    :raises BadRequest: invalid_plan, invalid_location, invalid_os.
    :raises InsufficientBalance: 402, nothing charged.
    :raises Conflict: idempotency_key_reused.
    """
    price = _resolve(ctx, body)
    digest = _digest(body)
    if key is not None:
        with ctx.db.session() as session:
            replay = _replay(ctx, session, account_id, key, body)
        if replay is not None:
            return replay
    user_data_enc = _user_data_enc(ctx, body.user_data)
    ssh_keys = None
    if body.ssh_keys:
        with ctx.db.session() as session:
            ssh_keys = keys_for_server(session, account_id, body.ssh_keys)
    password = body.root_password or generate_root_password()
    now = ctx.clock.now()
    try:
        with _writers(ctx), ctx.db.session() as session:
            # Core statements, not ORM units of work: this is the hot path of ordering (bench/orders.py).
            values = dict(
                account_id=account_id,
                plan=body.plan,
                location=body.location,
                os=body.os,
                hostname=(body.hostname or "pending").lower(),
                cycle=body.cycle,
                price_micros=price,
                status="provisioning",
                username="root",
                created_at=now,
                expires_at=period_end(now, body.cycle),
                root_password_enc=encrypt_password(ctx, password),
                idempotency_key=key,
                request_digest=digest if key is not None else None,
                auto_renew=True,
                ssh_keys=ssh_keys,
                user_data_enc=user_data_enc,
            )
            detail = f"{body.plan} {body.location} {body.os} {body.cycle}"
            if ctx.db.dialect == "postgresql":
                # One round trip for the server (its default hostname from its id), its history row and its job.
                server_id = session.execute(_insert_order_pg(values, body.hostname is None, detail, now)).scalar_one()
                if body.hostname is None:
                    values["hostname"] = f"vps-{server_id}"
            else:
                server_id = session.execute(sa.insert(Server).values(**values).returning(Server.id)).scalar_one()
                if body.hostname is None:
                    values["hostname"] = f"vps-{server_id}"
                    session.execute(sa.update(Server).where(Server.id == server_id).values(hostname=values["hostname"]))
                session.execute(
                    sa.insert(ServerEvent).values(server_id=server_id, kind="ordered", created_at=now, detail=detail)
                )
                session.execute(
                    sa.insert(ServerJob).values(
                        server_id=server_id,
                        kind="provision",
                        status="queued",
                        attempts=0,
                        run_after=now,
                        created_at=now,
                    )
                )
            out = server_out(Server(id=server_id, **values))
            events.emit(session, "server.provisioning", account_id, out, now=now)
            # Last: the balance update locks the account row until commit, so keep that short.
            ledger.post(
                session,
                account_id,
                -price,
                "order",
                ref=f"server:{server_id}",
                memo=f"{body.plan} in {body.location}, {body.cycle}",
                now=now,
            )
    except IntegrityError:
        if key is None:
            raise
        with ctx.db.session() as session:  # the same key won a race a moment ago: answer with its server
            replay = _replay(ctx, session, account_id, key, body)
        if replay is None:
            raise
        return replay
    return Ordered(OrderOut(server=out, root_password=None if body.root_password else password))


def replay_order(ctx: AppContext, account_id: int, key: str, body: OrderBody) -> Ordered | None:
    """The earlier order of ``key`` (None if there is none). :raises Conflict: idempotency_key_reused."""
    with ctx.db.session() as session:
        return _replay(ctx, session, account_id, key, body)


def _check_user_data(user_data: str) -> None:
    try:
        check_user_data(user_data)
    except InvalidInput as exc:
        raise BadRequest("invalid_user_data", f"This user data is not accepted: {exc}.") from None


def _user_data_enc(ctx: AppContext, user_data: str | None) -> str | None:
    if user_data is None:
        return None
    _check_user_data(user_data)
    return encrypt_text(ctx, user_data)


def quote_order(ctx: AppContext, account_id: int, balance_micros: int, body: QuoteBody) -> QuoteOut:
    """What :func:`place_order` would charge for ``body`` now; priced by the same ``_resolve``.

    The fields that set no price are checked as the order checks them (so a quote refuses what the
    order would refuse), and change nothing.
    """
    price = _resolve(ctx, body)
    if body.user_data is not None:
        _check_user_data(body.user_data)
    if body.ssh_keys:
        with ctx.db.session() as session:
            keys_for_server(session, account_id, body.ssh_keys)
    return _quote(price, 1, price, balance_micros, period_end(ctx.clock.now(), body.cycle))


def _quote(
    price: int, periods: int, period_price: int, balance: int, expires_at: datetime, most: int | None = None
) -> QuoteOut:
    return QuoteOut(
        price_usd=micros_to_usd(price),
        periods=periods,
        period_price_usd=micros_to_usd(period_price),
        balance_usd=micros_to_usd(balance),
        deficit_usd=micros_to_usd(max(0, price - balance)),
        sufficient=balance >= price,
        expires_at=expires_at,
        max_periods=most,
    )


async def order_quote(call: Call) -> QuoteOut:
    balance = await run_in_threadpool(_balance, call.ctx, call.account_id)
    return await run_in_threadpool(quote_order, call.ctx, call.account_id, balance, call.body)


def _balance(ctx: AppContext, account_id: int) -> int:
    with ctx.db.session() as session:
        return session.execute(sa.select(Account.balance_micros).where(Account.id == account_id)).scalar_one()


async def order_server(call: Call) -> Reply | Response:
    key = idempotency_key(call.request)
    sent = x402_headers.payment_header(call.request)
    if sent is not None:
        return await _paid_order(call, key, *sent)
    try:
        done = await run_in_threadpool(place_order, call.ctx, call.account_id, call.body, key)
    except InsufficientBalance as exc:
        return x402_orders.short_balance(call.ctx, exc, "/servers", x402_orders.ORDER_DESCRIPTION)
    return Reply(done.order, 201, {"Idempotent-Replayed": "true"} if done.replayed else {})


async def _paid_order(call: Call, key: str | None, header: str, version: int) -> Reply | Response:
    """An order re-sent with an x402 payment: settle and credit it, then order (vpsshop.x402.orders)."""
    ctx, body, account_id = call.ctx, call.body, call.account_id
    price = _resolve(ctx, body)  # a bad plan, location or os is refused before anything is paid
    coin, payment = x402_orders.decode(ctx, header, version)
    key = x402_orders.order_key(key, payment)
    replay = await run_in_threadpool(replay_order, ctx, account_id, key, body)
    if replay is not None:  # this payment (or this key) bought its server already: what paid it, as a top-up replay
        paid = await run_in_threadpool(
            lambda: x402_orders.replayed_headers(
                ctx, coin, payment, version, account_id=account_id, purpose=f"order:{key}"
            )
        )
        return Reply(replay.order, 201, {**paid, "Idempotent-Replayed": "true"})
    assert call.principal is not None
    paid = await x402_orders.settle_for(
        ctx,
        coin,
        payment,
        header,
        version,
        account_id=account_id,
        price_micros=price,
        balance_micros=call.principal.balance_micros,
        path="/servers",
        description=x402_orders.ORDER_DESCRIPTION,
        purpose=f"order:{key}",
    )
    try:
        done = await run_in_threadpool(place_order, ctx, account_id, body, key)
    except ApiError as exc:
        return x402_orders.kept_on_balance(exc, paid, "the order")
    return Reply(done.order, 201, {**paid.headers, **({"Idempotent-Replayed": "true"} if done.replayed else {})})


# ---- reading -------------------------------------------------------------------------------------


def _owned(session: Session, account_id: int, server_id: int, *, lock: bool = False) -> Server:
    query = select(Server).where(Server.id == server_id, Server.account_id == account_id)
    server = session.exec(query.with_for_update() if lock else query).first()
    if server is None:
        raise NotFound("server")
    return server


def servers_of(ctx: AppContext, account_id: int) -> ServerList:
    with ctx.db.session() as session:
        rows = session.exec(select(Server).where(Server.account_id == account_id).order_by(Server.id)).all()  # type: ignore[arg-type]
        return ServerList(servers=[server_out(s) for s in rows])


async def list_servers(call: Call) -> ServerList:
    return await run_in_threadpool(servers_of, call.ctx, call.account_id)


def server_of(ctx: AppContext, account_id: int, server_id: int) -> ServerOut:
    with ctx.db.session() as session:
        return server_out(_owned(session, account_id, server_id))


async def get_server(call: Call) -> ServerOut:
    return await run_in_threadpool(server_of, call.ctx, call.account_id, call.path["id"])


def reveal_credentials(ctx: AppContext, account_id: int, server_id: int) -> CredentialsOut:
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id)
    if server.status == "terminated" or server.root_password_enc is None:
        raise ApiError(410, "server_terminated", "The server was deleted; its credentials are gone.")
    assert server.id is not None
    return CredentialsOut(
        server_id=server.id,
        username=server.username,
        password=decrypt_password(ctx, server.root_password_enc),
        ip=server.ip,
        hostname=server.hostname,
    )


async def get_credentials(call: Call) -> CredentialsOut:
    return await run_in_threadpool(reveal_credentials, call.ctx, call.account_id, call.path["id"])


def set_auto_renew(ctx: AppContext, account_id: int, server_id: int, auto_renew: bool) -> ServerOut:
    now = ctx.clock.now()
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id, lock=True)
        if server.status == "terminated":
            raise Conflict("server_terminated", "A terminated server cannot be changed.")
        if server.auto_renew != auto_renew:
            server.auto_renew = auto_renew
            session.add(server)
            record(session, server_id, "auto_renew_on" if auto_renew else "auto_renew_off", now, "customer")
        return server_out(server)


def set_reverse_dns(ctx: AppContext, account_id: int, server_id: int, name: str | None) -> ServerOut:
    """Store the PTR name and queue the ``rdns`` job that tells the DNS provider."""
    if ctx.dns is None:
        raise Conflict("not_supported", "This shop has no DNS provider, so reverse DNS cannot be set.")
    now = ctx.clock.now()
    name = name.lower() if name else None
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id, lock=True)
        if server.status != "active" or not server.ip:
            raise Conflict(
                "server_not_active", f"Reverse DNS needs an active server with an address; this one is {server.status}."
            )
        if server.reverse_dns != name:
            server.reverse_dns = name
            session.add(server)
            enqueue(session, server_id, "rdns", now)
            record(session, server_id, "reverse_dns", now, name or "cleared")
        return server_out(server)


async def patch_server(call: Call) -> ServerOut:
    """Change the fields given; a field that is absent stays."""
    body: ServerPatch = call.body
    if "auto_renew" in body.model_fields_set and body.auto_renew is None:
        raise BadRequest("invalid_auto_renew", "auto_renew must be true or false.")
    out = None
    if "reverse_dns" in body.model_fields_set:
        out = await run_in_threadpool(set_reverse_dns, call.ctx, call.account_id, call.path["id"], body.reverse_dns)
    if body.auto_renew is not None:
        out = await run_in_threadpool(set_auto_renew, call.ctx, call.account_id, call.path["id"], body.auto_renew)
    if out is None:  # nothing to change: the server as it is
        out = await run_in_threadpool(server_of, call.ctx, call.account_id, call.path["id"])
    return out


# ---- renewal and power ---------------------------------------------------------------------------


def _renewable(ctx: AppContext, server: Server, periods: int, now: datetime) -> int:
    """Check the server can be renewed for ``periods`` now; return the most periods allowed."""
    if server.status not in ("active", "suspended"):
        raise Conflict(
            "server_not_renewable", f"A {server.status} server cannot be renewed (only active or suspended ones)."
        )
    check_not_admin_suspended(server)
    pol = policy(ctx)
    most = max_periods(pol, server, now)
    if periods > most:
        raise BadRequest(
            "invalid_periods",
            f"At most {most} period(s) can be paid now: a renewal may not move "
            f"expires_at more than {pol.max_prepay_days} days past now (the prepay horizon).",
            max_periods=most,
        )
    return most


def renew_now(
    ctx: AppContext, account_id: int, server_id: int, periods: int = 1, *, paid_by: int | None = None
) -> RenewOut:
    """Renew ``periods`` cycles from the balance. ``paid_by``: the x402 record that paid for it, marked done
    in the same transaction."""
    for _ in range(3):
        try:
            with ctx.db.session() as session:
                server = _owned(session, account_id, server_id, lock=True)
                now = ctx.clock.now()
                _renewable(ctx, server, periods, now)
                result = renew(session, server, now, by="customer", periods=periods)
                if paid_by is not None:
                    x402_orders.mark_done(session, paid_by)
                return RenewOut(server=server_out(result.server), charged_usd=micros_to_usd(result.charged_micros))
        except RenewalRaced:
            continue
    raise Conflict("server_busy", "The server changed while renewing; retry.")


async def renew_server(call: Call) -> RenewOut | Response:
    server_id = call.path["id"]
    periods = call.body.periods if call.body is not None else 1
    sent = x402_headers.payment_header(call.request)
    if sent is not None:
        return await _paid_renewal(call, server_id, periods, *sent)
    try:
        return await run_in_threadpool(renew_now, call.ctx, call.account_id, server_id, periods)
    except InsufficientBalance as exc:
        return x402_orders.short_balance(
            call.ctx, exc, f"/servers/{server_id}/renew", x402_orders.RENEWAL_DESCRIPTION, "/servers/{id}/renew"
        )


def _renewal_terms(ctx: AppContext, account_id: int, server_id: int, periods: int) -> tuple[int, int]:
    """(price of ``periods`` cycles, balance) of a renewable server. :raises ApiError: 404, 409, 400 as renew_now."""
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id)
        now = ctx.clock.now()
        _renewable(ctx, server, periods, now)
        price, _ = renewal_terms(server, now, periods)
        account = session.get(Account, account_id)
        assert account is not None
        return price, account.balance_micros


async def _paid_renewal(call: Call, server_id: int, periods: int, header: str, version: int) -> Reply | Response:
    """A renewal re-sent with an x402 payment: settle and credit it, then renew, once per authorization."""
    ctx, account_id = call.ctx, call.account_id
    coin, payment = x402_orders.decode(ctx, header, version)
    purpose = f"renew:{server_id}"
    earlier = await run_in_threadpool(x402_orders.recorded, ctx, coin, payment)
    if earlier is not None and earlier.purpose == purpose and earlier.outcome == "done" and earlier.status == "settled":
        server = await run_in_threadpool(server_of, ctx, account_id, server_id)
        reported = await run_in_threadpool(
            lambda: x402_orders.replayed_headers(ctx, coin, payment, version, account_id=account_id, purpose=purpose)
        )
        return Reply(
            RenewOut(server=server, charged_usd=server.price_usd), 200, {**reported, "Idempotent-Replayed": "true"}
        )
    price, balance = await run_in_threadpool(_renewal_terms, ctx, account_id, server_id, periods)
    paid = await x402_orders.settle_for(
        ctx,
        coin,
        payment,
        header,
        version,
        account_id=account_id,
        price_micros=price,
        balance_micros=balance,
        path=f"/servers/{server_id}/renew",
        description=x402_orders.RENEWAL_DESCRIPTION,
        purpose=purpose,
    )
    try:
        out = await run_in_threadpool(lambda: renew_now(ctx, account_id, server_id, periods, paid_by=paid.record_id))
    except ApiError as exc:
        return x402_orders.kept_on_balance(exc, paid, "the renewal")
    return Reply(out, 200, paid.headers)


def quote_renewal(ctx: AppContext, account_id: int, server_id: int, periods: int = 1) -> QuoteOut:
    """What :func:`renew_now` would charge now: the same :func:`renewal_terms`, nothing written."""
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id)
        now = ctx.clock.now()
        most = _renewable(ctx, server, periods, now)
        price, expires_at = renewal_terms(server, now, periods)
        balance = session.execute(sa.select(Account.balance_micros).where(Account.id == account_id)).scalar_one()
        return _quote(price, periods, server.price_micros, balance, expires_at, most)


async def renewal_quote(call: Call) -> QuoteOut:
    periods = call.body.periods if call.body is not None else 1
    return await run_in_threadpool(quote_renewal, call.ctx, call.account_id, call.path["id"], periods)


def power_action(ctx: AppContext, account_id: int, server_id: int, action: str) -> PowerActionOut:
    with ctx.db.session() as session:
        server = _owned(session, account_id, server_id)
        if server.status != "active":
            raise Conflict("server_not_active", f"Power actions need an active server; this one is {server.status}.")
        now = ctx.clock.now()
        job = enqueue(session, server_id, action, now)
        record(session, server_id, f"power_{action}", now, "customer")
        assert job.id is not None
        return PowerActionOut(server_id=server_id, action=action, job_id=job.id)  # type: ignore[arg-type]


def _power_endpoint(action: str):  # type: ignore[no-untyped-def]
    async def power(call: Call) -> PowerActionOut:
        return await run_in_threadpool(power_action, call.ctx, call.account_id, call.path["id"], action)

    power.__name__ = f"{action}_server"
    return power


_X402_HEADERS = (
    Header(
        "X-PAYMENT",
        "x402 v1 payment payload (base64 JSON) paying the deficit named by the 402; the answer "
        "then carries X-PAYMENT-RESPONSE.",
        schema={"type": "string", "minLength": 1},
    ),
    Header(
        "PAYMENT-SIGNATURE",
        "x402 v2 payment payload (base64 JSON), instead of X-PAYMENT; the answer then carries PAYMENT-RESPONSE.",
        schema={"type": "string", "minLength": 1},
    ),
)

_NOT_YOURS = "No server with this id on this account (another account's server is a 404 too)."


def routes() -> list[ApiRoute]:
    power_routes = [
        ApiRoute(
            "POST",
            f"/servers/{{id}}/{action}",
            _power_endpoint(action),
            summary,
            PowerActionOut,
            status=202,
            description=f"{text} The action runs as a job on the hypervisor within seconds; GET /servers/{{id}} shows "
            "the result in its power field once the job has run. Only an active server takes power actions; a power "
            "action does not change the billing status.",
            errors={404: _NOT_YOURS, 409: "server_not_active: the server is provisioning, suspended or terminated."},
            tags=TAG,
            operation_id=f"{action}Server",
        )
        for action, summary, text in (
            ("start", "Power a server on", "Starts the VM if it is off."),
            ("stop", "Power a server off", "Shuts the VM down (forced off after a short grace period)."),
            ("reboot", "Reboot a server", "Restarts the VM, or starts it if it is off."),
        )
    ]
    return [
        ApiRoute(
            "POST",
            "/servers",
            order_server,
            "Order a server",
            OrderOut,
            status=201,
            body=OrderBody,
            response_headers={"Cache-Control": "no-store"},  # the generated root_password, also on a replay
            description="Charges one billing cycle (price from the catalog rule: monthly = plan base price x location "
            "modifier; annual = 10 x monthly; default cycle monthly) from the balance and creates the server with "
            "status provisioning in one atomic step; concurrent orders never overdraw the balance. The server is "
            "created on the hypervisor by a background job and becomes active with an ip within about a minute. "
            "If provisioning fails after retries the server is terminated with status_reason and the charge is "
            "refunded to the balance.\n\n"
            "Idempotency-Key: scoped to the account. A retry with the same key and the same body returns the first "
            "order's response (201, header Idempotent-Replayed: true) and charges nothing; the same key with a "
            "different body is a 409 idempotency_key_reused. Keys do not expire.\n\n"
            "Paying by x402: " + x402_orders.X402_HEADERS_DOC + " An order paid this way is idempotent even "
            "without Idempotency-Key: its key is then the x402 `payment-identifier` id if the client sent one, "
            "else the authorization itself.",
            headers=(
                idempotency_header("1 to 200 visible ASCII characters; makes a retried order safe."),
                *_X402_HEADERS,
            ),
            errors={
                400: "invalid_plan, invalid_location, invalid_os, invalid_cycle, invalid_hostname, "
                "invalid_root_password, invalid_ssh_keys, invalid_user_data, invalid_idempotency_key, unknown_field, "
                "invalid_payment, invalid_coin (a payment header sent to a shop without x402)",
                409: "location_unavailable: the location is in the catalog but the shop has no hosts there (nothing "
                "is charged; choose another); idempotency_key_reused: this key was used for a different order; "
                "nonce_used: the x402 authorization was used for another request.",
                503: "settlement_pending: the x402 settlement outcome is not known yet; re-send the same payment. "
                "settlement_unavailable: the payment could not be checked now; nothing was sent or kept.",
            },
            responses={
                402: (
                    "insufficient_balance: the balance is below the price; nothing was charged (with the "
                    "x402 requirements for the deficit when the shop takes x402); wrong_amount or another "
                    "x402 refusal of a payment.",
                    x402_orders.X402InsufficientBalanceBody,
                )
            },
            tags=TAG,
            operation_id="orderServer",
        ),
        ApiRoute(
            "POST",
            "/servers/quote",
            order_quote,
            "Price an order without placing it",
            QuoteOut,
            body=QuoteBody,
            description="What POST /servers with this body would charge now, the balance, and the deficit to top "
            "up first. Send the order's own body: plan, location, os and cycle set the price; hostname, "
            "root_password, ssh_keys and user_data are accepted, checked as the order checks them (a quote refuses "
            "what the order would), and change nothing. Computed by the same pricing code as the order itself; "
            "nothing is written or reserved, so the price is only guaranteed by the order.",
            errors={
                400: "invalid_plan, invalid_location, invalid_os, invalid_cycle, invalid_hostname, "
                "invalid_root_password, invalid_ssh_keys, invalid_user_data, unknown_field",
                409: "location_unavailable: the shop has no hosts in this catalog location.",
            },
            tags=TAG,
            operation_id="quoteOrder",
        ),
        ApiRoute(
            "GET",
            "/servers",
            list_servers,
            "List the caller's servers",
            ServerList,
            tags=TAG,
            operation_id="listServers",
        ),
        ApiRoute(
            "GET",
            "/servers/{id}",
            get_server,
            "Show a server",
            ServerOut,
            errors={404: _NOT_YOURS},
            tags=TAG,
            operation_id="getServer",
            description="status: provisioning (paid, being created) -> active (running, ip set) -> suspended "
            "(expired unpaid: VM stopped, disk kept) -> terminated (VM and disk deleted after the grace period). "
            "A suspended server returns to active when renewed. status is the billing state: power says whether "
            "the VM is running or stopped (a stopped server is still active and still renews), and status_reason "
            "says when a reinstall is under way.",
        ),
        ApiRoute(
            "PATCH",
            "/servers/{id}",
            patch_server,
            "Change automatic renewal or reverse DNS",
            ServerOut,
            body=ServerPatch,
            description="auto_renew (default true) renews the server from the balance up to 72 hours before "
            "expires_at. Turned off, the server is suspended at expires_at unless POST /servers/{id}/renew is "
            "called, and terminated after the grace period.\n\n"
            "reverse_dns sets the PTR record of the server's address through the shop's DNS provider (a job, within "
            "seconds); null removes it. It needs an active server. The record follows the server's life: it is "
            "removed when the server is terminated, before the address is reused.",
            errors={
                400: "invalid_auto_renew, invalid_reverse_dns, unknown_field",
                404: _NOT_YOURS,
                409: "server_terminated: the server was deleted; server_not_active (reverse_dns); not_supported: "
                "the shop has no DNS provider (reverse_dns).",
            },
            tags=TAG,
            operation_id="updateServer",
        ),
        ApiRoute(
            "GET",
            "/servers/{id}/credentials",
            get_credentials,
            "Reveal the root login",
            CredentialsOut,
            response_headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
            description="The root username and password, decrypted for this response only (stored encrypted). "
            "Sent with Cache-Control: no-store. A terminated server's credentials are gone (410).",
            errors={404: _NOT_YOURS, 410: "server_terminated: the server was deleted."},
            tags=TAG,
            operation_id="getServerCredentials",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/renew",
            renew_server,
            "Renew a server for one or more cycles",
            RenewOut,
            body=RenewBody,
            body_required=False,
            description="Charges `periods` billing cycles (default 1; the body is optional) from the balance now "
            "and moves expires_at as many cycles on. A suspended server (expired unpaid) becomes active again and "
            "its VM is started; its new period starts now. A server the shop suspended (status_reason says why) "
            "is not renewable: 409 server_admin_suspended, checked before any money moves. Servers renew themselves "
            "from the balance up to 72 hours "
            "before expiry (capped at half the cycle), so this is for bringing a suspended server back or paying "
            "ahead. Prepay horizon: expires_at may not end up more than servers.max_prepay_days (default 1100) "
            "days past now; more periods are a 400 invalid_periods carrying max_periods, checked before any "
            "money moves.\n\n"
            "Paying by x402: " + x402_orders.X402_HEADERS_DOC,
            responses={
                402: (
                    "insufficient_balance: the balance does not cover the periods (with the x402 "
                    "requirements for the deficit when the shop takes x402); wrong_amount or another x402 "
                    "refusal.",
                    x402_orders.X402InsufficientBalanceBody,
                )
            },
            headers=_X402_HEADERS,
            errors={
                400: "invalid_periods (past the prepay horizon; max_periods says how many fit), unknown_field, "
                "invalid_payment (a malformed X-PAYMENT or PAYMENT-SIGNATURE), invalid_coin",
                404: _NOT_YOURS,
                409: "server_not_renewable: the server is provisioning or terminated; server_admin_suspended: the "
                "shop suspended the server (only the shop lifts that); nonce_used: the x402 authorization was used "
                "for another request.",
                503: "settlement_pending: the x402 settlement outcome is not known yet; re-send the same payment. "
                "settlement_unavailable: the payment could not be checked now; nothing was sent or kept.",
            },
            tags=TAG,
            operation_id="renewServer",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/renew/quote",
            renewal_quote,
            "Price a renewal without making it",
            QuoteOut,
            body=RenewBody,
            body_required=False,
            description="What POST /servers/{id}/renew with these periods would charge now, where expires_at would "
            "move, the balance and the deficit. Shares the renewal's pricing code; writes nothing.",
            errors={
                400: "invalid_periods (past the prepay horizon)",
                404: _NOT_YOURS,
                409: "server_not_renewable: the server is provisioning or terminated; server_admin_suspended: the "
                "shop suspended the server.",
            },
            tags=TAG,
            operation_id="quoteRenewal",
        ),
        *power_routes,
    ]
