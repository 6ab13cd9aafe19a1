"""The standing deposit address endpoints, over :mod:`vpsshop.deposits`."""

from __future__ import annotations

from vpsshop import deposits
from vpsshop.deposits import DepositAddressInput, DepositAddressList, DepositAddressOut
from vpsshop.routing import ApiRoute, Call, body_named

DepositAddressBody = body_named("DepositAddressBody", DepositAddressInput)
TAG = ("topups",)


async def request_address(call: Call) -> DepositAddressOut:
    return await deposits.request_deposit_address(call.ctx, call.actor, call.body)


async def list_addresses(call: Call) -> DepositAddressList:
    return await deposits.list_deposit_addresses(call.ctx, call.actor)


def routes() -> list[ApiRoute]:
    return [
        ApiRoute(
            "POST",
            "/deposit-addresses",
            request_address,
            "Get the account's standing deposit address in a coin",
            DepositAddressOut,
            body=DepositAddressBody,
            description="The account's standing deposit address in `coin`, made on the first request; every later "
            "request returns the same address (one per account and coin). It never expires: send any amount, any "
            "number of times. Each receipt is credited once it has its confirmations, at the exchange rate of that "
            "moment, as a completed top-up of its own (GET /topups/{ref}, the topup.* events and webhooks). A "
            "receipt worth less than `minimum_usd` is held, not lost, until the receipts held at the address add "
            "up to it; they are then credited together. See docs/payments.md.",
            errors={400: "invalid_coin (not offered, or no standing addresses in that coin), unknown_field."},
            tags=TAG,
            operation_id="requestDepositAddress",
        ),
        ApiRoute(
            "GET",
            "/deposit-addresses",
            list_addresses,
            "List the account's standing deposit addresses",
            DepositAddressList,
            description="Every standing address of the account with what it holds below the minimum (no QR codes: "
            "POST /deposit-addresses draws one).",
            tags=TAG,
            count_writes=False,
            operation_id="listDepositAddresses",
        ),
    ]
