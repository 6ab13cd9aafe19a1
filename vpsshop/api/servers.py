"""The server endpoints, over the operations of :mod:`vpsshop.servers`: ordering and quotes
(:mod:`~vpsshop.servers.orders`), reading, credentials, renewals, power and changes, reinstalls, console
tickets, termination, and the SSH key store.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from vpsshop import limits
from vpsshop.api import x402
from vpsshop.api.console import CLOSE_BAD_TICKET, CLOSE_UNAVAILABLE
from vpsshop.openapi import InsufficientBalanceBody
from vpsshop.routing import (
    ApiRoute,
    Call,
    Header,
    Reply,
    body_named,
    client_address,
    idempotency_header,
    idempotency_key,
)
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
from vpsshop.servers.console import TICKET_SECONDS, WS_PATH, ConsoleTicketOut
from vpsshop.servers.control import PowerAction, PowerActionOut, ServerChange
from vpsshop.servers.credentials import CredentialsOut
from vpsshop.servers.firewall import FirewallIn, FirewallOut
from vpsshop.servers.orders import OrderInput, OrderOut, QuoteInput, QuoteOut
from vpsshop.servers.reinstall import ReinstallInput, ReinstallOut
from vpsshop.servers.renewals import RenewInput, RenewOut
from vpsshop.servers.resize import ResizeInput, ResizeOut, ResizeQuoteOut
from vpsshop.servers.resource import ServerList, ServerOut
from vpsshop.servers.snapshots import SnapshotIn, SnapshotList, SnapshotOut, SnapshotRestoreOut
from vpsshop.servers.sshkeys import SshKeyDeleted, SshKeyInput, SshKeyList, SshKeyOut
from vpsshop.servers.termination import ServerTerminated, TerminateInput

# The bodies under the names of the OpenAPI description (clients generated from it use them).
OrderBody = body_named("OrderBody", OrderInput)
QuoteBody = body_named("QuoteBody", QuoteInput)
ServerPatch = body_named("ServerPatch", ServerChange)
FirewallBody = body_named("FirewallBody", FirewallIn)
SnapshotBody = body_named("SnapshotBody", SnapshotIn)
RenewBody = body_named("RenewBody", RenewInput)
ReinstallBody = body_named("ReinstallBody", ReinstallInput)
ResizeBody = body_named("ResizeBody", ResizeInput)
TerminateBody = body_named("TerminateBody", TerminateInput)
SshKeyBody = body_named("SshKeyBody", SshKeyInput)

TAG = ("servers",)
SSH_TAG = ("ssh-keys",)
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
REPLAYED = {"Idempotent-Replayed": "true"}


class X402InsufficientBalanceBody(InsufficientBalanceBody):
    """The 402 ``insufficient_balance`` of an order or renewal; with an x402 coin also x402 v1."""

    x402Version: int | None = Field(None, description="1 when the shop takes x402: pay the deficit and re-send.")
    accepts: list[dict[str, Any]] | None = Field(
        None, description="x402 v1 payment requirements for the deficit (one entry per x402 coin)."
    )


X402_HEADERS_DOC = (
    "When the balance is short and the shop takes x402 (USDCBASE), the 402 keeps the seed's body (error "
    "insufficient_balance, message, price, balance, deficit) and adds the x402 payment requirements for the "
    "deficit: `x402Version` and `accepts` in the body (v1) and the `PAYMENT-REQUIRED` header (v2, with the "
    "`bazaar` and `payment-identifier` extensions). Re-send the same request with `X-PAYMENT` (v1) or "
    "`PAYMENT-SIGNATURE` (v2): the payment is settled, credited to the balance as a completed top-up, and the "
    "request is made in the same call; the answer carries `X-PAYMENT-RESPONSE` or `PAYMENT-RESPONSE`. The "
    "authorization must pay at least the deficit and at most the price (else 402 wrong_amount, nothing moves). "
    "A payment is used once: re-sending it returns the first result (header Idempotent-Replayed: true) with the "
    "payment response header of the authorization that paid it; re-sending it with a different body is a 409 "
    "idempotency_key_reused. If the "
    "request fails after the payment settled, the answer is that failure with a `payment` object "
    "{topup, credited_usd, transaction}: the money stays on the balance. 503 settlement_pending: re-send the same "
    "payment; 503 settlement_unavailable: the payment could not be checked now and nothing was sent or kept, "
    "re-send it later. A shop with [x402] settle = on_ready only verifies an order payment and holds "
    "it: the server is made, the payment settled once it is ready (a boot that never completes settles "
    "nothing), and the payment response says `success: true`, an empty `transaction`, `extensions.settlement."
    "status: held`. See docs/x402.md."
)


SIGNUP_DOC = (
    "Pay as sign-up: without an Authorization header (and with an x402 coin) the answer is a 402 `payment_required` "
    "with the x402 requirements for the whole price, instead of a 401. Paying it (the same re-send) settles the "
    "payment for the account the paying wallet owns, creating it (zero balance, the sign-up limit of "
    "POST /account applies) on the wallet's first payment, and places the order there (the account's server quota "
    "applies). The 201 then carries `account`: `user_id`, `address` (the payer), `created`, and, the first time an "
    "order of that new account succeeds, its first `api_key` and `login_token` (shown once, Cache-Control: "
    "no-store). A replay of the same payment returns the same order and no key; so does an order paid by a wallet "
    "whose account already showed its key: that wallet signs in with POST /account/wallet-login for a new one. "
    "A wrong or revoked key is still a 401."
)


# ---- endpoints -----------------------------------------------------------------------------------


def _replayed(replayed: bool) -> dict[str, str]:
    return REPLAYED if replayed else {}


async def order_server(call: Call) -> Reply:
    if call.customer is None:  # no API key: pay as sign-up
        done = await orders.place_signup_order(
            call.ctx,
            call.body,
            idempotency_key=idempotency_key(call.request),
            payment=x402.signed_payment(call.request),
            client=client_address(call.request),
        )
        return Reply(done.order, 201, {**x402.settlement_headers(done.settled), **_replayed(done.replayed)})
    done = await orders.place_order(
        call.ctx,
        call.actor,
        call.body,
        idempotency_key=idempotency_key(call.request),
        payment=x402.signed_payment(call.request),
    )
    return Reply(done.order, 201, {**x402.settlement_headers(done.settled), **_replayed(done.replayed)})


async def order_quote(call: Call) -> QuoteOut:
    return await orders.quote_order(call.ctx, call.actor, call.body)


async def list_servers(call: Call) -> ServerList:
    return await resource.list_servers(call.ctx, call.actor)


async def get_server(call: Call) -> ServerOut:
    return await resource.get_server(call.ctx, call.actor, call.path["id"])


async def patch_server(call: Call) -> ServerOut:
    return await control.change_server(call.ctx, call.actor, call.path["id"], call.body)


async def get_firewall(call: Call) -> FirewallOut:
    return await firewall.get_firewall(call.ctx, call.actor, call.path["id"])


async def put_firewall(call: Call) -> FirewallOut:
    return await firewall.set_firewall(call.ctx, call.actor, call.path["id"], call.body)


async def list_snapshots(call: Call) -> SnapshotList:
    return await snapshots.list_snapshots(call.ctx, call.actor, call.path["id"])


async def create_snapshot(call: Call) -> Reply:
    data = call.body if call.body is not None else SnapshotIn()
    return Reply(await snapshots.create_snapshot(call.ctx, call.actor, call.path["id"], data), 202)


async def restore_snapshot(call: Call) -> Reply:
    done = await snapshots.restore_snapshot(call.ctx, call.actor, call.path["id"], call.path["snapshot_id"])
    return Reply(done, 202)


async def delete_snapshot(call: Call) -> Reply:
    done = await snapshots.delete_snapshot(call.ctx, call.actor, call.path["id"], call.path["snapshot_id"])
    return Reply(done, 202)


async def get_credentials(call: Call) -> CredentialsOut:
    return await credentials.reveal_credentials(call.ctx, call.actor, call.path["id"])


def _renew_input(call: Call) -> RenewInput:
    return call.body if call.body is not None else RenewInput()


async def renew_server(call: Call) -> Reply:
    done = await renewals.renew_server(
        call.ctx,
        call.actor,
        call.path["id"],
        _renew_input(call),
        idempotency_key=idempotency_key(call.request),
        payment=x402.signed_payment(call.request),
    )
    return Reply(done.renewal, 200, {**x402.settlement_headers(done.settled), **_replayed(done.replayed)})


async def renewal_quote(call: Call) -> QuoteOut:
    return await renewals.quote_renewal(call.ctx, call.actor, call.path["id"], _renew_input(call))


def _power_endpoint(action: PowerAction) -> Any:
    async def power(call: Call) -> PowerActionOut:
        return await control.power(call.ctx, call.actor, call.path["id"], action)

    power.__name__ = f"{action}_server"
    return power


async def reinstall_server(call: Call) -> Reply:
    done = await reinstall.reinstall_server(call.ctx, call.actor, call.path["id"], call.body)
    return Reply(done, 202)


async def resize_server(call: Call) -> Reply:
    done = await resize.resize_server(
        call.ctx, call.actor, call.path["id"], call.body, payment=x402.signed_payment(call.request)
    )
    return Reply(done.resize, 202, {**x402.settlement_headers(done.settled), **_replayed(done.replayed)})


async def resize_quote(call: Call) -> ResizeQuoteOut:
    return await resize.quote_resize(call.ctx, call.actor, call.path["id"], call.body)


async def terminate_server(call: Call) -> Reply:
    done = await termination.terminate_server(
        call.ctx,
        call.actor,
        call.path["id"],
        call.body if call.body is not None else TerminateInput(),
        idempotency_key=idempotency_key(call.request),
    )
    return Reply(done.server, 200, _replayed(done.replayed))


async def create_ticket(call: Call) -> Reply:
    return Reply(await console.open_console(call.ctx, call.actor, call.path["id"]), 201)


async def create_ssh_key(call: Call) -> Reply:
    return Reply(await sshkeys.add_key(call.ctx, call.actor, call.body), 201)


async def get_ssh_keys(call: Call) -> SshKeyList:
    return await sshkeys.list_keys(call.ctx, call.actor)


async def remove_ssh_key(call: Call) -> SshKeyDeleted:
    return await sshkeys.delete_key(call.ctx, call.actor, call.path["id"])


_X402_HEADERS = (
    Header(
        "X-PAYMENT",
        "x402 v1 payment payload (base64 JSON) paying the deficit named by the 402; the answer "
        "then carries X-PAYMENT-RESPONSE.",
        schema={"type": "string", "minLength": 1},
    ),
    Header(
        "PAYMENT-SIGNATURE",
        "x402 v2 payment payload (base64 JSON), instead of X-PAYMENT; the answer then carries PAYMENT-RESPONSE.",
        schema={"type": "string", "minLength": 1},
    ),
)

_NOT_YOURS = "No server with this id on this account (another account's server is a 404 too)."


_POWER_ACTIONS: tuple[tuple[PowerAction, str, str], ...] = (
    ("start", "Power a server on", "Starts the VM if it is off."),
    ("stop", "Power a server off", "Shuts the VM down (forced off after a short grace period)."),
    ("reboot", "Reboot a server", "Restarts the VM, or starts it if it is off."),
)


def routes() -> list[ApiRoute]:
    power_routes = [
        ApiRoute(
            "POST",
            f"/servers/{{id}}/{action}",
            _power_endpoint(action),
            summary,
            PowerActionOut,
            status=202,
            description=f"{text} The action runs as a job on the hypervisor within seconds; GET /servers/{{id}} shows "
            "the result in its power field once the job has run. Only an active server takes power actions; a power "
            "action does not change the billing status.",
            errors={404: _NOT_YOURS, 409: "server_not_active: the server is provisioning, suspended or terminated."},
            tags=TAG,
            count_writes=False,
            operation_id=f"{action}Server",
        )
        for action, summary, text in _POWER_ACTIONS
    ]
    return [
        ApiRoute(
            "POST",
            "/servers",
            order_server,
            "Order a server",
            OrderOut,
            status=201,
            body=OrderBody,
            response_headers={"Cache-Control": "no-store"},  # the generated root_password, also on a replay
            description="Charges one billing cycle (price from the catalog rule: monthly = plan base price x location "
            "modifier; annual = 10 x monthly; default cycle monthly) from the balance and creates the server with "
            "status provisioning in one atomic step; concurrent orders never overdraw the balance. The server is "
            "created on the hypervisor by a background job and becomes active with an ip within about a minute. "
            "If provisioning fails after retries the server is terminated with status_reason and the charge is "
            "refunded to the balance.\n\n"
            "Idempotency-Key: scoped to the account. A retry with the same key and the same body returns the first "
            "order's response (201, header Idempotent-Replayed: true) and charges nothing; the same key with a "
            "different body is a 409 idempotency_key_reused. Keys do not expire.\n\n"
            "Paying by x402: " + X402_HEADERS_DOC + " An order paid this way is idempotent even "
            "without Idempotency-Key: its key is then the x402 `payment-identifier` id if the client sent one, "
            "else the authorization itself.\n\n" + SIGNUP_DOC,
            headers=(
                idempotency_header("1 to 200 visible ASCII characters; makes a retried order safe."),
                *_X402_HEADERS,
            ),
            errors={
                400: "invalid_plan, invalid_location, invalid_os, invalid_cycle, invalid_hostname, "
                "invalid_root_password, invalid_ssh_keys, invalid_user_data, invalid_idempotency_key, unknown_field, "
                "invalid_payment, invalid_coin (a payment header sent to a shop without x402)",
                409: "location_unavailable: the location is in the catalog but the shop has no hosts there (nothing "
                "is charged; choose another); os_unavailable: no host of the location holds the operating system's "
                "image (nothing is charged); idempotency_key_reused: this key was used for a different order; "
                "nonce_used: the x402 authorization was used for another request.",
                503: "settlement_pending: the x402 settlement outcome is not known yet; re-send the same payment. "
                "settlement_unavailable: the payment could not be checked now; nothing was sent or kept.",
            },
            limits=limits.SERVER_QUOTA + ", or (no API key) too many accounts created from this client address "
            "([ratelimit] signups_per_client)",
            responses={
                402: (
                    "insufficient_balance: the balance is below the price; nothing was charged (with the "
                    "x402 requirements for the deficit when the shop takes x402); payment_required: no API key, "
                    "pay the whole price by x402 (pay as sign-up); wrong_amount or another x402 refusal of a payment.",
                    X402InsufficientBalanceBody,
                )
            },
            tags=TAG,
            count_writes=False,
            operation_id="orderServer",
            auth_optional=True,
        ),
        ApiRoute(
            "POST",
            "/servers/quote",
            order_quote,
            "Price an order without placing it",
            QuoteOut,
            body=QuoteBody,
            description="What POST /servers with this body would charge now, the balance, and the deficit to top "
            "up first. Send the order's own body: plan, location, os and cycle set the price; hostname, "
            "root_password, ssh_keys and user_data are accepted, checked as the order checks them (a quote refuses "
            "what the order would), and change nothing. Computed by the same pricing code as the order itself; "
            "nothing is written or reserved, so the price is only guaranteed by the order.",
            errors={
                400: "invalid_plan, invalid_location, invalid_os, invalid_cycle, invalid_hostname, "
                "invalid_root_password, invalid_ssh_keys, invalid_user_data, unknown_field",
                409: "location_unavailable: the shop has no hosts in this catalog location; os_unavailable: no host "
                "there holds the operating system's image.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="quoteOrder",
        ),
        ApiRoute(
            "GET",
            "/servers",
            list_servers,
            "List the caller's servers",
            ServerList,
            tags=TAG,
            count_writes=False,
            operation_id="listServers",
        ),
        ApiRoute(
            "GET",
            "/servers/{id}",
            get_server,
            "Show a server",
            ServerOut,
            errors={404: _NOT_YOURS},
            tags=TAG,
            count_writes=False,
            operation_id="getServer",
            description="status: provisioning (paid, being created) -> active (running, ip set) -> suspended "
            "(expired unpaid: VM stopped, disk kept) -> terminated (VM and disk deleted: after the grace period, or at "
            "once by DELETE /servers/{id}). "
            "A suspended server returns to active when renewed. status is the billing state: power says whether "
            "the VM is running or stopped (a stopped server is still active and still renews), and status_reason "
            "says when a reinstall is under way.",
        ),
        ApiRoute(
            "PATCH",
            "/servers/{id}",
            patch_server,
            "Change automatic renewal or reverse DNS",
            ServerOut,
            body=ServerPatch,
            description="auto_renew (default true) renews the server from the balance up to 72 hours before "
            "expires_at. Turned off, the server is suspended at expires_at unless POST /servers/{id}/renew is "
            "called, and terminated after the grace period.\n\n"
            "reverse_dns sets the PTR record of the server's address through the shop's DNS provider (a job, within "
            "seconds); null removes it. It needs an active server. The record follows the server's life: it is "
            "removed when the server is terminated, before the address is reused.",
            errors={
                400: "invalid_auto_renew, invalid_reverse_dns, unknown_field",
                404: _NOT_YOURS,
                409: "server_terminated: the server was deleted; server_not_active (reverse_dns); not_supported: "
                "the shop has no DNS provider (reverse_dns).",
            },
            tags=TAG,
            count_writes=False,
            operation_id="updateServer",
        ),
        ApiRoute(
            "DELETE",
            "/servers/{id}",
            terminate_server,
            "Terminate a server now",
            ServerTerminated,
            body=TerminateBody,
            body_required=False,
            description="Ends the server now, for good: it is terminated at once and a job deletes its VM, its disk "
            "and its first-boot (seed) image on the host within seconds, then frees its address (it may go to "
            "another customer). Nothing of it can be recovered. Works on an active server, one suspended for "
            "non-payment, and one still provisioning (its provisioning is cancelled). Answers the server as GET "
            "/servers/{id} now shows it (status terminated, status_reason saying why) with refunded_usd; emits "
            "server.terminated.\n\n"
            "Money: an active server's unused prepaid time is credited to the balance (ledger reason refund, ref "
            "server:<id>, emitted as ledger.credit): every whole billing period still to come at its price, and the "
            "current one pro rata to the microsecond; never more than was charged for the server, and once. A "
            "server still provisioning gets its whole order back. A server suspended for non-payment has no paid "
            "time left: nothing is credited. The balance is never paid out: top-ups are non-refundable.\n\n"
            "Two-factor: when the account has two-factor sign-in on (totp_enabled in GET /account), the body must "
            "carry totp_code, a fresh code of the authenticator app (or a recovery code), as POST /login does: "
            "without it 401 totp_required, a wrong or used code 401 invalid_totp_code, and nothing is done. The "
            "body is optional otherwise; confirm_hostname, when given, must be the server's hostname.\n\n"
            "A terminated server is a 409 server_terminated. Idempotency-Key: scoped to the account; a retry with "
            "the same key and server answers the first termination again (header Idempotent-Replayed: true) and "
            "does nothing; the same key with another server is a 409 idempotency_key_reused.",
            headers=(idempotency_header("1 to 200 visible ASCII characters; makes a retried termination safe."),),
            errors={
                400: "hostname_mismatch: confirm_hostname is not the server's hostname; invalid_totp_code, "
                "invalid_confirm_hostname, unknown_field",
                401: "totp_required: the account has two-factor on and no totp_code was sent; invalid_totp_code: the "
                "code is wrong or was used already.",
                404: _NOT_YOURS,
                409: "server_terminated: the server is terminated already; server_admin_suspended: the shop "
                "suspended the server (only the shop lifts or ends that); server_busy: the server changed meanwhile, "
                "retry; idempotency_key_reused: this key was used to terminate another server.",
            },
            limits="or too many wrong two-factor codes for this account ([signin] totp_failures_per_account)",
            tags=TAG,
            count_writes=False,
            operation_id="terminateServer",
        ),
        ApiRoute(
            "GET",
            "/servers/{id}/firewall",
            get_firewall,
            "Read a server's inbound firewall",
            FirewallOut,
            description="The inbound rules (protocol, ports, source) PUT /servers/{id}/firewall set; the same list "
            "is the firewall field of the server. Anti-spoofing is always on.",
            errors={404: _NOT_YOURS},
            tags=TAG,
            count_writes=False,
            operation_id="getServerFirewall",
        ),
        ApiRoute(
            "PUT",
            "/servers/{id}/firewall",
            put_firewall,
            "Replace a server's inbound firewall",
            FirewallOut,
            body=FirewallBody,
            description="Replaces the whole rule set: the hypervisor then lets in new connections to the server "
            "only where a rule allows them (protocol tcp, udp or icmp; a port or an inclusive range such as "
            "8000-8100; a source prefix, or anywhere), and drops every other new inbound connection. Answers to "
            "the server's own connections, its outbound traffic, DHCP and IPv6 neighbour discovery always pass. "
            "An empty list lets every inbound connection in (the default). Applied by a job within seconds; "
            "server.firewall_changed follows. At most servers.firewall_max_rules rules (50 by default).\n\n"
            "Whatever the rules, every server's packets leave the host only from its own MAC and IP addresses "
            "(anti-spoofing): that is not the customer's to turn off.",
            errors={
                400: "invalid_rule, too_many_rules, invalid_rules, unknown_field",
                404: _NOT_YOURS,
                409: "server_not_active: the server is not active; not_supported: the shop's hypervisor has no "
                "firewall.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="setServerFirewall",
        ),
        ApiRoute(
            "GET",
            "/servers/{id}/snapshots",
            list_snapshots,
            "List a server's snapshots",
            SnapshotList,
            description="The server's snapshots that are not deleted, oldest first, with the most a server may hold "
            "and the price of one per month (added to each renewal for every snapshot held then).",
            errors={404: _NOT_YOURS},
            tags=TAG,
            count_writes=False,
            operation_id="listServerSnapshots",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/snapshots",
            create_snapshot,
            "Take a snapshot of a server",
            SnapshotOut,
            status=202,
            body=SnapshotBody,
            body_required=False,
            description="A restore point of the server: a job takes it within seconds (status creating, then ready "
            "and a server.snapshot_created event). On this shop's hypervisor a running server's snapshot holds its "
            "disk and its memory (the guest is paused while it is written, then goes on); a stopped server's, its "
            "disk. Nothing is charged now: each renewal adds the catalog's snapshot_monthly_usd (per month of the "
            "cycle) for every snapshot the server holds then. At most servers.snapshots_max per server (3 by "
            "default). A reinstall or a termination removes every snapshot.",
            errors={
                400: "invalid_name, unknown_field",
                404: _NOT_YOURS,
                409: "server_not_active: the server is not active; snapshot_limit_reached: delete one first; "
                "not_supported: the shop's hypervisor backend has no snapshots.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="createServerSnapshot",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/snapshots/{snapshot_id}/restore",
            restore_snapshot,
            "Restore a server to a snapshot",
            SnapshotRestoreOut,
            status=202,
            description="Puts the server back to the snapshot: everything written to its disk since is lost (and a "
            "snapshot taken while it ran brings back its memory: the guest goes on from that moment). A job does "
            "it; until then the server's status_reason says it is restoring; afterwards it runs and "
            "server.snapshot_restored is emitted. The snapshot, and every other one, stays.",
            errors={
                404: "The server is not one of the caller's, or it has no such snapshot.",
                409: "server_not_active; snapshot_not_ready: it is still being taken or deleted; "
                "snapshot_predates_resize: it was taken on another plan; not_supported.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="restoreServerSnapshot",
        ),
        ApiRoute(
            "DELETE",
            "/servers/{id}/snapshots/{snapshot_id}",
            delete_snapshot,
            "Delete a server snapshot",
            SnapshotOut,
            status=202,
            description="A job removes the snapshot (status deleting, then deleted and a server.snapshot_deleted "
            "event). From this request on it no longer counts against the limit and no renewal charges it. The "
            "server's disk as it is now is untouched.",
            errors={
                404: "The server is not one of the caller's, or it has no such snapshot.",
                409: "snapshot_not_ready: it is still being taken, or being deleted.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="deleteServerSnapshot",
        ),
        ApiRoute(
            "GET",
            "/servers/{id}/credentials",
            get_credentials,
            "Reveal the root login",
            CredentialsOut,
            response_headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
            description="The root username and password, decrypted for this response only (stored encrypted). "
            "Sent with Cache-Control: no-store. A terminated server's credentials are gone (410).",
            errors={404: _NOT_YOURS, 410: "server_terminated: the server was deleted."},
            tags=TAG,
            count_writes=False,
            operation_id="getServerCredentials",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/renew",
            renew_server,
            "Renew a server for one or more cycles",
            RenewOut,
            body=RenewBody,
            body_required=False,
            description="Charges `periods` billing cycles (default 1; the body is optional) from the balance now "
            "and moves expires_at as many cycles on. A suspended server (expired unpaid) becomes active again and "
            "its VM is started; its new period starts now. A server the shop suspended (status_reason says why) "
            "is not renewable: 409 server_admin_suspended, checked before any money moves. Servers renew themselves "
            "from the balance up to 72 hours "
            "before expiry (capped at half the cycle), so this is for bringing a suspended server back or paying "
            "ahead. Prepay horizon: expires_at may not end up more than servers.max_prepay_days (default 1100) "
            "days past now; more periods are a 400 invalid_periods carrying max_periods, checked before any "
            "money moves.\n\n"
            "Idempotency-Key: scoped to the account. A retry with the same key, server and periods returns the "
            "first renewal's response (header Idempotent-Replayed: true) and charges nothing; the same key with "
            "another server or number of periods is a 409 idempotency_key_reused. A renewal paid by x402 is "
            "idempotent on its payment in the same way, even without the header.\n\n"
            "Paying by x402: " + X402_HEADERS_DOC,
            responses={
                402: (
                    "insufficient_balance: the balance does not cover the periods (with the x402 "
                    "requirements for the deficit when the shop takes x402); wrong_amount or another x402 "
                    "refusal.",
                    X402InsufficientBalanceBody,
                )
            },
            headers=(
                idempotency_header("1 to 200 visible ASCII characters; makes a retried renewal safe."),
                *_X402_HEADERS,
            ),
            errors={
                400: "invalid_periods (past the prepay horizon; max_periods says how many fit), unknown_field, "
                "invalid_payment (a malformed X-PAYMENT or PAYMENT-SIGNATURE), invalid_coin",
                404: _NOT_YOURS,
                409: "server_not_renewable: the server is provisioning or terminated; server_admin_suspended: the "
                "shop suspended the server (only the shop lifts that); idempotency_key_reused: this key or payment "
                "was used for another renewal; nonce_used: the x402 authorization was used for another request.",
                503: "settlement_pending: the x402 settlement outcome is not known yet; re-send the same payment. "
                "settlement_unavailable: the payment could not be checked now; nothing was sent or kept.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="renewServer",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/renew/quote",
            renewal_quote,
            "Price a renewal without making it",
            QuoteOut,
            body=RenewBody,
            body_required=False,
            description="What POST /servers/{id}/renew with these periods would charge now, where expires_at would "
            "move, the balance and the deficit. Shares the renewal's pricing code; writes nothing.",
            errors={
                400: "invalid_periods (past the prepay horizon)",
                404: _NOT_YOURS,
                409: "server_not_renewable: the server is provisioning or terminated; server_admin_suspended: the "
                "shop suspended the server.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="quoteRenewal",
        ),
        *power_routes,
        ApiRoute(
            "POST",
            "/servers/{id}/reinstall",
            reinstall_server,
            "Reinstall a server",
            ReinstallOut,
            status=202,
            body=ReinstallBody,
            response_headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
            description="Erases the server's disk and installs `os` (any catalog OS) afresh: a job powers the VM "
            "off, recreates its disk from the OS's base image and boots it with new first-boot data (root password, "
            "the chosen SSH keys, user data). Everything on the old disk is lost. Address, hostname, plan, paid "
            "period and price stay; nothing is charged. The new password (generated unless given) is returned "
            "once, with Cache-Control: no-store, and by GET /servers/{id}/credentials afterwards. The server stays "
            "active throughout; poll GET /servers/{id}: its status_reason says it is reinstalling until the job is "
            "done, then is null again (power running, and a server.reinstalled event is emitted; the guest answers "
            "once the new system has booted). If the job fails after its retries, status_reason says so.",
            errors={
                400: "invalid_os, invalid_ssh_keys, invalid_root_password, invalid_user_data, unknown_field",
                404: _NOT_YOURS,
                409: "server_not_active: the server is provisioning, suspended or terminated; "
                "reinstall_in_progress; not_supported: the shop's hypervisor backend cannot reinstall; "
                "os_unavailable: no host of the server's location holds that operating system's image.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="reinstallServer",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/resize",
            resize_server,
            "Resize a server to another plan",
            ResizeOut,
            status=202,
            body=ResizeBody,
            description="Moves the server to `plan` (any catalog plan whose disk is at least as large as the "
            "server's: a disk is never shrunk). The new plan's price less the old one's, for the paid time left "
            "until expires_at (prorated to the second), is charged from the balance now, in the same transaction "
            "that changes the plan and queues the job (POST /servers/{id}/resize/quote prices it first; a plan "
            "that costs less charges nothing and credits nothing). expires_at does not move; renewals bill the "
            "new plan. A job then powers the VM off, gives it the plan's memory and vCPUs, grows its disk and "
            "starts it again; the guest grows its file system at that boot, keeping its data. Poll GET "
            "/servers/{id}: its status_reason says it is resizing until the job is done, then is null again "
            "(a server.resized event is emitted).\n\n"
            "A resize paid by x402 is idempotent on its payment: re-sending it answers the resize it paid for "
            "and charges nothing more.\n\nPaying by x402: " + X402_HEADERS_DOC,
            responses={
                402: (
                    "insufficient_balance: the balance does not cover the charge; nothing changed (with the x402 "
                    "requirements for the deficit when the shop takes x402); wrong_amount or another x402 refusal.",
                    X402InsufficientBalanceBody,
                )
            },
            headers=_X402_HEADERS,
            errors={
                400: "invalid_plan, unknown_field, invalid_payment (a malformed X-PAYMENT or PAYMENT-SIGNATURE), "
                "invalid_coin",
                404: _NOT_YOURS,
                409: "server_not_active: the server is provisioning, suspended or terminated; same_plan; "
                "disk_would_shrink: the plan's disk is smaller than the server's (disk_gib says the server's); "
                "resize_in_progress, reinstall_in_progress; not_supported: the shop's hypervisor backend cannot "
                "resize; nonce_used: the x402 authorization was used for another request.",
                503: "settlement_pending: the x402 settlement outcome is not known yet; re-send the same payment. "
                "settlement_unavailable: the payment could not be checked now; nothing was sent or kept.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="resizeServer",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/resize/quote",
            resize_quote,
            "Price a resize without making it",
            ResizeQuoteOut,
            body=ResizeBody,
            description="What POST /servers/{id}/resize to this plan would charge now (the same pricing code), "
            "the new price per cycle, the paid time left, the balance and the deficit. Writes nothing.",
            errors={
                400: "invalid_plan, unknown_field",
                404: _NOT_YOURS,
                409: "server_not_active, same_plan, disk_would_shrink, not_supported",
            },
            tags=TAG,
            count_writes=False,
            operation_id="quoteResize",
        ),
        ApiRoute(
            "POST",
            "/servers/{id}/console",
            create_ticket,
            "Open the serial console",
            ConsoleTicketOut,
            status=201,
            response_headers={"Cache-Control": "no-store", "Pragma": "no-cache"},
            description=f"Issues a ticket for the server's serial console, valid once and for {TICKET_SECONDS} "
            f"seconds. Connect a WebSocket to `url` (GET /v1{WS_PATH}?ticket=...; no Authorization header is "
            "needed, the ticket is bound to this account and server). The socket carries the console both ways: "
            "binary frames from the guest (boot messages, the login prompt), binary or text frames to it "
            f"(keystrokes). A bad, used or expired ticket: the socket closes with code {CLOSE_BAD_TICKET}; a "
            f"console that cannot be opened (the server was powered off meanwhile, or the hypervisor cannot): code "
            f"{CLOSE_UNAVAILABLE}, with the reason in plain words.",
            errors={
                404: _NOT_YOURS,
                409: "server_not_active: the server is not active; server_stopped: the server is powered off "
                "(its power is stopped): start it first; not_supported: the shop's hypervisor backend has no serial "
                "console.",
            },
            tags=TAG,
            count_writes=False,
            operation_id="openServerConsole",
        ),
        ApiRoute(
            "POST",
            "/ssh-keys",
            create_ssh_key,
            "Store an SSH public key",
            SshKeyOut,
            status=201,
            body=SshKeyBody,
            description="Stores a public key under a name, to be chosen by id when ordering (ssh_keys on POST "
            f"/servers) or reinstalling. Accepted: Ed25519, ECDSA (P-256, P-384, P-521) and RSA of at least 2048 "
            "bits; anything else is a 400 invalid_public_key saying why. At most "
            f"{sshkeys.MAX_KEYS_PER_ACCOUNT} keys per account.",
            errors={
                400: "invalid_name, invalid_public_key, unknown_field",
                409: "ssh_key_exists: the account stores this key already (same fingerprint); too_many_ssh_keys.",
            },
            tags=SSH_TAG,
            count_writes=False,
            operation_id="createSshKey",
        ),
        ApiRoute(
            "GET",
            "/ssh-keys",
            get_ssh_keys,
            "List the caller's SSH keys",
            SshKeyList,
            tags=SSH_TAG,
            count_writes=False,
            operation_id="listSshKeys",
        ),
        ApiRoute(
            "DELETE",
            "/ssh-keys/{id}",
            remove_ssh_key,
            "Delete a stored SSH key",
            SshKeyDeleted,
            description="Removes the key from the store. Servers ordered with it keep it in root's authorized_keys "
            "(each server holds a copy) until they are reinstalled without it.",
            errors={404: "No SSH key with this id on this account."},
            tags=SSH_TAG,
            count_writes=False,
            operation_id="deleteSshKey",
        ),
    ]
