"""``kraken``: last-trade prices from Kraken's public market-data API (no key needed).

One ``GET {base_url}/0/public/Ticker?pair=<PAIR>`` per symbol. Kraken answers
``{"error": [], "result": {"<its pair name>": {"c": ["<last price>", "<lot volume>"], ...}}}`` and
names the pair its own way (``XBTUSD`` comes back as ``XXBTZUSD``), so the single entry of
``result`` is read whatever its key; an unknown pair is ``{"error": ["EQuery:Unknown asset pair"]}``.
Kraken lists every classic coin of the shop against USD (BTC, LTC, XMR, ETH, TRX, SOL, USDT, USDC),
which is why it is the recommended production source. The source only fetches: vpsshop's rate
service caches, refreshes and enforces ``rates.max_age_seconds``.

Settings::

    [rates]
    source = "kraken"
    max_age_seconds = 600
    [rates.kraken]
    base_url = "https://api.kraken.com"       # default
    pairs = { BTC = "XBTUSD" }                # optional: symbol -> Kraken pair (these are defaults)
"""

from __future__ import annotations

import asyncio
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable

import httpx
from pydantic import BaseModel, ConfigDict, Field

from vpsshop import PluginError, RateSource, Readiness

DEFAULT_PAIRS = {"BTC": "XBTUSD", "DOGE": "XDGUSD"}


class KrakenConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field("https://api.kraken.com", description="Kraken API root (tests point it elsewhere).")
    timeout_seconds: float = Field(10, gt=0, le=60)
    pairs: dict[str, str] = Field(default_factory=dict, description="Rate symbol -> Kraken pair (default SYMBOLUSD).")


class KrakenTicker(RateSource):
    """USD prices from Kraken's public ticker."""

    name = "kraken"
    Config = KrakenConfig

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        cfg: KrakenConfig = config  # type: ignore[assignment]
        self.pairs = {**DEFAULT_PAIRS, **cfg.pairs}
        self.client = httpx.AsyncClient(base_url=cfg.base_url.rstrip("/"), timeout=cfg.timeout_seconds,
                                        headers={"Accept": "application/json", "User-Agent": "vpsshop"})

    async def _last(self, symbol: str) -> tuple[str, Decimal | None]:
        pair = self.pairs.get(symbol, f"{symbol}USD")
        try:
            response = await self.client.get("/0/public/Ticker", params={"pair": pair})
        except httpx.HTTPError as exc:
            raise PluginError(f"Kraken did not answer: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise PluginError(f"Kraken answered HTTP {response.status_code} for {pair}")
        try:
            body: Any = response.json()
            errors = body.get("error") or []
            if any("Unknown asset pair" in str(e) for e in errors):
                return symbol, None
            if errors:
                raise PluginError(f"Kraken refused {pair}: {', '.join(map(str, errors))[:200]}")
            result = body["result"]
            if len(result) != 1:
                raise PluginError(f"Kraken answered {len(result)} pairs for {pair}")
            price = Decimal(str(next(iter(result.values()))["c"][0]))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, InvalidOperation):
            raise PluginError(f"Kraken's answer for {pair} is not a ticker") from None
        return symbol, price if price.is_finite() and price > 0 else None

    async def fetch(self, symbols: Iterable[str]) -> dict[str, Decimal]:
        answers = await asyncio.gather(*(self._last(s) for s in symbols))
        return {symbol: price for symbol, price in answers if price is not None}

    async def check_ready(self) -> Readiness:
        try:
            prices = await self.fetch(["BTC"])
        except PluginError as exc:
            return Readiness(False, str(exc))
        return Readiness("BTC" in prices, "BTC/USD ticker answered" if prices else "no BTC/USD price")

    async def close(self) -> None:
        await self.client.aclose()
