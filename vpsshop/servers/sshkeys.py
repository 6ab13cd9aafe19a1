"""The SSH key store: ``POST/GET /ssh-keys``, ``DELETE /ssh-keys/{id}``.

A stored key is chosen by id when ordering or reinstalling a server (``ssh_keys`` on
``POST /servers``); the server keeps a copy of the key text, so deleting a key from the store does
not lock anyone out of a running server.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

import sqlalchemy as sa
from pydantic import BaseModel, Field, WithJsonSchema
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select
from starlette.concurrency import run_in_threadpool

from vpsshop.cloudinit import MAX_PUBLIC_KEY_CHARS, InvalidInput, parse_ssh_public_key
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest, Conflict, NotFound
from vpsshop.routing import ApiModel, ApiRoute, Call, JsonInt, Reply
from vpsshop.servers.models import SshKey

TAG = ("ssh-keys",)
MAX_KEYS_PER_ACCOUNT = 50
MAX_KEYS_PER_SERVER = 10
_NAME = r"^[\x20-\x7e]+$"


class SshKeyBody(ApiModel):
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


def add_key(ctx: AppContext, account_id: int, body: SshKeyBody) -> SshKeyOut:
    try:
        parsed = parse_ssh_public_key(body.public_key)
    except InvalidInput as exc:
        raise BadRequest("invalid_public_key", f"This public key is not accepted: {exc}.") from None
    now = ctx.clock.now()
    try:
        with ctx.db.session() as session:
            count = session.execute(
                sa.select(sa.func.count()).select_from(SshKey).where(SshKey.account_id == account_id)
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
            return key_out(key)
    except IntegrityError:
        raise Conflict("ssh_key_exists", f"This account already stores the key {parsed.fingerprint}.") from None


def list_keys(ctx: AppContext, account_id: int) -> SshKeyList:
    with ctx.db.session() as session:
        rows = session.exec(select(SshKey).where(SshKey.account_id == account_id).order_by(SshKey.id)).all()  # type: ignore[arg-type]
        return SshKeyList(ssh_keys=[key_out(k) for k in rows])


def delete_key(ctx: AppContext, account_id: int, key_id: int) -> None:
    with ctx.db.session() as session:
        deleted = session.execute(
            sa.delete(SshKey).where(SshKey.id == key_id, SshKey.account_id == account_id)  # type: ignore[arg-type]
        ).rowcount
    if deleted != 1:
        raise NotFound("SSH key on this account")


SshKeyId = Annotated[
    JsonInt,  # a number: not true, not "3"
    Field(ge=1, le=ApiRoute.MAX_ID),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": ApiRoute.MAX_ID}),  # pydantic writes ge/le
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
    rows = session.exec(select(SshKey).where(SshKey.account_id == account_id, SshKey.id.in_(wanted))).all()  # type: ignore[union-attr]
    found = {k.id: k.public_key for k in rows}
    missing = [i for i in wanted if i not in found]
    if missing:
        raise BadRequest("invalid_ssh_keys", f"No SSH key {missing[0]} on this account; GET /ssh-keys lists yours.")
    return json.dumps([found[i] for i in wanted])


async def create_ssh_key(call: Call) -> Reply:
    return Reply(await run_in_threadpool(add_key, call.ctx, call.account_id, call.body), 201)


async def get_ssh_keys(call: Call) -> SshKeyList:
    return await run_in_threadpool(list_keys, call.ctx, call.account_id)


class Deleted(BaseModel):
    id: int
    deleted: bool = True


async def remove_ssh_key(call: Call) -> Deleted:
    await run_in_threadpool(delete_key, call.ctx, call.account_id, call.path["id"])
    return Deleted(id=call.path["id"])


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST",
            "/ssh-keys",
            create_ssh_key,
            "Store an SSH public key",
            SshKeyOut,
            status=201,
            body=SshKeyBody,
            description="Stores a public key under a name, to be chosen by id when ordering (ssh_keys on POST "
            f"/servers) or reinstalling. Accepted: Ed25519, ECDSA (P-256, P-384, P-521) and RSA of at least 2048 "
            f"bits; anything else is a 400 invalid_public_key saying why. At most {MAX_KEYS_PER_ACCOUNT} keys per "
            "account.",
            errors={
                400: "invalid_name, invalid_public_key, unknown_field",
                409: "ssh_key_exists: the account stores this key already (same fingerprint); too_many_ssh_keys.",
            },
            tags=TAG,
            operation_id="createSshKey",
        ),
        ApiRoute(
            "GET",
            "/ssh-keys",
            get_ssh_keys,
            "List the caller's SSH keys",
            SshKeyList,
            tags=TAG,
            operation_id="listSshKeys",
        ),
        ApiRoute(
            "DELETE",
            "/ssh-keys/{id}",
            remove_ssh_key,
            "Delete a stored SSH key",
            Deleted,
            description="Removes the key from the store. Servers ordered with it keep it in root's authorized_keys "
            "(each server holds a copy) until they are reinstalled without it.",
            errors={404: "No SSH key with this id on this account."},
            tags=TAG,
            operation_id="deleteSshKey",
        ),
    ]
