"""ETH and USDT (ERC-20) deposits through an Ethereum JSON-RPC node (geth, reth, Erigon, Nethermind, anvil).

Deposit addresses are derived watch-only from the reseller's *account* extended public key of the BIP-44
Ethereum path (``m/44'/60'/0'``, the key MetaMask, Ledger Live or ``cast wallet`` derive their accounts
from): top-up number *n* of ETH pays ``<account>/0/n``, top-up number *n* of USDT pays ``<account>/1/n``
(the ``branch`` setting), so the two coins never hand out the same address. An address is the last 20
bytes of the Keccak-256 of the uncompressed public key, shown with its EIP-55 checksum.

Both coins share **one scan group per node** (``evm:<hash of rpc_url>``): one watcher pass reads each new block
once with ``eth_getBlockByNumber(n, true)`` (native transfers: a transaction whose ``to`` is watched and
whose receipt succeeded) and the token contracts' ``Transfer`` logs of the same block range with one
``eth_getLogs`` (filtered to the contracts and the ``Transfer`` topic; the recipient, topic 2, is matched
against the watch set in Python: a topic filter listing thousands of addresses is refused by most nodes).
Identities: the transaction hash for ETH, ``<tx hash>:<log index in the block>`` for a token transfer.

Reorganisations: the cursor is ``<height>:<block hash>``; when that block left the chain the scan steps
``reorg_depth`` blocks back and rescans (idempotent). Every block read must chain to the previous one by
``parentHash`` and every log's ``blockHash`` must be the hash of the block read at its height, otherwise
the scan stops without moving (a reorg happened while it read). :meth:`EvmCoin.recheck` compares each
payment's block hash with the canonical block at its height; a native transaction found in another block
stays counted there, a token log whose block left the chain is dropped (the rescan finds it again under
its new identity if it was mined again).

Settings ``[coins.ETH]``::

    xpub = "xpub6..."           # account key m/44'/60'/0'; public only
    network = "ethereum"        # ethereum, sepolia, holesky, or any name with chain_id set
    chain_id = 1                # optional for the known networks
    rpc_url = "http://127.0.0.1:8545/"
    confirmations = 12
    start_block = 21000000      # optional: first block scanned on the first run (default: the tip)

``[coins.USDT]``: the same, plus ``contract = "0xdAC17F958D2ee523a2206206994597C13D831ec7"`` and
``decimals = 6``; ``branch`` defaults to 1. The sandbox uses the account key of the well-known test
mnemonic "abandon ... about" on Sepolia and no node: addresses and QR codes only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
from Crypto.Hash import keccak
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vpsshop import (
    ConfigError,
    DepositAddress,
    DepositCoin,
    DetectedPayment,
    PaymentCheck,
    PluginError,
    Readiness,
    require_reachable,
    ScanResult,
    WatchSet,
    hookimpl,
)
from vpsshop.hdkeys import ExtendedPublicKey, KeyError_

# Account key m/44'/60'/0' of the BIP-39 test mnemonic "abandon x11 about": public, well known, and
# useless for real money (anyone can spend from it). Address 0 is 0x9858EfFD232B4033E47d90003D41EC34EcaEda94.
SANDBOX_XPUB = (
    "xpub6DCoCpSuQZB2jawqnGMEPS63ePKWkwWPH4TU45Q7LPXWuNd8TMtVxRrgjtEshuqpK3mdhaWHPFsBngh5GFZaM6si3yZdUsT8ddYM3PwnATt"
)
# Aave's faucet USDT on Sepolia (6 decimals): the sandbox only prints it in payment URIs.
SANDBOX_USDT_CONTRACT = "0xaA8E23Fb1079EA71e0a56F48a2aA51851D8433D0"

KNOWN_CHAINS = {"ethereum": 1, "sepolia": 11155111, "holesky": 17000}
TRANSFER_TOPIC = "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
"""keccak256("Transfer(address,address,uint256)")"""
DECIMALS_SELECTOR = "0x313ce567"
"""keccak256("decimals()")[:4]"""


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def to_checksum_address(address_hex: str) -> str:
    """EIP-55 mixed-case checksum of a 20-byte hex address (with or without ``0x``)."""
    lower = address_hex.lower().removeprefix("0x")
    if len(lower) != 40 or any(c not in "0123456789abcdef" for c in lower):
        raise ValueError(f"not a 20-byte hex address: {address_hex!r}")
    digest = keccak256(lower.encode()).hex()
    return "0x" + "".join(c.upper() if c.isalpha() and int(digest[i], 16) >= 8 else c for i, c in enumerate(lower))


def public_key_to_address(uncompressed: bytes) -> str:
    """The EIP-55 address of a 65-byte uncompressed secp256k1 public key."""
    if len(uncompressed) != 65 or uncompressed[0] != 4:
        raise ValueError("expected a 65-byte uncompressed public key")
    return to_checksum_address(keccak256(uncompressed[1:])[-20:].hex())


def parse_address(text: str) -> str:
    """Validate a 0x address; a mixed-case one must carry a correct EIP-55 checksum. Returns it checksummed."""
    text = text.strip()
    if not text.startswith("0x"):
        raise ValueError("an address starts with 0x")
    checksummed = to_checksum_address(text)
    body = text[2:]
    if body != body.lower() and body != body.upper() and text != checksummed:
        raise ValueError("bad EIP-55 checksum")
    return checksummed


def endpoint_label(url: str) -> str:
    """``scheme://host:port`` of a node URL, for messages and logs (never its path or query)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def endpoint_id(url: str) -> str:
    """A short, stable, non-secret identifier of a node URL (scan group names are stored and logged)."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]


# ---- settings ---------------------------------------------------------------------------------------


class EvmCoinConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    xpub: str = Field(description="Account extended public key of m/44'/60'/<account>'. Never a private key.")
    branch: int = Field(0, ge=0, lt=2**31, description="Derivation branch under the account key: <xpub>/<branch>/<n>.")
    network: str = Field("ethereum", pattern=r"^[a-z0-9][a-z0-9-]{0,39}$", description="Shown as deposit_network.")
    chain_id: int | None = Field(None, ge=1, description="EIP-155 chain id; optional for the known networks.")
    rpc_url: str | None = Field(None, description="JSON-RPC endpoint of the node; none: addresses only.")
    confirmations: int = Field(12, ge=0, le=1000)
    start_block: int | None = Field(None, ge=0, description="First block scanned on the first run.")
    reorg_depth: int = Field(64, ge=1, le=10_000, description="Blocks rescanned when the cursor's block left the chain.")
    max_blocks_per_scan: int = Field(20, ge=1, le=2000, description="Blocks read per scan call (one batch).")
    timeout_seconds: float = Field(15, gt=0, le=300)

    @field_validator("xpub")
    @classmethod
    def _parse_xpub(cls, value: str) -> str:
        try:
            ExtendedPublicKey.parse(value)
        except KeyError_ as exc:
            raise ValueError(str(exc)) from None
        return value.strip()

    @model_validator(mode="after")
    def _chain_id(self) -> EvmCoinConfig:
        if self.chain_id is None:
            if self.network not in KNOWN_CHAINS:
                raise ValueError(f"network {self.network!r} is not one of {sorted(KNOWN_CHAINS)}: set chain_id")
            self.chain_id = KNOWN_CHAINS[self.network]
        return self


class EvmTokenConfig(EvmCoinConfig):
    branch: int = Field(1, ge=0, lt=2**31, description="Derivation branch; differs from ETH's so no address is shared.")
    contract: str = Field(description="The ERC-20 token contract address.")
    decimals: int = Field(6, ge=0, le=36, description="The token's decimals (USDT: 6).")

    @field_validator("contract")
    @classmethod
    def _contract(cls, value: str) -> str:
        return parse_address(value)


# ---- JSON-RPC -----------------------------------------------------------------------------------------


class EthRpc:
    """A small Ethereum JSON-RPC 2.0 client with batches (one HTTP request for many calls)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.where = endpoint_label(url)
        """Scheme, host and port only: the path or query of a provider URL may hold an API key."""
        self.client = httpx.AsyncClient(timeout=timeout)
        self._id = 0

    async def _post(self, payload: Any, what: str) -> Any:
        try:
            response = await self.client.post(self.url, json=payload)
        except httpx.HTTPError as exc:
            raise PluginError(f"EVM node at {self.where} did not answer {what}: {type(exc).__name__}") from None
        try:
            return json.loads(response.content)
        except ValueError:
            raise PluginError(f"EVM node answered {what} with HTTP {response.status_code}, not JSON") from None

    async def call(self, method: str, *params: Any) -> Any:
        self._id += 1
        body = await self._post({"jsonrpc": "2.0", "id": self._id, "method": method, "params": list(params)}, method)
        if not isinstance(body, dict):
            raise PluginError(f"EVM node answered {method} with a malformed body")
        if body.get("error"):
            raise EthRpcError(method, body["error"])
        return body.get("result")

    async def batch(self, calls: list[tuple[str, list[Any]]], chunk: int = 100) -> list[Any]:
        """Results of ``calls`` in order; a failed call raises :class:`PluginError`."""
        results: list[Any] = []
        for start in range(0, len(calls), chunk):
            part = calls[start : start + chunk]
            first = self._id + 1
            self._id += len(part)
            payload = [{"jsonrpc": "2.0", "id": first + i, "method": m, "params": p} for i, (m, p) in enumerate(part)]
            body = await self._post(payload, part[0][0])
            if not isinstance(body, list):
                raise PluginError(f"EVM node answered a batch of {part[0][0]} with {str(body)[:200]}")
            by_id = {item.get("id"): item for item in body if isinstance(item, dict)}
            for i, (method, _) in enumerate(part):
                item = by_id.get(first + i)
                if item is None or item.get("error"):
                    raise EthRpcError(method, (item or {}).get("error") or {"message": "missing from the batch answer"})
                results.append(item.get("result"))
        return results

    async def close(self) -> None:
        await self.client.aclose()


