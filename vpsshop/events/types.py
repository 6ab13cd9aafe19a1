"""Every event type: its name, the resource its ``data`` holds, and when it happens.

Names are ``<resource>.<what happened>`` (Standard Webhooks' full-stop hierarchy). A webhook
endpoint subscribes to names or to ``<resource>.*`` / ``*`` patterns. ``data`` is the resource as the
API shows it (the same model: the API's response and the event's payload are one), plus
``data.object`` naming it; ``docs/events.md`` shows examples.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EventType:
    name: str
    object: str
    """The resource in ``data`` (``data.object``): account, api_key, wallet, ledger_entry, topup, deposit_address,
    server, snapshot, ssh_key, webhook."""
    description: str


_TYPES = [
    EventType("account.created", "account", "An account was created (POST /account)."),
    EventType(
        "account.updated",
        "account",
        "The account's settings changed: two-factor sign-in was turned on or off (data.totp_enabled).",
    ),
    EventType("api_key.created", "api_key", "An API key was minted (POST /keys, or a dashboard sign-in)."),
    EventType("api_key.revoked", "api_key", "An API key was revoked (DELETE /keys/{id})."),
    EventType(
        "wallet.linked",
        "wallet",
        "A wallet now owns the account: it paid the order that created the account, or it was linked by signing "
        "(POST /account/wallets).",
    ),
    EventType("wallet.unlinked", "wallet", "A wallet was removed from the account (DELETE /account/wallets/{id})."),
    EventType("ledger.credit", "ledger_entry", "The balance went up: a top-up payment, a refund, a support credit."),
    EventType("ledger.debit", "ledger_entry", "The balance went down: an order or a renewal."),
    EventType("topup.created", "topup", "A top-up was started; data carries its deposit address and amount."),
    EventType(
        "topup.payment_seen",
        "topup",
        "A payment to the top-up's address was seen on chain or in the "
        "mempool; data.payment has it. It is credited once it has its confirmations.",
    ),
    EventType(
        "topup.payment_confirmed",
        "topup",
        "A payment reached its confirmations and was credited; "
        "data.payment.credited_usd says how much (a ledger.credit event carries the entry).",
    ),
    EventType(
        "topup.payment_dropped",
        "topup",
        "A payment seen earlier left the chain before its confirmations "
        "(a reorganisation or a replaced transaction). If it comes back it is seen again.",
    ),
    EventType(
        "topup.late_payment",
        "topup",
        "A payment arrived after the top-up expired or was cancelled (or in "
        "another coin of the same chain): it was credited at the rate of the moment it was credited.",
    ),
    EventType(
        "topup.underpaid",
        "topup",
        "The payments credited to the top-up are less than the amount asked "
        "for: what arrived was credited; data.amount_received and data.credited_usd say how much.",
    ),
    EventType(
        "topup.overpaid",
        "topup",
        "The payments credited to the top-up are more than the amount asked for: all of it was credited.",
    ),
    EventType("topup.completed", "topup", "The top-up's first payment was credited: status completed."),
    EventType(
        "topup.expired",
        "topup",
        "The top-up's rate lock ended with nothing paid: status expired. A payment "
        "that still arrives is credited (topup.late_payment).",
    ),
    EventType(
        "topup.cancelled",
        "topup",
        "The top-up was cancelled by the customer, or its x402 authorization was refused: status cancelled.",
    ),
    EventType(
        "deposit_address.payment_seen",
        "deposit_address",
        "A payment to one of the account's standing deposit addresses was seen on chain or in the mempool; "
        "data.payment has it (amount, confirmations). Once confirmed it is credited as a top-up of its own "
        "(topup.created, topup.payment_confirmed, topup.completed) or held (deposit_address.payment_held).",
    ),
    EventType(
        "deposit_address.payment_held",
        "deposit_address",
        "A confirmed payment to a standing deposit address is worth less than data.minimum_usd together with "
        "what is already held there: it is held, not lost (data.held_amount is the total held), and credited "
        "with the receipt that brings the held ones to the minimum.",
    ),
    EventType(
        "deposit_address.payment_dropped",
        "deposit_address",
        "A payment to a standing deposit address seen earlier left the chain before its confirmations (a "
        "reorganisation or a replaced transaction). If it comes back it is seen again.",
    ),
    EventType("server.provisioning", "server", "A server was ordered and paid: status provisioning."),
    EventType(
        "server.active",
        "server",
        "The server has booted and its SSH daemon answers (the guest reported it): status active, data.ready_at "
        "and data.host_keys set.",
    ),
    EventType(
        "server.boot_failed",
        "server",
        "The server's first boot (after an order or a reinstall) finished with errors in its configuration "
        "(cloud-init's): the server runs (status active) but data.ready_at is null and data.status_reason names "
        "the errors. Sent instead of server.active or server.reinstalled.",
    ),
    EventType(
        "server.payment_failed",
        "server",
        'The x402 payment of the server\'s order, held until the server was ready ([x402] settle = "on_ready"), '
        "could not be settled then (the payer moved the funds, the authorization expired or its nonce was used): "
        "the server is terminated (data.status_reason says why), what it was charged is refunded and the held "
        "payment's credit taken back (ledger reversal).",
    ),
    EventType(
        "server.suspended",
        "server",
        "The paid period ended unrenewed, or the server passed its traffic allowance under the suspend policy "
        "(data.status_reason says which): the VM is stopped, its disk kept.",
    ),
    EventType(
        "server.traffic_exceeded",
        "server",
        "The server's traffic this period (data.traffic) passed its plan's allowance; data.traffic.policy_applied "
        "says what the shop did: throttle (its rate capped until the next renewal), suspend or none.",
    ),
    EventType(
        "server.traffic_restored",
        "server",
        "A renewal started a new traffic period and the throttle of the last one was lifted on the hypervisor.",
    ),
    EventType("server.unsuspended", "server", "A suspended server was renewed: status active again, the VM starts."),
    EventType("server.renewed", "server", "One more billing cycle was charged; data.expires_at is the new end."),
    EventType(
        "server.renewal_failed",
        "server",
        "An automatic renewal found the balance too low (once per "
        "period); the server is suspended at expires_at unless the balance is topped up.",
    ),
    EventType(
        "server.terminated",
        "server",
        "The server was deleted: at its customer's request (DELETE /servers/{id}; unused prepaid time credited "
        "as a ledger.credit), by the shop, after the grace period, or because provisioning failed (then the order "
        "was refunded); data.status_reason says which.",
    ),
    EventType(
        "server.updated",
        "server",
        "The customer changed the server (PATCH /servers/{id}): automatic renewal or reverse DNS; data has the "
        "new values.",
    ),
    EventType(
        "server.firewall_changed",
        "server",
        "The server's inbound firewall (PUT /servers/{id}/firewall) is now in force on the hypervisor; data.firewall "
        "holds its rules.",
    ),
    EventType(
        "server.snapshot_created",
        "snapshot",
        "The hypervisor took a snapshot of the server (POST /servers/{id}/snapshots): data is the snapshot, now ready.",
    ),
    EventType(
        "server.snapshot_restored",
        "snapshot",
        "The server was put back to a snapshot (POST /servers/{id}/snapshots/{snapshot_id}/restore) and runs "
        "again: data is the snapshot.",
    ),
    EventType(
        "server.snapshot_deleted",
        "snapshot",
        "A snapshot of the server is gone (DELETE /servers/{id}/snapshots/{snapshot_id}): data is the snapshot.",
    ),
    EventType(
        "server.started",
        "server",
        "A start (POST /servers/{id}/start) has run on the hypervisor: the VM is powered on (data.power running).",
    ),
    EventType(
        "server.stopped",
        "server",
        "A stop (POST /servers/{id}/stop) has run on the hypervisor: the VM is powered off (data.power stopped). "
        "The server stays active and is still billed.",
    ),
    EventType(
        "server.rebooted",
        "server",
        "A reboot (POST /servers/{id}/reboot) has run on the hypervisor: the VM restarted (data.power running).",
    ),
    EventType(
        "server.power_failed",
        "server",
        "A start, stop or reboot could not be done on the hypervisor after its retries; data.power is as before.",
    ),
    EventType(
        "server.reinstalling",
        "server",
        "A reinstall was requested (POST /servers/{id}/reinstall): the disk is being recreated; "
        "data.status_reason says so until server.reinstalled.",
    ),
    EventType(
        "server.reinstalled",
        "server",
        "A reinstall (POST /servers/{id}/reinstall) is done: the new system has booted and its SSH daemon "
        "answers; data.status_reason is null again, data.ready_at and data.host_keys are the new system's.",
    ),
    EventType(
        "server.resizing",
        "server",
        "A resize was requested and charged (POST /servers/{id}/resize): data.plan is the new plan; "
        "data.status_reason says so until server.resized.",
    ),
    EventType(
        "server.resized",
        "server",
        "A resize is done: the server runs again with its new plan's memory, vCPUs and disk (its file system "
        "grown at that boot); data.status_reason is null again.",
    ),
    EventType(
        "server.migrating",
        "server",
        "The shop is moving the server to another host of its location (maintenance): it is powered off while "
        "its disk is copied; data.status_reason says so until server.migrated. Its address stays.",
    ),
    EventType(
        "server.migrated",
        "server",
        "The move to another host is done: the server runs there again (if it ran before) with the same disk, "
        "address and host keys; data.status_reason is null again.",
    ),
    EventType("ssh_key.created", "ssh_key", "An SSH public key was stored (POST /ssh-keys)."),
    EventType(
        "ssh_key.deleted",
        "ssh_key",
        "A stored SSH key was deleted (DELETE /ssh-keys/{id}); servers made with it keep their copy.",
    ),
    EventType("webhook.created", "webhook", "A webhook endpoint was registered (POST /webhooks)."),
    EventType(
        "webhook.updated",
        "webhook",
        "A webhook endpoint was changed, paused or re-enabled (PATCH /webhooks/{id}).",
    ),
    EventType(
        "webhook.deleted",
        "webhook",
        "A webhook endpoint was deleted (DELETE /webhooks/{id}); nothing more is sent to it, this event included.",
    ),
    EventType(
        "webhook.disabled",
        "webhook",
        "A webhook endpoint was disabled: it failed for days, or answered "
        "410 Gone. Re-enable it with PATCH /webhooks/{id}.",
    ),
]

EVENT_TYPES: dict[str, EventType] = {t.name: t for t in _TYPES}
OBJECTS = tuple(dict.fromkeys(t.object for t in _TYPES))


def matches(patterns: list[str], event_type: str) -> bool:
    """Whether an endpoint subscribed to ``patterns`` receives ``event_type``."""
    for pattern in patterns:
        if pattern == "*" or pattern == event_type:
            return True
        if pattern.endswith(".*") and event_type.startswith(pattern[:-1]):
            return True
    return False


def valid_pattern(pattern: str) -> bool:
    if pattern == "*" or pattern in EVENT_TYPES:
        return True
    return pattern.endswith(".*") and pattern[:-2] in OBJECTS_BY_PREFIX


OBJECTS_BY_PREFIX = frozenset(name.split(".", 1)[0] for name in EVENT_TYPES)
