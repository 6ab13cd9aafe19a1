"""x402 on the core side, in one place: paying a top-up, an order or a renewal by a signed authorization.

* :mod:`vpsshop.x402.headers`     the HTTP side: reading ``X-PAYMENT`` / ``PAYMENT-SIGNATURE``, the 402's
  v1 body and v2 ``PAYMENT-REQUIRED`` header, ``X-PAYMENT-RESPONSE`` / ``PAYMENT-RESPONSE`` (no database);
* :mod:`vpsshop.x402.settlement`  recording an authorization before settling it, crediting it once,
  resolving settlements whose outcome was unknown;
* :mod:`vpsshop.x402.orders`      an order or a renewal paid in the same request (the 402 is the price list);
* :mod:`vpsshop.x402.discovery`   the v2 ``bazaar`` and ``payment-identifier`` extensions of every 402;
* :mod:`vpsshop.x402.hooks`       core's plugin ``x402-settlements``: settlement resolution as its own
  background task.

Imports go one way: the endpoints (:mod:`vpsshop.api.topups`, :mod:`vpsshop.servers.api`) use this
package, and this package uses :mod:`vpsshop.payments` (its tables), :mod:`vpsshop.coins` (the coin
contract, :class:`vpsshop.X402Coin`) and the ledger; nothing in :mod:`vpsshop.payments` imports it.
The coin itself (USDCBASE) is the default plugin ``vpsshop_x402``.
"""
