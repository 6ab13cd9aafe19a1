"""The SSH key store: add, list and delete the account's public keys (``/v1/ssh-keys``, the dashboard,
the MCP tools), with ``ssh_key.created`` and ``ssh_key.deleted`` events.

A stored key is chosen by id when ordering or reinstalling a server (``ssh_keys`` on
``POST /servers``); the server keeps a copy of the key text, so deleting a key from the store does
not lock anyone out of a running server.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

import sqlalchemy as sa
from anyio import to_thread
from pydantic import BaseModel, Field, WithJsonSchema
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

import vpsshop.events as events
from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.cloudinit import MAX_PUBLIC_KEY_CHARS, InvalidInput, parse_ssh_public_key
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict, NotFound
from vpsshop.inputs import MAX_ID, Input, JsonInt
from vpsshop.servers.models import SshKey

__all__ = [
    "MAX_KEYS_PER_ACCOUNT",
    "MAX_KEYS_PER_SERVER",
    "SshKeyDeleted",
    "SshKeyId",
    "SshKeyInput",
    "SshKeyList",
    "SshKeyOut",
    "add_key",
    "delete_key",
    "keys_for_server",
    "list_keys",
]

MAX_KEYS_PER_ACCOUNT = 50
MAX_KEYS_PER_SERVER = 10
_NAME = r"^[\x20-\x7e]+$"


class SshKeyInput(Input):
    """Body of ``POST /ssh-keys``."""

    name: str = Field(
        min_length=1,
        max_length=64,
        pattern=_NAME,
        description="A label for the key: 1 to 64 printable ASCII characters (invalid_name).",
    )
    public_key: str = Field(
        min_length=1,
        max_length=MAX_PUBLIC_KEY_CHARS,
        description="One line in OpenSSH authorized_keys format, '<type> <base64> [comment]', without options: "
        "ssh-ed25519, ecdsa-sha2-nistp256/384/521, or ssh-rsa of at least 2048 bits (invalid_public_key). The "
        "comment is not kept.",
    )


class SshKeyOut(BaseModel):
    id: int
    name: str
    key_type: str = Field(description="ed25519, ecdsa or rsa.")
    bits: int = Field(description="Key size in bits (256 for Ed25519, the curve size for ECDSA).")
    public_key: str = Field(description="'<type> <base64>', as written to root's authorized_keys.")
    fingerprint: str = Field(description="SHA256:<base64>, as `ssh-keygen -l -f key.pub` prints it.")
    created_at: datetime


class SshKeyList(BaseModel):
    ssh_keys: list[SshKeyOut] = Field(description="The caller's stored keys, oldest first.")


class SshKeyDeleted(BaseModel):
    id: int
    deleted: bool = True


def key_out(key: SshKey) -> SshKeyOut:
    assert key.id is not None
    return SshKeyOut(
        id=key.id,
        name=key.name,
        key_type=key.key_type,
        bits=key.bits,
        public_key=key.public_key,
        fingerprint=key.fingerprint,
        created_at=key.created_at,
    )


async def add_key(ctx: AppContext, customer: Customer, data: SshKeyInput) -> SshKeyOut:
    """Store a public key under a name.

    :raises BadRequest: invalid_public_key (saying why). :raises Conflict: ssh_key_exists, too_many_ssh_keys.
    """
    return await to_thread.run_sync(_add_key, ctx, customer.account_id, data)


def _add_key(ctx: AppContext, account_id: int, body: SshKeyInput) -> SshKeyOut:
    limits.count_write(ctx, account_id)  # first: a refused key counts too (parsing one costs)
    try:
        parsed = parse_ssh_public_key(body.public_key)
    except InvalidInput as exc:
        raise BadRequest("invalid_public_key", f"This public key is not accepted: {exc}.") from None
    now = ctx.clock.now()
    try:
        with ctx.db.session() as session:
            count = session.execute(
                sa.select(sa.func.count()).select_from(SshKey).where(col(SshKey.account_id) == account_id)
            ).scalar_one()
            if count >= MAX_KEYS_PER_ACCOUNT:
                raise Conflict(
                    "too_many_ssh_keys", f"An account holds at most {MAX_KEYS_PER_ACCOUNT} keys; delete one first."
                )
            key = SshKey(
                account_id=account_id,
                name=body.name,
                key_type=parsed.key_type,
                bits=parsed.bits,
                public_key=parsed.openssh,
                fingerprint=parsed.fingerprint,
                created_at=now,
            )
            session.add(key)
            session.flush()
            out = key_out(key)
            events.emit(session, "ssh_key.created", account_id, out, now=now)
            return out
    except IntegrityError:
        raise Conflict("ssh_key_exists", f"This account already stores the key {parsed.fingerprint}.") from None


async def list_keys(ctx: AppContext, customer: Customer) -> SshKeyList:
    """The account's stored keys, oldest first."""

    def read() -> SshKeyList:
        with ctx.db.session() as session:
            rows = session.exec(
                select(SshKey).where(SshKey.account_id == customer.account_id).order_by(col(SshKey.id))
            ).all()
            return SshKeyList(ssh_keys=[key_out(k) for k in rows])

    return await to_thread.run_sync(read)


async def delete_key(ctx: AppContext, customer: Customer, key_id: int) -> SshKeyDeleted:
    """Delete a stored key (servers made with it keep their copy). :raises NotFound: not the account's."""

    def delete() -> SshKeyDeleted:
        limits.count_write(ctx, customer.account_id)
        with ctx.db.session() as session:
            key = session.exec(
                select(SshKey).where(SshKey.id == key_id, SshKey.account_id == customer.account_id)
            ).first()
            if key is None:
                raise NotFound("SSH key on this account")
            out = key_out(key)
            session.delete(key)
            events.emit(session, "ssh_key.deleted", customer.account_id, out, now=ctx.clock.now())
        return SshKeyDeleted(id=key_id)

    return await to_thread.run_sync(delete)


SshKeyId = Annotated[
    JsonInt,  # a number: not true, not "3"
    Field(ge=1, le=MAX_ID),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_ID}),  # the validator hides ge/le from pydantic
]
"""The id of a stored key as a request names it: a database id (a larger number is an unknown key,
refused by the model instead of overflowing the database's integer)."""


def keys_for_server(session: Session, account_id: int, ids: list[int] | None) -> str | None:
    """The public keys of ``ids`` (the caller's own), as the JSON list stored on the server.

    :raises BadRequest: ``invalid_ssh_keys`` naming an id that is not one of the caller's keys.
    """
    if not ids:
        return None
    wanted = list(dict.fromkeys(ids))
    rows = session.exec(select(SshKey).where(SshKey.account_id == account_id, col(SshKey.id).in_(wanted))).all()
    found = {k.id: k.public_key for k in rows}
    missing = [i for i in wanted if i not in found]
    if missing:
        raise BadRequest("invalid_ssh_keys", f"No SSH key {missing[0]} on this account; GET /ssh-keys lists yours.")
    return json.dumps([found[i] for i in wanted])
