"""The shop's MCP tools: one per customer operation of the REST API, over the same operations.

Each :class:`Tool` names the operation it calls, the REST operations it covers (``operations``, their
OpenAPI ``operationId``: ``tests/test_mcp_tools.py`` fails when a customer operation has no tool), its
arguments as a model built from the operation's own input model (the same fields, rules, error codes
and descriptions as the REST body, plus the path's ids and the headers' idempotency key and x402
payment), and its MCP annotations.

A tool answers the resource as the API answers it (``structuredContent``, and the same JSON as text).
An operation's refusal is a result with ``isError: true`` carrying the API's error body (``error``,
``message``, and for a short balance ``price``, ``balance``, ``deficit`` and the x402 requirements).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, Field

from vpsshop import accounts, deposits, signin, topups, wallets
from vpsshop.accounts import NewKeyInput
from vpsshop.actors import Customer
from vpsshop.context import AppContext
from vpsshop.deposits import DepositAddressInput
from vpsshop.errors import ApiError
from vpsshop.events import feed, webhooks
from vpsshop.events.feed import EVENT_ID_PATTERN, EventQuery
from vpsshop.events.webhooks import DeliveryQuery, RedeliverInput, WebhookChange, WebhookInput
from vpsshop.inputs import IDEMPOTENCY_KEY, MAX_ID, Input
from vpsshop.servers import (
    console,
    control,
    credentials,
    firewall,
    orders,
    reinstall,
    renewals,
    resize,
    resource,
    snapshots,
    sshkeys,
    termination,
)
from vpsshop.servers.control import PowerAction, ServerChange
from vpsshop.servers.firewall import FirewallIn
from vpsshop.servers.orders import OrderInput, QuoteInput
from vpsshop.servers.reinstall import ReinstallInput
from vpsshop.servers.renewals import RenewInput
from vpsshop.servers.resize import ResizeInput
from vpsshop.servers.snapshots import SnapshotIn
from vpsshop.servers.sshkeys import SshKeyInput
from vpsshop.servers.termination import TerminateInput
from vpsshop.signin import LoginInput
from vpsshop.topups import REF_PATTERN, TopupInput
from vpsshop.wallets import WalletLoginInput
from vpsshop.x402.offers import SettledPayment, SignedPayment

__all__ = ["TOOLS", "Tool", "ToolError"]

Result = BaseModel | dict[str, Any]
Handler = Callable[[AppContext, Customer, Any], Awaitable[Result]]
KeylessHandler = Callable[[AppContext, str, Any], Awaitable[Result]]
"""A tool's answer to a call without an API key: the context, the caller's address, the arguments."""


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    arguments: type[Input]
    run: Handler
    operations: tuple[str, ...]
    """The REST operations (OpenAPI ``operationId``) this tool does."""
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    needs_key: bool = True
    """Acts for the account of the caller's API key (else anyone may call it)."""
    keyless: KeylessHandler | None = None
    """What a call without an API key does instead of a 401 (``order_server``: pay as sign-up)."""


class ToolError(ApiError):
    """A tool's own refusal (a wait that timed out), answered like an operation's."""


# ---- arguments: the operations' inputs, plus what the REST API carries in the path and headers --------


class _IdBounds(TypedDict):
    ge: int
    le: int


_ID = _IdBounds(ge=1, le=MAX_ID)


class NoArguments(Input):
    pass


class ServerRef(Input):
    server_id: int = Field(description="The server's id (list_servers).", **_ID)


class TopupRef(Input):
    ref: str = Field(pattern=REF_PATTERN, description="The top-up's ref, as start_topup gave it.")


class KeyRef(Input):
    key_id: int = Field(description="The API key's id (list_api_keys).", **_ID)


class SshKeyRef(Input):
    ssh_key_id: int = Field(description="The stored SSH key's id (list_ssh_keys).", **_ID)


class WebhookRef(Input):
    webhook_id: int = Field(description="The webhook endpoint's id (list_webhooks).", **_ID)


class EventRef(Input):
    event_id: str = Field(pattern=EVENT_ID_PATTERN, description="The event's id (evt_...).")


