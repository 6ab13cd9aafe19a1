"""Tables of the servers area: the job queue, the lifecycle history and the address leases.

The ``servers`` table itself lives in :mod:`vpsshop.models` (``GET /v1/account`` counts it); the
columns this area added to it come with migration ``0003``.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from vpsshop.models import _ts

JOB_KINDS = (
    "provision",
    "start",
    "stop",
    "reboot",
    "suspend",
    "resume",
    "destroy",
    "reinstall",
    "rdns",
    "resize",
    "migrate",
    "firewall",
    "snapshot",
    "restore",
    "delete_snapshot",
)
JOB_STATES = ("queued", "running", "done", "failed")


class ServerJob(SQLModel, table=True):
    """One hypervisor verb to run for one server, outside any request.

    A worker claims a job by moving it from ``queued`` to ``running`` with a lease
    (``locked_until``) in one statement; a job whose worker died is claimable again once the lease
    has passed, so a job survives restarts. Jobs of one server run in id order, one at a time.
    """

    __tablename__ = "server_jobs"
    __table_args__ = (sa.Index("ix_server_jobs_claim", "status", "run_after"),)

    id: int | None = Field(default=None, primary_key=True)
    server_id: int = Field(foreign_key="servers.id", index=True, nullable=False)
    kind: str = Field(max_length=16, nullable=False)
    status: str = Field(default="queued", max_length=16, nullable=False)
    attempts: int = Field(default=0, nullable=False)
    run_after: datetime = _ts()
    locked_until: datetime | None = _ts(nullable=True)
    locked_by: str | None = Field(default=None, max_length=64)
    last_error: str | None = Field(default=None, max_length=500)
    target: str | None = Field(default=None, max_length=200)
    """The host a ``migrate`` job moves the server to; the snapshot id of a ``snapshot``, ``restore``
    or ``delete_snapshot`` job."""
    created_at: datetime = _ts()
    finished_at: datetime | None = _ts(nullable=True)


class DrainedHost(SQLModel, table=True):
    """A host the operator drained (``vpsshop admin host drain``): no new server is placed there.

    Its servers stay until moved (``vpsshop admin migrate`` / ``host evacuate``); undraining deletes
    the row.
    """

    __tablename__ = "drained_hosts"

    host: str = Field(primary_key=True, max_length=200)
    reason: str | None = Field(default=None, max_length=500)
    drained_at: datetime = _ts()


class ServerEvent(SQLModel, table=True):
    """The history of a server: each lifecycle step, written in the transaction that made it.

    ``once_key`` is unique: a step that must happen once per period (a failed renewal notice, a
    suspension for one expiry date) carries a key, and a second attempt to record it fails.
    """

    __tablename__ = "server_events"

    id: int | None = Field(default=None, primary_key=True)
    server_id: int = Field(foreign_key="servers.id", index=True, nullable=False)
    kind: str = Field(max_length=32, nullable=False)
    detail: str | None = Field(default=None, max_length=500)
    once_key: str | None = Field(default=None, max_length=200, unique=True)
    created_at: datetime = _ts()


class IpLease(SQLModel, table=True):
    """An address of a backend's pool held by one server. Unique per pool: never shared."""

    __tablename__ = "ip_leases"
    __table_args__ = (sa.UniqueConstraint("pool", "address", name="uq_ip_leases_pool_address"),)

    id: int | None = Field(default=None, primary_key=True)
    pool: str = Field(max_length=64, nullable=False)
    address: str = Field(max_length=45, nullable=False)
    server_id: int = Field(foreign_key="servers.id", unique=True, nullable=False)
    created_at: datetime = _ts()


class Ipv6Lease(SQLModel, table=True):
    """An IPv6 address (or, in a routed pool, a /64) of a backend's pool held by one server; never
    shared. Beside :class:`IpLease`, so that a server holds one of each.

    .. versionadded:: 1.1
    """

    __tablename__ = "ipv6_leases"
    __table_args__ = (sa.UniqueConstraint("pool", "address", name="uq_ipv6_leases_pool_address"),)

    id: int | None = Field(default=None, primary_key=True)
    pool: str = Field(max_length=64, nullable=False)
    address: str = Field(max_length=49, nullable=False)
    server_id: int = Field(foreign_key="servers.id", unique=True, nullable=False)
    created_at: datetime = _ts()


