"""The engine side of x402 top-ups (USDCBASE): 402 requirements, then settle a signed authorization.

Flow of ``POST /topups`` for an :class:`vpsshop.X402Coin`:

1. without ``X-PAYMENT``: ``402 {"x402Version": 1, "error": ..., "accepts": [requirements]}``;
2. with ``X-PAYMENT``: the coin decodes it (no network), core records (payer, nonce) in
   ``x402_payments`` *before* settling (unique: one authorization, one record), then the coin
   settles. Success credits the ledger once under the key ``x402:<coin>:<payer>:<nonce>`` and
   answers 201 with the top-up (completed) and ``X-PAYMENT-RESPONSE``.
3. :class:`X402Rejected`: the record is closed as rejected, nothing is credited, the answer is the
   rejection's status with ``{"error", "message"}``.
4. :class:`PluginError` (outcome unknown): the record stays ``settling``, the answer is 503; a
   retry of the same header, or the watcher, asks :meth:`X402Coin.settlement_status` and credits
   once if the authorization was used. A record the chain does not show is closed as rejected
   only once the authorization can no longer be used: ``valid_before`` (plus
   :data:`SETTLE_GRACE` for blocks still arriving) has passed. Until then anyone holding the
   signed authorization (the shop's stuck transaction, a front-runner) may still get it mined,
   and the USDC would reach ``payTo``: closing the record earlier would lose that payment.

USDC is valued at par: ``maxAmountRequired`` is the USD amount in USDC base units, so the amount a
client signs never depends on a rate that could move between the 402 and the re-send.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from anyio import to_thread
from sqlalchemy.exc import IntegrityError
from sqlmodel import select
from starlette.requests import Request

from vpsshop import events, ledger
from vpsshop.coins import X402Coin, X402Payment, X402Rejected, X402Settlement
from vpsshop.errors import ApiError, BadRequest, PluginError
from vpsshop.events.resources import topup_data, x402_payment_data
from vpsshop.money import MICROS_PER_USD
from vpsshop.payments.models import Topup, X402Record

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.payments.engine import PaymentEngine

log = logging.getLogger("vpsshop.x402")

X402_VERSION = 1
ABANDON_AFTER = timedelta(minutes=30)
"""For a coin that does not report ``valid_before`` (0): an open settlement the chain still does not
show after this long is closed as rejected."""
SETTLE_GRACE = timedelta(minutes=2)
"""How long after ``valid_before`` a transaction may still show up: block timestamps that trail
the shop's clock, an RPC node a few blocks behind."""