class Idempotent(Input):
    idempotency_key: str | None = Field(
        None,
        pattern=IDEMPOTENCY_KEY,
        description="Makes a retried call safe: the same key with the same arguments returns the first result "
        "and charges nothing more; with other arguments it is refused (idempotency_key_reused).",
    )


class PaymentArg(Input):
    payment: str | None = Field(
        None,
        max_length=16_384,
        description="An x402 payment signed for the requirements of this tool's 402 (accepts, x402 v2) as "
        "base64 JSON, for clients that cannot send it where x402's MCP binding puts it (_meta['x402/payment'], "
        "which an x402 MCP client fills in). The payment is settled, credited to the balance, and the call is "
        "made with it; the result carries payment_response. A payment is used once.",
    )


class Paid(Idempotent, PaymentArg):
    pass


class TopupArgs(TopupInput, Paid):
    pass


class WalletRef(Input):
    wallet_id: int = Field(description="The wallet's id (list_wallets).", **_ID)


class Signed(Input):
    signed_message: str | None = Field(
        None,
        min_length=1,
        max_length=16_384,
        description="The x402 sign-in-with-x payload your wallet signed for this tool's challenge (the base64 "
        "SIGN-IN-WITH-X value). Call without it first: the result is isError with error 402 and the message to "
        "sign in extensions['sign-in-with-x'] (CAIP-122: EIP-4361 for an EVM wallet, Sign-In With Solana for a "
        "Solana one; valid 5 minutes, used once).",
    )


class WalletLoginArgs(WalletLoginInput, Signed):
    pass


class OrderArgs(OrderInput, Paid):
    pass


class RenewArgs(ServerRef, RenewInput, Paid):
    pass


class RenewalQuoteArgs(ServerRef, RenewInput):
    pass


class ChangeArgs(ServerRef, ServerChange):
    pass


class FirewallArgs(ServerRef, FirewallIn):
    pass


class SnapshotArgs(ServerRef, SnapshotIn):
    pass


class SnapshotRef(ServerRef):
    snapshot_id: int = Field(description="The snapshot's id (list_snapshots).", **_ID)


class PowerArgs(ServerRef):
    action: PowerAction = Field(description="start, stop or reboot.")


class ReinstallArgs(ServerRef, ReinstallInput):
    pass


class ResizeArgs(ServerRef, ResizeInput, PaymentArg):
    pass


class TerminateArgs(ServerRef, TerminateInput, Idempotent):
    confirm_hostname: str = Field(  # required here: the agent confirms what it ends
        min_length=1,
        max_length=253,
        description="The server's hostname (get_server shows it), to confirm which server is ended for good: a "
        "different one is refused and nothing is done (hostname_mismatch).",
    )


class WaitArgs(ServerRef):
    status: Literal["provisioning", "active", "suspended", "terminated"] = Field(
        "active", description="The status to wait for (default active)."
    )
    timeout_seconds: float = Field(120, ge=1, le=900, description="How long to wait, 1 to 900 seconds.")


class WebhookChangeArgs(WebhookRef, WebhookChange):
    pass


class DeliveriesArgs(WebhookRef, DeliveryQuery):
    pass


class RedeliverArgs(WebhookRef, RedeliverInput):
    pass


def part(args: Input, model: type[Input]) -> Any:
    """The operation's own input out of a tool's arguments (absent fields stay absent)."""
    return model.model_validate(args.model_dump(include=set(model.model_fields), exclude_unset=True))


def _payment(args: PaymentArg) -> SignedPayment | None:
    return SignedPayment.from_payload(args.payment) if args.payment else None


def paid_result(out: BaseModel, settled: SettledPayment | None, replayed: bool) -> dict[str, Any]:
    """An operation's result with what the REST API says in headers: the settlement, a replay."""
    result = out.model_dump(mode="json")
    if settled is not None:
        result["payment_response"] = settled.response()
    if replayed:
        result["idempotent_replayed"] = True
    return result


# ---- handlers --------------------------------------------------------------------------------------


async def _create_account(ctx: AppContext, customer: Customer, args: NoArguments) -> Result:
    return await accounts.create_account(ctx, client="mcp")


async def _sign_in(ctx: AppContext, customer: Customer, args: LoginInput) -> Result:
    return await signin.login(ctx, args, client="mcp")