class EthRpcError(PluginError):
    """The node answered with a JSON-RPC error (it is reachable)."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method}: {error.get('message')} (code {error.get('code')})")
        self.code = error.get("code")


# ---- the coins ------------------------------------------------------------------------------------------



class EvmCoin(DepositCoin):
    """ETH or an ERC-20 token on one EVM node. Subclasses set the class attributes."""

    Config: ClassVar[type[BaseModel]] = EvmCoinConfig
    decimals = 18
    is_token: ClassVar[bool] = False

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        cfg: EvmCoinConfig = config  # type: ignore[assignment]
        self.cfg = cfg
        self.account = ExtendedPublicKey.parse(cfg.xpub)
        self.receive = self.account.child(cfg.branch)
        self.chain_id: int = cfg.chain_id  # type: ignore[assignment]
        self.rpc = EthRpc(cfg.rpc_url, cfg.timeout_seconds) if cfg.rpc_url else None
        self.group: list[EvmCoin] = [self]
        """The coins sharing this coin's scan, linked by :func:`vpsshop_startup` (this one alone until then)."""

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"xpub": SANDBOX_XPUB, "network": "sepolia", "confirmations": 1}

    @property
    def network(self) -> str:
        return self.cfg.network

    @property
    def scan_group(self) -> str:
        """``evm:<hash of the RPC URL>``: one scan per node, without the URL's secrets (fits 40 characters)."""
        return f"evm:{endpoint_id(self.cfg.rpc_url)}" if self.cfg.rpc_url else self.code

    @property
    def can_scan(self) -> bool:
        return self.rpc is not None

    def key_id(self) -> str:
        return f"{self.account.fingerprint().hex()}:{self.account.chain_code[:4].hex()}/{self.cfg.branch}"

    def derive_address(self, index: int) -> DepositAddress:
        address = public_key_to_address(self.receive.child(index).uncompressed())
        return DepositAddress(address, index, address.lower())

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """EIP-681: ``ethereum:<address>@<chain id>?value=<wei>``."""
        return f"ethereum:{address}@{self.chain_id}?value={amount_atomic}"

    # ---- watching -----------------------------------------------------------------------------------

    def _node(self) -> EthRpc:
        if self.rpc is None:
            raise PluginError(f"{self.code}: no rpc_url is configured")
        return self.rpc

    def group_members(self) -> list[EvmCoin]:
        """The live coins of this scan group (this one included), native coin first."""
        ordered = sorted(self.group, key=lambda c: (c.is_token, c.code))
        seen: dict[str, str] = {}
        for coin in ordered:
            key = coin.key_id()
            if key in seen:
                raise PluginError(f"{coin.code} and {seen[key]} derive deposit addresses from the same key and "
                                  f"branch: give one of them another 'branch' or another xpub")
            seen[key] = coin.code
        return ordered

    async def _hash_at(self, height: int) -> str:
        if height < 0:
            return ""
        block = await self._node().call("eth_getBlockByNumber", hex(height), False)
        return str(block["hash"]) if block else ""

    async def scan(self, cursor: str | None, watched: WatchSet) -> ScanResult:
        node = self._node()
        cfg = self.cfg
        members = self.group_members()
        native = next((c for c in members if not c.is_token), None)
        tokens = {c.contract_key: c for c in members if isinstance(c, EvmToken)}
        tip = int(await node.call("eth_blockNumber"), 16)
        if cursor is None:
            start = cfg.start_block if cfg.start_block is not None else tip
            height = max(start - 1, -1)
            block_hash = await self._hash_at(height)
        else:
            height_text, block_hash = cursor.split(":", 1)
            height = int(height_text)
            if height > tip or (height >= 0 and await self._hash_at(height) != block_hash):
                height = max(min(height, tip) - cfg.reorg_depth, -1)
                block_hash = await self._hash_at(height)
                return ScanResult(f"{height}:{block_hash}", [])
        last = min(tip, height + cfg.max_blocks_per_scan)
        if last <= height:
            return ScanResult(f"{height}:{block_hash}", [])
        unchanged = ScanResult(f"{height}:{block_hash}", [])
        blocks = await node.batch(
            [("eth_getBlockByNumber", [hex(h), native is not None]) for h in range(height + 1, last + 1)], chunk=10
        )
        hashes: dict[int, str] = {}
        previous = block_hash
        for h, block in zip(range(height + 1, last + 1), blocks):
            if not block or (previous and block["parentHash"] != previous):
                return unchanged  # the chain moved while we read it: try again next pass
            hashes[h] = previous = block["hash"]
        found: list[tuple[str, DetectedPayment]] = []
        if native is not None:
            native_found = await native.match_block_transactions(blocks, watched, tip)
            if native_found is None:
                return unchanged
            found.extend((native.code, p) for p in native_found)
        if tokens:
            logs = await self.transfer_logs(height + 1, last, [c.cfg.contract for c in tokens.values()])  # type: ignore[attr-defined]
            for log in logs:
                matched = match_transfer_log(log, watched, tokens)
                if matched is None:
                    continue
                coin, to, amount = matched
                h = int(log["blockNumber"], 16)
                if hashes.get(h) != log.get("blockHash"):
                    return unchanged
                identity = f"{log['transactionHash'].lower()}:{int(log['logIndex'], 16)}"
                found.append((coin.code, DetectedPayment(identity, to, amount, log["transactionHash"].lower(),
                                                         tip - h + 1, h, log["blockHash"])))
        return ScanResult(f"{last}:{hashes[last]}", found)

    async def transfer_logs(self, first: int, last: int, contracts: list[str]) -> list[dict[str, Any]]:
        """The contracts' ``Transfer`` logs of blocks ``first..last``. A node or provider that refuses the
        range (too many results, range too wide) is asked again for each half."""
        try:
            logs = await self._node().call("eth_getLogs", {"fromBlock": hex(first), "toBlock": hex(last),
                                                           "address": contracts, "topics": [TRANSFER_TOPIC]})
        except EthRpcError:
            if first >= last:
                raise
            middle = (first + last) // 2
            return [*await self.transfer_logs(first, middle, contracts),
                    *await self.transfer_logs(middle + 1, last, contracts)]
        return list(logs or ())

    async def match_block_transactions(self, blocks: list[dict[str, Any]], watched: WatchSet,
                                       tip: int) -> list[DetectedPayment] | None:
        """Native transfers to watched addresses in ``blocks`` (full transactions) whose receipt succeeded.

        None when a receipt is missing or names another block: the chain moved while it was read."""
        candidates = []
        for block in blocks:
            for tx in block["transactions"]:
                to = tx.get("to")
                if to is None:
                    continue
                to = to.lower()
                if to in watched:
                    value = int(tx["value"], 16)
                    if value > 0:
                        candidates.append((tx["hash"].lower(), to, value, int(block["number"], 16), block["hash"]))
        if not candidates:
            return []
        receipts = await self._node().batch([("eth_getTransactionReceipt", [c[0]]) for c in candidates])
        found = []
        for (txid, to, value, h, block_hash), receipt in zip(candidates, receipts):
            if not receipt or receipt.get("blockHash") != block_hash:
                return None
            if receipt.get("status") == "0x1":
                found.append(DetectedPayment(txid, to, value, txid, tip - h + 1, h, block_hash))
        return found

    async def recheck(self, payments: list[DetectedPayment]) -> list[PaymentCheck]:
        node = self._node()
        tip = int(await node.call("eth_blockNumber"), 16)
        heights = sorted({p.block_height for p in payments if p.block_height is not None and p.block_height <= tip})
        blocks = await node.batch([("eth_getBlockByNumber", [hex(h), False]) for h in heights]) if heights else []
        canonical = {h: b["hash"] for h, b in zip(heights, blocks) if b}
        checks = []
        for payment in payments:
            h = payment.block_height
            if h is not None and payment.block_hash and h not in canonical:
                # The node is behind the block that held it (a lagging backend of a load-balanced
                # provider): nothing is known yet, so it is kept, with no confirmations counted.
                checks.append(PaymentCheck(payment.identity, True, 0, h, payment.block_hash))
            elif h is not None and payment.block_hash and canonical[h] == payment.block_hash:
                checks.append(PaymentCheck(payment.identity, True, tip - h + 1, h, payment.block_hash))
            elif self.is_token:
                checks.append(PaymentCheck(payment.identity, False))
            else:
                checks.append(await self._recheck_native(payment.txid, payment.identity, tip))
        return checks

    async def _recheck_native(self, txid: str, identity: str, tip: int) -> PaymentCheck:
        """A native transfer whose block left the chain: counted where it was mined again, if anywhere."""
        node = self._node()
        receipt = await node.call("eth_getTransactionReceipt", txid)
        if receipt and receipt.get("blockHash") and receipt.get("status") == "0x1":
            h = int(receipt["blockNumber"], 16)
            return PaymentCheck(identity, True, tip - h + 1, h, receipt["blockHash"])
        tx = await node.call("eth_getTransactionByHash", txid)
        if tx and tx.get("blockHash") is None:
            return PaymentCheck(identity, True, 0, None, None)  # back in the mempool
        return PaymentCheck(identity, False)

    async def preflight(self) -> None:
        """Production refuses to start when the configured node does not answer at all."""
        url = self.config.rpc_url  # type: ignore[attr-defined]
        if url:
            await require_reachable(url, setting=f"coins.{self.code}.rpc_url", what=f"{self.code} node")

    async def check_ready(self) -> Readiness:
        if self.rpc is None:
            return Readiness(True, f"{self.network}: addresses only, no node configured (not watched)")
        try:
            chain_id = int(await self.rpc.call("eth_chainId"), 16)
            if chain_id != self.chain_id:
                return Readiness(False, f"node is on chain id {chain_id}, settings say {self.chain_id}")
            tip = int(await self.rpc.call("eth_blockNumber"), 16)
            self.group_members()
        except (PluginError, ValueError, TypeError) as exc:
            return Readiness(False, str(exc))
        return Readiness(True, f"{self.network} at block {tip}")

    async def close(self) -> None:
        if self.rpc is not None:
            await self.rpc.close()


