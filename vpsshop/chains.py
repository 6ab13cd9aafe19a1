"""The chain kit: what a coin plugin that reads its own node builds on (public API).

A deposit coin that watches a chain needs the same scaffolding whatever the chain: a client of
the node that never puts the node's URL (which may carry an API key) into a message, settings
for the node and the extended public key, the "addresses only" mode when no node is configured,
the start-up check that the node answers, and, for a chain of blocks, a cursor that notices
reorganisations. This module holds that scaffolding once, so a plugin is its own chain code:
how to read a block and which of its transfers pay a watched key.

The pieces (``docs/chain-kit.md`` walks through a whole coin):

* :class:`JsonRpcClient`: JSON-RPC 1.0/2.0 over HTTP, with batches; :class:`HttpJsonClient` for
  a node whose API is plain JSON over HTTP (java-tron). Failures raise :class:`NodeError`, error
  answers :class:`RpcError`; both are :class:`vpsshop.PluginError`.
* :data:`Xpub` and :class:`XpubConfig`: a validated account extended public key setting;
  :class:`XpubCoin`: deposit addresses ``<xpub>/<branch>/<n>``.
* :class:`NodeConfig`: the node's URL, confirmations, time-out (:class:`BlockScanConfig` adds
  the scan's start, reorganisation depth and step); :class:`NodeCoin`: a deposit coin backed by
  that node (the node guard, ``preflight``, ``check_ready``, ``close``).
* :class:`BlockCoin`: a :class:`NodeCoin` on a chain of numbered, hashed blocks. Its
  :meth:`~BlockCoin.scan` keeps a :class:`BlockCursor` (``<height>:<hash>``), steps back
  ``reorg_depth`` blocks when the cursor's block left the chain, and its
  :meth:`~BlockCoin.recheck` compares each payment's block with the block now at its height.

Key helpers (:class:`ExtendedPublicKey`, base58 and bech32 encodings, Keccak-256) are re-exported
here so a plugin needs no internal module; their cryptography is bip-utils' (EIP-55 is eth-utils').
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Generic, TypeVar, cast
from urllib.parse import urlsplit

import httpx
from bip_utils import EthAddrEncoder, Kekkak256
from eth_utils import to_checksum_address as _eip55
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from vpsshop.coins import DepositCoin, DetectedPayment, PaymentCheck, ScanResult, WatchSet
from vpsshop.component import Readiness, require_reachable
from vpsshop.errors import ConfigError, PluginError, StartupError
from vpsshop.hdkeys import (
    ExtendedPublicKey,
    b58check_decode,
    b58check_encode,
    b58decode,
    b58encode,
    p2wpkh_address,
)
from vpsshop.hdkeys import KeyError_ as KeyFormatError
from vpsshop.push import (
    ChannelDown,
    WakeChannel,
    datagram_wakes,
    long_poll_wakes,
    merge_wakes,
    websocket_wakes,
    zmq_sub_wakes,
)

__all__ = [
    "BlockCoin",
    "BlockCursor",
    "BlockScanConfig",
    "ChannelDown",
    "ExtendedPublicKey",
    "HttpJsonClient",
    "JsonRpcClient",
    "KeyFormatError",
    "NodeCoin",
    "NodeConfig",
    "NodeError",
    "RpcError",
    "WakeChannel",
    "Xpub",
    "XpubCoin",
    "XpubConfig",
    "b58check_decode",
    "b58check_encode",
    "b58decode",
    "b58encode",
    "check_distinct_keys",
    "datagram_wakes",
    "endpoint_id",
    "endpoint_label",
    "keccak256",
    "keccak_address",
    "long_poll_wakes",
    "merge_wakes",
    "p2wpkh_address",
    "to_checksum_address",
    "websocket_wakes",
    "zmq_sub_wakes",
]


# ---- node endpoints ------------------------------------------------------------------------------


def endpoint_label(url: str) -> str:
    """``scheme://host:port`` of a node URL, for messages and logs (never its path, query or
    credentials: a provider URL may carry an API key there)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def endpoint_id(url: str) -> str:
    """A short, stable, non-secret identifier of a node URL (12 hex digits), for scan group names,
    which core stores and logs."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]


def keccak256(data: bytes) -> bytes:
    """Keccak-256 (the pre-standard SHA-3 Ethereum and TRON use)."""
    digest: bytes = Kekkak256.QuickDigest(data)
    return digest


def to_checksum_address(address_hex: str) -> str:
    """The EIP-55 mixed-case spelling of a 20-byte hex address (with or without ``0x``), as EVM
    chains show addresses. :raises ValueError: not 20 bytes of hex."""
    lower = address_hex.lower().removeprefix("0x")
    if len(lower) != 40 or any(c not in "0123456789abcdef" for c in lower):
        raise ValueError(f"not a 20-byte hex address: {address_hex!r}")
    return str(_eip55("0x" + lower))


def keccak_address(uncompressed: bytes) -> bytes:
    """The 20-byte account of a 65-byte uncompressed secp256k1 public key: the last 20 bytes of
    the Keccak-256 of its 64 coordinate bytes (Ethereum and every EVM chain; TRON prefixes 0x41).

    :raises ValueError: not an uncompressed public key.
    """
    if len(uncompressed) != 65 or uncompressed[0] != 4:
        raise ValueError("expected a 65-byte uncompressed public key")
    address: str = EthAddrEncoder.EncodeKey(uncompressed, skip_chksum_enc=True)
    return bytes.fromhex(address.removeprefix("0x"))


# ---- one error family -----------------------------------------------------------------------------


class NodeError(PluginError):
    """The node did not answer usefully: no connection, a time-out, an HTTP error, not JSON.

    The message names the endpoint by :func:`endpoint_label` only.
    """


class RpcError(PluginError):
    """The node answered a call with an error object: it is reachable, the call failed.

    ``code`` is the error's code (JSON-RPC ``error.code``; None when the API has none),
    ``method`` the call.
    """

    def __init__(self, method: str, error: Any) -> None:
        if isinstance(error, dict):
            message, code = error.get("message"), error.get("code")
            super().__init__(f"{method}: {message} (code {code})")
        else:
            code = None
            super().__init__(f"{method}: {error}")
        self.method = method
        self.code = code


# ---- clients -------------------------------------------------------------------------------------------


class HttpJsonClient:
    """JSON over HTTP POST to one node: :meth:`post_json` sends a body, returns the decoded answer.

    ``name`` says what the node is in messages (``"EVM node"``); ``auth`` and ``headers`` are
    handed to httpx (basic or digest auth, an API-key header). Numbers with a fraction come back
    as :class:`~decimal.Decimal` when ``decimal_floats`` is set (amounts of bitcoind).
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "node",
        timeout: float = 15.0,
        auth: httpx.Auth | tuple[str, str] | None = None,
        headers: dict[str, str] | None = None,
        decimal_floats: bool = False,
    ) -> None:
        self.url = url
        self.name = name
        self.where = endpoint_label(url)
        """Scheme, host and port only: what messages show of the URL."""
        self.client = httpx.AsyncClient(timeout=timeout, auth=auth, headers=headers or {})
        self._parse_float = Decimal if decimal_floats else None

    async def post_json(self, body: Any, *, path: str = "", what: str = "") -> Any:
        """POST ``body`` to the URL (plus ``path``) and decode the JSON answer.

        :raises NodeError: no answer, or an answer that is not JSON (its HTTP status is named).
        """
        what = what or path or "a request"
        try:
            response = await self.client.post(f"{self.url.rstrip('/')}{path}" if path else self.url, json=body)
        except httpx.HTTPError as exc:
            raise NodeError(f"{self.name} at {self.where} did not answer {what}: {type(exc).__name__}") from None
        if not response.content.strip() and response.status_code == 200:
            return None
        try:
            return json.loads(response.content, parse_float=self._parse_float)
        except ValueError:
            raise NodeError(
                f"{self.name} at {self.where} answered {what} with HTTP {response.status_code}, not JSON"
            ) from None

    async def close(self) -> None:
        await self.client.aclose()


