"""Every service the dashboard calls, in one place: the functions the API endpoints call too.

The pages never touch tables or plugins themselves. Each function here is one call into a service
module (accounts, top-ups, servers, SSH keys, webhooks and events, two-factor, sessions), run off
the event loop where it blocks, so the dashboard cannot drift from the API: an order placed here is
the order ``POST /v1/servers`` places, with the same checks, errors and ledger entry.

Limits too: each method that changes something first counts it as the API's router counts the
matching endpoint (:meth:`Shop.write`: ``limits.enforce`` with that endpoint's route, so the
account's write limit and the server and top-up quotas), and a new account counts against the
client address's sign-up limit (``limits.signup``). Over a limit the method raises the API's
:class:`~vpsshop.ratelimit.RateLimited` (429, ``Retry-After``) before anything is done.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from starlette.concurrency import run_in_threadpool

from vpsshop import accounts, limits, sessions, twofactor
from vpsshop.accounts import AccountCreated, AccountOut, ApiKeyCreated, ApiKeyList, ApiKeyRevoked, LedgerEntryOut
from vpsshop.api import topups as topup_api
from vpsshop.api.accounts import NewKeyBody
from vpsshop.api.topups import TopupBody, TopupOut
from vpsshop.catalog import Catalog
from vpsshop.coins import DepositCoin, X402Coin
from vpsshop.context import AppContext
from vpsshop.errors import BadRequest
from vpsshop.events import api as events_api
from vpsshop.money import usd_to_micros
from vpsshop.payments import engine_for
from vpsshop.payments.models import Topup
from vpsshop.routing import ApiModel, ApiRoute, validation_error
from vpsshop.servers import api as server_api
from vpsshop.servers import console, reinstall, sshkeys
from vpsshop.servers.api import (
    CredentialsOut,
    OrderBody,
    Ordered,
    PowerActionOut,
    QuoteOut,
    RenewOut,
    ServerList,
    ServerOut,
)
from vpsshop.servers.console import ConsoleTicketOut
from vpsshop.servers.reinstall import ReinstallBody, ReinstallOut
from vpsshop.servers.sshkeys import SshKeyBody, SshKeyList, SshKeyOut
from vpsshop.x402 import headers as x402_headers


def parse(model: type[ApiModel], data: dict[str, Any]) -> Any:
    """A form's fields validated by the API's body model: the same rules, error codes and messages."""
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(model, exc) from None


class Shop:
    """The services of one shop, as the dashboard's pages use them (``request.state.shop``)."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.routes: dict[tuple[str, str], ApiRoute] = {
            (route.method.upper(), route.path): route for route in ctx.routes
        }

    # ---- limits --------------------------------------------------------------------------------------

    async def write(self, account_id: int, method: str, path: str) -> None:
        """Count a change as the API counts ``method path`` for this account (``limits.enforce``):
        one write of the account's limit, and the server or top-up quota of an order or a top-up.

        :raises RateLimited: over a limit or quota (429 with ``Retry-After``); nothing is done.
        """
        route = self.routes[(method, path)]  # KeyError: the API has no such endpoint (a dashboard bug)
        servers = (await self.account(account_id)).servers if (method, path) == ("POST", "/servers") else 0
        await run_in_threadpool(limits.enforce, self.ctx, route, account_id, servers)

    # ---- account, keys, sign-in ------------------------------------------------------------------

    async def create_account(self, client: str) -> AccountCreated:
        """``POST /v1/account``: the sign-up limit of ``client``'s address (shared with the API), then the account."""
        await run_in_threadpool(limits.signup, self.ctx, client)
        return await run_in_threadpool(accounts.create_account, self.ctx)

    async def account(self, account_id: int) -> AccountOut:
        return await run_in_threadpool(accounts.get_account, self.ctx, account_id)

    async def ledger(self, account_id: int, limit: int = 15) -> list[LedgerEntryOut]:
        return await run_in_threadpool(accounts.ledger_entries, self.ctx, account_id, limit)

    async def keys(self, account_id: int) -> ApiKeyList:
        return await run_in_threadpool(accounts.list_keys, self.ctx, account_id)

    async def mint_key(self, account_id: int, name: str | None) -> ApiKeyCreated:
        body = parse(NewKeyBody, {} if name is None else {"name": name})
        await self.write(account_id, "POST", "/keys")
        return await run_in_threadpool(accounts.mint_key, self.ctx, account_id, body.name)

    async def revoke_key(self, account_id: int, key_id: int) -> ApiKeyRevoked:
        await self.write(account_id, "DELETE", "/keys/{id}")
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

    @property
    def orderable_locations(self) -> list[Any]:
        """The catalog's locations the hypervisor serves (an order elsewhere is refused with 409)."""
        return [loc for loc in self.ctx.catalog.locations if self.ctx.serves_location(loc.id)]

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
        await self.write(account_id, "POST", "/topups")
        return await topup_api.create_deposit_topup(self.ctx, account_id, coin, usd_to_micros(body.amount), key)

    async def x402_requirements(self, account_id: int, coin: X402Coin, body: TopupBody) -> dict[str, Any]:
        """What an x402 wallet is asked to sign for this amount: the API's 402 requirements (counted as
        the API counts the ``POST /topups`` that answers them)."""
        await self.write(account_id, "POST", "/topups")
        return x402_headers.requirements(self.ctx, coin, usd_to_micros(body.amount))

    def watched(self, coin_code: str) -> bool:
        """Whether the shop watches ``coin_code``'s chain for payments (a sandbox coin without a node does not)."""
        coin = self.ctx.coins.get(coin_code)
        return isinstance(coin, DepositCoin) and coin.can_scan

    async def topup(self, account_id: int, ref: str) -> TopupOut:
        return await topup_api.read_topup(self.ctx, account_id, ref)

    async def cancel_topup(self, account_id: int, ref: str) -> TopupOut:
        await self.write(account_id, "POST", "/topups/{ref}/cancel")
        return await topup_api.cancel_topup_of(self.ctx, account_id, ref)

    async def recent_topups(self, account_id: int, limit: int = 10) -> list[Topup]:
        return await run_in_threadpool(engine_for(self.ctx).recent_topups, account_id, limit)

    # ---- servers -------------------------------------------------------------------------------------

    def order_body(self, data: dict[str, Any]) -> OrderBody:
        return parse(OrderBody, data)  # type: ignore[no-any-return]

    async def order(self, account_id: int, body: OrderBody, key: str | None) -> Ordered:
        await self.write(account_id, "POST", "/servers")
        return await run_in_threadpool(server_api.place_order, self.ctx, account_id, body, key)

    async def servers(self, account_id: int) -> ServerList:
        return await run_in_threadpool(server_api.servers_of, self.ctx, account_id)

    async def server(self, account_id: int, server_id: int) -> ServerOut:
        return await run_in_threadpool(server_api.server_of, self.ctx, account_id, server_id)

    async def credentials(self, account_id: int, server_id: int) -> CredentialsOut:
        return await run_in_threadpool(server_api.reveal_credentials, self.ctx, account_id, server_id)

    async def set_auto_renew(self, account_id: int, server_id: int, on: bool) -> ServerOut:
        await self.write(account_id, "PATCH", "/servers/{id}")
        return await run_in_threadpool(server_api.set_auto_renew, self.ctx, account_id, server_id, on)

    async def set_reverse_dns(self, account_id: int, server_id: int, name: str | None) -> ServerOut:
        body = parse(server_api.ServerPatch, {"reverse_dns": name})
        await self.write(account_id, "PATCH", "/servers/{id}")
        return await run_in_threadpool(server_api.set_reverse_dns, self.ctx, account_id, server_id, body.reverse_dns)

    @property
    def has_dns(self) -> bool:
        """Whether the shop has a DNS provider (without one, reverse DNS cannot be set)."""
        return self.ctx.dns is not None

    def can(self, capability: str) -> bool:
        """Whether the shop's hypervisor backend has ``capability`` (``reinstall``, ``console``)."""
        backend = self.ctx.hypervisor
        return backend is not None and capability in backend.capabilities

    @property
    def prepay_days(self) -> int:
        """How far ahead a server may be paid (``servers.max_prepay_days``), as renewals check it."""
        from vpsshop.servers.lifecycle import policy

        return policy(self.ctx).max_prepay_days

    def renew_body(self, periods: int | str) -> int:
        return parse(server_api.RenewBody, {"periods": periods}).periods  # type: ignore[no-any-return]

    async def renewal_quote(self, account_id: int, server_id: int, periods: int = 1) -> QuoteOut:
        return await run_in_threadpool(server_api.quote_renewal, self.ctx, account_id, server_id, periods)

    async def renew(self, account_id: int, server_id: int, periods: int = 1) -> RenewOut:
        await self.write(account_id, "POST", "/servers/{id}/renew")
        return await run_in_threadpool(server_api.renew_now, self.ctx, account_id, server_id, periods)

    async def power(self, account_id: int, server_id: int, action: str) -> PowerActionOut:
        await self.write(account_id, "POST", f"/servers/{{id}}/{action}")
        return await run_in_threadpool(server_api.power_action, self.ctx, account_id, server_id, action)

    def reinstall_body(self, data: dict[str, Any]) -> ReinstallBody:
        return parse(ReinstallBody, data)  # type: ignore[no-any-return]

    async def reinstall(self, account_id: int, server_id: int, body: ReinstallBody) -> ReinstallOut:
        await self.write(account_id, "POST", "/servers/{id}/reinstall")
        return await run_in_threadpool(reinstall.reinstall_server, self.ctx, account_id, server_id, body)

    async def console_ticket(self, account_id: int, server_id: int) -> ConsoleTicketOut:
        await self.write(account_id, "POST", "/servers/{id}/console")
        return await run_in_threadpool(console.issue_ticket, self.ctx, account_id, server_id)

    # ---- SSH keys ------------------------------------------------------------------------------------

    async def ssh_keys(self, account_id: int) -> SshKeyList:
        return await run_in_threadpool(sshkeys.list_keys, self.ctx, account_id)

    async def add_ssh_key(self, account_id: int, name: str, public_key: str) -> SshKeyOut:
        body = parse(SshKeyBody, {"name": name, "public_key": public_key})
        await self.write(account_id, "POST", "/ssh-keys")
        return await run_in_threadpool(sshkeys.add_key, self.ctx, account_id, body)

    async def delete_ssh_key(self, account_id: int, key_id: int) -> None:
        await self.write(account_id, "DELETE", "/ssh-keys/{id}")
        await run_in_threadpool(sshkeys.delete_key, self.ctx, account_id, key_id)

    # ---- webhooks and events ---------------------------------------------------------------------------

    async def webhooks(self, account_id: int) -> events_api.WebhookList:
        return await run_in_threadpool(events_api._list, self.ctx, account_id)

    async def webhook(self, account_id: int, endpoint_id: int) -> events_api.WebhookOut:
        return await run_in_threadpool(events_api._get, self.ctx, account_id, endpoint_id)

    async def create_webhook(self, account_id: int, data: dict[str, Any]) -> events_api.WebhookCreated:
        body = parse(events_api.WebhookBody, data)
        await self.write(account_id, "POST", "/webhooks")
        return await run_in_threadpool(events_api._create, self.ctx, account_id, body)

    async def change_webhook(self, account_id: int, endpoint_id: int, data: dict[str, Any]) -> events_api.WebhookOut:
        body = parse(events_api.WebhookPatch, data)
        await self.write(account_id, "PATCH", "/webhooks/{id}")
        return await run_in_threadpool(events_api._patch, self.ctx, account_id, endpoint_id, body)

    async def delete_webhook(self, account_id: int, endpoint_id: int) -> None:
        await self.write(account_id, "DELETE", "/webhooks/{id}")
        await run_in_threadpool(events_api._delete, self.ctx, account_id, endpoint_id)

    async def deliveries(
        self, account_id: int, endpoint_id: int, before: int | None, limit: int = 20
    ) -> events_api.DeliveryList:
        return await run_in_threadpool(events_api._deliveries, self.ctx, account_id, endpoint_id, before, limit)

    async def redeliver(self, account_id: int, endpoint_id: int, event_id: str) -> None:
        body = parse(events_api.RedeliverBody, {"event_id": event_id})
        await self.write(account_id, "POST", "/webhooks/{id}/redeliver")
        await run_in_threadpool(events_api._redeliver, self.ctx, account_id, endpoint_id, body.event_id)

    async def events(
        self, account_id: int, before: str | None, type_: str | None, limit: int = 25
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The account's events newest first, as ``GET /v1/events`` gives them, and the cursor of the
        next (older) page (None at the end). The first page starts at the newest event."""

        def run() -> tuple[list[dict[str, Any]], str | None]:
            page = json.loads(
                events_api._list_events(self.ctx, account_id, None, before, limit, type_, newest_first=True).body
            )
            return page["events"], page["cursor"] if page["has_more"] else None

        return await run_in_threadpool(run)
