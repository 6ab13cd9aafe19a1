"""SOL deposits through Solana JSON-RPC, to a deposit address per top-up, swept to the reseller.

**Why the shop holds deposit keys.** Solana keys are ed25519, which has no public derivation: an
address cannot be derived from an extended *public* key as BTC, ETH and TRON addresses are. A
Solana Pay reference key (one merchant address, a random reference per invoice) would avoid holding
keys, but only wallets that build Solana Pay transfers attach the reference: a customer paying from an
exchange withdrawal could not be matched. The API promises a deposit address per top-up, so this plugin
derives one per top-up from a dedicated *deposit mnemonic*: top-up number *n* pays
``m/44'/501'/<n>'/0'`` (SLIP-0010 ed25519, the path Phantom and Solflare use for account *n*), so the
reseller can recover every deposit key from the mnemonic with any Solana wallet.

The mnemonic is stored only encrypted: ``seed_encrypted`` is a Fernet token made with the shop's
``encryption_key`` (``python -m vpsshop_solana encrypt-mnemonic``). It is decrypted in memory when the
coin is built (core hands the coin the shop's secrets) and never logged. :meth:`Solana.sweep` moves what deposit
addresses hold to ``sweep_to``; it is idempotent (it sends each address's *current* balance less the fee,
so running it twice, or while a sweep is in flight, never moves more than is there).

**Detection** scans blocks, not addresses: ``getBlocks`` lists the confirmed blocks after the cursor and
``getBlock(slot, {transactionDetails: "accounts"})`` gives each transaction's account keys with their
balances before and after; an account of the watch set whose balance grew in a successful transaction
received a deposit (this finds system transfers and transfers made by programs alike). Identity:
``<signature>:<account>``. ``getSignatureStatuses`` rechecks payments: one whose transaction is no longer
known is dropped; ``confirmations`` counts confirmed blocks on top, 32 meaning finalized (rooted).

Settings ``[coins.SOL]``::

    seed_encrypted = "gAAAAA..."   # Fernet(encryption_key) token of the deposit mnemonic
    network = "solana"             # solana (mainnet-beta), solana-devnet, solana-testnet
    rpc_url = "http://127.0.0.1:8899/"
    confirmations = 32             # 1..32; 32 = finalized
    sweep_to = "<base58 address>"  # where Solana.sweep sends deposits
    # ws_url = "ws://127.0.0.1:8900/"  # PubSub endpoint; default: rpc_url's, as Solana's CLI derives it
                                     # (http -> ws, https -> wss, an explicit port + 1); "" = polled only

**Push.** The watcher follows the node's WebSocket PubSub ``slotSubscribe``: every ``slotNotification``
(a slot processed) runs a scan at once, which reads the blocks that reached ``confirmed`` since the
cursor, so a payment is credited within about a second of its block instead of at the next poll
(``[topups] watch_interval_seconds``). ``slotSubscribe`` because it is stable and served by every
validator and RPC provider, and says exactly "something new, look": ``blockSubscribe`` would carry the
block itself but is marked unstable and needs ``--rpc-pubsub-enable-block-subscription`` (most
providers refuse it); ``logsSubscribe``/``accountSubscribe`` take one address each (``mentions``
holds a single key), so a shop with thousands of open and standing addresses would need as many
subscriptions, renewed as addresses come and go. A wake only says "look now": the scan reads from
its cursor as always, so a missed notification costs latency, never a payment; when the socket is
down the coin is polled and the socket reopened with back-off.

The sandbox, when no ``seed_encrypted`` is set, uses the public test mnemonic "abandon ... about" on
devnet (its account 0 is HAgk14JpMQLgt6rVgv7cBQFJWFto5Dqxi472uT3DKpqk) and no node.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from bip_utils import Bip32Slip10Ed25519, Bip39SeedGenerator, MnemonicChecksumError, SolAddrDecoder, SolAddrEncoder
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import AliasChoices, Field, SecretStr, field_validator

from vpsshop import (
    ConfigError,
    DepositAddress,
    DepositCoin,
    DetectedPayment,
    PaymentCheck,
    PluginError,
    Readiness,
    ScanResult,
    ShopSecrets,
    WatchSet,
    hookimpl,
)
from vpsshop.chains import BlockScanConfig, JsonRpcClient, NodeCoin, RpcError, b58decode, websocket_wakes

SANDBOX_MNEMONIC = "abandon " * 11 + "about"
"""The BIP-39 test mnemonic: public, so its keys are only for the sandbox (devnet)."""
FINALIZED = 32
LAMPORTS_PER_SIGNATURE = 5000
SYSTEM_PROGRAM = bytes(32)


# ---- keys ---------------------------------------------------------------------------------------------


def mnemonic_to_seed(mnemonic: str, passphrase: str = "") -> bytes:
    """BIP-39 seed of a mnemonic (bip-utils), its words and checksum checked first.

    :raises ConfigError: not a BIP-39 mnemonic (a mistyped word would otherwise derive a wallet the
        reseller does not hold).
    """
    words = " ".join(mnemonic.split())
    try:
        seed: bytes = Bip39SeedGenerator(words).Generate(passphrase)
    except (ValueError, MnemonicChecksumError) as exc:
        raise ConfigError(f"the SOL deposit mnemonic is not a valid BIP-39 mnemonic: {exc}") from None
    return seed


@dataclass(frozen=True)
class DepositKey:
    """The key of one deposit address (kept in memory only)."""

    private: Ed25519PrivateKey
    public: bytes

    @property
    def address(self) -> str:
        address: str = SolAddrEncoder.EncodeKey(self.public)
        return address

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


def deposit_key(seed: bytes, index: int) -> DepositKey:
    """The key of deposit address ``index``: SLIP-0010 ed25519 at ``m/44'/501'/<index>'/0'`` (bip-utils)."""
    node = Bip32Slip10Ed25519.FromSeed(seed).DerivePath(f"m/44'/501'/{index}'/0'")
    private = Ed25519PrivateKey.from_private_bytes(node.PrivateKey().Raw().ToBytes())
    return DepositKey(private, private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def parse_pubkey(text: str) -> bytes:
    try:
        raw: bytes = SolAddrDecoder.DecodeAddr(text.strip())
    except ValueError as exc:  # not base58, or not 32 bytes
        raise ValueError(f"not a Solana address: {exc}") from None
    return raw


def encrypt_mnemonic(encryption_key: str, mnemonic: str) -> str:
    """The ``seed_encrypted`` setting for ``mnemonic`` under the shop's ``encryption_key``."""
    return ShopSecrets(encryption_key).encrypt(" ".join(mnemonic.split()))