class JsonRpcClient(HttpJsonClient):
    """A JSON-RPC client: :meth:`call` one method, :meth:`batch` many in one request.

    ``version`` is ``"2.0"`` (Ethereum, Solana, monero-wallet-rpc) or ``"1.0"`` (bitcoind);
    ``named`` sends parameters as an object, even when there are none (monero-wallet-rpc).
    """

    def __init__(self, url: str, *, version: str = "2.0", named: bool = False, **options: Any) -> None:
        super().__init__(url, **options)
        self.version = version
        self.named = named
        self._id = 0

    async def call(self, method: str, *params: Any, **named: Any) -> Any:
        """The result of ``method`` with positional ``params`` or, for a server that takes
        named parameters (monero-wallet-rpc), ``named``.

        :raises RpcError: the node answered with an error. :raises NodeError: no usable answer.
        """
        self._id += 1
        payload = {
            "jsonrpc": self.version,
            "id": self._id,
            "method": method,
            "params": named if named or self.named else list(params),
        }
        body = await self.post_json(payload, what=method)
        if not isinstance(body, dict):
            raise NodeError(f"{self.name} at {self.where} answered {method} with a malformed body")
        if body.get("error"):
            raise RpcError(method, body["error"])
        return body.get("result")

    async def batch(self, calls: Sequence[tuple[str, Sequence[Any]]], chunk: int = 100) -> list[Any]:
        """Results of ``calls`` (method, params) in order, ``chunk`` calls per HTTP request.

        :raises RpcError: any call failed or is missing from the answer.
        """
        results: list[Any] = []
        for start in range(0, len(calls), chunk):
            part = calls[start : start + chunk]
            first = self._id + 1
            self._id += len(part)
            payload = [
                {"jsonrpc": self.version, "id": first + i, "method": method, "params": list(params)}
                for i, (method, params) in enumerate(part)
            ]
            body = await self.post_json(payload, what=part[0][0])
            if not isinstance(body, list):
                raise NodeError(f"{self.name} at {self.where} answered a batch of {part[0][0]} with {str(body)[:200]}")
            by_id = {item.get("id"): item for item in body if isinstance(item, dict)}
            for i, (method, _) in enumerate(part):
                item = by_id.get(first + i)
                if item is None or item.get("error"):
                    raise RpcError(method, (item or {}).get("error") or {"message": "missing from the batch answer"})
                results.append(item.get("result"))
        return results


