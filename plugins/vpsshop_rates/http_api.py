"""What the public-exchange rate sources share: an HTTP client, one request per symbol, readiness.

A subclass sets ``exchange`` (its name in messages), ``probe`` (what ``check_ready`` calls the BTC
price) and implements :meth:`PublicPriceApi.price`; its ``Config`` extends :class:`PublicApiConfig`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from decimal import Decimal
from typing import ClassVar

import httpx
from pydantic import BaseModel, ConfigDict, Field

from vpsshop import PluginError, RateSource, Readiness


class PublicApiConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="The exchange's API root (tests point it elsewhere).")
    timeout_seconds: float = Field(10, gt=0, le=60)


class PublicPriceApi(RateSource[PublicApiConfig]):
    """A rate source that asks a public exchange API for each symbol's USD price, concurrently."""

    exchange: ClassVar[str]
    probe: ClassVar[str] = "BTC-USD price"

    def __init__(self, config: PublicApiConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        cfg = config
        self.client = httpx.AsyncClient(
            base_url=cfg.base_url.rstrip("/"),
            timeout=cfg.timeout_seconds,
            headers={"Accept": "application/json", "User-Agent": "vpsshop"},
        )

    async def price(self, symbol: str) -> Decimal | None:
        """USD per unit of ``symbol``; None when the exchange does not price it. Must be
        overridden; raise :class:`vpsshop.PluginError` when the exchange fails."""
        raise NotImplementedError

    async def get(self, path: str, **params: str) -> httpx.Response:
        try:
            return await self.client.get(path, params=params or None)
        except httpx.HTTPError as exc:
            raise PluginError(f"{self.exchange} did not answer: {type(exc).__name__}") from None

    async def fetch(self, symbols: Iterable[str]) -> dict[str, Decimal]:
        symbols = list(symbols)
        prices = await asyncio.gather(*(self.price(s) for s in symbols))
        return {s: p for s, p in zip(symbols, prices, strict=False) if p is not None and p.is_finite() and p > 0}

    async def check_ready(self) -> Readiness:
        try:
            prices = await self.fetch(["BTC"])
        except PluginError as exc:
            return Readiness(False, str(exc))
        return Readiness("BTC" in prices, f"{self.probe} answered" if prices else f"no {self.probe}")

    async def close(self) -> None:
        await self.client.aclose()
