"""``coinbase``: spot prices from Coinbase's public price API (no key needed).

One ``GET {base_url}/v2/prices/<SYMBOL>-USD/spot`` per symbol, answered as
``{"data": {"amount": "97123.45", "base": "BTC", "currency": "USD"}}``. The source only fetches:
vpsshop's rate service caches the answers, refreshes them every ``rates.refresh_seconds`` and
refuses new top-ups when the newest price is older than ``rates.max_age_seconds``.

Settings::

    [rates]
    source = "coinbase"
    max_age_seconds = 600
    [rates.coinbase]
    base_url = "https://api.coinbase.com"     # default
    timeout_seconds = 10
    symbols = { USDT = "USDT" }               # optional: symbol -> Coinbase asset code
"""

from __future__ import annotations

import asyncio
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable

import httpx
from pydantic import BaseModel, ConfigDict, Field

from vpsshop import PluginError, RateSource, Readiness


class CoinbaseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field("https://api.coinbase.com", description="Coinbase API root (tests point it elsewhere).")
    timeout_seconds: float = Field(10, gt=0, le=60)
    symbols: dict[str, str] = Field(default_factory=dict, description="Rate symbol -> Coinbase asset code.")


class CoinbaseSpot(RateSource):
    """USD spot prices from Coinbase."""

    name = "coinbase"
    Config = CoinbaseConfig

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        cfg: CoinbaseConfig = config  # type: ignore[assignment]
        self.cfg = cfg
        self.client = httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"), timeout=cfg.timeout_seconds,
                                        headers={"Accept": "application/json", "User-Agent": "vpsshop"})

    async def _spot(self, symbol: str) -> tuple[str, Decimal | None]:
        asset = self.cfg.symbols.get(symbol, symbol)
        try:
            response = await self.client.get(f"/v2/prices/{asset}-USD/spot")
        except httpx.HTTPError as exc:
            raise PluginError(f"Coinbase did not answer: {type(exc).__name__}") from None
        if response.status_code == 404:
            return symbol, None  # Coinbase does not price it
        if response.status_code != 200:
            raise PluginError(f"Coinbase answered HTTP {response.status_code} for {asset}-USD")
        try:
            data: Any = response.json()["data"]
            if data.get("currency") != "USD" or data.get("base") != asset:
                raise PluginError(f"Coinbase answered a price of {data.get('base')}-{data.get('currency')}")
            price = Decimal(str(data["amount"]))
        except (ValueError, KeyError, TypeError, AttributeError, InvalidOperation):
            raise PluginError(f"Coinbase's answer for {asset}-USD is not a price") from None
        return symbol, price if price.is_finite() and price > 0 else None

    async def fetch(self, symbols: Iterable[str]) -> dict[str, Decimal]:
        answers = await asyncio.gather(*(self._spot(s) for s in symbols))
        return {symbol: price for symbol, price in answers if price is not None}

    async def check_ready(self) -> Readiness:
        try:
            prices = await self.fetch(["BTC"])
        except PluginError as exc:
            return Readiness(False, str(exc))
        return Readiness("BTC" in prices, "BTC-USD spot answered" if prices else "no BTC-USD price")

    async def close(self) -> None:
        await self.client.aclose()
