"""xDAI deposits on Gnosis Chain, written on vpsshop's chain kit (``vpsshop.chains``).

Gnosis Chain is an EVM account chain whose native coin, xDAI, is a dollar stablecoin. Deposit
addresses derive watch-only from the reseller's account key of the BIP-44 Ethereum path
(``m/44'/60'/0'``): top-up number *n* pays ``<account>/0/n``. A deposit is a transaction of a
block whose ``to`` is a watched address, with a value, whose receipt succeeded.

Settings ``[coins.XDAI]``::

    xpub = "xpub6..."              # account key m/44'/60'/0'; public only
    network = "gnosis"             # gnosis, chiado, or any name with chain_id set
    rpc_url = "http://127.0.0.1:8545/"
    confirmations = 12

The kit gives the rest: ``branch``, ``start_block``, ``reorg_depth``, ``max_blocks_per_scan``,
``timeout_seconds``; "addresses only" when ``rpc_url`` is not set (the sandbox); the node check at
start-up; the block cursor, reorganisations and rechecks. See docs/chain-kit.md in vpsshop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from pydantic import Field, model_validator

from vpsshop import DepositAddress, DepositCoin, DetectedPayment, PluginError, WatchSet, hookimpl
from vpsshop.chains import (
    BlockCoin,
    BlockCursor,
    BlockScanConfig,
    JsonRpcClient,
    XpubCoin,
    XpubConfig,
    keccak_address,
    to_checksum_address,
)

CHAIN_IDS = {"gnosis": 100, "chiado": 10200}
# Account key m/44'/60'/0' of the public test mnemonic "abandon x11 about": for the sandbox only.
SANDBOX_XPUB = (
    "xpub6DCoCpSuQZB2jawqnGMEPS63ePKWkwWPH4TU45Q7LPXWuNd8TMtVxRrgjtEshuqpK3mdhaWHPFsBngh5GFZaM6si3yZdUsT8ddYM3PwnATt"
)


class XdaiConfig(XpubConfig, BlockScanConfig):
    """``[coins.XDAI]``: the kit's xpub and node settings, plus the network."""

    network: str = Field("gnosis", pattern=r"^[a-z0-9][a-z0-9-]{0,39}$", description="Shown as deposit_network.")
    chain_id: int | None = Field(None, ge=1, description="EIP-155 chain id; optional for gnosis and chiado.")
    confirmations: int = Field(12, ge=0, le=1000)

    @model_validator(mode="after")
    def _chain_id(self) -> XdaiConfig:
        if self.chain_id is None:
            if self.network not in CHAIN_IDS:
                raise ValueError(f"network {self.network!r} is not one of {sorted(CHAIN_IDS)}: set chain_id")
            self.chain_id = CHAIN_IDS[self.network]
        return self


class Xdai(XpubCoin[XdaiConfig], BlockCoin[XdaiConfig, JsonRpcClient]):
    code = "XDAI"
    name = "xDAI (Gnosis Chain)"
    decimals = 18
    rate_symbol = "DAI"
    Config: ClassVar[type[XdaiConfig]] = XdaiConfig
    node_name = "Gnosis node"

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"xpub": SANDBOX_XPUB, "network": "chiado", "confirmations": 1}

    @property
    def network(self) -> str:
        return self.config.network

    def derive_address(self, index: int) -> DepositAddress:
        address = to_checksum_address(keccak_address(self.receive.child(index).uncompressed()).hex())
        return DepositAddress(address, index, address.lower())

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """EIP-681: ``ethereum:<address>@<chain id>?value=<wei>``."""
        return f"ethereum:{address}@{self.config.chain_id}?value={amount_atomic}"

    # ---- the chain's own code: the tip, a block's hash, and what a block pays --------------------

    async def tip(self) -> int:
        return int(await self.node.call("eth_blockNumber"), 16)

    async def block_hash(self, height: int) -> str:
        block = await self.node.call("eth_getBlockByNumber", hex(height), False)
        return str(block["hash"]) if block else ""

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        found: list[tuple[str, DetectedPayment]] = []
        position = after
        for height in range(after.height + 1, last + 1):
            block = await self.node.call("eth_getBlockByNumber", hex(height), True)
            if not block or (position.hash and block["parentHash"] != position.hash):
                break  # the chain moved while it was read: the next scan checks the cursor
            for tx in block["transactions"]:
                to, value = (tx.get("to") or "").lower(), int(tx["value"], 16)
                if to not in watched or value <= 0:
                    continue
                receipt = await self.node.call("eth_getTransactionReceipt", tx["hash"])
                if not receipt or receipt.get("blockHash") != block["hash"]:
                    return position, found
                if receipt.get("status") == "0x1":
                    txid = tx["hash"].lower()
                    payment = DetectedPayment(txid, to, value, txid, tip - height + 1, height, block["hash"])
                    found.append((self.code, payment))
            position = BlockCursor(height, block["hash"])
        return position, found

    async def node_ready(self) -> str:
        chain_id = int(await self.node.call("eth_chainId"), 16)
        if chain_id != self.config.chain_id:
            raise PluginError(f"node is on chain id {chain_id}, settings say {self.config.chain_id}")
        return f"{self.network} at block {await self.tip()}"


@hookimpl
def vpsshop_register_coins() -> Iterable[type[DepositCoin[Any]]]:
    return [Xdai]
