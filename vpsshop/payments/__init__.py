"""The payment engine: top-ups, deposit watching, crediting and exchange rates.

* :mod:`vpsshop.payments.models`   the tables;
* :mod:`vpsshop.payments.rates`    cached, age-limited exchange rates over the ``RateSource`` hook;
* :mod:`vpsshop.payments.engine`   creating, reading, cancelling, expiring and crediting top-ups;
* :mod:`vpsshop.payments.watcher`  scanning chains block by block against the watched addresses;
* :mod:`vpsshop.payments.hooks`    core's own plugin: the watcher as a background task.

x402 (paying by a signed authorization) lives in :mod:`vpsshop.x402`, which uses this package's tables;
nothing here imports it.

Lifecycle for resellers: ``docs/payments.md``. Coin plugin contract: ``docs/coin-plugins.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext
    from vpsshop.payments.engine import PaymentEngine


def engine_for(ctx: AppContext) -> PaymentEngine:
    """The payment engine of this app or worker (built on first use, one per context)."""
    from vpsshop.payments.engine import ENGINE, PaymentEngine

    return ctx.state(ENGINE, PaymentEngine)
