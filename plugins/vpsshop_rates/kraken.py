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

from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import Field

from vpsshop import PluginError
from vpsshop_rates.http_api import PublicApiConfig, PublicPriceApi

DEFAULT_PAIRS = {"BTC": "XBTUSD", "DOGE": "XDGUSD"}


class KrakenConfig(PublicApiConfig):
    base_url: str = Field("https://api.kraken.com", description="Kraken API root (tests point it elsewhere).")
    pairs: dict[str, str] = Field(default_factory=dict, description="Rate symbol -> Kraken pair (default SYMBOLUSD).")


class KrakenTicker(PublicPriceApi):
    """USD prices from Kraken's public ticker."""

    name = "kraken"
    exchange = "Kraken"
    probe = "BTC/USD ticker"
    Config = KrakenConfig

    config: KrakenConfig

    def __init__(self, config: KrakenConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.pairs = {**DEFAULT_PAIRS, **config.pairs}

    async def price(self, symbol: str) -> Decimal | None:
        pair = self.pairs.get(symbol, f"{symbol}USD")
        response = await self.get("/0/public/Ticker", pair=pair)
        if response.status_code != 200:
            raise PluginError(f"Kraken answered HTTP {response.status_code} for {pair}")
        try:
            body: Any = response.json()
            errors = body.get("error") or []
            if any("Unknown asset pair" in str(e) for e in errors):
                return None
            if errors:
                raise PluginError(f"Kraken refused {pair}: {', '.join(map(str, errors))[:200]}")
            result = body["result"]
            if len(result) != 1:
                raise PluginError(f"Kraken answered {len(result)} pairs for {pair}")
            return Decimal(str(next(iter(result.values()))["c"][0]))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, InvalidOperation):
            raise PluginError(f"Kraken's answer for {pair} is not a ticker") from None
