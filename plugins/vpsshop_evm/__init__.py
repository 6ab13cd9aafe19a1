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
    ws_url = "ws://127.0.0.1:8546/"  # optional: eth_subscribe newHeads, a pass the moment a block arrives
    confirmations = 12
    start_block = 21000000      # optional: first block scanned on the first run (default: the tip)

``[coins.USDT]``: the same, plus ``contract = "0xdAC17F958D2ee523a2206206994597C13D831ec7"`` and
``decimals = 6``; ``branch`` defaults to 1. The sandbox uses the account key of the well-known test
mnemonic "abandon ... about" on Sepolia and no node: addresses and QR codes only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, ClassVar

from bip_utils import EthAddrEncoder
from pydantic import Field, field_validator, model_validator

from vpsshop import DepositAddress, DepositCoin, DetectedPayment, PaymentCheck, PluginError, WatchSet, hookimpl
from vpsshop.chains import (
    BlockCoin,
    BlockCursor,
    BlockScanConfig,
    JsonRpcClient,
    RpcError,
    XpubCoin,
    XpubConfig,
    endpoint_id,
    to_checksum_address,
    websocket_wakes,
)

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


def public_key_to_address(uncompressed: bytes) -> str:
    """The EIP-55 address of a 65-byte uncompressed secp256k1 public key (bip-utils' encoder)."""
    address: str = EthAddrEncoder.EncodeKey(uncompressed)
    return address


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


# ---- settings ---------------------------------------------------------------------------------------


class EvmCoinConfig(XpubConfig, BlockScanConfig):
    network: str = Field("ethereum", pattern=r"^[a-z0-9][a-z0-9-]{0,39}$", description="Shown as deposit_network.")
    chain_id: int | None = Field(None, ge=1, description="EIP-155 chain id; optional for the known networks.")
    confirmations: int = Field(12, ge=0, le=1000)
    reorg_depth: int = Field(
        64, ge=1, le=10_000, description="Blocks rescanned when the cursor's block left the chain."
    )
    max_blocks_per_scan: int = Field(20, ge=1, le=2000, description="Blocks read per scan call (one batch).")
    ws_url: str | None = Field(
        None,
        pattern=r"^wss?://",
        description="The node's WebSocket endpoint: the watcher follows eth_subscribe newHeads (none: polled).",
    )

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


# ---- the coins ------------------------------------------------------------------------------------------


