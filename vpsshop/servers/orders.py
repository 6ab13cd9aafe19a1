"""Ordering a server: a quote that writes nothing, and the order itself, paid from the balance or
by x402 in the same call.

:func:`place_order` is the one way a server is bought: the REST API (``POST /v1/servers``, with or
without an x402 payment), the dashboard's order form and the MCP tool ``order_server`` all call it.
It charges one billing cycle and creates the server (status provisioning) in one transaction; a job
then makes it on the hypervisor (:mod:`vpsshop.servers.jobs`).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypedDict

import sqlalchemy as sa
from anyio import to_thread
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

import vpsshop.events as events
import vpsshop.ledger as ledger
from vpsshop import idempotency, limits, wallets
from vpsshop.accounts import MissingCredential, customer_of, read_summary
from vpsshop.actors import Customer
from vpsshop.catalog import price_cents
from vpsshop.cloudinit import MAX_DEPTH, MAX_EXPANDED_CHARS, MAX_USER_DATA_BYTES, InvalidInput, check_user_data
from vpsshop.context import AppContext, StateKey
from vpsshop.encryption import encrypt_text
from vpsshop.errors import ApiError, BadRequest, Conflict
from vpsshop.inputs import Input
from vpsshop.ledger import InsufficientBalance
from vpsshop.models import Server, table_of
from vpsshop.money import MICROS_PER_CENT, UsdAmount, micros_to_usd
from vpsshop.servers.credentials import decrypt_password, encrypt_password, generate_root_password
from vpsshop.servers.lifecycle import DEFAULT_CYCLE, nudge_after_commit, period_end
from vpsshop.servers.models import ServerEvent, ServerJob
from vpsshop.servers.resource import ServerOut, server_out
from vpsshop.servers.sshkeys import MAX_KEYS_PER_SERVER, SshKeyId, keys_for_server
from vpsshop.wallets import SignupCredentials
from vpsshop.x402 import messages, purchases
from vpsshop.x402.offers import SettledPayment, SignedPayment

__all__ = [
    "HOSTNAME_PATTERN",
    "ORDER_DESCRIPTION",
    "PRINTABLE_PATTERN",
    "OrderInput",
    "OrderOut",
    "Ordered",
    "QuoteInput",
    "QuoteOut",
    "place_order",
    "place_signup_order",
    "quote_order",
]

HOSTNAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
PRINTABLE_PATTERN = r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$"  # printable ASCII, not only spaces
ORDER_DESCRIPTION = "Pays what the balance lacks for this server order; the order is placed with the paid re-send."


class OrderInput(Input):
    """What an order is (the body of ``POST /servers``). Each bad field has its own code: ``invalid_<field>``."""

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
        pattern=HOSTNAME_PATTERN,
        description="A DNS label: 1-63 letters, digits and hyphens, not starting or ending with a hyphen; "
        "stored lower-case. Default vps-<id> (invalid_hostname).",
    )
    root_password: str | None = Field(
        None,
        min_length=10,
        max_length=128,
        pattern=PRINTABLE_PATTERN,
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


class QuoteInput(OrderInput):
    """Body of ``POST /servers/quote``: the body of the order to price, exactly as it would be sent to
    ``POST /servers``. Only plan, location, os and cycle change the price; the other fields are
    checked as the order checks them, and change nothing."""


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


class OrderOut(BaseModel):
    """Response of ``POST /servers``."""

    server: ServerOut
    root_password: str | None = Field(
        description="The generated root password when the order gave none (null otherwise). Shown here once; "
        "GET /servers/{id}/credentials reveals it later."
    )
    account: SignupCredentials | None = Field(
        None,
        description="Only for an order paid by x402 without an API key (pay as sign-up): the paying wallet's "
        "account, with its first API key and login token when this order created it (shown once; null on a "
        "replay and for a wallet that already had an account).",
    )


@dataclass(frozen=True)
class Ordered:
    """What :func:`place_order` did: the order, whether it is the replay of an earlier one, and the x402
    settlement that paid it (on a replay: the one that paid the first order)."""

    order: OrderOut
    replayed: bool = False
    settled: SettledPayment | None = None


# ---- pricing -------------------------------------------------------------------------------------


def _resolve(ctx: AppContext, body: OrderInput) -> int:
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
    os_ = next((o for o in data.operating_systems if o.id == body.os), None)
    if os_ is None:
        raise BadRequest("invalid_os", f"No operating system {body.os!r}; GET /catalog lists them.")
    if not ctx.offers_os(location.id, os_.image):
        raise Conflict(
            "os_unavailable",
            f"{os_.name} ({os_.id}) cannot be ordered in {location.name} ({location.id}) at the moment: no host "
            "there holds its image. Nothing was charged; choose another operating system or location.",
        )
    return price_cents(plan, location, body.cycle) * MICROS_PER_CENT


def quote(
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


def _check_user_data(user_data: str) -> None:
    try:
        check_user_data(user_data)
    except InvalidInput as exc:
        raise BadRequest("invalid_user_data", f"This user data is not accepted: {exc}.") from None


def user_data_enc(ctx: AppContext, user_data: str | None) -> str | None:
    """Customer user data checked (:func:`vpsshop.cloudinit.check_user_data`) and encrypted for storage.

    :raises BadRequest: invalid_user_data.
    """
    if user_data is None:
        return None
    _check_user_data(user_data)
    return encrypt_text(ctx, user_data)


def _balance(ctx: AppContext, account_id: int) -> int:
    with ctx.db.session() as session:
        return read_summary(session, account_id).balance_micros


async def quote_order(ctx: AppContext, customer: Customer, data: QuoteInput) -> QuoteOut:
    """What :func:`place_order` would charge for ``data`` now, priced by the same code; writes nothing.

    The fields that set no price are checked as the order checks them (so a quote refuses what the
    order would refuse), and change nothing. Counts against the account's write limit (a quote can
    parse user data).
    """

    def run() -> QuoteOut:
        limits.count_write(ctx, customer.account_id)
        price = _resolve(ctx, data)
        if data.user_data is not None:
            _check_user_data(data.user_data)
        with ctx.db.session() as session:
            if data.ssh_keys:
                keys_for_server(session, customer.account_id, data.ssh_keys)
            balance = read_summary(session, customer.account_id).balance_micros
        return quote(price, 1, price, balance, period_end(ctx.clock.now(), data.cycle))

    return await to_thread.run_sync(run)


# ---- ordering ------------------------------------------------------------------------------------


def _digest(body: OrderInput) -> str:
    # Fields added later (ssh_keys, user_data) count only when given, so an order made before they
    # existed still replays.
    return idempotency.digest(body, optional=("ssh_keys", "user_data"))


def _replay(ctx: AppContext, session: Session, account_id: int, key: str, body: OrderInput) -> Ordered | None:
    server = session.exec(select(Server).where(Server.account_id == account_id, Server.idempotency_key == key)).first()
    if server is None:
        return None
    if server.request_digest != _digest(body):
        raise idempotency.refuse_reuse("order", server_id=server.id)
    generated = None
    if body.root_password is None and server.root_password_enc is not None:
        # Same body as the first order, which gave no password: the first response carried the
        # generated one, and so does its replay (the credentials endpoint reveals it anyway).
        generated = decrypt_password(ctx, server.root_password_enc)
    return Ordered(OrderOut(server=server_out(server), root_password=generated), replayed=True)


def _replay_order(ctx: AppContext, account_id: int, key: str, body: OrderInput) -> Ordered | None:
    with ctx.db.session() as session:
        return _replay(ctx, session, account_id, key, body)


class _OrderLock:
    def __init__(self, _ctx: AppContext) -> None:
        self.lock = threading.Lock()


_SQLITE_ORDERS = StateKey[_OrderLock]("sqlite-order-lock")


def _writers(ctx: AppContext) -> Any:
    """On SQLite, one order transaction at a time per process.

    SQLite has one writer at a time anyway (``BEGIN IMMEDIATE``); threads that find the database
    locked wait in SQLite's busy handler, which sleeps in growing steps. Queueing them on a Python
    lock instead hands the write lock straight to the next order (see docs/performance.md).
    """
    if ctx.db.dialect != "sqlite":
        return contextlib.nullcontext()
    return ctx.state(_SQLITE_ORDERS, _OrderLock).lock


def _live_servers(session: Session, account_id: int) -> int:
    count = session.execute(
        sa.select(sa.func.count())
        .select_from(Server)
        .where(col(Server.account_id) == account_id, col(Server.status) != "terminated")
    ).scalar()
    return int(count or 0)


class _OrderRow(TypedDict):
    """The columns an order writes to ``servers``, as one Core insert takes them."""

    account_id: int
    plan: str
    location: str
    os: str
    hostname: str
    cycle: str
    price_micros: int
    status: str
    username: str
    created_at: datetime
    expires_at: datetime
    root_password_enc: str
    idempotency_key: str | None
    request_digest: str | None
    auto_renew: bool
    ssh_keys: str | None
    user_data_enc: str | None
    snapshot_fee_micros: int


_TABLES = table_of(Server), table_of(ServerEvent), table_of(ServerJob)


def _insert_order_pg(values: _OrderRow, default_hostname: bool, detail: str, now: datetime) -> Any:
    """PostgreSQL: the server row, its ``ordered`` event and its ``provision`` job in one statement.

    The id is drawn from the table's sequence first, so the default hostname ``vps-<id>`` goes into
    the same insert (elsewhere it takes an insert and an update).
    """
    servers, events, jobs = _TABLES
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


def _count_order(ctx: AppContext, customer: Customer) -> None:
    """An order counts against the account's write limit and its server quota."""
    limits.count_write(ctx, customer.account_id)
    if customer.summary is not None:  # read with the caller's key, in this request
        servers = customer.summary.servers
    else:
        with ctx.db.session() as session:
            servers = _live_servers(session, customer.account_id)
    limits.server_quota(ctx, servers)