# ---- transactions (legacy wire format) --------------------------------------------------------------


def compact_u16(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def transfer_transaction(key: DepositKey, to: bytes, lamports: int, recent_blockhash: bytes) -> bytes:
    """A signed legacy transaction: one System Program transfer from ``key`` (fee payer) to ``to``."""
    header = bytes([1, 0, 1])  # 1 signer; 0 read-only signed; 1 read-only unsigned (the program)
    keys = compact_u16(3) + key.public + to + SYSTEM_PROGRAM
    data = struct.pack("<IQ", 2, lamports)  # SystemInstruction::Transfer
    instruction = bytes([2]) + compact_u16(2) + bytes([0, 1]) + compact_u16(len(data)) + data
    message = header + keys + recent_blockhash + compact_u16(1) + instruction
    return compact_u16(1) + key.sign(message) + message


# ---- settings and RPC ---------------------------------------------------------------------------------


class SolanaConfig(BlockScanConfig):
    seed_encrypted: SecretStr | None = Field(
        None,
        description="Fernet(encryption_key) token of the deposit mnemonic (python -m vpsshop_solana "
        "encrypt-mnemonic). Required outside the sandbox.",
    )
    network: str = Field("solana", pattern=r"^[a-z0-9][a-z0-9-]{0,39}$")
    confirmations: int = Field(FINALIZED, ge=1, le=FINALIZED, description="Confirmed blocks on top; 32 = finalized.")
    sweep_to: str | None = Field(None, description="Address Solana.sweep moves deposits to.")
    start_block: int | None = Field(None, ge=0, validation_alias=AliasChoices("start_slot"))
    reorg_depth: int = Field(
        150, ge=1, le=10_000, description="Slots rescanned when the cursor's block left the chain."
    )
    max_blocks_per_scan: int = Field(100, ge=1, le=5000, validation_alias=AliasChoices("max_slots_per_scan"))
    timeout_seconds: float = Field(20, gt=0, le=300)
    ws_url: str | None = Field(
        None,
        pattern=r"^(wss?://.*)?$",
        description="The node's WebSocket PubSub endpoint: the watcher follows slotSubscribe. Default: derived "
        'from rpc_url as Solana\'s CLI does (http -> ws, https -> wss, an explicit port + 1); "" = polled only.',
    )

    @field_validator("sweep_to")
    @classmethod
    def _sweep_to(cls, value: str | None) -> str | None:
        if value is not None:
            parse_pubkey(value)
        return value


def pubsub_url(rpc_url: str) -> str:
    """The PubSub endpoint of a JSON-RPC URL, derived as Solana's CLI does (``compute_websocket_url``):
    ``http`` -> ``ws``, ``https`` -> ``wss``, and an explicit port + 1 (a validator serves PubSub on the
    port after its RPC port: 8899 -> 8900); a URL without a port keeps the scheme's default (providers
    serve both on 443)."""
    parts = urlsplit(rpc_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    netloc = parts.netloc
    if parts.port is not None:
        host = netloc.rsplit(":", 1)[0]
        netloc = f"{host}:{parts.port + 1}"
    return urlunsplit((scheme, netloc, parts.path, parts.query, parts.fragment))


SKIPPED_SLOT_CODES = {-32007, -32009}
"""Slot skipped / missing in long-term storage: no block at that slot."""
BLOCK_NOT_AVAILABLE = -32004
"""Block not available for slot (not produced yet, or not yet served by this backend)."""


@dataclass(frozen=True)
class SweepResult:
    index: int
    address: str
    lamports: int
    signature: str | None
    """None when the address held too little to pay the fee (nothing sent)."""


class Solana(NodeCoin[SolanaConfig, JsonRpcClient]):
    code = "SOL"
    name = "Solana"
    rate_symbol = "SOL"
    decimals = 9
    default_priority = 30
    node_name = "Solana node"
    Config: ClassVar[type[SolanaConfig]] = SolanaConfig
    uses_secrets = True

    def __init__(self, config: SolanaConfig, *, sandbox: bool = False, secrets: ShopSecrets | None = None) -> None:
        super().__init__(config, sandbox=sandbox)
        self.cfg = config
        if config.seed_encrypted is None and not sandbox:
            raise ConfigError("missing setting 'coins.SOL.seed_encrypted' (python -m vpsshop_solana encrypt-mnemonic)")
        self._seed: bytes | None = mnemonic_to_seed(SANDBOX_MNEMONIC) if config.seed_encrypted is None else None
        self._secrets = secrets
        if secrets is not None:
            self.unlock(secrets)

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"network": "solana-devnet", "confirmations": 1}

    def unlock(self, secrets: ShopSecrets | str) -> None:
        """Decrypt the deposit mnemonic with the shop's secrets (core hands them to the constructor;
        a caller building the coin by hand may pass the ``encryption_key`` itself)."""
        if self.cfg.seed_encrypted is None:  # the sandbox key; close() wiped it if the app was restarted
            self._seed = mnemonic_to_seed(SANDBOX_MNEMONIC)
            return
        if isinstance(secrets, str):
            secrets = ShopSecrets(secrets)
        self._secrets = secrets
        mnemonic = secrets.decrypt(self.cfg.seed_encrypted.get_secret_value(), setting="coins.SOL.seed_encrypted")
        self._seed = mnemonic_to_seed(mnemonic)

    def _key(self, index: int) -> DepositKey:
        if self._seed is None and (self._secrets is not None or self.cfg.seed_encrypted is None):
            # close() dropped the seed; an app started again on the same coin unlocks it again
            self.unlock(self._secrets or "")
        if self._seed is None:
            raise PluginError("SOL deposit keys are locked: the coin was built without the shop's secrets")
        return deposit_key(self._seed, index)

    @property
    def network(self) -> str:
        return self.cfg.network

    def key_id(self) -> str:
        return f"sol:{self._key(0).address[:16]}"

    def derive_address(self, index: int) -> DepositAddress:
        address = self._key(index).address
        return DepositAddress(address, index, address)

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """Solana Pay transfer request: ``solana:<address>?amount=<SOL>``."""
        amount = format(Decimal(amount_atomic).scaleb(-self.decimals), "f").rstrip("0").rstrip(".")
        return f"solana:{address}?amount={amount}"

    # ---- watching -----------------------------------------------------------------------------------

    @property
    def ws_url(self) -> str | None:
        """The PubSub endpoint followed (``ws_url``, else derived from ``rpc_url``); None: polled."""
        if self.cfg.ws_url is not None:
            return self.cfg.ws_url or None
        return pubsub_url(self.cfg.rpc_url) if self.cfg.rpc_url else None

    def wake_channel(self) -> AsyncIterator[str] | None:
        """``slotSubscribe`` over the PubSub endpoint: a scan at every slot (see the module's *Push*)."""
        if self._client is None or self.ws_url is None:
            return None
        return websocket_wakes(self.ws_url, {"method": "slotSubscribe", "params": []})

    async def _block_hash(self, slot: int) -> str | None:
        try:
            block = await self.node.call(
                "getBlock",
                slot,
                {"encoding": "json", "transactionDetails": "none", "rewards": False, "commitment": "confirmed"},
            )
        except RpcError as exc:
            if exc.code in SKIPPED_SLOT_CODES or exc.code == BLOCK_NOT_AVAILABLE:
                return None
            raise
        return str(block["blockhash"]) if block else None

    async def scan(self, cursor: str | None, watched: WatchSet, members: Sequence[DepositCoin[Any]] = ()) -> ScanResult:
        """Cursor ``<scanned up to slot>:<last block slot>:<its blockhash>``."""
        node = self.node
        cfg = self.cfg
        tip = int(await node.call("getSlot", {"commitment": "confirmed"}))
        if cursor is None:
            start = cfg.start_block if cfg.start_block is not None else tip
            return ScanResult(f"{start - 1}:-1:", [])
        done_text, block_slot_text, block_hash = cursor.split(":", 2)
        done, block_slot = int(done_text), int(block_slot_text)
        if block_slot >= 0 and await self._block_hash(block_slot) != block_hash:
            back = max(block_slot - cfg.reorg_depth, -1)
            return ScanResult(f"{back}:-1:", [])
        end = min(tip, done + cfg.max_blocks_per_scan)
        if end <= done:
            return ScanResult(cursor, [])
        slots = await node.call("getBlocks", done + 1, end, {"commitment": "confirmed"})
        found: list[tuple[str, DetectedPayment]] = []
        for slot in slots or ():
            try:
                block = await node.call(
                    "getBlock",
                    slot,
                    {
                        "encoding": "json",
                        "transactionDetails": "accounts",
                        "rewards": False,
                        "maxSupportedTransactionVersion": 0,
                        "commitment": "confirmed",
                    },
                )
            except RpcError as exc:
                if exc.code == BLOCK_NOT_AVAILABLE:
                    # Listed by getBlocks, so it exists: this backend cannot serve it yet. Stop before it.
                    return ScanResult(f"{slot - 1}:{block_slot}:{block_hash}", found)
                if exc.code in SKIPPED_SLOT_CODES:
                    continue
                raise
            if block_hash and block.get("previousBlockhash") != block_hash and block_slot >= 0:
                return ScanResult(f"{slot - 1}:{block_slot}:{block_hash}", found)  # forked while reading
            found.extend((self.code, p) for p in match_block(block, slot, watched))
            block_slot, block_hash = slot, block["blockhash"]
        return ScanResult(f"{end}:{block_slot}:{block_hash}", found)

    async def recheck(self, payments: list[DetectedPayment]) -> list[PaymentCheck]:
        node = self.node
        checks = []
        for start in range(0, len(payments), 256):  # getSignatureStatuses takes at most 256
            part = payments[start : start + 256]
            answer = await node.call("getSignatureStatuses", [p.txid for p in part], {"searchTransactionHistory": True})
            node_slot = int((answer.get("context") or {}).get("slot", 0))
            for payment, status in zip(part, answer["value"], strict=True):
                if status is None and await self._still_in_its_block(payment, node_slot):
                    # The block is there but this node does not know the signature yet (a lagging
                    # backend): kept, no confirmations counted.
                    checks.append(PaymentCheck(payment.identity, True, 0, payment.block_height, payment.block_hash))
                    continue
                if status is None or status.get("err") is not None:
                    checks.append(PaymentCheck(payment.identity, False))
                    continue
                if status.get("confirmationStatus") == "finalized" or status.get("confirmations") is None:
                    confirmations = FINALIZED
                else:
                    confirmations = min(int(status["confirmations"]) + 1, FINALIZED - 1)
                slot = int(status["slot"])
                same = slot == payment.block_height
                checks.append(
                    PaymentCheck(payment.identity, True, confirmations, slot, payment.block_hash if same else None)
                )
        return checks

    async def _still_in_its_block(self, payment: DetectedPayment, node_slot: int) -> bool:
        """Whether the block a payment was found in is still on the chain (or not reached by this node)."""
        if payment.block_height is None:
            return False
        if node_slot and payment.block_height > node_slot:
            return True
        return await self._block_hash(payment.block_height) == payment.block_hash

    # ---- collecting -----------------------------------------------------------------------------------

    async def sweep(self, indexes: Iterable[int]) -> list[SweepResult]:
        """Move the balance of deposit addresses ``indexes`` to ``sweep_to``, less the fee.

        Idempotent: each transfer sends the address's balance at that moment less the fee and leaves it
        empty; run again, an empty address is skipped, and two sweeps racing cannot both succeed (the
        second finds no funds). Returns one result per index.
        """
        node = self.node
        if self.cfg.sweep_to is None:
            raise PluginError("set coins.SOL.sweep_to before sweeping")
        to = parse_pubkey(self.cfg.sweep_to)
        results = []
        for index in indexes:
            key = self._key(index)
            if key.public == to:
                continue
            answer = await node.call("getBalance", key.address, {"commitment": "confirmed"})
            lamports = int(answer["value"])
            if lamports <= LAMPORTS_PER_SIGNATURE:
                results.append(SweepResult(index, key.address, 0, None))
                continue
            latest = await node.call("getLatestBlockhash", {"commitment": "confirmed"})
            raw = transfer_transaction(
                key, to, lamports - LAMPORTS_PER_SIGNATURE, b58decode(latest["value"]["blockhash"])
            )
            signature = await node.call(
                "sendTransaction",
                base64.b64encode(raw).decode(),
                {"encoding": "base64", "preflightCommitment": "confirmed"},
            )
            results.append(SweepResult(index, key.address, lamports - LAMPORTS_PER_SIGNATURE, str(signature)))
        return results

    async def check_ready(self) -> Readiness:
        if self._seed is None and self._secrets is None and self.cfg.seed_encrypted is not None:
            return Readiness(False, "deposit keys are locked (the coin was built without the shop's secrets)")
        return await super().check_ready()

    async def node_ready(self) -> str:
        health = await self.node.call("getHealth")
        slot = await self.node.call("getSlot", {"commitment": "confirmed"})
        if health != "ok":
            raise PluginError(f"{self.network} at slot {slot} ({health})")
        return f"{self.network} at slot {slot} ({health})"

    async def close(self) -> None:
        self._seed = None
        await super().close()


def match_block(block: dict[str, Any], slot: int, watched: WatchSet) -> list[DetectedPayment]:
    """Balance increases of watched accounts in a block's successful transactions."""
    found = []
    for tx in block.get("transactions") or ():
        meta = tx.get("meta")
        if not meta or meta.get("err") is not None:
            continue
        body = tx.get("transaction") or {}
        keys = body.get("accountKeys") or (body.get("message") or {}).get("accountKeys") or ()
        pre, post = meta.get("preBalances") or (), meta.get("postBalances") or ()
        signature = body["signatures"][0]
        for i, key in enumerate(keys):
            pubkey = key["pubkey"] if isinstance(key, dict) else key
            if pubkey in watched and i < len(pre) and i < len(post) and post[i] > pre[i]:
                found.append(
                    DetectedPayment(
                        f"{signature}:{pubkey}",
                        pubkey,
                        int(post[i]) - int(pre[i]),
                        signature,
                        1,
                        slot,
                        block["blockhash"],
                    )
                )
    return found


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[DepositCoin[Any]]]:
    return [Solana]
