"""Base class of payment coins.

A coin plugin subclasses :class:`PaymentCoin` and returns the class from
``vpsshop_register_coins``. Core instantiates it with the settings table ``[coins.<CODE>]``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from vpsshop.component import Component

SettlementMethod = Literal["deposit", "x402"]


class PaymentCoin(Component):
    """A way for a customer to fund a balance.

    Class attributes every subclass must set:

    ``code``
        The coin code of the API (``"BTC"``, ``"USDTTRC"``). Unique across loaded plugins.
    ``name``
        Human name shown in the catalog (``"Bitcoin"``, ``"Tether USD (TRC-20)"``).
    ``decimals``
        Digits of the coin's base unit (8 for BTC satoshis, 12 for XMR piconero, 6 for USDT).
    ``rate_symbol``
        The symbol whose USD price values this coin (``"BTC"``; ``"USDT"`` for both USDT coins).

    ``settlement`` says how money arrives: ``"deposit"`` (a deposit address per top-up, watched
    on chain) or ``"x402"`` (a signed authorization settled during the request).
    """

    code: ClassVar[str]
    name: ClassVar[str]
    decimals: ClassVar[int]
    rate_symbol: ClassVar[str]
    settlement: ClassVar[SettlementMethod] = "deposit"

    @property
    def network(self) -> str:
        """The chain and network deposits go to, shown as ``deposit_network`` (``"bitcoin"``,
        ``"bitcoin-testnet"``, ``"base-sepolia"``). Must be overridden."""
        raise NotImplementedError(f"{type(self).__name__} must define network")

    def payment_option(self) -> dict[str, str]:
        """The catalog's entry for this coin. Override only to add fields."""
        return {"coin": self.code, "name": self.name, "network": self.network, "method": self.settlement}