def _place(ctx: AppContext, customer: Customer, body: OrderInput, key: str | None, *, count: bool = True) -> Ordered:
    """Charge one cycle and create the server (provisioning), atomically; ``key`` makes it idempotent.
    ``count``: apply the write limit and the server quota here (False: the caller has)."""
    account_id = customer.account_id
    if count:
        _count_order(ctx, customer)
    price = _resolve(ctx, body)
    digest = _digest(body)
    if key is not None:
        with ctx.db.session() as session:
            replay = _replay(ctx, session, account_id, key, body)
        if replay is not None:
            return replay
    stored_user_data = user_data_enc(ctx, body.user_data)
    ssh_keys = None
    if body.ssh_keys:
        with ctx.db.session() as session:
            ssh_keys = keys_for_server(session, account_id, body.ssh_keys)
    password = body.root_password or generate_root_password()
    now = ctx.clock.now()
    try:
        with _writers(ctx), ctx.db.session() as session:
            # Core statements, not ORM units of work: this is the hot path of ordering (bench/orders.py).
            values = _OrderRow(
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
                user_data_enc=stored_user_data,
                snapshot_fee_micros=0,
            )
            detail = f"{body.plan} {body.location} {body.os} {body.cycle}"
            if ctx.db.dialect == "postgresql":
                # One round trip for the server (its default hostname from its id), its history row and its job.
                server_id = session.execute(_insert_order_pg(values, body.hostname is None, detail, now)).scalar_one()
                if body.hostname is None:
                    values["hostname"] = f"vps-{server_id}"
            else:
                server_id = session.execute(sa.insert(Server).values(**values).returning(col(Server.id))).scalar_one()
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
            nudge_after_commit(session)
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


