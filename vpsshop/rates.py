"""Base class of exchange-rate sources."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import ClassVar

from vpsshop.component import Component, ConfigT


class RateSource(Component[ConfigT]):
    """Tells what one unit of a coin is worth in USD.

    ``name`` identifies the source in the ``rates.source`` setting. Core asks through
    :meth:`fetch`, caches the answer and refuses new top-ups when it is older than
    ``rates.max_age_seconds``, so a source never caches or guesses.
    """

    name: ClassVar[str]

    async def fetch(self, symbols: Iterable[str]) -> dict[str, Decimal]:
        """USD per unit for each symbol (``{"BTC": Decimal("97123.45")}``). Must be overridden.

        Leave out a symbol the source cannot price; raise :class:`vpsshop.PluginError` when the
        source cannot be reached.
        """
        raise NotImplementedError
