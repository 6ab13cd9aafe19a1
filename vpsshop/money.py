"""Money: integer micro-dollars inside the program and the database, decimals at the edges.

One US dollar is 1,000,000 micros. USDC's base unit is exactly one micro, a cent is 10,000 micros,
and the value of any crypto payment is kept to the micro (rounded down), so nothing a customer
sends disappears into rounding of whole cents. Floats never hold money: JSON numbers are produced
from :class:`~decimal.Decimal` at the very edge (see :data:`UsdAmount`).
"""

from __future__ import annotations

from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Annotated

from pydantic import PlainSerializer

MICROS_PER_USD = 1_000_000
MICROS_PER_CENT = 10_000

MIN_TOPUP_CENTS = 25_00
"""The smallest top-up in cents (the API contract: 25 USD); the catalog's ``topup_limits`` shows it."""
MAX_TOPUP_CENTS = 2000_00
"""The largest top-up in cents (the API contract: 2000 USD)."""


def usd_to_micros(amount: Decimal | int | str) -> int:
    """Convert a USD amount to micros, refusing anything finer than a micro."""
    try:
        value = Decimal(amount)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise ValueError(f"not a USD amount: {amount!r}") from exc
    if not value.is_finite():
        raise ValueError(f"not a USD amount: {amount!r}")
    micros = value * MICROS_PER_USD
    if micros != micros.to_integral_value():
        raise ValueError(f"USD amount finer than a micro-dollar: {amount!r}")
    return int(micros)


def micros_to_usd(micros: int) -> Decimal:
    """Micros as a Decimal of dollars, shown to the cent at least (``12500000`` -> ``12.50``)."""
    if micros % MICROS_PER_CENT == 0:
        return Decimal(micros // MICROS_PER_CENT).scaleb(-2)
    return Decimal(micros).scaleb(-6).normalize()


def apply_modifier(cents: int, modifier: Decimal) -> int:
    """A price in cents times a modifier, rounded half up to a whole cent."""
    return int((Decimal(cents) * modifier).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def coin_value_micros(amount_atomic: int, decimals: int, usd_per_coin: Decimal) -> int:
    """USD value in micros of ``amount_atomic`` base units of a coin, rounded down to a micro."""
    coins = Decimal(amount_atomic).scaleb(-decimals)
    return int((coins * usd_per_coin * MICROS_PER_USD).to_integral_value(rounding=ROUND_DOWN))


def _to_json_number(value: Decimal) -> float:
    # The edge: amounts are at most 6 decimals and far below 2**53 micros, so the shortest float
    # representation prints exactly the decimal digits of ``value``.
    return float(value)


UsdAmount = Annotated[Decimal, PlainSerializer(_to_json_number, return_type=float, when_used="json")]
"""A USD amount in an API model: a Decimal in Python, a JSON number on the wire."""