# ---- settings ----------------------------------------------------------------------------------------------


def _check_xpub(value: str) -> str:
    try:
        ExtendedPublicKey.parse(value)
    except KeyFormatError as exc:
        raise ValueError(str(exc)) from None
    return value.strip()


Xpub = Annotated[str, AfterValidator(_check_xpub)]
"""A setting holding an account extended public key (xpub/tpub/zpub/vpub...); a private key or a
malformed key is refused with the reason."""


class XpubConfig(BaseModel):
    """Settings of a coin whose deposit addresses derive from an account extended public key."""

    model_config = ConfigDict(extra="forbid", populate_by_name=False)

    xpub: Xpub = Field(description="Account extended public key. Never a private key.")
    branch: int = Field(0, ge=0, lt=2**31, description="Derivation branch under the account key: <xpub>/<branch>/<n>.")


class NodeConfig(BaseModel):
    """Settings of a coin watched through its own node.

    A plugin whose settings use other names (``api_url``, ``start_height``) redeclares the field
    with ``validation_alias``; the kit reads the field names below.
    """

    model_config = ConfigDict(extra="forbid")

    rpc_url: str | None = Field(None, description="The node's endpoint; none: addresses only, nothing watched.")
    confirmations: int = Field(1, ge=0, le=1000, description="Confirmations a payment needs before it is credited.")
    timeout_seconds: float = Field(15, gt=0, le=300, description="Time limit of one request to the node.")


class BlockScanConfig(NodeConfig):
    """:class:`NodeConfig` plus where and how far a block scan goes (:class:`BlockCoin`)."""

    start_block: int | None = Field(None, ge=0, description="First block scanned on the first run (default: the tip).")
    reorg_depth: int = Field(
        64, ge=1, le=10_000, description="Blocks rescanned when the cursor's block left the chain."
    )
    max_blocks_per_scan: int = Field(20, ge=1, le=5000, description="Blocks read per scan call.")


ConfigT = TypeVar("ConfigT", bound=BaseModel)
XpubConfigT = TypeVar("XpubConfigT", bound=XpubConfig)
"""The settings of an :class:`XpubCoin`: they include :class:`XpubConfig`'s."""
BlockScanConfigT = TypeVar("BlockScanConfigT", bound=BlockScanConfig)
"""The settings of a :class:`BlockCoin`: they include :class:`BlockScanConfig`'s."""
ClientT = TypeVar("ClientT", bound=HttpJsonClient)


# ---- coins --------------------------------------------------------------------------------------------------


