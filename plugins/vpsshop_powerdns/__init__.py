"""Reverse DNS through the PowerDNS Authoritative Server's HTTP API.

Settings (``[dns] provider = "powerdns"``)::

    [dns.powerdns]
    api_url = "http://127.0.0.1:8081"      # the webserver of pdns_server (api=yes)
    api_key = "..."                        # its api-key (or VPSSHOP_DNS__POWERDNS__API_KEY)
    server_id = "localhost"
    zones = ["100.51.198.in-addr.arpa"]    # the reverse zones this shop may write; they must exist
    ttl = 3600

A PTR record is one RRset, written with ``PATCH /api/v1/servers/{server_id}/zones/{zone}``:
``changetype: REPLACE`` to set it, ``DELETE`` to clear it (deleting an absent RRset succeeds, so both
are idempotent). The zone is the longest configured zone that the address's ``in-addr.arpa`` (or
``ip6.arpa``) name falls in; an address in none of them is an error naming the setting.

It imports only ``vpsshop``'s public API, like a third-party plugin.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from vpsshop import DnsProvider, PluginError, Readiness, hookimpl, ptr_name, require_reachable

TIMEOUT_SECONDS = 10.0


class PowerDnsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_url: str = Field(description="Base URL of the PowerDNS webserver, e.g. http://127.0.0.1:8081.")
    api_key: SecretStr = Field(description="The api-key of pdns_server (sent as X-API-Key).")
    server_id: str = Field("localhost", pattern=r"^[A-Za-z0-9_.-]+$")
    zones: list[str] = Field(min_length=1, description="Reverse zones this shop may write (they must exist).")
    ttl: int = Field(3600, ge=60, le=86400)

    @field_validator("zones")
    @classmethod
    def _canonical(cls, value: list[str]) -> list[str]:
        zones = [z.strip().lower().rstrip(".") + "." for z in value]
        for zone in zones:
            if not (zone.endswith((".in-addr.arpa.", ".ip6.arpa."))):
                raise ValueError(f"{zone!r} is not a reverse zone (in-addr.arpa or ip6.arpa)")
        return zones


class PowerDnsProvider(DnsProvider):
    """PTR records in PowerDNS zones; see the module docstring."""

    name = "powerdns"
    Config = PowerDnsConfig

    config: PowerDnsConfig

    def _zone(self, ip: str) -> tuple[str, str]:
        try:
            owner = ptr_name(ip)
        except ValueError:
            raise PluginError(f"{ip!r} is not an IP address") from None
        zones = [z for z in self.config.zones if owner.endswith("." + z)]
        if not zones:
            raise PluginError(f"no zone in dns.powerdns.zones holds {owner} (the PTR name of {ip})")
        return owner, max(zones, key=len)

    def holds(self, ip: str) -> bool:
        try:
            self._zone(ip)
        except PluginError:
            return False
        return True

    async def _patch(self, zone: str, rrset: dict[str, Any]) -> None:
        url = f"{self.config.api_url.rstrip('/')}/api/v1/servers/{self.config.server_id}/zones/{zone}"
        headers = {"X-API-Key": self.config.api_key.get_secret_value()}
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as client:
                response = await client.patch(url, json={"rrsets": [rrset]}, headers=headers)
        except httpx.HTTPError as exc:
            raise PluginError(f"PowerDNS API at {self.config.api_url} does not answer: {type(exc).__name__}") from None
        if response.status_code != 204:
            try:
                detail = response.json().get("error", "")
            except ValueError:
                detail = response.text[:200]
            raise PluginError(f"PowerDNS refused the change to zone {zone} ({response.status_code}): {detail}")

    async def set_ptr(self, ip: str, hostname: str) -> None:
        owner, zone = self._zone(ip)
        await self._patch(
            zone,
            {
                "name": owner,
                "type": "PTR",
                "ttl": self.config.ttl,
                "changetype": "REPLACE",
                "records": [{"content": hostname.rstrip(".") + ".", "disabled": False}],
            },
        )

    async def clear_ptr(self, ip: str) -> None:
        owner, zone = self._zone(ip)
        await self._patch(zone, {"name": owner, "type": "PTR", "changetype": "DELETE"})

    async def preflight(self) -> None:
        await require_reachable(self.config.api_url, setting="dns.powerdns.api_url", what="the PowerDNS API")

    async def check_ready(self) -> Readiness:
        url = f"{self.config.api_url.rstrip('/')}/api/v1/servers/{self.config.server_id}"
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_SECONDS) as client:
                response = await client.get(url, headers={"X-API-Key": self.config.api_key.get_secret_value()})
        except httpx.HTTPError as exc:
            return Readiness(False, f"PowerDNS API does not answer: {type(exc).__name__}")
        if response.status_code != 200:
            return Readiness(False, f"PowerDNS API answered {response.status_code}")
        return Readiness(True, f"PowerDNS {response.json().get('version', '?')}, zones {', '.join(self.config.zones)}")


@hookimpl(trylast=True)
def vpsshop_register_dns_providers() -> Iterable[type[DnsProvider]]:
    return [PowerDnsProvider]