class X402Required(Exception):
    """Answer 402 with this body (the x402 payment requirements)."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__("payment required")
        self.body = body


def amount_atomic(coin: X402Coin, amount_micros: int) -> int:
    """The top-up's USD amount in the stablecoin's base units, at par."""
    return amount_micros * 10**coin.decimals // MICROS_PER_USD


def requirements(
    engine: "PaymentEngine", coin: X402Coin, amount_micros: int, path: str = "/topups", description: str | None = None,
) -> dict[str, Any]:
    """One v1 ``accepts`` entry for ``amount_micros`` USD, for the resource ``path`` (under ``public_url``)."""
    public = engine.ctx.settings.public_url.rstrip("/")
    if description is None:
        description = f"Top-up of {amount_micros / MICROS_PER_USD:.2f} USD"
    return coin.payment_requirements(amount_atomic(coin, amount_micros), f"{public}{path}", description)


PAYMENT_ID = re.compile(r"[A-Za-z0-9_-]{16,128}")


def payment_header(request: Request) -> tuple[str, int] | None:
    """The request's x402 payment: (``X-PAYMENT`` value, 1) or (``PAYMENT-SIGNATURE`` value, 2), or None.

    :raises BadRequest: invalid_payment when a header is empty or both are sent.
    """
    v1, v2 = request.headers.get("x-payment"), request.headers.get("payment-signature")
    for name, value in (("X-PAYMENT", v1), ("PAYMENT-SIGNATURE", v2)):
        if value is not None and not value.strip():
            raise BadRequest("invalid_payment", f"The {name} header is empty; send the base64 payment payload.")
    if v1 is not None and v2 is not None:
        raise BadRequest("invalid_payment", "Send either X-PAYMENT (x402 v1) or PAYMENT-SIGNATURE (v2), not both.")
    if v1 is not None:
        return v1, 1
    if v2 is not None:
        return v2, 2
    return None


def payment_identifier(payment: X402Payment) -> str | None:
    """The id of the x402 v2 ``payment-identifier`` extension in the payload, if the client sent one.

    :raises BadRequest: invalid_payment when the extension is there but its id is not 16 to 128
        letters, digits, ``_`` or ``-``.
    """
    extensions = payment.raw.get("extensions")
    ext = extensions.get("payment-identifier") if isinstance(extensions, dict) else None
    info = ext.get("info") if isinstance(ext, dict) else None
    value = info.get("id") if isinstance(info, dict) else None
    if value is None:
        return None
    if not isinstance(value, str) or not PAYMENT_ID.fullmatch(value):
        raise BadRequest("invalid_payment", "extensions.payment-identifier.info.id must be 16 to 128 letters, "
                         "digits, '_' or '-'.")
    return value


def may_still_settle(payment: X402Payment, created_at: datetime, now: datetime) -> bool:
    """True while an authorization the chain does not show may still be mined (keep its record open)."""
    if payment.valid_before > 0:
        return now <= datetime.fromtimestamp(payment.valid_before, timezone.utc) + SETTLE_GRACE
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=timezone.utc)
    return now - created_at <= ABANDON_AFTER


def decode_recorded(coin: X402Coin, header: str) -> X402Payment:
    """Decode a header kept in a record: ``X-PAYMENT`` (v1) or ``PAYMENT-SIGNATURE`` (v2)."""
    try:
        version = int(json.loads(base64.b64decode(header + "=" * (-len(header) % 4))).get("x402Version", 1))
    except (ValueError, TypeError, AttributeError):
        version = X402_VERSION
    return coin.decode_payment(header, version)


def payment_required_body(engine: "PaymentEngine", coin: X402Coin, amount_micros: int, error: str) -> dict[str, Any]:
    return {"x402Version": X402_VERSION, "error": error, "accepts": [requirements(engine, coin, amount_micros)]}


def _b64_json(body: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def payment_required_header(
    engine: "PaymentEngine", coin: X402Coin, amount_micros: int, path: str = "/topups", description: str | None = None,
    extensions: dict[str, Any] | None = None,
) -> str | None:
    """``PAYMENT-REQUIRED`` (x402 v2) sent with the 402 next to the v1 body; None when the coin does
    not offer v2 (:meth:`X402Coin.payment_requirements_v2` raises ``NotImplementedError``)."""
    reqs = requirements(engine, coin, amount_micros, path, description)
    try:
        accepted = coin.payment_requirements_v2(reqs)
    except NotImplementedError:
        return None
    required: dict[str, Any] = {
        "x402Version": 2,
        "error": "PAYMENT-SIGNATURE header is required",
        "resource": {"url": reqs["resource"], "description": reqs.get("description", ""),
                     "mimeType": reqs.get("mimeType", "application/json")},
        "accepts": [accepted],
    }
    if extensions:
        required["extensions"] = extensions
    return _b64_json(required)


def response_header(coin: X402Coin, settlement: X402Settlement, version: int = X402_VERSION) -> str:
    """``X-PAYMENT-RESPONSE`` (v1) or ``PAYMENT-RESPONSE`` (v2): base64 JSON of the settle result."""
    return _b64_json(coin.settlement_response(settlement, version))


def decode(coin: X402Coin, header: str, version: int) -> X402Payment:
    """The coin's reading of a payment header. :raises ApiError: the coin's refusal (400 invalid_payment)."""
    try:
        return coin.decode_payment(header, version)
    except X402Rejected as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None


async def pay(
    engine: "PaymentEngine", coin: X402Coin, account_id: int, amount_micros: int, header: str,
    version: int = X402_VERSION, *, path: str = "/topups", description: str | None = None,
    purpose: str | None = None,
) -> tuple[Topup, X402Settlement]:
    """Settle the payment header (``X-PAYMENT`` v1, ``PAYMENT-SIGNATURE`` v2) for a top-up of
    ``amount_micros``. See the module docs.

    ``path`` and ``description`` name the resource of the requirements the payment is checked
    against; ``purpose`` is what the payment is for besides the top-up (``order:<key>``,
    ``renew:<id>``, see :class:`X402Record`): an authorization recorded for another purpose is a 409
    ``nonce_used``.
    """
    payment = decode(coin, header, version)
    reqs = requirements(engine, coin, amount_micros, path, description)
    record, topup, fresh = await to_thread.run_sync(
        _record_before_settling, engine, coin, account_id, amount_micros, payment, header, reqs, purpose
    )
    if not fresh:
        if topup.account_id != account_id or record.purpose != purpose:
            raise ApiError(409, "nonce_used", "This authorization was already used for another request.")
        if record.status == "settled":
            # the payer as the coin writes it (checksummed for USDCBASE), as in the first answer
            settlement = X402Settlement(payment.payer, record.nonce, record.transaction or "", record.network or "",
                                        int(record.amount_atomic))
            return topup, settlement
        if record.status == "rejected":
            raise ApiError(402, "nonce_used", f"This authorization was refused before ({record.error}); sign a new one.")
        settled = await coin.settlement_status(payment)
        if settled is None and not may_still_settle(payment, record.created_at, engine.ctx.clock.now()):
            await to_thread.run_sync(_reject, engine, record.id, "not_settled")
            raise ApiError(402, "authorization_expired",
                           "This authorization expired before it was settled; nothing moved. Sign a new one.")
        if settled is None:
            raise ApiError(503, "settlement_pending",
                           "The settlement of this authorization is not confirmed yet; retry the same request shortly.")
        topup = await to_thread.run_sync(_credit, engine, coin, record.id, settled)
        return topup, settled
    try:
        settled = await coin.settle(payment, reqs)
    except X402Rejected as exc:
        await to_thread.run_sync(_reject, engine, record.id, exc.code)
        raise ApiError(exc.status, exc.code, exc.message) from None
    except PluginError as exc:
        log.warning("x402 settlement of %s/%s has an unknown outcome: %s", payment.payer, payment.nonce, exc)
        raise ApiError(503, "settlement_pending",
                       "The settlement outcome is not known yet; retry the same request shortly. "
                       "The authorization is recorded and will be credited once if it settles.") from None
    topup = await to_thread.run_sync(_credit, engine, coin, record.id, settled)
    return topup, settled


def _record_before_settling(
    engine: "PaymentEngine", coin: X402Coin, account_id: int, amount_micros: int, payment: X402Payment,
    header: str, reqs: dict[str, Any], purpose: str | None = None,
) -> tuple[X402Record, Topup, bool]:
    """Insert the top-up and the (payer, nonce) record, or return the existing record."""
    from vpsshop.payments.engine import new_ref

    now = engine.ctx.clock.now()
    payer, nonce = payment.payer.lower(), payment.nonce.lower()
    try:
        with engine.ctx.db.session() as session:
            topup = Topup(
                ref=new_ref(), account_id=account_id, coin=coin.code, status="pending", amount_micros=amount_micros,
                rate="1", deposit_address=str(reqs.get("payTo", "")), deposit_amount_atomic=str(payment.value_atomic),
                deposit_network=coin.network, registered=True, created_at=now,
                expires_at=now + timedelta(seconds=int(reqs.get("maxTimeoutSeconds", 60))),
            )
            session.add(topup)
            session.flush()
            events.emit(session, "topup.created", account_id, topup_data(engine.ctx, topup), now=now)
            record = X402Record(
                coin=coin.code, payer=payer, nonce=nonce, topup_id=topup.id, status="settling",  # type: ignore[arg-type]
                amount_atomic=str(payment.value_atomic), header=header, requirements=json.dumps(reqs), created_at=now,
                purpose=purpose,
            )
            session.add(record)
            session.flush()
            return record, topup, True
    except IntegrityError:
        with engine.ctx.db.session() as session:
            record = session.exec(select(X402Record).where(
                X402Record.coin == coin.code, X402Record.payer == payer, X402Record.nonce == nonce)).one()
            topup = session.get(Topup, record.topup_id)
            assert topup is not None
            return record, topup, False


def _reject(engine: "PaymentEngine", record_id: int | None, code: str) -> None:
    now = engine.ctx.clock.now()
    with engine.ctx.db.session() as session:
        record = session.get(X402Record, record_id)
        if record is None or record.status != "settling":
            return
        record.status, record.error = "rejected", code[:200]
        topup = session.get(Topup, record.topup_id)
        if topup is not None and topup.status == "pending":
            topup.status, topup.cancelled_at = "cancelled", now
            session.add(topup)
            events.emit(session, "topup.cancelled", topup.account_id, topup_data(engine.ctx, topup), now=now)
        session.add(record)


def _credit(engine: "PaymentEngine", coin: X402Coin, record_id: int | None, settled: X402Settlement) -> Topup:
    """Credit a settled authorization once (ledger key ``x402:<coin>:<payer>:<nonce>``)."""
    now = engine.ctx.clock.now()
    with engine.ctx.db.session() as session:
        stmt = select(X402Record).where(X402Record.id == record_id)
        if session.get_bind().dialect.name == "postgresql":
            stmt = stmt.with_for_update()
        record = session.exec(stmt).one()
        topup = session.get(Topup, record.topup_id)
        assert topup is not None
        if record.status == "settled":
            return topup
        micros = int(settled.amount_atomic) * MICROS_PER_USD // 10**coin.decimals
        if micros > 0:
            ledger.post(session, topup.account_id, micros, "topup", ref=topup.ref,
                        dedupe_key=f"x402:{coin.code}:{record.payer}:{record.nonce}",
                        memo=f"x402 {coin.code} tx {settled.transaction}"[:500], now=now)
        record.status, record.transaction, record.network, record.settled_at = (
            "settled", settled.transaction, settled.network, now)
        topup.status, topup.completed_at = "completed", now
        session.add(record)
        session.add(topup)
        events.emit(session, "topup.payment_confirmed", topup.account_id,
                    x402_payment_data(engine.ctx, topup, settled.transaction, settled.amount_atomic, micros), now=now)
        events.emit(session, "topup.completed", topup.account_id, topup_data(engine.ctx, topup), now=now)
        return topup


async def resolve_open_settlements(engine: "PaymentEngine") -> int:
    """Watcher step: ask the coin about records left ``settling``; credit or close them."""
    coins = {code: c for code, c in engine.ctx.coins.items() if isinstance(c, X402Coin)}
    if not coins:
        return 0
    records = await to_thread.run_sync(_open_records, engine, list(coins))
    credited = 0
    for record in records:
        coin = coins[record.coin]
        try:
            payment = decode_recorded(coin, record.header)
            settled = await coin.settlement_status(payment)
        except (PluginError, X402Rejected) as exc:
            log.warning("x402 record %s still unresolved: %s", record.id, exc)
            continue
        if settled is not None:
            await to_thread.run_sync(_credit, engine, coin, record.id, settled)
            credited += 1
        elif not may_still_settle(payment, record.created_at, engine.ctx.clock.now()):
            await to_thread.run_sync(_reject, engine, record.id, "not_settled")
    return credited


def _open_records(engine: "PaymentEngine", coins: list[str]) -> list[X402Record]:
    with engine.ctx.db.session() as session:
        return list(session.exec(select(X402Record).where(
            X402Record.status == "settling", X402Record.coin.in_(coins)).limit(100)).all())  # type: ignore[attr-defined]
