"""Base class of payment coins.

A coin plugin subclasses :class:`PaymentCoin` and returns the class from
``vpsshop_register_coins``. Core instantiates it with the settings table ``[coins.<CODE>]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from pydantic import BaseModel

from vpsshop.component import Component

ConfigT = TypeVar("ConfigT", bound=BaseModel)

SettlementMethod = Literal["deposit", "x402"]


class PaymentCoin(Component[ConfigT]):
    """A way for a customer to fund a balance.

    Class attributes every subclass must set:

    ``code``
        The coin code of the API (``"BTC"``, ``"USDTTRC"``). Unique across loaded plugins.
    ``name``
        Human name shown in the catalog (``"Bitcoin"``, ``"Tether USD (TRC-20)"``).
    ``decimals``
        Digits of the coin's base unit (8 for BTC satoshis, 12 for XMR piconero, 6 for USDT).
    ``rate_symbol``
        The symbol whose USD price values this coin (``"BTC"``; ``"USDT"`` for both USDT coins).

    ``settlement`` says how money arrives: ``"deposit"`` (a deposit address per top-up, watched
    on chain) or ``"x402"`` (a signed authorization settled during the request).
    """

    code: ClassVar[str]
    name: ClassVar[str]
    decimals: int  # not a ClassVar: a token sets its own from its settings (vpsshop_evm, vpsshop_tron)
    rate_symbol: ClassVar[str]
    settlement: ClassVar[SettlementMethod] = "deposit"

    default_priority: ClassVar[int | None] = None
    """When ``[topups] default_coin`` is not set, a top-up that names no coin uses the enabled
    coin with the highest ``default_priority`` (ties: the first registered). None: picked only
    when no enabled coin has a priority."""

    enabled_in_sandbox: ClassVar[bool] = True
    """Whether a sandbox enables the coin without a ``[coins.CODE]`` section (with its
    ``sandbox_config``). False for a coin with no public test peer to fall back on (USDCSOL): it is
    enabled only where configured, in the sandbox as in production."""

    @property
    def network(self) -> str:
        """The chain and network deposits go to, shown as ``deposit_network`` (``"bitcoin"``,
        ``"bitcoin-testnet"``, ``"base-sepolia"``). Must be overridden."""
        raise NotImplementedError(f"{type(self).__name__} must define network")

    def payment_option(self) -> dict[str, str]:
        """The catalog's entry for this coin. Override only to add fields."""
        return {"coin": self.code, "name": self.name, "network": self.network, "method": self.settlement}


# ---- x402: settled during the request ---------------------------------------------------------


@dataclass(frozen=True)
class X402Payment:
    """A decoded ``X-PAYMENT`` (or v2 ``PAYMENT-SIGNATURE``) header, before anything is settled.

    ``payer`` and ``nonce`` are the payment's identity on chain (EIP-3009 authorizations are
    single-use per (payer, nonce)); core keys the credit on them. ``valid_before`` (unix seconds,
    0 when unknown) is when the authorization stops being usable: until then an open record whose
    :meth:`X402Coin.settlement_status` is None may still be settled, after it None is final.
    """

    payer: str
    nonce: str
    value_atomic: int
    version: int
    raw: dict[str, Any]
    valid_before: int = 0


@dataclass(frozen=True)
class X402Settlement:
    """A settled authorization: what ``X-PAYMENT-RESPONSE`` reports."""

    payer: str
    nonce: str
    transaction: str
    network: str
    amount_atomic: int


