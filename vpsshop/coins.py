"""Base class of payment coins.

A coin plugin subclasses :class:`PaymentCoin` and returns the class from
``vpsshop_register_coins``. Core instantiates it with the settings table ``[coins.<CODE>]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

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


# ---- x402: settled during the request ---------------------------------------------------------


@dataclass(frozen=True)
class X402Payment:
    """A decoded ``X-PAYMENT`` (or v2 ``PAYMENT-SIGNATURE``) header, before anything is settled.

    ``payer`` and ``nonce`` are the payment's identity on chain (EIP-3009 authorizations are
    single-use per (payer, nonce)); core keys the credit on them. ``valid_before`` (unix seconds,
    0 when unknown) is when the authorization stops being usable: until then an open record whose
    :meth:`X402Coin.settlement_status` is None may still be settled, after it None is final.
    """

    payer: str
    nonce: str
    value_atomic: int
    version: int
    raw: dict[str, Any]
    valid_before: int = 0


@dataclass(frozen=True)
class X402Settlement:
    """A settled authorization: what ``X-PAYMENT-RESPONSE`` reports."""

    payer: str
    nonce: str
    transaction: str
    network: str
    amount_atomic: int


class X402Rejected(Exception):
    """The payment is not acceptable and nothing moved on chain.

    ``code`` is the error code of the response body (``invalid_payment``, ``wrong_amount``,
    ``authorization_expired``, ``nonce_used``, ``settlement_reverted`` ...), ``status`` 402 (pay
    again) or 400 (the header itself is malformed).
    """

    def __init__(self, code: str, message: str, status: int = 402) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class X402Coin(PaymentCoin):
    """A coin paid by an x402 authorization (USDCBASE): no deposit address, no watching.

    Core's top-up endpoint answers 402 with :meth:`payment_requirements`; on the re-sent request it
    calls :meth:`decode_payment`, records (payer, nonce) *before* settling, then :meth:`settle`.
    If settling ends with an unknown outcome (:class:`vpsshop.PluginError`, an RPC time-out) the
    record stays open and core later asks :meth:`settlement_status`, so one authorization can
    never be credited twice nor lost.
    """

    settlement: ClassVar[SettlementMethod] = "x402"

    def payment_requirements(self, amount_atomic: int, resource: str, description: str) -> dict[str, Any]:
        """One entry of the 402 body's ``accepts`` (x402 v1 field names). Must be overridden."""
        raise NotImplementedError

    def decode_payment(self, header_value: str, version: int = 1) -> X402Payment:
        """Parse the header without touching the network. Raise :class:`X402Rejected` (400) when
        it is not base64 JSON of the expected shape. Must be overridden."""
        raise NotImplementedError

    async def settle(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        """Verify ``payment`` against ``requirements`` (signature, recipient, exact value,
        validity window, network, asset, unused nonce) and settle it on chain.

        :raises X402Rejected: invalid, nothing moved.
        :raises vpsshop.PluginError: the outcome is unknown (time-out); core retries through
            :meth:`settlement_status`. Must be overridden.
        """
        raise NotImplementedError

    def payment_requirements_v2(self, requirements: dict[str, Any]) -> dict[str, Any]:
        """The x402 v2 form of one v1 ``accepts`` entry, for the ``PAYMENT-REQUIRED`` header that
        core adds to the 402 (the body stays v1). Default: the coin does not speak v2."""
        raise NotImplementedError(f"{type(self).__name__} does not offer x402 v2")

    def settlement_response(self, settlement: X402Settlement, version: int = 1) -> dict[str, Any]:
        """What core base64-encodes into ``X-PAYMENT-RESPONSE`` (v1) or ``PAYMENT-RESPONSE`` (v2).

        Default: the v1 settle result. A coin whose v2 network name differs overrides it.
        """
        return {
            "success": True,
            "transaction": settlement.transaction,
            "network": settlement.network,
            "payer": settlement.payer,
        }

    async def settlement_status(self, payment: X402Payment) -> X402Settlement | None:
        """After an unknown outcome: the settlement if the authorization was used on chain to pay
        this shop, else None. Must be overridden."""
        raise NotImplementedError
