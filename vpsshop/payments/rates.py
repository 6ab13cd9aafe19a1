"""Exchange rates as the engine uses them: cached, refreshed, and refused when too old.

The configured :class:`vpsshop.RateSource` only fetches. This service keeps the last answer per
symbol with the time it was fetched (by the service's clock), asks again after
``rates.refresh_seconds`` and, when the source fails, keeps using an answer no older than
``rates.max_age_seconds``. Past that a new top-up is refused with ``503 rate_unavailable``: the
service never guesses a price.

Settings (``[rates]``): ``source`` (the plugin), ``refresh_seconds`` (default 60),
``max_age_seconds`` (default 600).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from vpsshop.errors import ApiError, ConfigError, PluginError

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext

log = logging.getLogger("vpsshop.rates")

DEFAULT_REFRESH_SECONDS = 60
DEFAULT_MAX_AGE_SECONDS = 600


class RateUnavailable(ApiError):
    """No fresh enough price: new top-ups in the coin are refused (503)."""

    def __init__(self, symbol: str, detail: str, *, public: bool = False) -> None:
        # The rate source's error text goes to the operator's log only; core's own reasons (the age of
        # the last price) are also told to the client (``public``).
        log.warning("no current %s/USD rate: %s", symbol, detail)
        shown = f" ({detail})" if public else ""
        super().__init__(503, "rate_unavailable", f"No current {symbol}/USD exchange rate{shown}; try again shortly.")


@dataclass(frozen=True)
class Quote:
    symbol: str
    usd: Decimal
    fetched_at: datetime


class RateService:
    """Prices of coins in USD for one app or worker."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        section = ctx.settings.rates
        try:
            self.refresh_seconds = float(section.get("refresh_seconds", DEFAULT_REFRESH_SECONDS))
            self.max_age_seconds = float(section.get("max_age_seconds", DEFAULT_MAX_AGE_SECONDS))
        except (TypeError, ValueError):
            raise ConfigError("rates.refresh_seconds and rates.max_age_seconds must be numbers") from None
        self._quotes: dict[str, Quote] = {}
        self._lock = asyncio.Lock()

    def _age(self, quote: Quote) -> float:
        return (self.ctx.clock.now() - quote.fetched_at).total_seconds()

    async def price(self, symbol: str) -> Quote:
        """USD per unit of ``symbol``. :raises RateUnavailable: no answer younger than the max age."""
        quote = self._quotes.get(symbol)
        if quote is not None and self._age(quote) < self.refresh_seconds:
            return quote
        async with self._lock:
            quote = self._quotes.get(symbol)
            if quote is not None and self._age(quote) < self.refresh_seconds:
                return quote
            detail = await self._refresh(symbol)
        quote = self._quotes.get(symbol)
        if quote is None:
            raise RateUnavailable(symbol, detail or "the rate source does not price it")
        if self._age(quote) > self.max_age_seconds:
            raise RateUnavailable(
                symbol,
                f"last price is {int(self._age(quote))} s old; the limit is {int(self.max_age_seconds)} s",
                public=True,
            )
        return quote

    async def _refresh(self, symbol: str) -> str:
        source = self.ctx.rate_source
        if source is None:
            return "no rate source is configured"
        wanted = sorted({symbol, *self._quotes})
        try:
            prices = await asyncio.wait_for(source.fetch(wanted), timeout=15)
        except (TimeoutError, PluginError, OSError) as exc:
            log.warning("rate source %s failed: %s", source.name, exc or type(exc).__name__)
            return f"the rate source failed: {exc or type(exc).__name__}"
        now = self.ctx.clock.now()
        for sym, usd in prices.items():
            usd = Decimal(usd)
            if usd.is_finite() and usd > 0:
                self._quotes[sym] = Quote(sym, usd, now)
        return ""