async def place_order(
    ctx: AppContext,
    customer: Customer,
    data: OrderInput,
    *,
    idempotency_key: str | None = None,
    payment: SignedPayment | None = None,
) -> Ordered:
    """Order a server: charge one billing cycle from the balance and create the server, atomically.

    ``idempotency_key``: the same key with the same order returns the first order and charges nothing
    (with another order: 409 ``idempotency_key_reused``). ``payment``: an x402 payment of what the
    balance lacks, settled and credited first; an order paid this way is idempotent on the payment
    (:func:`vpsshop.x402.purchases.payment_key`).

    :raises BadRequest: invalid_plan, invalid_location, invalid_os, invalid_user_data, invalid_ssh_keys ...
    :raises InsufficientBalance: 402, nothing charged; with the x402 requirements for the deficit
        (``exc.offer``) when the shop takes x402.
    :raises Conflict: idempotency_key_reused, location_unavailable, os_unavailable.
    :raises RateLimited: the account's write limit or server quota.
    """
    if payment is None:
        try:
            return await to_thread.run_sync(_place, ctx, customer, data, idempotency_key)
        except InsufficientBalance as exc:
            raise purchases.offer_deficit(ctx, exc, "/servers", ORDER_DESCRIPTION) from None
    return await _paid_order(ctx, customer, data, idempotency_key, payment)


