"""BTC and LTC deposits through a Bitcoin Core-compatible node (bitcoind, litecoind).

One code path for both coins; what differs is in :data:`NETWORKS`. Deposit addresses are native
segwit (P2WPKH, BIP-84) derived watch-only from the reseller's account extended public key
(``zpub``/``vpub``, or the ``xpub``/``tpub`` form of the same key): top-up number *n* pays
``<account key>/0/n``. The node holds no key of the shop: the watcher reads blocks with
``getblock <hash> 2`` and tests every output against the watched addresses, and reads the mempool
(``getrawmempool`` + ``getrawtransaction``) to show unconfirmed payments.

Settings ``[coins.BTC]`` / ``[coins.LTC]``::

    xpub = "zpub6r..."          # account key m/84'/0'/0' (LTC: m/84'/2'/0'); public only
    network = "mainnet"         # mainnet, testnet or regtest
    rpc_url = "http://127.0.0.1:8332/"
    rpc_user = "vpsshop"
    rpc_password = "..."
    confirmations = 2           # BTC default 2, LTC default 6
    start_height = 870000       # optional: first block to scan on the first run (default: the tip)
    notify_listen = "127.0.0.1:28400"  # optional: UDP port the node's -walletnotify/-blocknotify send to
    watch_wallet = "vpsshop"    # the watch-only wallet deposit addresses go into (with notify_listen)

**Push.** The watcher follows the node with ``waitfornewblock`` (a long poll on a connection of
its own, one request per ``push_timeout_seconds`` while nothing happens), so a block is read the
moment the node has it. A payment still in the mempool is seen at once when ``notify_listen`` is
set: each deposit address is then imported into the node's watch-only wallet ``watch_wallet``
(created blank, without private keys) and the node's ``-walletnotify`` (and ``-blocknotify``)
command sends a datagram ``<txid> <wallet>`` to that port. Without it, mempool payments show at
the next block. This works on builds without ZMQ (Debian's litecoind 0.21); docs/payments.md
has the node's settings.

The sandbox uses the BIP-84 test vector's account key on testnet and no node: it hands out
addresses and QR codes and watches nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Literal

import httpx
from pydantic import AliasChoices, Field, SecretStr

from vpsshop import DepositAddress, DepositCoin, DetectedPayment, PaymentCheck, PluginError, WatchSet, hookimpl
from vpsshop.chains import (
    BlockCoin,
    BlockCursor,
    BlockScanConfig,
    JsonRpcClient,
    RpcError,
    Xpub,
    XpubCoin,
    XpubConfig,
    datagram_wakes,
    long_poll_wakes,
    merge_wakes,
    p2wpkh_address,
)

# The account key of the BIP-84 test vector ("abandon ... about"), in its testnet (vpub) encoding:
# public, well known, and useless for real money: the sandbox's deposit key.
SANDBOX_VPUB = (
    "vpub5YvMuJNjRSYon44z9QmCfdf8SqJRVNvz6m55Qy5iVjZQxDfUgtiQjnc7CC1fAbED2tAGCZRERUfvtn2DstZGU6HMns6dXXH2wujSc2wfi2x"
)


@dataclass(frozen=True)
class ChainParams:
    network_name: str
    hrp: str
    node_chain: str
    """What ``getblockchaininfo`` calls the chain: main, test or regtest."""


NETWORKS: dict[str, dict[str, ChainParams]] = {
    "BTC": {
        "mainnet": ChainParams("bitcoin", "bc", "main"),
        "testnet": ChainParams("bitcoin-testnet", "tb", "test"),
        "regtest": ChainParams("bitcoin-regtest", "bcrt", "regtest"),
    },
    "LTC": {
        "mainnet": ChainParams("litecoin", "ltc", "main"),
        "testnet": ChainParams("litecoin-testnet", "tltc", "test"),
        "regtest": ChainParams("litecoin-regtest", "rltc", "regtest"),
    },
}
URI_SCHEMES = {"BTC": "bitcoin", "LTC": "litecoin"}


class UtxoCoinConfig(XpubConfig, BlockScanConfig):
    xpub: Xpub = Field(description="Account extended public key (zpub/vpub/xpub/tpub). Never a private key.")
    branch: Literal[0] = Field(0, description="Receive addresses only: <xpub>/0/<n>.")
    network: Literal["mainnet", "testnet", "regtest"] = "mainnet"
    rpc_user: str | None = None
    rpc_password: SecretStr | None = None
    confirmations: int = Field(2, ge=0, le=100)
    start_block: int | None = Field(
        None, ge=0, validation_alias=AliasChoices("start_height"), description="First block scanned on the first run."
    )
    reorg_depth: int = Field(
        12, ge=1, le=10_000, description="Blocks rescanned when the cursor's block left the chain."
    )
    max_blocks_per_scan: int = Field(25, ge=1, le=1000)
    watch_mempool: bool = Field(True, description="Show unconfirmed payments (reads new mempool transactions).")
    timeout_seconds: float = Field(10, gt=0, le=120)
    push_timeout_seconds: float = Field(
        60, ge=1, le=3600, description="Time limit of one waitfornewblock long poll (one request this often when idle)."
    )
    notify_listen: str | None = Field(
        None,
        pattern=r"^[0-9A-Za-z.:\[\]-]+:[0-9]{1,5}$",
        description="host:port (UDP) the node's -walletnotify / -blocknotify command sends to: mempool payments "
        "are seen at once.",
    )
    watch_wallet: str = Field(
        "vpsshop",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="With notify_listen: the node's watch-only wallet that deposit addresses are imported into.",
    )


class LitecoinConfig(UtxoCoinConfig):
    confirmations: int = Field(6, ge=0, le=100)


class UtxoCoin(XpubCoin[UtxoCoinConfig], BlockCoin[UtxoCoinConfig, JsonRpcClient]):
    """A Bitcoin-family coin on a Bitcoin Core-compatible node. Subclasses set the class attributes."""

    Config: ClassVar[type[UtxoCoinConfig]] = UtxoCoinConfig
    decimals = 8
    trust_heights_above_tip = False  # one node: a block above its tip left the chain in a reorg

    def __init__(self, config: UtxoCoinConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.params = NETWORKS[self.code][config.network]
        self._mempool_done: set[str] = set()
        self._wallet: JsonRpcClient | None = None

    def connect(self, url: str) -> JsonRpcClient:
        cfg = self.config
        auth = (cfg.rpc_user, cfg.rpc_password.get_secret_value() if cfg.rpc_password else "") if cfg.rpc_user else None
        return JsonRpcClient(
            url, version="1.0", name=f"{self.code} node", timeout=cfg.timeout_seconds, auth=auth, decimal_floats=True
        )

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"xpub": SANDBOX_VPUB, "network": "testnet", "confirmations": 1}

    @property
    def network(self) -> str:
        return self.params.network_name

    def key_id(self) -> str:
        return f"{self.account.fingerprint().hex()}:{self.account.chain_code[:4].hex()}"

    def derive_address(self, index: int) -> DepositAddress:
        address = p2wpkh_address(self.params.hrp, self.receive.child(index).public_key)
        return DepositAddress(address, index, address)

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        amount = self.format_amount(amount_atomic).rstrip("0").rstrip(".")
        return f"{URI_SCHEMES[self.code]}:{address}?amount={amount}&label={label}"

    # ---- push ------------------------------------------------------------------------------------

    def wake_channel(self) -> AsyncIterator[str] | None:
        """``waitfornewblock`` long polls, and the datagrams of ``-walletnotify`` when
        ``notify_listen`` is set."""
        if self._client is None:
            return None
        channel = long_poll_wakes(*self._new_block_waiter())
        if self.config.notify_listen is None:
            return channel
        host, _, port = self.config.notify_listen.rpartition(":")
        wallet = self.config.watch_wallet.encode()

        def ours(datagram: bytes) -> bool:  # "<txid> <wallet>" from -walletnotify, "<hash>" from -blocknotify
            words = datagram.split()
            return len(words) < 2 or words[1] == wallet

        return merge_wakes(channel, datagram_wakes(host.strip("[]"), int(port), ours))

    @property
    def wake_sees_everything(self) -> bool:
        """Mempool payments wake the watcher only with ``notify_listen``; without it the coin is
        polled too (blocks still wake it at once)."""
        return self.config.notify_listen is not None or not self.config.watch_mempool

    def _new_block_waiter(self) -> tuple[Callable[[], Awaitable[bool]], Callable[[], Awaitable[None]]]:
        """(wait, connect) of :func:`long_poll_wakes`: ``waitfornewblock`` on a client of its own."""
        cfg = self.config
        assert cfg.rpc_url is not None
        client = self.connect(cfg.rpc_url)
        client.client.timeout = httpx.Timeout(cfg.push_timeout_seconds + cfg.timeout_seconds)
        best = [""]

        async def connect() -> None:
            try:
                if cfg.notify_listen is not None:  # a node that restarted has the watch wallet unloaded
                    await self._watch_wallet(load=True)
                best[0] = str(await client.call("getbestblockhash"))
            except BaseException:
                await client.close()
                raise

        async def new_block() -> bool:
            """True when the best block is not the one of the last answer (a block arrived)."""
            try:
                tip = await client.call("waitfornewblock", int(cfg.push_timeout_seconds * 1000))
            except BaseException:
                await client.close()
                raise
            moved = tip["hash"] != best[0]
            best[0] = tip["hash"]
            return bool(moved)

        return new_block, connect

    async def register_address(self, address: DepositAddress) -> None:
        """With ``notify_listen``: import the address, watch-only and without a rescan, into the
        node's wallet ``watch_wallet`` (so ``-walletnotify`` tells of its payments)."""
        if self.config.notify_listen is None or self._client is None:
            return
        wallet = await self._watch_wallet()
        request = {"scriptPubKey": {"address": address.address}, "timestamp": "now", "watchonly": True}
        try:
            answer = await wallet.call("importmulti", [request], {"rescan": False})
        except RpcError as exc:
            if "descriptor" not in str(exc).lower():
                raise
            checked = await self.node.call("getdescriptorinfo", f"addr({address.address})")
            answer = await wallet.call("importdescriptors", [{"desc": checked["descriptor"], "timestamp": "now"}])
        if not answer or not answer[0].get("success"):
            raise PluginError(f"{self.code} node did not import {address.address}: {answer}")

    async def _watch_wallet(self, load: bool = False) -> JsonRpcClient:
        name = self.config.watch_wallet
        if self._wallet is None or load:
            if name not in await self.node.call("listwallets"):
                try:
                    await self.node.call("loadwallet", name)
                except RpcError:
                    await self.node.call("createwallet", name, True, True)
            assert self.config.rpc_url is not None
            if self._wallet is None:
                self._wallet = self.connect(f"{self.config.rpc_url.rstrip('/')}/wallet/{name}")
        return self._wallet

    async def close(self) -> None:
        if self._wallet is not None:
            await self._wallet.close()
        await super().close()

    # ---- the chain ---------------------------------------------------------------------------------

    async def tip(self) -> int:
        return int(await self.node.call("getblockcount"))

    async def block_hash(self, height: int) -> str:
        return str(await self.node.call("getblockhash", height))

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        """``getblock <hash> 2`` per block, every output tested against the watched addresses."""
        found: list[tuple[str, DetectedPayment]] = []
        position = after
        for h in range(after.height + 1, last + 1):
            block_hash = await self.block_hash(h)
            block = await self.node.call("getblock", block_hash, 2)
            for tx in block["tx"]:
                found.extend((self.code, p) for p in self._match(tx, watched, tip - h + 1, h, block_hash))
            position = BlockCursor(h, block_hash)
        return position, found

    def _match(
        self, tx: dict[str, Any], watched: WatchSet, confirmations: int, height: int | None, block_hash: str | None
    ) -> Iterable[DetectedPayment]:
        for out in tx.get("vout", ()):
            script = out.get("scriptPubKey", {})
            address = script.get("address")
            if address is None:
                addresses: list[str] = script.get("addresses") or []
                address = addresses[0] if len(addresses) == 1 else None
            if address is None or address not in watched:
                continue
            amount = int((Decimal(out["value"]) * 10**self.decimals).to_integral_exact())
            yield DetectedPayment(
                f"{tx['txid']}:{out['n']}", address, amount, tx["txid"], confirmations, height, block_hash
            )

    async def scan_unconfirmed(
        self, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> list[tuple[str, DetectedPayment]]:
        """New mempool transactions (``getrawmempool`` + ``getrawtransaction``), each read once."""
        if not self.config.watch_mempool:
            return []
        txids = await self.node.call("getrawmempool")
        if len(self._mempool_done) > 200_000:
            self._mempool_done = set(self._mempool_done & set(txids))
        found: list[tuple[str, DetectedPayment]] = []
        for txid in txids:
            if txid in self._mempool_done:
                continue
            try:
                tx = await self.node.call("getrawtransaction", txid, True)
            except RpcError:
                continue  # left the mempool meanwhile
            self._mempool_done.add(txid)
            found.extend((self.code, p) for p in self._match(tx, watched, 0, None, None))
        return found

    async def recheck_moved(self, payment: DetectedPayment, tip: int) -> PaymentCheck:
        """Not (or no longer) in a block of the best chain: counted unconfirmed while in the mempool."""
        try:
            await self.node.call("getmempoolentry", payment.txid)
        except RpcError:
            return PaymentCheck(payment.identity, False)
        return PaymentCheck(payment.identity, True, 0, None, None)

    async def node_ready(self) -> str:
        info = await self.node.call("getblockchaininfo")
        if info.get("chain") != self.params.node_chain:
            raise ValueError(f"node is on chain {info.get('chain')!r}, settings say {self.params.node_chain!r}")
        return f"{self.network} at height {info.get('blocks')}"


class Bitcoin(UtxoCoin):
    code = "BTC"
    name = "Bitcoin"
    rate_symbol = "BTC"
    default_priority = 90


class Litecoin(UtxoCoin):
    code = "LTC"
    name = "Litecoin"
    rate_symbol = "LTC"
    default_priority = 50
    Config = LitecoinConfig


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[DepositCoin[Any]]]:
    return [Bitcoin, Litecoin]