async def _wallet_login(ctx: AppContext, customer: Customer, args: WalletLoginArgs) -> Result:
    data = WalletLoginInput(totp_code=args.totp_code)
    return await wallets.wallet_login(ctx, args.signed_message, data, client="mcp", path="/account/wallet-login")


async def _start_topup(ctx: AppContext, customer: Customer, args: TopupArgs) -> Result:
    started = await topups.start_topup(
        ctx, customer, part(args, TopupInput), idempotency_key=args.idempotency_key, payment=_payment(args)
    )
    return paid_result(started.topup, started.settled, False)


async def _topup_signup(ctx: AppContext, client: str, args: TopupArgs) -> Result:
    signup = await topups.start_signup_topup(ctx, part(args, TopupInput), payment=_payment(args), client=client)
    return paid_result(signup.topup, signup.settled, False)


async def _order(ctx: AppContext, customer: Customer, args: OrderArgs) -> Result:
    done = await orders.place_order(
        ctx, customer, part(args, OrderInput), idempotency_key=args.idempotency_key, payment=_payment(args)
    )
    return paid_result(done.order, done.settled, done.replayed)


async def _order_signup(ctx: AppContext, client: str, args: OrderArgs) -> Result:
    done = await orders.place_signup_order(
        ctx, part(args, OrderInput), idempotency_key=args.idempotency_key, payment=_payment(args), client=client
    )
    return paid_result(done.order, done.settled, done.replayed)


async def _renew(ctx: AppContext, customer: Customer, args: RenewArgs) -> Result:
    done = await renewals.renew_server(
        ctx,
        customer,
        args.server_id,
        part(args, RenewInput),
        idempotency_key=args.idempotency_key,
        payment=_payment(args),
    )
    return paid_result(done.renewal, done.settled, done.replayed)


async def _resize(ctx: AppContext, customer: Customer, args: ResizeArgs) -> Result:
    done = await resize.resize_server(ctx, customer, args.server_id, part(args, ResizeInput), payment=_payment(args))
    return paid_result(done.resize, done.settled, done.replayed)


async def _terminate(ctx: AppContext, customer: Customer, args: TerminateArgs) -> Result:
    done = await termination.terminate_server(
        ctx, customer, args.server_id, part(args, TerminateInput), idempotency_key=args.idempotency_key
    )
    return paid_result(done.server, None, done.replayed)


async def _wait(ctx: AppContext, customer: Customer, args: WaitArgs) -> Result:
    deadline = time.monotonic() + args.timeout_seconds
    while True:
        server = await resource.get_server(ctx, customer, args.server_id)
        if server.status == args.status:
            return server
        if time.monotonic() >= deadline:
            raise ToolError(
                408,
                "wait_timeout",
                f"Server {server.id} is {server.status}, not {args.status}, after {args.timeout_seconds:g} s; "
                "call wait_for_server again, or get_server later.",
                server=server.model_dump(mode="json"),
            )
        await asyncio.sleep(min(2.0, max(0.0, deadline - time.monotonic())))


async def _list_events(ctx: AppContext, customer: Customer, args: EventQuery) -> Result:
    page = await feed.list_events(ctx, customer, args)
    return {"events": [event.payload() for event in page.events], "has_more": page.has_more, "cursor": page.cursor}


async def _get_event(ctx: AppContext, customer: Customer, args: EventRef) -> Result:
    return (await feed.get_event(ctx, customer, args.event_id)).payload()


