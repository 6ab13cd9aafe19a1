"""Every service the dashboard calls, in one place: the functions the API endpoints call too.

The pages never touch tables or plugins themselves. Each function here is one call into a service
module (accounts, top-ups, servers, two-factor, sessions), run off the event loop where it blocks,
so the dashboard cannot drift from the API: an order placed here is the order ``POST /v1/servers``
places, with the same checks, errors and ledger entry.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from starlette.concurrency import run_in_threadpool

from vpsshop import accounts, sessions, twofactor
from vpsshop.accounts import AccountCreated, AccountOut, ApiKeyCreated, ApiKeyList, ApiKeyRevoked, LedgerEntryOut
from vpsshop.api import topups as topup_api
from vpsshop.api.topups import TopupBody, TopupOut
from vpsshop.catalog import Catalog
from vpsshop.coins import DepositCoin, X402Coin
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest
from vpsshop.money import usd_to_micros
from vpsshop.payments import engine_for
from vpsshop.payments.models import Topup
from vpsshop.routing import validation_error
from vpsshop.servers import api as server_api
from vpsshop.servers.api import CredentialsOut, OrderBody, Ordered, PowerActionOut, RenewOut, ServerList, ServerOut
from vpsshop.x402 import headers as x402_headers


class Shop:
    """The services of one shop, as the dashboard's pages use them (``request.state.shop``)."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    # ---- account, keys, sign-in ------------------------------------------------------------------

    async def create_account(self) -> AccountCreated:
        return await run_in_threadpool(accounts.create_account, self.ctx)

    async def account(self, account_id: int) -> AccountOut:
        return await run_in_threadpool(accounts.get_account, self.ctx, account_id)

    async def ledger(self, account_id: int, limit: int = 15) -> list[LedgerEntryOut]:
        return await run_in_threadpool(accounts.ledger_entries, self.ctx, account_id, limit)

    async def keys(self, account_id: int) -> ApiKeyList:
        return await run_in_threadpool(accounts.list_keys, self.ctx, account_id)

    async def mint_key(self, account_id: int, name: str | None) -> ApiKeyCreated:
        return await run_in_threadpool(accounts.mint_key, self.ctx, account_id, name)

    async def revoke_key(self, account_id: int, key_id: int) -> ApiKeyRevoked:
        return await run_in_threadpool(accounts.revoke_key, self.ctx, account_id, key_id)

    async def check_login_token(self, token: str, client: str) -> tuple[int, bool]:
        return await run_in_threadpool(accounts.check_login_token, self.ctx, token, client)

    async def check_second_factor(self, account_id: int, code: str | None, client: str) -> None:
        await run_in_threadpool(accounts.check_second_factor, self.ctx, account_id, code, client)

    # ---- sessions ----------------------------------------------------------------------------------

    async def start_session(self, account_id: int, *, pending_totp: bool, user_agent: str | None) -> str:
        return await run_in_threadpool(
            lambda: sessions.start(self.ctx, account_id, pending_totp=pending_totp, user_agent=user_agent)
        )

    async def resolve_session(self, token: str | None) -> sessions.ActiveSession | None:
        return await run_in_threadpool(sessions.resolve, self.ctx, token)

    async def complete_second_factor(self, pending: sessions.ActiveSession) -> str:
        return await run_in_threadpool(sessions.complete_second_factor, self.ctx, pending)

    async def end_session(self, account_id: int, session_id: int) -> bool:
        return await run_in_threadpool(sessions.end, self.ctx, account_id, session_id)

    async def end_other_sessions(self, account_id: int, keep_id: int | None) -> int:
        return await run_in_threadpool(sessions.end_others, self.ctx, account_id, keep_id)

    async def live_sessions(self, account_id: int) -> list[sessions.ActiveSession]:
        return await run_in_threadpool(sessions.live, self.ctx, account_id)

    # ---- two-factor --------------------------------------------------------------------------------

    async def begin_totp(self, account_id: int) -> twofactor.Enrolment:
        return await run_in_threadpool(twofactor.begin_enrolment, self.ctx, account_id)

    async def confirm_totp(self, account_id: int, code: str) -> list[str]:
        return await run_in_threadpool(twofactor.confirm_enrolment, self.ctx, account_id, code)

    async def disable_totp(self, account_id: int, code: str) -> None:
        await run_in_threadpool(twofactor.disable, self.ctx, account_id, code)

    async def new_recovery_codes(self, account_id: int, code: str) -> list[str]:
        return await run_in_threadpool(twofactor.regenerate_recovery_codes, self.ctx, account_id, code)

    async def recovery_codes_left(self, account_id: int) -> int:
        return await run_in_threadpool(twofactor.recovery_codes_left, self.ctx, account_id)

    async def verify_totp(self, account_id: int, code: str | None) -> None:
        await run_in_threadpool(twofactor.verify, self.ctx, account_id, code)

    # ---- catalog and top-ups -------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        return self.ctx.catalog

    def topup_body(self, amount: str, coin: str | None) -> TopupBody:
        """The API's body model validates the form: the same limits, codes and messages."""
        try:
            value: Any = Decimal(amount.strip().lstrip("$").replace(",", ""))
        except ArithmeticError:
            raise BadRequest("invalid_amount", "amount: enter a number of US dollars, like 30 or 30.50.") from None
        from pydantic import ValidationError

        try:
            return TopupBody.model_validate({"amount": value, "coin": coin or None})
        except ValidationError as exc:
            raise validation_error(TopupBody, exc) from None

    def topup_coin(self, code: str | None) -> DepositCoin | X402Coin:
        """The coin of a top-up (the default when None). :raises BadRequest: invalid_coin."""
        return engine_for(self.ctx).coin(code)

    async def create_topup(self, account_id: int, coin: DepositCoin, body: TopupBody, key: str | None) -> TopupOut:
        return await topup_api.create_deposit_topup(self.ctx, account_id, coin, usd_to_micros(body.amount), key)

    def x402_requirements(self, coin: X402Coin, body: TopupBody) -> dict[str, Any]:
        """What an x402 wallet is asked to sign for this amount: the API's 402 requirements."""
        return x402_headers.requirements(self.ctx, coin, usd_to_micros(body.amount))

    async def topup(self, account_id: int, ref: str) -> TopupOut:
        return await topup_api.read_topup(self.ctx, account_id, ref)

    async def cancel_topup(self, account_id: int, ref: str) -> TopupOut:
        return await topup_api.cancel_topup_of(self.ctx, account_id, ref)

    async def recent_topups(self, account_id: int, limit: int = 10) -> list[Topup]:
        return await run_in_threadpool(engine_for(self.ctx).recent_topups, account_id, limit)

    # ---- servers -------------------------------------------------------------------------------------

    def order_body(self, data: dict[str, Any]) -> OrderBody:
        from pydantic import ValidationError

        try:
            return OrderBody.model_validate(data)
        except ValidationError as exc:
            raise validation_error(OrderBody, exc) from None

    async def order(self, account_id: int, body: OrderBody, key: str | None) -> Ordered:
        return await run_in_threadpool(server_api.place_order, self.ctx, account_id, body, key)

    async def servers(self, account_id: int) -> ServerList:
        return await run_in_threadpool(server_api.servers_of, self.ctx, account_id)

    async def server(self, account_id: int, server_id: int) -> ServerOut:
        return await run_in_threadpool(server_api.server_of, self.ctx, account_id, server_id)

    async def credentials(self, account_id: int, server_id: int) -> CredentialsOut:
        return await run_in_threadpool(server_api.reveal_credentials, self.ctx, account_id, server_id)

    async def set_auto_renew(self, account_id: int, server_id: int, on: bool) -> ServerOut:
        return await run_in_threadpool(server_api.set_auto_renew, self.ctx, account_id, server_id, on)

    async def renew(self, account_id: int, server_id: int) -> RenewOut:
        return await run_in_threadpool(server_api.renew_now, self.ctx, account_id, server_id)

    async def power(self, account_id: int, server_id: int, action: str) -> PowerActionOut:
        return await run_in_threadpool(server_api.power_action, self.ctx, account_id, server_id, action)
