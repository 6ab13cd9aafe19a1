"""Standing deposit addresses as the customer asks for them: one address per coin that never expires.

``POST /v1/deposit-addresses`` and ``GET /v1/deposit-addresses``, the dashboard's deposit page and the
MCP tool ``deposit_address`` call these. What arrives at an address is credited by the watcher
(:mod:`vpsshop.payments.standing`): each confirmed receipt a completed top-up of its own, at the rate
of the moment it is confirmed; receipts below ``topups.standing_minimum_usd`` are held until they add up.
"""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from pydantic import BaseModel, Field

from vpsshop import limits
from vpsshop.actors import Customer
from vpsshop.coins import DepositCoin
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest
from vpsshop.inputs import Input
from vpsshop.payments import engine_for, standing
from vpsshop.payments.models import DepositAddressRow
from vpsshop.payments.resource import DepositAddressOut, qr_data_uri

__all__ = [
    "DepositAddressInput",
    "DepositAddressList",
    "DepositAddressOut",
    "list_deposit_addresses",
    "request_deposit_address",
    "standing_coins",
]


class DepositAddressInput(Input):
    """Body of ``POST /deposit-addresses``."""

    coin: str = Field(
        min_length=1,
        max_length=16,
        description="Coin code (BTC, LTC, ETH, USDT, TRX, USDTTRC, SOL ...): a deposit coin of this shop.",
        json_schema_extra={"x-catalog": "standing_coins"},
    )

    @classmethod
    def error_code(cls, field_name: str, error_type: str) -> str:
        if field_name == "coin":
            return "invalid_coin"
        return super().error_code(field_name, error_type)


class DepositAddressList(BaseModel):
    deposit_addresses: list[DepositAddressOut] = Field(description="The account's standing addresses, oldest first.")


def standing_coins(ctx: AppContext) -> list[str]:
    """The shop's coins that have standing deposit addresses."""
    return [code for code, coin in ctx.coins.items() if isinstance(coin, DepositCoin) and coin.standing_addresses]


def _out(ctx: AppContext, row: DepositAddressRow, *, qr: bool) -> DepositAddressOut:
    with ctx.db.session() as session:
        out = standing.address_out(ctx, session, row)
    if qr:
        out.qr_data_uri = qr_data_uri(row.address)  # the bare address: no amount, any wallet reads it
    return out


async def request_deposit_address(ctx: AppContext, customer: Customer, data: DepositAddressInput) -> DepositAddressOut:
    """The account's standing address in ``data.coin``, made on the first request (idempotent).

    :raises BadRequest: invalid_coin (not offered, or no standing addresses in that coin).
    :raises RateLimited: the account's write limit.
    """
    await to_thread.run_sync(limits.count_write, ctx, customer.account_id)
    coin: Any = engine_for(ctx).coin(data.coin)
    if not isinstance(coin, DepositCoin):
        raise BadRequest("invalid_coin", f"Coin {coin.code} is not paid to a deposit address.")
    allocate = engine_for(ctx).allocate_index
    row, registered = await to_thread.run_sync(standing.standing_address, ctx, customer.account_id, coin, allocate)
    if not registered:
        await standing.register(ctx, coin, row)
    return await to_thread.run_sync(lambda: _out(ctx, row, qr=True))


async def list_deposit_addresses(ctx: AppContext, customer: Customer, *, qr: bool = False) -> DepositAddressList:
    """The account's standing addresses (``qr``: with their QR codes)."""

    def read() -> DepositAddressList:
        rows = standing.standing_addresses(ctx, customer.account_id)
        return DepositAddressList(deposit_addresses=[_out(ctx, r, qr=qr) for r in rows])

    return await to_thread.run_sync(read)