class SshKey(SQLModel, table=True):
    """An OpenSSH public key in an account's key store (``/v1/ssh-keys``).

    ``public_key`` is the normalised ``<type> <base64>`` (the comment dropped); ``fingerprint`` is
    OpenSSH's ``SHA256:<base64 without padding>`` of the key blob, unique per account.
    """

    __tablename__ = "ssh_keys"
    __table_args__ = (sa.UniqueConstraint("account_id", "fingerprint", name="uq_ssh_keys_account_fingerprint"),)

    id: int | None = Field(default=None, primary_key=True)
    account_id: int = Field(foreign_key="accounts.id", index=True, nullable=False)
    name: str = Field(max_length=64, nullable=False)
    key_type: str = Field(max_length=32, nullable=False)
    bits: int = Field(nullable=False)
    public_key: str = Field(sa_type=sa.Text, nullable=False)
    fingerprint: str = Field(max_length=64, nullable=False)
    created_at: datetime = _ts()


class ConsoleTicket(SQLModel, table=True):
    """A single-use ticket for a server's console WebSocket (``vpsshop.servers.console``).

    Only the SHA-256 of the ticket is stored; ``used_at`` is set by the one ``UPDATE`` that redeems it.
    """

    __tablename__ = "console_tickets"

    id: int | None = Field(default=None, primary_key=True)
    token_hash: str = Field(max_length=64, unique=True, nullable=False)
    account_id: int = Field(foreign_key="accounts.id", nullable=False)
    server_id: int = Field(foreign_key="servers.id", index=True, nullable=False)
    created_at: datetime = _ts()
    expires_at: datetime = _ts()
    used_at: datetime | None = _ts(nullable=True)


class ServerTraffic(SQLModel, table=True):
    """A server's network traffic in one traffic period (``vpsshop.servers.traffic``).

    A period starts when the server is ordered and again at each renewal. ``last_in`` and
    ``last_out`` are the hypervisor's interface counters at the last sample (``sampled_at``): the
    next sample counts what they grew by, or, when they are lower (the counters started again after
    a reboot or a migration), all of the new value. ``policy_applied`` is what the shop did when
    the period's traffic passed the allowance (``throttle``, ``suspend``, ``none``), ``lifted_at``
    when a throttle was taken off again (after the renewal that started the next period).

    .. versionadded:: 1.1
    """

    __tablename__ = "server_traffic"
    __table_args__ = (sa.UniqueConstraint("server_id", "period_start", name="uq_server_traffic_period"),)

    id: int | None = Field(default=None, primary_key=True)
    server_id: int = Field(foreign_key="servers.id", index=True, nullable=False)
    period_start: datetime = _ts()
    in_bytes: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)
    out_bytes: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)
    last_in: int | None = Field(default=None, sa_type=sa.BigInteger)
    last_out: int | None = Field(default=None, sa_type=sa.BigInteger)
    sampled_at: datetime | None = _ts(nullable=True)
    allowance_bytes: int | None = Field(default=None, sa_type=sa.BigInteger)
    """The period's allowance (in and out together) as the last sample read it from the settings and
    the catalog; None: unlimited."""
    policy_applied: str | None = Field(default=None, max_length=16)
    applied_at: datetime | None = _ts(nullable=True)
    lifted_at: datetime | None = _ts(nullable=True)


SNAPSHOT_STATES = ("creating", "ready", "deleting", "deleted", "failed")


class ServerSnapshot(SQLModel, table=True):
    """A restore point of a server (issue 25, part 4; vpsshop/servers/snapshots.py).

    ``creating`` until its ``snapshot`` job has run, then ``ready``; ``deleting`` from the
    customer's DELETE until its job has removed it, then ``deleted``; ``failed`` when its job gave
    up. A termination or a reinstall makes every one of the server's snapshots ``deleted``.
    """

    __tablename__ = "server_snapshots"

    id: int | None = Field(default=None, primary_key=True)
    server_id: int = Field(foreign_key="servers.id", index=True, nullable=False)
    label: str | None = Field(default=None, max_length=64)
    status: str = Field(default="creating", max_length=16, nullable=False)
    plan: str = Field(max_length=32, nullable=False)
    """The server's plan when the snapshot was taken: a snapshot from before a resize is not restored."""
    fee_micros: int = Field(default=0, sa_type=sa.BigInteger, nullable=False)
    """What the snapshot adds to each renewal (``servers.snapshot_fee_micros`` holds the sum)."""
    created_at: datetime = _ts()
    ready_at: datetime | None = _ts(nullable=True)
    deleted_at: datetime | None = _ts(nullable=True)
