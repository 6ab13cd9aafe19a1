"""The ``[events]`` settings: webhook delivery, its retry schedule, SSRF rules, the plugin hook."""

from __future__ import annotations

import ipaddress
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vpsshop.context import AppContext, StateKey
from vpsshop.errors import ConfigError, describe_validation_error

SANDBOX_ALLOWED_NETWORKS = ("127.0.0.0/8", "::1/128")
"""The sandbox delivers to loopback so a customer can try webhooks against a local receiver."""


class EventSettings(BaseModel):
    """``[events]``. Production defaults are strict; the sandbox allows plain http and loopback."""

    model_config = ConfigDict(extra="forbid")

    interval_seconds: float = Field(1, ge=0.05, le=60, description="How often a worker looks for work.")
    timeout_seconds: float = Field(10, ge=0.2, le=30, description="Whole time allowed for one webhook request.")
    connect_timeout_seconds: float = Field(5, ge=0.1, le=30)
    max_response_bytes: int = Field(4096, ge=0, le=1 << 20, description="Bytes of a response read (and logged).")
    retry_base_seconds: float = Field(15, ge=0.01, le=3600, description="First retry delay; doubles each attempt.")
    retry_max_delay_seconds: float = Field(8 * 3600, ge=0.01, le=86400, description="Longest delay between tries.")
    retry_window_hours: float = Field(72, ge=0.0001, le=30 * 24, description="A delivery is retried this long.")
    disable_after_hours: float = Field(
        120, ge=0.0001, le=90 * 24, description="An endpoint failing without a success this long is disabled."
    )
    lease_seconds: float = Field(60, ge=1, le=3600, description="A claimed delivery's lease (> timeout_seconds).")
    concurrency: int = Field(8, ge=1, le=256, description="Requests one worker sends at once.")
    batch_size: int = Field(100, ge=1, le=5000, description="Events fanned out or deliveries claimed per step.")
    max_endpoints_per_account: int = Field(10, ge=1, le=1000)
    require_https: bool = Field(True, description="Refuse http:// endpoint URLs (sandbox: false).")
    allowed_networks: list[str] = Field(
        default_factory=list,
        description="Networks (CIDR) webhooks may reach although they are private, loopback or link-local. "
        "Default none in production; loopback in the sandbox.",
    )
    hook_max_attempts: int = Field(10, ge=1, le=1000, description="Calls of a failing vpsshop_event per event.")
    hook_retry_seconds: float = Field(5, ge=0.01, le=3600, description="First delay after a failing hook call.")

    @field_validator("allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not a network like 10.0.0.0/8 or fd00::/8") from None
        return value

    @model_validator(mode="after")
    def _lease_outlives_request(self) -> EventSettings:
        if self.lease_seconds <= self.timeout_seconds:
            raise ValueError("lease_seconds must be longer than timeout_seconds")
        return self

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        return [ipaddress.ip_network(item, strict=False) for item in self.allowed_networks]


def build_settings(section: dict[str, Any], *, sandbox: bool) -> EventSettings:
    data: dict[str, Any] = {}
    if sandbox:
        data = {"require_https": False, "allowed_networks": list(SANDBOX_ALLOWED_NETWORKS)}
    data.update(section)
    try:
        return EventSettings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "events")) from None


def event_settings(ctx: AppContext) -> EventSettings:
    """The validated ``[events]`` section of this app or worker (cached on the context)."""
    return ctx.state(_SETTINGS, lambda ctx: build_settings(ctx.settings.events, sandbox=ctx.settings.sandbox))


_SETTINGS = StateKey[EventSettings]("event-settings")