class EvmToken(EvmCoin):
    """An ERC-20 token on an EVM node: contract and decimals are settings."""

    Config: ClassVar[type[BaseModel]] = EvmTokenConfig
    is_token: ClassVar[bool] = True

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.decimals = config.decimals  # type: ignore[attr-defined,misc]
        self.contract_key = self.cfg.contract.lower()  # type: ignore[attr-defined]

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """EIP-681 token transfer: ``ethereum:<contract>@<chain id>/transfer?address=<to>&uint256=<units>``."""
        contract = self.cfg.contract  # type: ignore[attr-defined]
        return f"ethereum:{contract}@{self.chain_id}/transfer?address={address}&uint256={amount_atomic}"

    async def check_ready(self) -> Readiness:
        ready = await super().check_ready()
        if not ready.ok or self.rpc is None:
            return ready
        contract = self.cfg.contract  # type: ignore[attr-defined]
        try:
            code = await self.rpc.call("eth_getCode", contract, "latest")
            if not code or code == "0x":
                return Readiness(False, f"no contract at {contract} on {self.network}")
            answer = await self.rpc.call("eth_call", {"to": contract, "data": DECIMALS_SELECTOR}, "latest")
            decimals = int(answer, 16)
        except (PluginError, ValueError, TypeError) as exc:
            return Readiness(False, str(exc))
        if decimals != self.decimals:
            return Readiness(False, f"contract {contract} has {decimals} decimals, settings say {self.decimals}")
        return ready


