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

from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import Field

from vpsshop import PluginError
from vpsshop_rates.http_api import PublicApiConfig, PublicPriceApi


class CoinbaseConfig(PublicApiConfig):
    base_url: str = Field("https://api.coinbase.com", description="Coinbase API root (tests point it elsewhere).")
    symbols: dict[str, str] = Field(default_factory=dict, description="Rate symbol -> Coinbase asset code.")


class CoinbaseSpot(PublicPriceApi):
    """USD spot prices from Coinbase."""

    name = "coinbase"
    exchange = "Coinbase"
    probe = "BTC-USD spot"
    Config = CoinbaseConfig
    config: CoinbaseConfig

    async def price(self, symbol: str) -> Decimal | None:
        asset = self.config.symbols.get(symbol, symbol)
        response = await self.get(f"/v2/prices/{asset}-USD/spot")
        if response.status_code == 404:
            return None  # Coinbase does not price it
        if response.status_code != 200:
            raise PluginError(f"Coinbase answered HTTP {response.status_code} for {asset}-USD")
        try:
            data: Any = response.json()["data"]
            if data.get("currency") != "USD" or data.get("base") != asset:
                raise PluginError(f"Coinbase answered a price of {data.get('base')}-{data.get('currency')}")
            return Decimal(str(data["amount"]))
        except (ValueError, KeyError, TypeError, AttributeError, InvalidOperation):
            raise PluginError(f"Coinbase's answer for {asset}-USD is not a price") from None