class NodeCoin(DepositCoin[ConfigT], Generic[ConfigT, ClientT]):
    """A deposit coin watched through one node, whose settings include :class:`NodeConfig`'s.

    Set :attr:`node_name` (``"EVM node"``) and, when the node's URL setting is not ``rpc_url``,
    :attr:`node_setting`; override :meth:`connect` when the client is not a plain
    :class:`JsonRpcClient`, and :meth:`node_ready` to say what a healthy node looks like. With no
    URL configured the coin hands out addresses and is not watched (:attr:`can_scan` False).
    """

    node_name: ClassVar[str] = "node"
    node_what: ClassVar[str] = "node"
    """What start-up messages call the node after the coin code (``"BTC node"``)."""
    node_setting: ClassVar[str] = "rpc_url"
    """The settings key of the node's URL, as the reseller writes it (for messages)."""

    def __init__(self, config: ConfigT, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        url = getattr(config, "rpc_url", None)
        self._client: ClientT | None = self.connect(url) if url else None

    def connect(self, url: str) -> ClientT:
        """The client of the node at ``url``. Default: a JSON-RPC 2.0 client."""
        timeout = float(getattr(self.config, "timeout_seconds", 15))
        # The default of a coin whose ClientT is JsonRpcClient; a coin with another client overrides connect.
        return cast(ClientT, JsonRpcClient(url, name=self.node_name, timeout=timeout))

    @property
    def node(self) -> ClientT:
        """The node's client. :raises PluginError: no node is configured (addresses only)."""
        if self._client is None:
            raise PluginError(f"{self.code}: no {self.node_setting} is configured")
        return self._client

    @property
    def can_scan(self) -> bool:
        return self._client is not None

    async def node_ready(self) -> str:
        """Check the node serves the configured chain; return a short status (``"at block 7"``).

        Raise :class:`vpsshop.PluginError` (or ValueError) with the reason when it does not.
        Default: the node answered nothing wrong.
        """
        return "node answers"

    async def preflight(self) -> None:
        """Production refuses to start without a node (its deposits would never be seen, let alone
        credited) and when the configured node does not answer at all."""
        url = getattr(self.config, "rpc_url", None)
        setting = f"coins.{self.code}.{self.node_setting}"
        if not url:
            if self.sandbox:
                return  # a sandbox hands out addresses nobody watches, and says so in its banner
            raise StartupError(
                f"{setting} is not set: without its {self.node_what} nothing watches {self.code} deposits, so "
                f"customers would pay addresses that are never credited. Set {setting}, or remove [coins.{self.code}]."
            )
        await require_reachable(url, setting=setting, what=f"{self.code} {self.node_what}")

    async def check_ready(self) -> Readiness:
        if self._client is None:
            detail = f"{self.network}: addresses only, no node configured (not watched)"
            return Readiness(self.sandbox, detail, sandbox_ok=True)
        try:
            detail = await self.node_ready()
        except (PluginError, ValueError, TypeError, KeyError) as exc:
            return Readiness(False, str(exc))
        return Readiness(True, detail)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


class XpubCoin(DepositCoin[XpubConfigT]):
    """Deposit addresses ``<account key>/<branch>/<index>`` from the config's ``xpub`` and
    ``branch`` (:class:`XpubConfig`). A subclass turns a child key into an address in
    :meth:`derive_address` from ``self.receive.child(index)``."""

    def __init__(self, config: XpubConfigT, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.account = ExtendedPublicKey.parse(config.xpub)
        self.branch = int(getattr(config, "branch", 0))
        self.receive = self.account.child(self.branch)

    def key_id(self) -> str:
        """``<fingerprint>:<chain code prefix>/<branch>`` of the account key."""
        return f"{self.account.fingerprint().hex()}:{self.account.chain_code[:4].hex()}/{self.branch}"


def check_distinct_keys(members: Sequence[DepositCoin[Any]]) -> None:
    """Refuse a scan group whose coins derive deposit addresses from the same key and branch
    (they would hand out the same addresses). Core calls it at start-up for every scan group.

    :raises ConfigError: two such coins, named.
    """
    seen: dict[str, str] = {}
    for coin in members:
        try:
            key = coin.key_id()
        except NotImplementedError:
            continue
        if key in seen:
            raise ConfigError(
                f"{coin.code} and {seen[key]} derive deposit addresses from the same key and branch: "
                "give one of them another 'branch' or another xpub"
            )
        seen[key] = coin.code


@dataclass(frozen=True)
class BlockCursor:
    """Where a block scan stands: the last block read, by height and hash (``"<height>:<hash>"``).

    Height -1 with an empty hash is "before the genesis block".
    """

    height: int
    hash: str

    def __str__(self) -> str:
        return f"{self.height}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> BlockCursor:
        height, _, block_hash = text.partition(":")
        return cls(int(height), block_hash)


class BlockCoin(NodeCoin[BlockScanConfigT, ClientT]):
    """A :class:`NodeCoin` on a chain of numbered blocks, scanned block by block.

    The kit's :meth:`scan` reads the tip, resumes from the cursor (the first run starts at
    ``start_block`` or the tip; when the cursor's block is no longer at its height it steps back
    ``reorg_depth`` blocks and returns, so the next call rescans from there), and hands the next
    at most ``max_blocks_per_scan`` blocks to :meth:`scan_blocks`. Its :meth:`recheck` compares
    each payment's block hash with the block now at that height.

    A subclass writes the chain's own code: :meth:`tip`, :meth:`block_hash` and
    :meth:`scan_blocks`; optionally :meth:`block_hashes` (a batch), :meth:`recheck_moved` (a
    payment whose block left the chain: found elsewhere?).
    """

    trust_heights_above_tip: ClassVar[bool] = True
    """In :meth:`recheck`, a payment in a block above the node's tip (a lagging backend of a
    load-balanced provider) is kept with no confirmations counted. False: it goes to
    :meth:`recheck_moved` (a single node whose tip fell back in a reorganisation)."""

    # ---- the chain's own code --------------------------------------------------------------------

    async def tip(self) -> int:
        """The height of the node's best block. Must be overridden."""
        raise NotImplementedError

    async def block_hash(self, height: int) -> str:
        """The hash of the best chain's block at ``height`` ("" when there is none). Must be
        overridden."""
        raise NotImplementedError

    async def block_hashes(self, heights: Sequence[int]) -> dict[int, str]:
        """Hashes of the blocks at ``heights`` (missing ones left out). Default: one
        :meth:`block_hash` call per height; override to batch."""
        found = {}
        for height in heights:
            value = await self.block_hash(height)
            if value:
                found[height] = value
        return found

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        """Read blocks ``after.height + 1 .. last`` and match their transfers against ``watched``
        for the coins ``members`` (the scan group, this coin included).

        Return the cursor of the last block read (``after`` when nothing was read) and the
        (coin code, payment) pairs found. A block whose parent is not the previous block's
        hash means the chain moved while it was read: stop before it. Must be overridden.
        """
        raise NotImplementedError

    async def scan_unconfirmed(
        self, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> list[tuple[str, DetectedPayment]]:
        """Payments not yet in a block (``confirmations`` 0), read once the scan reached the tip.
        Default: none (the chain shows no mempool, or the coin does not show them)."""
        return []

    async def recheck_moved(self, payment: DetectedPayment, tip: int) -> PaymentCheck:
        """A payment whose block is no longer at its height. Default: gone (``present`` False);
        a later rescan finds it again if it was mined again."""
        return PaymentCheck(payment.identity, False)

    # ---- written once ----------------------------------------------------------------------------

    @property
    def scan_settings(self) -> BlockScanConfig:
        return self.config

    async def scan(self, cursor: str | None, watched: WatchSet, members: Sequence[DepositCoin[Any]] = ()) -> ScanResult:
        self.node  # noqa: B018 - raises the "no node" PluginError before anything else
        tip = await self.tip()
        cfg = self.scan_settings
        if cursor is None:
            start = cfg.start_block if cfg.start_block is not None else tip
            height = max(start - 1, -1)
            position = BlockCursor(height, await self.block_hash(height) if height >= 0 else "")
        else:
            position = BlockCursor.parse(cursor)
            if position.height > tip or (
                position.height >= 0 and await self.block_hash(position.height) != position.hash
            ):
                height = max(min(position.height, tip) - cfg.reorg_depth, -1)
                back = BlockCursor(height, await self.block_hash(height) if height >= 0 else "")
                return ScanResult(str(back), [], tip_height=tip, scanned_height=max(height, 0))
        last = min(tip, position.height + cfg.max_blocks_per_scan)
        members = members or self.scan_members or (self,)
        end = position
        found: list[tuple[str, DetectedPayment]] = []
        if last > position.height:
            end, found = await self.scan_blocks(position, last, tip, watched, members)
        if end.height == tip:
            found.extend(await self.scan_unconfirmed(watched, members))
        return ScanResult(str(end), found, tip_height=tip, scanned_height=max(end.height, 0))

    async def recheck(self, payments: list[DetectedPayment]) -> list[PaymentCheck]:
        tip = await self.tip()
        heights = sorted({p.block_height for p in payments if p.block_height is not None and p.block_height <= tip})
        canonical = await self.block_hashes(heights) if heights else {}
        checks = []
        for payment in payments:
            h = payment.block_height
            if (
                h is not None
                and payment.block_hash
                and h not in canonical
                and (self.trust_heights_above_tip or h <= tip)
            ):
                # The node does not serve the block that held it (yet): nothing is known, so it
                # is kept, with no confirmations counted.
                checks.append(PaymentCheck(payment.identity, True, 0, h, payment.block_hash))
            elif h is not None and payment.block_hash and canonical.get(h) == payment.block_hash:
                checks.append(PaymentCheck(payment.identity, True, tip - h + 1, h, payment.block_hash))
            else:
                checks.append(await self.recheck_moved(payment, tip))
        return checks
