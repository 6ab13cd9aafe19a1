"""Default exchange-rate sources.

``kraken``: Kraken's public ticker (:mod:`vpsshop_rates.kraken`), the recommended production source:
it prices every classic coin of the shop, XMR and TRX included.
``coinbase``: Coinbase's public spot prices (:mod:`vpsshop_rates.coinbase`); Coinbase lists no XMR.

``fixed``: rates written in the settings. The sandbox uses it with the values below; in
production it needs ``[rates.fixed] prices`` and suits a shop that sets its rates by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from vpsshop import RateSource, Readiness, hookimpl

SANDBOX_PRICES = {
    "BTC": "60000",
    "LTC": "80",
    "XMR": "150",
    "ETH": "3000",
    "TRX": "0.25",
    "SOL": "150",
    "USDT": "1",
    "USDC": "1",
}


class FixedRatesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prices: dict[str, Decimal] = Field(description="USD per unit, by symbol.")


class FixedRates(RateSource[FixedRatesConfig]):
    """Rates that never change: the sandbox, tests, and shops that price by hand."""

    name = "fixed"
    Config = FixedRatesConfig

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"prices": dict(SANDBOX_PRICES)}

    async def fetch(self, symbols: Iterable[str]) -> dict[str, Decimal]:
        prices: dict[str, Decimal] = self.config.prices
        return {s: prices[s] for s in symbols if s in prices}

    async def check_ready(self) -> Readiness:
        return Readiness(True, f"{len(self.config.prices)} fixed prices")


@hookimpl(trylast=True)
def vpsshop_register_rate_sources() -> Iterable[type[RateSource[Any]]]:
    from vpsshop_rates.coinbase import CoinbaseSpot
    from vpsshop_rates.kraken import KrakenTicker

    return [FixedRates, KrakenTicker, CoinbaseSpot]