class X402Rejected(Exception):
    """The payment is not acceptable, or cannot be checked now, and nothing moved on chain.

    ``code`` is the error code of the response body (``invalid_payment``, ``wrong_amount``,
    ``authorization_expired``, ``nonce_used``, ``settlement_reverted`` ...), ``status`` 402 (pay
    again) or 400 (the header itself is malformed). A 5xx ``status`` (503 ``settlement_unavailable``:
    the facilitator or the node could not be asked, nothing was sent) makes core keep no record of
    the authorization, so the same payment may be re-sent.
    """

    def __init__(self, code: str, message: str, status: int = 402) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class X402Coin(PaymentCoin[Any]):  # not generic: a coin declares its own `config: MyConfig`
    """A coin paid by an x402 authorization (USDCBASE): no deposit address, no watching.

    Core's top-up endpoint answers 402 with :meth:`payment_requirements`; on the re-sent request it
    calls :meth:`decode_payment`, records (payer, nonce) *before* settling, then :meth:`settle`.
    If settling ends with an unknown outcome (:class:`vpsshop.PluginError`, an RPC time-out) the
    record stays open and core later asks :meth:`settlement_status`, so one authorization can
    never be credited twice nor lost.
    """

    settlement: ClassVar[SettlementMethod] = "x402"

    def payment_requirements(self, amount_atomic: int, resource: str, description: str) -> dict[str, Any]:
        """One entry of the 402 body's ``accepts`` (x402 v1 field names). Must be overridden."""
        raise NotImplementedError

    def decode_payment(self, header_value: str, version: int = 1) -> X402Payment:
        """Parse the header without touching the network. Raise :class:`X402Rejected` (400) when
        it is not base64 JSON of the expected shape. Must be overridden."""
        raise NotImplementedError

    async def settle(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        """Verify ``payment`` against ``requirements`` (signature, recipient, exact value,
        validity window, network, asset, unused nonce) and settle it on chain.

        :raises X402Rejected: invalid, nothing moved; with a 5xx status: not checked, nothing sent.
        :raises vpsshop.PluginError: the outcome is unknown (time-out after something may have been
            sent); core retries through
            :meth:`settlement_status`. Must be overridden.
        """
        raise NotImplementedError

    async def verify(self, payment: X402Payment, requirements: dict[str, Any]) -> None:
        """Check ``payment`` against ``requirements`` as :meth:`settle` does (signature, recipient,
        exact value, validity window, network, asset, unused nonce, the payer's funds) without
        settling it: nothing moves, and a payment that passes may still fail to settle later (the
        payer can move the funds or use the nonce meanwhile).

        :raises X402Rejected: invalid; with a 5xx status: not checked. Default: the coin cannot
            verify apart from settling (:class:`NotImplementedError`).
        """
        raise NotImplementedError

    def payment_requirements_v2(self, requirements: dict[str, Any]) -> dict[str, Any]:
        """The x402 v2 form of one v1 ``accepts`` entry, for the ``PAYMENT-REQUIRED`` header that
        core adds to the 402 (the body stays v1). Default: the coin does not speak v2."""
        raise NotImplementedError(f"{type(self).__name__} does not offer x402 v2")

    def settlement_response(self, settlement: X402Settlement, version: int = 1) -> dict[str, Any]:
        """What core base64-encodes into ``X-PAYMENT-RESPONSE`` (v1) or ``PAYMENT-RESPONSE`` (v2).

        Default: the v1 settle result. A coin whose v2 network name differs overrides it.
        """
        return {
            "success": True,
            "transaction": settlement.transaction,
            "network": settlement.network,
            "payer": settlement.payer,
        }

    async def settlement_status(self, payment: X402Payment) -> X402Settlement | None:
        """After an unknown outcome: the settlement if the authorization was used on chain to pay
        this shop, else None. Must be overridden."""
        raise NotImplementedError


# ---- deposit coins: an address per top-up, watched on chain ----------------------------------


STANDING_INDEX_BASE = 2**30
"""Standing deposit address ``n`` derives at index ``STANDING_INDEX_BASE + n`` (1073741825, ...);
top-up addresses count up from 1 and never get there."""


@dataclass(frozen=True)
class DepositAddress:
    """Where one top-up is paid, derived watch-only by :meth:`DepositCoin.derive_address`.

    ``address`` is shown to the customer. ``watch_key`` is what a chain scan matches payments
    on; it is unique per coin and usually the address itself, normalised (lower-case hex for
    EVM, the subaddress index for Monero). ``index`` is the derivation index core allocated.
    """

    address: str
    index: int
    watch_key: str


@dataclass(frozen=True)
class DetectedPayment:
    """One payment a scan found to a watched key.

    ``identity`` is the chain's own identity of the payment, unique per coin: ``"txid:vout"``
    for an output, ``"txhash:logindex"`` for a token ``Transfer`` event, the transaction hash
    for a native account transfer, ``"txid:major:minor"`` for a Monero transfer to a
    subaddress. Core credits each identity at most once, whatever scans report it again.

    ``confirmations`` is 0 for a transaction still in the mempool. ``block_hash`` is the block
    it was found in (None in the mempool): :meth:`DepositCoin.recheck` uses it to notice reorgs.
    """

    identity: str
    watch_key: str
    amount_atomic: int
    txid: str
    confirmations: int
    block_height: int | None = None
    block_hash: str | None = None


@dataclass(frozen=True)
class PaymentCheck:
    """The answer of :meth:`DepositCoin.recheck` about one earlier :class:`DetectedPayment`.

    ``present`` False means the transaction is no longer on the best chain nor in the mempool
    (dropped, double-spent, reorganised away): core stops counting it and credits nothing.
    """

    identity: str
    present: bool
    confirmations: int = 0
    block_height: int | None = None
    block_hash: str | None = None


@dataclass(frozen=True)
class ScanResult:
    """What one :meth:`DepositCoin.scan` call found and how far it got.

    ``cursor`` is opaque to core (a block height and hash, a log block number, a wallet
    height); core stores it and hands it back on the next scan. ``payments`` may repeat
    payments seen before (core deduplicates on ``identity``) and may hold payments of every
    coin sharing the scan (``coin`` names which).
    """

    cursor: str | None
    payments: list[tuple[str, DetectedPayment]] = field(default_factory=list)
    """(coin code, payment) pairs."""
    tip_height: int | None = None
    """The node's tip when the scan read it, if the chain has block heights (for the watcher-lag metric)."""
    scanned_height: int | None = None
    """The last block this scan covered, if the chain has block heights (for the watcher-lag metric)."""


class WatchSet(Protocol):
    """The watched keys of one scan group, as core hands them to :meth:`DepositCoin.scan`.

    Membership tests are O(1) whatever the number of top-ups: a scan tests each output (log,
    transfer) of a block against it, so the cost of a block does not grow with the number of
    pending top-ups. Keys stay watched after a top-up expires or is cancelled, so late
    payments are still found.
    """

    def __contains__(self, key: object) -> bool: ...

    def __len__(self) -> int: ...


class DepositCoin(PaymentCoin[ConfigT]):
    """A coin paid to a deposit address per top-up, found by scanning the chain.

    Core calls, in this order over a top-up's life:

    1. :meth:`derive_address` with a fresh index when a top-up is created (no network);
    2. :meth:`register_address` once, so a node that must be told about watched addresses
       (a Monero wallet's subaddress table, a wallet's ``importmulti``) knows it;
    3. :meth:`payment_uri` to make the QR code;
    4. :meth:`scan` from the watcher (and, rate-limited, when a customer polls), with the
       cursor it returned last time and the :class:`WatchSet` of the scan group;
    5. :meth:`recheck` for every payment seen but not yet credited, until it reaches
       :attr:`confirmations` (credited) or disappears (never credited).

    **Scan groups.** Coins that share one chain scan (ETH and USDT on one EVM node, TRX and
    USDTTRC) return the same :attr:`scan_group`; core then calls :meth:`scan` on *one* coin
    of the group with the union of their watch keys, a single cursor and the group's coins as
    ``members``, and the scan reports payments tagged with the coin they belong to. A coin alone
    returns its own code. At start-up core refuses a group two of whose coins have the same
    :meth:`key_id` (they would hand out the same addresses).

    Settings every deposit coin reads from its config (``[coins.<CODE>]``): ``confirmations``
    (int) when present; see :attr:`confirmations`.
    """

    settlement: ClassVar[SettlementMethod] = "deposit"

    scan_members: tuple[DepositCoin[Any], ...] = ()
    """The live coins of this coin's scan group (this one included), in registration order: set
    by core when it builds the shop, empty before (a coin built by hand is alone). What
    :meth:`scan` receives as ``members``."""

    watch_mode: str | None = None
    """How core's watcher in this process follows the coin's chain: ``push`` (its node's wake
    channel is up), ``poll`` (every ``watch_interval_seconds``), None (not watched here)."""

    @property
    def scan_group(self) -> str:
        """Coins with the same value share one scan and one cursor. Default: :attr:`code`."""
        return self.code

    @property
    def confirmations(self) -> int:
        """Confirmations a payment needs before it is credited. Default: ``config.confirmations``
        or 1."""
        return int(getattr(self.config, "confirmations", 1))

    @property
    def can_scan(self) -> bool:
        """False when no node is configured (a sandbox that only hands out addresses): core then
        never calls :meth:`scan` and health says the coin is not watched. Default: True."""
        return True

    def key_id(self) -> str:
        """Identifies the public key addresses derive from, so core keeps one index counter per
        key: a reseller who changes the xpub starts again at index 1, and never reuses an index
        of the same key. Must be overridden; return a short, stable, non-secret string (a
        fingerprint)."""
        raise NotImplementedError

    def derive_address(self, index: int) -> DepositAddress:
        """The deposit address number ``index`` (1, 2, 3 ...), derived watch-only.

        Called when a top-up is created; must not touch the network and must return the same
        address for the same index every time. Must be overridden.
        """
        raise NotImplementedError

    standing_addresses: ClassVar[bool] = True
    """Whether an account may ask for a standing deposit address in this coin
    (:meth:`derive_standing_address`). Set False in a coin that cannot derive them."""

    def derive_standing_address(self, number: int) -> DepositAddress:
        """Standing deposit address number ``number`` (1, 2, 3 ...): one per account, never expiring.

        Derived from the same watch-only key as top-up addresses but from a range of its own, so
        the two never meet: the default is :meth:`derive_address` at index
        :data:`STANDING_INDEX_BASE` + ``number`` (on an xpub coin ``<account>/<branch>/1073741824+n``,
        documented in docs/payments.md so a reseller's wallet can be told to look there). A coin
        whose indices cannot reach that high overrides it (or sets :attr:`standing_addresses` False).
        """
        if number < 1:
            raise ValueError("standing addresses are numbered from 1")
        return self.derive_address(STANDING_INDEX_BASE + number)

    async def register_address(self, address: DepositAddress) -> None:
        """Tell the node about a new watched address, if it needs to know. Called once per
        top-up right after the row is committed; may be called again (must be idempotent).
        Raise :class:`vpsshop.PluginError` when the node cannot be reached; the top-up still
        exists and the watcher retries. Default: nothing."""

    def wake_channel(self) -> AsyncIterator[str] | None:
        """The node's push channel: an async iterator that yields once when it is connected, then
        whenever the node has something new (a block; a payment in the mempool), and raises
        :class:`vpsshop.PluginError` (or ends) when the connection is lost.

        Core's watcher runs a pass of the scan group at every wake, and while no channel is up it
        polls every ``[topups] watch_interval_seconds``, calling this again with back-off. Called
        on the first coin of a scan group only. Build it from the chain kit's wake channels
        (:func:`vpsshop.chains.long_poll_wakes`, ``datagram_wakes``, ``websocket_wakes``,
        ``merge_wakes``). Default: None, the coin is polled."""
        return None

    @property
    def wake_sees_everything(self) -> bool:
        """True when the wake channel tells of everything :meth:`scan` reports (mempool payments
        included): the periodic pass then leaves the coin alone while the channel is up. False:
        the channel only speeds up blocks and the coin is polled as well. Default: True."""
        return True

    @property
    def pending_poll_seconds(self) -> float | None:
        """How often core looks at the chain while a top-up of this scan group waits for its
        payment, whatever the wake channel says: for a node whose channel cannot tell of every
        pool payment (monerod publishes a transaction only once Dandelion++ has fluffed it, up to
        a minute after it reached the node). Only while such a top-up is open, so an idle shop
        still makes no requests but the channel's. Default: None (the channel and the periodic
        pass only).

        .. versionadded:: 1.1"""
        return None

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """The URI a wallet app scans from the QR code (BIP-21 ``bitcoin:<addr>?amount=..``,
        ``monero:<addr>?tx_amount=..``, EIP-681 ...). Default: the bare address."""
        return address

    async def scan(self, cursor: str | None, watched: WatchSet, members: Sequence[DepositCoin[Any]] = ()) -> ScanResult:
        """Find payments to ``watched`` keys since ``cursor`` (None: start at the chain's tip,
        nothing older is looked at).

        ``members`` are the live coins of this coin's scan group, this one included, in the
        order they were registered (core passes :attr:`scan_members`; empty when called by hand:
        use :attr:`scan_members`, or this coin alone); a scan matches payments of each.

        Read the chain's tip *first* and scan no further than it: core refreshed ``watched``
        just before this call, and a payment to an address handed out after that can only be in a
        later block, which the next call covers with the address watched. ``scan`` must also be
        repeatable from an older cursor (reporting payments again is harmless).

        Scan each block once, test each output against ``watched``, and include unconfirmed
        (mempool) payments with ``confirmations=0`` where the chain exposes them. Handle a
        reorganisation of blocks after ``cursor`` by stepping back to the fork. Bound the work of
        one call (core calls again at once while the cursor moves). Raise
        :class:`vpsshop.PluginError` when the node fails. Must be overridden.
        """
        raise NotImplementedError

    async def recheck(self, payments: list[DetectedPayment]) -> list[PaymentCheck]:
        """The current state of payments found earlier and not yet credited (one
        :class:`PaymentCheck` per payment, any order). A payment whose block left the best chain
        and whose transaction is nowhere else is ``present=False``. Must be overridden."""
        raise NotImplementedError

    def format_amount(self, amount_atomic: int) -> str:
        """Atomic units as a decimal string in the coin's units (``"0.00041667"``)."""
        return format_atomic(amount_atomic, self.decimals)


def link_scan_groups(coins: Iterable[PaymentCoin[Any]]) -> dict[str, list[DepositCoin[Any]]]:
    """Group the deposit coins that can scan by :attr:`DepositCoin.scan_group` and give each its
    :attr:`DepositCoin.scan_members`. Called by core once the coins are built."""
    groups: dict[str, list[DepositCoin[Any]]] = {}
    for coin in coins:
        if isinstance(coin, DepositCoin) and coin.can_scan:
            groups.setdefault(coin.scan_group, []).append(coin)
    for members in groups.values():
        for coin in members:
            coin.scan_members = tuple(members)
    return groups


def format_atomic(amount_atomic: int, decimals: int) -> str:
    sign = "-" if amount_atomic < 0 else ""
    whole, frac = divmod(abs(amount_atomic), 10**decimals)
    if decimals == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:0{decimals}d}"