TOOLS: tuple[Tool, ...] = (
    Tool(
        "get_catalog",
        "The catalog",
        "Plans, locations, operating systems, every price (monthly = plan base price x location modifier; annual = "
        "10 x monthly), top-up limits and the coins accepted.",
        NoArguments,
        lambda ctx, customer, args: _catalog(ctx),
        ("getCatalog",),
        read_only=True,
        idempotent=True,
        needs_key=False,
    ),
    Tool(
        "create_account",
        "Create an account",
        "A new account with a zero balance: its API key (api_key, a Bearer credential for this server) and its "
        "dashboard login token, both shown once. No identity is asked for.",
        NoArguments,
        _create_account,
        ("createAccount",),
        needs_key=False,
    ),
    Tool(
        "sign_in",
        "Sign in with the login token",
        "A new API key for the account of a login token (and its two-factor code when the account has it on): how "
        "an account whose keys are lost is used again.",
        LoginInput,
        _sign_in,
        ("login",),
        needs_key=False,
    ),
    Tool(
        "sign_in_with_wallet",
        "Sign in with a wallet",
        "A new API key for the account a wallet owns (x402 sign-in-with-x): the wallet that paid the order that "
        "created the account, or one linked to it. Call without signed_message for the challenge, sign it with the "
        "wallet, call again with the signed payload.",
        WalletLoginArgs,
        _wallet_login,
        ("walletLogin",),
        needs_key=False,
    ),
    Tool(
        "list_wallets",
        "Wallets",
        "The wallets that own the account: each signs in with sign_in_with_wallet.",
        NoArguments,
        lambda ctx, customer, args: wallets.list_wallets(ctx, customer),
        ("listWallets",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "link_wallet",
        "Link a wallet",
        "Link the wallet that signs to the account, as sign_in_with_wallet signs (call without signed_message for "
        "the challenge). A wallet owns one account at most (wallet_taken).",
        Signed,
        lambda ctx, customer, args: wallets.link_wallet(ctx, customer, args.signed_message, path="/account/wallets"),
        ("linkWallet",),
    ),
    Tool(
        "unlink_wallet",
        "Remove a wallet",
        "The wallet no longer signs in to the account.",
        WalletRef,
        lambda ctx, customer, args: wallets.unlink_wallet(ctx, customer, args.wallet_id),
        ("unlinkWallet",),
        destructive=True,
    ),
    Tool(
        "get_account",
        "The account",
        "The account of the API key: balance (USD), number of servers, two-factor state.",
        NoArguments,
        lambda ctx, customer, args: accounts.get_account(ctx, customer),
        ("getAccount",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "list_api_keys",
        "API keys",
        "The account's active API keys, by id and prefix (a key's value cannot be read back).",
        NoArguments,
        lambda ctx, customer, args: accounts.list_keys(ctx, customer),
        ("listKeys",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "create_api_key",
        "Mint an API key",
        "A new API key for the account; its full value is in this result only.",
        NewKeyInput,
        lambda ctx, customer, args: accounts.create_key(ctx, customer, args),
        ("createKey",),
    ),
    Tool(
        "revoke_api_key",
        "Revoke an API key",
        "The key stops working from its next use (revoking the key of this session ends it).",
        KeyRef,
        lambda ctx, customer, args: accounts.revoke_key(ctx, customer, args.key_id),
        ("revokeKey",),
        destructive=True,
    ),
    Tool(
        "start_topup",
        "Top up the balance",
        "Start a top-up of amount USD (25 to 2000) paid in coin, one of get_catalog's payment_options (omitted: the "
        "shop's default). A deposit coin answers with the address and the amount to send (get_topup shows its "
        "progress). An x402 coin (USDCBASE) answers isError with error 402 and the x402 payment requirements "
        "(x402Version 2, accepts): an x402 MCP client pays them in the call's _meta['x402/payment']. Without an "
        "API key an x402 top-up is paid as sign-up: the paying wallet's account is credited (created by its first "
        "payment, its api_key and login_token in the result's account once).",
        TopupArgs,
        _start_topup,
        ("createTopup",),
        keyless=_topup_signup,
    ),
    Tool(
        "get_topup",
        "A top-up",
        "A top-up and the progress of its payment; checking it credits the balance once the payment has its "
        "confirmations (status completed).",
        TopupRef,
        lambda ctx, customer, args: topups.get_topup(ctx, customer, args.ref),
        ("getTopup",),
        read_only=True,
    ),
    Tool(
        "cancel_topup",
        "Cancel a top-up",
        "Stops a pending top-up; a payment that still arrives to its address is credited anyway.",
        TopupRef,
        lambda ctx, customer, args: topups.cancel_topup(ctx, customer, args.ref),
        ("cancelTopup",),
        idempotent=True,
    ),
    Tool(
        "deposit_address",
        "The account's standing deposit address",
        "The account's standing deposit address in coin (made the first time; always the same one after). Send any "
        "amount there, any number of times: each receipt is credited once confirmed, at the rate of that moment, "
        "as a completed top-up of its own; one worth less than minimum_usd is held until the receipts add up.",
        DepositAddressInput,
        lambda ctx, customer, args: deposits.request_deposit_address(ctx, customer, args),
        ("requestDepositAddress",),
        idempotent=True,
    ),
    Tool(
        "list_deposit_addresses",
        "The account's standing deposit addresses",
        "Every standing deposit address of the account, with what it holds below the minimum.",
        NoArguments,
        lambda ctx, customer, args: deposits.list_deposit_addresses(ctx, customer),
        ("listDepositAddresses",),
        read_only=True,
    ),
    Tool(
        "quote_order",
        "Price an order",
        "What order_server with these arguments would charge now, the balance, and the deficit to top up first "
        "(deficit_usd). Checks the order as order_server does; changes nothing.",
        QuoteInput,
        lambda ctx, customer, args: orders.quote_order(ctx, customer, args),
        ("quoteOrder",),
        read_only=True,
    ),
    Tool(
        "order_server",
        "Order a server",
        "Order a server, paid from the balance: the result is the server (provisioning; wait_for_server until "
        "active) and its generated root password, shown once. A short balance is isError with error "
        "insufficient_balance, deficit, and when the shop takes x402 the payment requirements for the deficit "
        "(x402Version 2, accepts): an x402 MCP client pays them in _meta['x402/payment'] and the order is made "
        "in the same call. Without an API key (shops taking x402) the whole price is asked (error "
        "payment_required): paying it creates the paying wallet's account, and the result's account shows its "
        "api_key and login_token once. Send idempotency_key to retry safely.",
        OrderArgs,
        _order,
        ("orderServer",),
        keyless=_order_signup,
    ),
    Tool(
        "list_servers",
        "Servers",
        "The account's servers, terminated ones included.",
        NoArguments,
        lambda ctx, customer, args: resource.list_servers(ctx, customer),
        ("listServers",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "get_server",
        "A server",
        "One server: status (provisioning, active, suspended, terminated), power, ip, expires_at.",
        ServerRef,
        lambda ctx, customer, args: resource.get_server(ctx, customer, args.server_id),
        ("getServer",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "wait_for_server",
        "Wait for a server",
        "Wait until a server has status (default active), checking every 2 seconds: the server then. A wait "
        "that times out is isError with error wait_timeout and the server as it is.",
        WaitArgs,
        _wait,
        (),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "update_server",
        "Change a server",
        "Turn automatic renewal on or off (auto_renew), or set the address's reverse DNS name (reverse_dns; null "
        "removes it). Fields left out stay as they are.",
        ChangeArgs,
        lambda ctx, customer, args: control.change_server(ctx, customer, args.server_id, part(args, ServerChange)),
        ("updateServer",),
        idempotent=True,
    ),
    Tool(
        "get_firewall",
        "Read a server's firewall",
        "The server's inbound firewall rules (protocol, ports, source); empty: every inbound connection is let in.",
        ServerRef,
        lambda ctx, customer, args: firewall.get_firewall(ctx, customer, args.server_id),
        ("getServerFirewall",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "set_firewall",
        "Replace a server's firewall",
        "Replace the server's inbound rules as a whole: new inbound connections are then let in only where a rule "
        "allows them (protocol tcp, udp or icmp; ports such as 22 or 8000-8100; a source prefix, or anywhere); an "
        "empty list lets every one in. Keep a rule for SSH (tcp 22) to keep logging in. Applied on the hypervisor "
        "within seconds (event server.firewall_changed). Anti-spoofing is always on.",
        FirewallArgs,
        lambda ctx, customer, args: firewall.set_firewall(ctx, customer, args.server_id, part(args, FirewallIn)),
        ("setServerFirewall",),
        idempotent=True,
        destructive=True,
    ),
    Tool(
        "list_snapshots",
        "A server's snapshots",
        "The server's snapshots (id, name, status, plan, monthly price), the most it may hold, and the price of one "
        "per month.",
        ServerRef,
        lambda ctx, customer, args: snapshots.list_snapshots(ctx, customer, args.server_id),
        ("listServerSnapshots",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "create_snapshot",
        "Take a snapshot",
        "Take a restore point of the server (its disk, and a running server's memory) before a risky change: done "
        "within seconds (status creating, then ready; event server.snapshot_created). Nothing is charged now; each "
        "renewal adds the catalog's monthly snapshot price for every snapshot held then.",
        SnapshotArgs,
        lambda ctx, customer, args: snapshots.create_snapshot(ctx, customer, args.server_id, part(args, SnapshotIn)),
        ("createServerSnapshot",),
    ),
    Tool(
        "restore_snapshot",
        "Restore a snapshot",
        "Put the server back to a ready snapshot: everything written to its disk since is lost. Done by a job "
        "(event server.snapshot_restored); the snapshot stays.",
        SnapshotRef,
        lambda ctx, customer, args: snapshots.restore_snapshot(ctx, customer, args.server_id, args.snapshot_id),
        ("restoreServerSnapshot",),
        destructive=True,
    ),
    Tool(
        "delete_snapshot",
        "Delete a snapshot",
        "Remove a snapshot (event server.snapshot_deleted); it is no longer billed. The server itself is untouched.",
        SnapshotRef,
        lambda ctx, customer, args: snapshots.delete_snapshot(ctx, customer, args.server_id, args.snapshot_id),
        ("deleteServerSnapshot",),
        destructive=True,
    ),
    Tool(
        "get_credentials",
        "Root login",
        "The root username and password, ip and hostname of a server.",
        ServerRef,
        lambda ctx, customer, args: credentials.reveal_credentials(ctx, customer, args.server_id),
        ("getServerCredentials",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "renew_server",
        "Renew a server",
        "Pay periods more billing cycles (default 1) from the balance now; a server suspended for non-payment "
        "runs again. A short balance is isError with insufficient_balance and, with x402, the requirements for "
        "the deficit (x402Version 2, accepts): an x402 MCP client pays them in _meta['x402/payment'] and the "
        "server is renewed in the same call.",
        RenewArgs,
        _renew,
        ("renewServer",),
    ),
    Tool(
        "quote_renewal",
        "Price a renewal",
        "What renew_server with these periods would charge now and where expires_at would move; changes nothing.",
        RenewalQuoteArgs,
        lambda ctx, customer, args: renewals.quote_renewal(ctx, customer, args.server_id, part(args, RenewInput)),
        ("quoteRenewal",),
        read_only=True,
    ),
    Tool(
        "power_server",
        "Start, stop or reboot",
        "Start, stop or reboot an active server: queued, done on the hypervisor within seconds (get_server shows "
        "the new power; the events server.started, server.stopped, server.rebooted report it).",
        PowerArgs,
        lambda ctx, customer, args: control.power(ctx, customer, args.server_id, args.action),
        ("startServer", "stopServer", "rebootServer"),
        destructive=True,
    ),
    Tool(
        "reinstall_server",
        "Reinstall a server",
        "Erase the server's disk and install os afresh with new first-boot data (SSH keys, root password, user "
        "data). Everything on the disk is lost; the new password is in this result (generated unless given).",
        ReinstallArgs,
        lambda ctx, customer, args: reinstall.reinstall_server(
            ctx, customer, args.server_id, part(args, ReinstallInput)
        ),
        ("reinstallServer",),
        destructive=True,
    ),
    Tool(
        "resize_server",
        "Resize a server",
        "Move a server to another plan whose disk is at least as large: the price difference for the paid time "
        "left is charged from the balance now (quote_resize prices it), then the VM is powered off, given the "
        "plan's memory, vCPUs and disk, and started again with its data; renewals bill the new plan. A short "
        "balance is isError with insufficient_balance and, with x402, the requirements for the deficit: an x402 "
        "MCP client pays them in _meta['x402/payment'] and the server is resized in the same call.",
        ResizeArgs,
        _resize,
        ("resizeServer",),
        destructive=True,
    ),
    Tool(
        "quote_resize",
        "Price a resize",
        "What resize_server to this plan would charge now, and the plan's price per cycle; changes nothing.",
        ResizeArgs,
        lambda ctx, customer, args: resize.quote_resize(ctx, customer, args.server_id, part(args, ResizeInput)),
        ("quoteResize",),
        read_only=True,
    ),
    Tool(
        "terminate_server",
        "Terminate a server",
        "End a server now, for good: its VM, disk and address are deleted within seconds and nothing of it can be "
        "recovered. Confirm with the server's hostname (confirm_hostname); an account with two-factor on also "
        "needs a fresh totp_code from its owner. An active server's unused prepaid time is credited to the "
        "balance (refunded_usd); one still provisioning gets its whole order back. The result is the server, "
        "status terminated.",
        TerminateArgs,
        _terminate,
        ("terminateServer",),
        destructive=True,
        idempotent=True,
    ),
    Tool(
        "open_console",
        "Serial console",
        "A ticket for the server's serial console, valid once for a few seconds: connect a WebSocket to url on this "
        "shop's host (wss:// behind TLS) to read and type on the console.",
        ServerRef,
        lambda ctx, customer, args: console.open_console(ctx, customer, args.server_id),
        ("openServerConsole",),
    ),
    Tool(
        "list_ssh_keys",
        "SSH keys",
        "The account's stored SSH public keys (their ids go in order_server's and reinstall_server's ssh_keys).",
        NoArguments,
        lambda ctx, customer, args: sshkeys.list_keys(ctx, customer),
        ("listSshKeys",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "add_ssh_key",
        "Store an SSH key",
        "Store a public key (Ed25519, ECDSA, or RSA of 2048 bits or more) under a name.",
        SshKeyInput,
        lambda ctx, customer, args: sshkeys.add_key(ctx, customer, args),
        ("createSshKey",),
    ),
    Tool(
        "delete_ssh_key",
        "Delete an SSH key",
        "Delete a stored key; servers made with it keep their copy until reinstalled.",
        SshKeyRef,
        lambda ctx, customer, args: sshkeys.delete_key(ctx, customer, args.ssh_key_id),
        ("deleteSshKey",),
        destructive=True,
    ),
    Tool(
        "list_events",
        "Events",
        "The account's events, oldest first after an event id (after), or newest first before one (before): what "
        "happened to its top-ups, servers, keys and balance.",
        EventQuery,
        _list_events,
        ("listEvents",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "get_event",
        "An event",
        "One of the account's events by its id.",
        EventRef,
        _get_event,
        ("getEvent",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "create_webhook",
        "Register a webhook",
        "Register an https URL to receive the account's events, signed (Standard Webhooks); its signing secret is "
        "in this result only.",
        WebhookInput,
        lambda ctx, customer, args: webhooks.create_webhook(ctx, customer, args),
        ("createWebhook",),
    ),
    Tool(
        "list_webhooks",
        "Webhooks",
        "The account's webhook endpoints.",
        NoArguments,
        lambda ctx, customer, args: webhooks.list_webhooks(ctx, customer),
        ("listWebhooks",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "get_webhook",
        "A webhook",
        "One webhook endpoint.",
        WebhookRef,
        lambda ctx, customer, args: webhooks.get_webhook(ctx, customer, args.webhook_id),
        ("getWebhook",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "update_webhook",
        "Change a webhook",
        "Change a webhook's URL, event types or description; enabled true turns a disabled one on again, false "
        "pauses it.",
        WebhookChangeArgs,
        lambda ctx, customer, args: webhooks.change_webhook(ctx, customer, args.webhook_id, part(args, WebhookChange)),
        ("updateWebhook",),
        idempotent=True,
    ),
    Tool(
        "delete_webhook",
        "Delete a webhook",
        "Stop deliveries to a webhook endpoint at once.",
        WebhookRef,
        lambda ctx, customer, args: webhooks.delete_webhook(ctx, customer, args.webhook_id),
        ("deleteWebhook",),
        destructive=True,
    ),
    Tool(
        "list_webhook_deliveries",
        "A webhook's deliveries",
        "A webhook endpoint's delivery log, newest first, with every attempt.",
        DeliveriesArgs,
        lambda ctx, customer, args: webhooks.list_deliveries(ctx, customer, args.webhook_id, part(args, DeliveryQuery)),
        ("listDeliveries",),
        read_only=True,
        idempotent=True,
    ),
    Tool(
        "redeliver_event",
        "Send an event again",
        "Queue one of the account's events to a webhook endpoint again (the same webhook-id).",
        RedeliverArgs,
        lambda ctx, customer, args: webhooks.redeliver(ctx, customer, args.webhook_id, part(args, RedeliverInput)),
        ("redeliverEvent",),
    ),
)


async def _catalog(ctx: AppContext) -> Result:
    return ctx.current_catalog()