class EvmCoin(XpubCoin[EvmCoinConfig], BlockCoin[EvmCoinConfig, JsonRpcClient]):
    """ETH or an ERC-20 token on one EVM node. Subclasses set the class attributes."""

    Config: ClassVar[type[EvmCoinConfig]] = EvmCoinConfig
    decimals = 18
    is_token: ClassVar[bool] = False
    node_name = "EVM node"

    def __init__(self, config: EvmCoinConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.chain_id: int = config.chain_id or 0

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"xpub": SANDBOX_XPUB, "network": "sepolia", "confirmations": 1}

    @property
    def network(self) -> str:
        return self.config.network

    @property
    def scan_group(self) -> str:
        """``evm:<hash of the RPC URL>``: one scan per node, without the URL's secrets (fits 40 characters)."""
        return f"evm:{endpoint_id(self.config.rpc_url)}" if self.config.rpc_url else self.code

    @property
    def group(self) -> str:
        """The scan group (coins on one node share it)."""
        return self.scan_group

    def derive_address(self, index: int) -> DepositAddress:
        address = public_key_to_address(self.receive.child(index).uncompressed())
        return DepositAddress(address, index, address.lower())

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """EIP-681: ``ethereum:<address>@<chain id>?value=<wei>``."""
        return f"ethereum:{address}@{self.chain_id}?value={amount_atomic}"

    def wake_channel(self) -> AsyncIterator[str] | None:
        """``eth_subscribe`` ``newHeads`` over ``ws_url`` (the scan group's first coin's)."""
        if self._client is None or self.config.ws_url is None:
            return None
        return websocket_wakes(self.config.ws_url, {"method": "eth_subscribe", "params": ["newHeads"]})

    # ---- the chain ----------------------------------------------------------------------------------

    async def tip(self) -> int:
        return int(await self.node.call("eth_blockNumber"), 16)

    async def block_hash(self, height: int) -> str:
        block = await self.node.call("eth_getBlockByNumber", hex(height), False)
        return str(block["hash"]) if block else ""

    async def block_hashes(self, heights: Sequence[int]) -> dict[int, str]:
        blocks = await self.node.batch([("eth_getBlockByNumber", [hex(h), False]) for h in heights])
        return {h: b["hash"] for h, b in zip(heights, blocks, strict=True) if b}

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        """One batch of blocks (full transactions when a native coin is watched) and one ``eth_getLogs``
        of the tokens' ``Transfer`` logs; nothing is kept when the chain moved while it was read."""
        native = next((c for c in members if isinstance(c, EvmCoin) and not c.is_token), None)
        tokens = {c.contract_key: c for c in members if isinstance(c, EvmToken)}
        heights = range(after.height + 1, last + 1)
        blocks = await self.node.batch(
            [("eth_getBlockByNumber", [hex(h), native is not None]) for h in heights], chunk=10
        )
        hashes: dict[int, str] = {}
        previous = after.hash
        for h, block in zip(heights, blocks, strict=True):
            if not block or (previous and block["parentHash"] != previous):
                return after, []  # the chain moved while we read it: try again next pass
            hashes[h] = previous = block["hash"]
        found: list[tuple[str, DetectedPayment]] = []
        if native is not None:
            native_found = await native.match_block_transactions(blocks, watched, tip)
            if native_found is None:
                return after, []
            found.extend((native.code, p) for p in native_found)
        if tokens:
            logs = await self.transfer_logs(after.height + 1, last, [c.config.contract for c in tokens.values()])
            for log in logs:
                matched = match_transfer_log(log, watched, tokens)
                if matched is None:
                    continue
                coin, to, amount = matched
                h = int(log["blockNumber"], 16)
                if hashes.get(h) != log.get("blockHash"):
                    return after, []
                identity = f"{log['transactionHash'].lower()}:{int(log['logIndex'], 16)}"
                found.append(
                    (
                        coin.code,
                        DetectedPayment(
                            identity, to, amount, log["transactionHash"].lower(), tip - h + 1, h, log["blockHash"]
                        ),
                    )
                )
        return BlockCursor(last, hashes[last]), found

    async def transfer_logs(self, first: int, last: int, contracts: list[str]) -> list[dict[str, Any]]:
        """The contracts' ``Transfer`` logs of blocks ``first..last``. A node or provider that refuses the
        range (too many results, range too wide) is asked again for each half."""
        try:
            logs = await self.node.call(
                "eth_getLogs",
                {"fromBlock": hex(first), "toBlock": hex(last), "address": contracts, "topics": [TRANSFER_TOPIC]},
            )
        except RpcError:
            if first >= last:
                raise
            middle = (first + last) // 2
            return [
                *await self.transfer_logs(first, middle, contracts),
                *await self.transfer_logs(middle + 1, last, contracts),
            ]
        return list(logs or ())

    async def match_block_transactions(
        self, blocks: list[dict[str, Any]], watched: WatchSet, tip: int
    ) -> list[DetectedPayment] | None:
        """Native transfers to watched addresses in ``blocks`` (full transactions) whose receipt succeeded.

        None when a receipt is missing or names another block: the chain moved while it was read."""
        candidates = []
        for block in blocks:
            for tx in block["transactions"]:
                to = (tx.get("to") or "").lower()
                if to and to in watched and int(tx["value"], 16) > 0:
                    candidates.append(
                        (tx["hash"].lower(), to, int(tx["value"], 16), int(block["number"], 16), block["hash"])
                    )
        if not candidates:
            return []
        receipts = await self.node.batch([("eth_getTransactionReceipt", [c[0]]) for c in candidates])
        found = []
        for (txid, to, value, h, block_hash), receipt in zip(candidates, receipts, strict=True):
            if not receipt or receipt.get("blockHash") != block_hash:
                return None
            if receipt.get("status") == "0x1":
                found.append(DetectedPayment(txid, to, value, txid, tip - h + 1, h, block_hash))
        return found

    async def recheck_moved(self, payment: DetectedPayment, tip: int) -> PaymentCheck:
        """A native transfer whose block left the chain is counted where it was mined again, if anywhere;
        a token log is dropped (the rescan finds it again under its new identity if it was mined again)."""
        if self.is_token:
            return PaymentCheck(payment.identity, False)
        receipt = await self.node.call("eth_getTransactionReceipt", payment.txid)
        if receipt and receipt.get("blockHash") and receipt.get("status") == "0x1":
            h = int(receipt["blockNumber"], 16)
            return PaymentCheck(payment.identity, True, tip - h + 1, h, receipt["blockHash"])
        tx = await self.node.call("eth_getTransactionByHash", payment.txid)
        if tx and tx.get("blockHash") is None:
            return PaymentCheck(payment.identity, True, 0, None, None)  # back in the mempool
        return PaymentCheck(payment.identity, False)

    async def node_ready(self) -> str:
        chain_id = int(await self.node.call("eth_chainId"), 16)
        if chain_id != self.chain_id:
            raise PluginError(f"node is on chain id {chain_id}, settings say {self.chain_id}")
        return f"{self.network} at block {await self.tip()}"


class EvmToken(EvmCoin):
    """An ERC-20 token on an EVM node: contract and decimals are settings."""

    Config: ClassVar[type[EvmCoinConfig]] = EvmTokenConfig
    config: EvmTokenConfig
    is_token: ClassVar[bool] = True

    def __init__(self, config: EvmTokenConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.decimals = config.decimals
        self.contract_key = config.contract.lower()

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """EIP-681 token transfer: ``ethereum:<contract>@<chain id>/transfer?address=<to>&uint256=<units>``."""
        return f"ethereum:{self.config.contract}@{self.chain_id}/transfer?address={address}&uint256={amount_atomic}"

    async def node_ready(self) -> str:
        detail = await super().node_ready()
        contract = self.config.contract
        code = await self.node.call("eth_getCode", contract, "latest")
        if not code or code == "0x":
            raise PluginError(f"no contract at {contract} on {self.network}")
        decimals = int(await self.node.call("eth_call", {"to": contract, "data": DECIMALS_SELECTOR}, "latest"), 16)
        if decimals != self.decimals:
            raise PluginError(f"contract {contract} has {decimals} decimals, settings say {self.decimals}")
        return detail


def match_transfer_log(
    log: dict[str, Any], watched: WatchSet, tokens: dict[str, EvmToken]
) -> tuple[EvmToken, str, int] | None:
    """(token, recipient, amount) of an ERC-20 ``Transfer`` log to a watched address, else None."""
    topics: list[str] = log.get("topics") or []
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
    default_priority = 70


class TetherErc20(EvmToken):
    code = "USDT"
    name = "Tether USD (ERC-20)"
    rate_symbol = "USDT"
    decimals = 6
    default_priority = 20

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {**super().sandbox_config(), "contract": SANDBOX_USDT_CONTRACT, "decimals": 6}


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[DepositCoin[Any]]]:
    return [Ether, TetherErc20]
