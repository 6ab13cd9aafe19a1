"""One idempotency rule for every operation that moves money: the same key (or x402 payment) with the
same input returns the first answer and does nothing again; with a different input it is a 409
``idempotency_key_reused``, whatever the operation.

A key is an ``Idempotency-Key`` the client sent, the id of the x402 ``payment-identifier`` extension,
or the x402 authorization itself (:func:`vpsshop.x402.purchases.payment_key`); it is scoped to the
account and the operation. An order and a top-up keep the key and the digest of their input on
their own row; a renewal, which has no row of its own, keeps its answer in ``idempotent_requests``
(:func:`recall`, :func:`remember`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlmodel import Session, select

from vpsshop.errors import Conflict
from vpsshop.models import IdempotentRequest

__all__ = ["digest", "recall", "refuse_reuse", "remember"]


def digest(data: BaseModel | dict[str, Any], *, optional: Iterable[str] = ()) -> str:
    """The SHA-256 of an input's canonical JSON. Fields named in ``optional`` count only when given
    (not None), so that an input made before they existed still matches its replay."""
    if isinstance(data, BaseModel):
        skip = {name for name in optional if getattr(data, name, None) is None}
        values = data.model_dump(mode="json", exclude=skip)
    else:
        values = {k: v for k, v in data.items() if not (k in optional and v is None)}
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def refuse_reuse(what: str, **extra: Any) -> Conflict:
    """The 409 of a key (or payment) used before for a different ``what``."""
    return Conflict(
        "idempotency_key_reused",
        f"This idempotency key (or x402 payment) was used for a different {what} by this account; use a new "
        f"key for a new {what}.",
        **extra,
    )


def recall(session: Session, account_id: int, operation: str, key: str, request_digest: str) -> str | None:
    """The JSON answer of ``operation`` made under ``key`` with the same input, or None when the key is
    new. :raises Conflict: ``idempotency_key_reused``: the key was used with another input."""
    row = session.exec(
        select(IdempotentRequest).where(
            IdempotentRequest.account_id == account_id,
            IdempotentRequest.operation == operation,
            IdempotentRequest.key == key,
        )
    ).first()
    if row is None:
        return None
    if row.request_digest != request_digest:
        raise refuse_reuse(operation)
    return row.response


def remember(
    session: Session, account_id: int, operation: str, key: str, request_digest: str, response: BaseModel, now: Any
) -> None:
    """Keep ``response`` as the answer of ``operation`` under ``key``, in the operation's transaction
    (a concurrent request with the same key fails on the unique constraint and is answered by
    :func:`recall` on its retry)."""
    session.execute(
        sa.insert(IdempotentRequest).values(
            account_id=account_id,
            operation=operation,
            key=key[:300],
            request_digest=request_digest,
            response=response.model_dump_json(),
            created_at=now,
        )
    )
