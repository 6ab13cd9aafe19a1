"""x402 on the core side, in one place: paying a top-up, an order or a renewal by a signed authorization.

* :mod:`vpsshop.x402.messages`    x402's messages without a transport: payment requirements, reading a signed
  payment, the settlement response;
* :mod:`vpsshop.x402.offers`      what the operations say about x402: a payment asked for (:class:`PaymentOffer`),
  one given (:class:`SignedPayment`), one settled (:class:`SettledPayment`), and the errors that carry them;
* :mod:`vpsshop.x402.settlement`  recording an authorization before settling it, crediting it once,
  resolving settlements whose outcome was unknown;
* :mod:`vpsshop.x402.purchases`   an order or a renewal paid in the same call (the 402 is the price list);
* :mod:`vpsshop.x402.hooks`       core's plugin ``x402-settlements``: settlement resolution as its own
  background task.

The HTTP side (the ``X-PAYMENT`` / ``PAYMENT-SIGNATURE`` headers, ``PAYMENT-REQUIRED``, the payment
responses and the discovery extensions) is the REST API's: :mod:`vpsshop.api.x402`. Imports go one way:
the operations (:mod:`vpsshop.topups`, :mod:`vpsshop.servers.orders`, :mod:`vpsshop.servers.renewals`) use
this package, and this package uses :mod:`vpsshop.payments` (its tables and the Top-up resource),
:mod:`vpsshop.coins` (the coin contract, :class:`vpsshop.X402Coin`) and the ledger; nothing in
:mod:`vpsshop.payments` imports it. The coin itself (USDCBASE) is the default plugin ``vpsshop_x402``.
"""
