"""The Server resource as the API shows it (``GET /v1/servers/{id}``), apart from the endpoints.

Events (``vpsshop.events.resources``), the dashboard and the reinstall endpoint render servers with
:func:`server_out`; keeping it here, with nothing but the model and money helpers below it, lets
the ledger's event views use it without importing the server endpoints (which import the ledger).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from vpsshop.models import Server
from vpsshop.money import UsdAmount, micros_to_usd

__all__ = ["ServerOut", "server_out"]


class ServerOut(BaseModel):
    """The seed's Server."""

    id: int
    plan: str = Field(description="Plan id.")
    location: str
    os: str
    hostname: str
    cycle: Literal["monthly", "annual"]
    price_usd: UsdAmount = Field(description="Price of one billing cycle, charged at order and at each renewal.")
    status: Literal["provisioning", "active", "suspended", "terminated"]
    ip: str | None = Field(description="Null until the server is active.")
    username: str = Field(description="Login name: root.")
    created_at: datetime
    expires_at: datetime = Field(description="End of the paid period; see docs/servers.md for what follows.")
    auto_renew: bool = Field(description="Renewed from the balance shortly before expires_at.")
    status_reason: str | None = Field(
        description="Why the server is suspended or terminated; while a reinstall is under way, that it is "
        "reinstalling (null again once it is done, or why it failed); else null."
    )
    power: Literal["running", "stopped"] | None = Field(
        description="Whether the VM is powered on, as the last hypervisor job left it: running once provisioned "
        "and after start, reboot, resume or reinstall; stopped after stop or suspension. Null while provisioning "
        "and once the VM is destroyed (by the job that follows termination). A power action changes it when its "
        "job has run (within seconds)."
    )
    reverse_dns: str | None = Field(None, description="The PTR name of the server's address set by PATCH, else null.")


def server_out(server: Server) -> ServerOut:
    assert server.id is not None
    return ServerOut(
        id=server.id,
        plan=server.plan,
        location=server.location,
        os=server.os,
        hostname=server.hostname,
        cycle=server.cycle,  # type: ignore[arg-type]
        price_usd=micros_to_usd(server.price_micros),
        status=server.status,  # type: ignore[arg-type]
        ip=server.ip,
        username=server.username,
        created_at=server.created_at,
        expires_at=server.expires_at,
        auto_renew=server.auto_renew,
        status_reason=server.status_reason,
        power=server.power,  # type: ignore[arg-type]
        reverse_dns=server.reverse_dns,
    )