def match_transfer_log(log: dict[str, Any], watched: WatchSet,
                       tokens: dict[str, EvmToken]) -> tuple[EvmToken, str, int] | None:
    """(token, recipient, amount) of an ERC-20 ``Transfer`` log to a watched address, else None."""
    topics = log.get("topics") or ()
    if log.get("removed") or len(topics) != 3 or topics[0] != TRANSFER_TOPIC:
        return None  # ERC-721 Transfer has a 4th indexed topic; removed logs left the chain
    coin = tokens.get(str(log.get("address", "")).lower())
    if coin is None:
        return None
    to = "0x" + topics[2][-40:].lower()
    if to not in watched:
        return None
    data = log.get("data") or "0x"
    amount = int(data, 16) if len(data) > 2 else 0
    if amount <= 0:
        return None
    return coin, to, amount


class Ether(EvmCoin):
    code = "ETH"
    name = "Ether"
    rate_symbol = "ETH"


class TetherErc20(EvmToken):
    code = "USDT"
    name = "Tether USD (ERC-20)"
    rate_symbol = "USDT"
    decimals = 6

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {**super().sandbox_config(), "contract": SANDBOX_USDT_CONTRACT, "decimals": 6}


@hookimpl
def vpsshop_startup(ctx: Any) -> None:
    """Link the coins of each scan group, so the one core asks to scan reads every coin's deposits."""
    groups: dict[str, list[EvmCoin]] = {}
    for coin in ctx.coins.values():
        if isinstance(coin, EvmCoin) and coin.can_scan:
            groups.setdefault(coin.scan_group, []).append(coin)
    for members in groups.values():
        for coin in members:
            coin.group = list(members)
        try:
            members[0].group_members()
        except PluginError as exc:
            raise ConfigError(str(exc)) from None


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[DepositCoin]]:
    return [Ether, TetherErc20]