async def _paid_order(
    ctx: AppContext, customer: Customer, data: OrderInput, idempotency_key: str | None, payment: SignedPayment
) -> Ordered:
    """An order sent with an x402 payment: settle and credit it, then order (:mod:`vpsshop.x402.purchases`)."""
    account_id = customer.account_id
    price = _resolve(ctx, data)  # a bad plan, location or os is refused before anything is paid
    coin, decoded = purchases.decode(ctx, payment)
    key = purchases.payment_key(idempotency_key, decoded)
    replay = await to_thread.run_sync(_replay_order, ctx, account_id, key, data)
    if replay is not None:  # this payment (or this key) bought its server already: what paid it, as a top-up replay
        settled = await to_thread.run_sync(
            lambda: purchases.replayed_settlement(
                ctx, coin, decoded, payment.version, account_id=account_id, purpose=f"order:{key}"
            )
        )
        return Ordered(replay.order, True, settled)
    await to_thread.run_sync(_count_order, ctx, customer)
    balance = (
        customer.summary.balance_micros
        if customer.summary is not None
        else await to_thread.run_sync(_balance, ctx, account_id)
    )
    if messages.holds_orders(ctx, coin):  # verified and held: the server's readiness settles it
        paid = await purchases.hold_for(
            ctx,
            coin,
            decoded,
            payment,
            account_id=account_id,
            price_micros=price,
            balance_micros=balance,
            purpose=f"order:{key}",
        )
        try:
            done = await to_thread.run_sync(lambda: _place(ctx, customer, data, key, count=False))
        except ApiError as exc:  # no order: the authorization is dropped, nothing was sent
            await to_thread.run_sync(purchases.release_held, ctx, account_id, f"order:{key}", exc.error)
            raise
        return Ordered(done.order, done.replayed, paid.settled)
    paid = await purchases.settle_for(
        ctx,
        coin,
        decoded,
        payment,
        account_id=account_id,
        price_micros=price,
        balance_micros=balance,
        path="/servers",
        description=ORDER_DESCRIPTION,
        purpose=f"order:{key}",
    )
    done = await purchases.fulfil(paid, "the order", lambda: _place(ctx, customer, data, key, count=False))
    return Ordered(done.order, done.replayed, paid.settled)


async def place_signup_order(
    ctx: AppContext,
    data: OrderInput,
    *,
    idempotency_key: str | None = None,
    payment: SignedPayment | None = None,
    client: str,
) -> Ordered:
    """An order sent without an API key (pay as sign-up): paid in full by x402, for the account the
    paying wallet owns, created by its first payment (:func:`vpsshop.wallets.owner_account`). The answer
    carries that account (``OrderOut.account``), with its first API key and login token the first time
    an order of a new account succeeds. Otherwise as :func:`place_order` with a payment.

    :raises InsufficientBalance: 402 without a payment, with the x402 requirements for the whole price.
    :raises MissingCredential: 401 when the shop takes no x402 (no sign-up by paying there).
    :raises RateLimited: a new account over the sign-up limit of ``client``; the order quota.
    """
    price = _resolve(ctx, data)  # a bad plan, location or os is refused before anything is asked or paid
    if payment is None:
        if purchases.offered_coin(ctx) is None:
            raise MissingCredential()  # a shop without x402: no sign-up by paying, the key is required
        raise purchases.offer_signup(ctx, price, "/servers", ORDER_DESCRIPTION)
    _coin, decoded = purchases.decode(ctx, payment)
    owner = await to_thread.run_sync(wallets.owner_account, ctx, decoded.payer, client)
    customer = await customer_of(ctx, owner.account_id)
    done = await _paid_order(ctx, customer, data, idempotency_key, payment)
    if done.replayed:
        shown = SignupCredentials(
            user_id=owner.account_id,
            address=wallets.wallet_address(decoded.payer),
            created=False,
            api_key=None,
            key_id=None,
            login_token=None,
        )
    else:
        shown = await to_thread.run_sync(wallets.deliver_credentials, ctx, decoded.payer, owner)
    order = done.order.model_copy(update={"account": shown})
    return Ordered(order, done.replayed, done.settled)
