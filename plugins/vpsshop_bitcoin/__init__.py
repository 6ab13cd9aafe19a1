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

The sandbox uses the BIP-84 test vector's account key on testnet and no node: it hands out
addresses and QR codes and watches nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Iterable, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from vpsshop import PluginError, Readiness, hookimpl, require_reachable
from vpsshop import DepositAddress, DepositCoin, DetectedPayment, PaymentCheck, ScanResult, WatchSet
from vpsshop.hdkeys import ExtendedPublicKey, KeyError_, p2wpkh_address

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
MAX_BLOCKS_PER_SCAN = 25
REORG_STEP_BACK = 12
"""Blocks rescanned when the stored cursor's block left the best chain (rescans are idempotent)."""


class UtxoCoinConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    xpub: str = Field(description="Account extended public key (zpub/vpub/xpub/tpub). Never a private key.")
    network: Literal["mainnet", "testnet", "regtest"] = "mainnet"
    rpc_url: str | None = Field(None, description="JSON-RPC endpoint of the node; none: addresses only.")
    rpc_user: str | None = None
    rpc_password: SecretStr | None = None
    confirmations: int = Field(2, ge=0, le=100)
    start_height: int | None = Field(None, ge=0, description="First block scanned on the first run.")
    watch_mempool: bool = Field(True, description="Show unconfirmed payments (reads new mempool transactions).")
    timeout_seconds: float = Field(10, gt=0, le=120)

    @field_validator("xpub")
    @classmethod
    def _parse_xpub(cls, value: str) -> str:
        try:
            ExtendedPublicKey.parse(value)
        except KeyError_ as exc:
            raise ValueError(str(exc)) from None
        return value.strip()


class LitecoinConfig(UtxoCoinConfig):
    confirmations: int = Field(6, ge=0, le=100)


class NodeRpc:
    """A small JSON-RPC 1.0 client of bitcoind/litecoind; amounts come back as Decimal."""

    def __init__(self, url: str, user: str | None, password: str | None, timeout: float) -> None:
        auth = (user, password or "") if user else None
        self.client = httpx.AsyncClient(base_url=url, auth=auth, timeout=timeout)
        parsed = httpx.URL(url)
        self.url = f"{parsed.host}:{parsed.port or ''}"  # for messages: never the credentials of the URL
        self._id = 0

    async def call(self, method: str, *params: Any) -> Any:
        self._id += 1
        try:
            response = await self.client.post("", json={"jsonrpc": "1.0", "id": self._id, "method": method,
                                                        "params": list(params)})
        except httpx.HTTPError as exc:
            raise PluginError(f"node at {self.url} did not answer {method}: {type(exc).__name__}") from None
        try:
            body = json.loads(response.content, parse_float=Decimal)
        except ValueError:
            raise PluginError(f"node answered {method} with HTTP {response.status_code}, not JSON") from None
        if body.get("error"):
            raise RpcError(method, body["error"])
        return body["result"]

    async def close(self) -> None:
        await self.client.aclose()


class RpcError(PluginError):
    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method}: {error.get('message')} (code {error.get('code')})")
        self.code = error.get("code")


class UtxoCoin(DepositCoin):
    """A Bitcoin-family coin on a Bitcoin Core-compatible node. Subclasses set the class attributes."""

    Config: ClassVar[type[BaseModel]] = UtxoCoinConfig
    decimals = 8

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        cfg: UtxoCoinConfig = config  # type: ignore[assignment]
        self.params = NETWORKS[self.code][cfg.network]
        self.account = ExtendedPublicKey.parse(cfg.xpub)
        self.receive = self.account.child(0)
        self.rpc = NodeRpc(cfg.rpc_url, cfg.rpc_user, cfg.rpc_password.get_secret_value()
                           if cfg.rpc_password else None, cfg.timeout_seconds) if cfg.rpc_url else None
        self._mempool_done: set[str] = set()

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"xpub": SANDBOX_VPUB, "network": "testnet", "confirmations": 1}

    @property
    def network(self) -> str:
        return self.params.network_name

    @property
    def can_scan(self) -> bool:
        return self.rpc is not None

    def key_id(self) -> str:
        return f"{self.account.fingerprint().hex()}:{self.account.chain_code[:4].hex()}"

    def derive_address(self, index: int) -> DepositAddress:
        address = p2wpkh_address(self.params.hrp, self.receive.child(index).public_key)
        return DepositAddress(address, index, address)

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        amount = self.format_amount(amount_atomic).rstrip("0").rstrip(".")
        return f"{URI_SCHEMES[self.code]}:{address}?amount={amount}&label={label}"

    # ---- watching ---------------------------------------------------------------------------------

    def _node(self) -> NodeRpc:
        if self.rpc is None:
            raise PluginError(f"{self.code}: no rpc_url is configured")
        return self.rpc

    async def scan(self, cursor: str | None, watched: WatchSet) -> ScanResult:
        node = self._node()
        tip = int(await node.call("getblockcount"))
        if cursor is None:
            start = self.config.start_height if self.config.start_height is not None else tip  # type: ignore[attr-defined]
            height = max(start - 1, -1)
            block_hash = await node.call("getblockhash", height) if height >= 0 else ""
        else:
            height_text, block_hash = cursor.split(":", 1)
            height = int(height_text)
            if height > tip or (height >= 0 and await node.call("getblockhash", height) != block_hash):
                height = max(min(height, tip) - REORG_STEP_BACK, -1)
                block_hash = await node.call("getblockhash", height) if height >= 0 else ""
        found: list[tuple[str, DetectedPayment]] = []
        last = min(tip, height + MAX_BLOCKS_PER_SCAN)
        for h in range(height + 1, last + 1):
            block_hash = await node.call("getblockhash", h)
            block = await node.call("getblock", block_hash, 2)
            for tx in block["tx"]:
                for payment in self._match(tx, watched, tip - h + 1, h, block_hash):
                    found.append((self.code, payment))
            height = h
        if height == tip and self.config.watch_mempool:  # type: ignore[attr-defined]
            found.extend((self.code, p) for p in await self._scan_mempool(watched))
        new_cursor = f"{height}:{block_hash}"
        return ScanResult(new_cursor, found)

    def _match(self, tx: dict[str, Any], watched: WatchSet, confirmations: int, height: int | None,
               block_hash: str | None) -> Iterable[DetectedPayment]:
        for out in tx.get("vout", ()):
            script = out.get("scriptPubKey", {})
            address = script.get("address")
            if address is None:
                addresses = script.get("addresses") or ()
                address = addresses[0] if len(addresses) == 1 else None
            if address is None or address not in watched:
                continue
            amount = int((Decimal(out["value"]) * 10**self.decimals).to_integral_exact())
            yield DetectedPayment(f"{tx['txid']}:{out['n']}", address, amount, tx["txid"], confirmations, height,
                                  block_hash)

    async def _scan_mempool(self, watched: WatchSet) -> list[DetectedPayment]:
        node = self._node()
        txids = await node.call("getrawmempool")
        if len(self._mempool_done) > 200_000:
            self._mempool_done = set(self._mempool_done & set(txids))
        found = []
        for txid in txids:
            if txid in self._mempool_done:
                continue
            try:
                tx = await node.call("getrawtransaction", txid, True)
            except RpcError:
                continue  # left the mempool meanwhile
            self._mempool_done.add(txid)
            found.extend(self._match(tx, watched, 0, None, None))
        return found

    async def recheck(self, payments: list[DetectedPayment]) -> list[PaymentCheck]:
        node = self._node()
        tip = int(await node.call("getblockcount"))
        checks = []
        for payment in payments:
            if payment.block_hash:
                header = await node.call("getblockheader", payment.block_hash)
                if int(header["confirmations"]) > 0:
                    checks.append(PaymentCheck(payment.identity, True, tip - int(header["height"]) + 1,
                                               int(header["height"]), payment.block_hash))
                    continue
            try:
                await node.call("getmempoolentry", payment.txid)
            except RpcError:
                checks.append(PaymentCheck(payment.identity, False))
                continue
            checks.append(PaymentCheck(payment.identity, True, 0, None, None))
        return checks

    async def preflight(self) -> None:
        """Production refuses to start when the configured node does not answer at all."""
        url = self.config.rpc_url  # type: ignore[attr-defined]
        if url:
            await require_reachable(url, setting=f"coins.{self.code}.rpc_url", what=f"{self.code} node")

    async def check_ready(self) -> Readiness:
        if self.rpc is None:
            return Readiness(True, f"{self.network}: addresses only, no node configured (not watched)")
        try:
            info = await self.rpc.call("getblockchaininfo")
        except PluginError as exc:
            return Readiness(False, str(exc))
        if info.get("chain") != self.params.node_chain:
            return Readiness(False, f"node is on chain {info.get('chain')!r}, settings say {self.params.node_chain!r}")
        return Readiness(True, f"{self.network} at height {info.get('blocks')}")

    async def close(self) -> None:
        if self.rpc is not None:
            await self.rpc.close()


class Bitcoin(UtxoCoin):
    code = "BTC"
    name = "Bitcoin"
    rate_symbol = "BTC"


class Litecoin(UtxoCoin):
    code = "LTC"
    name = "Litecoin"
    rate_symbol = "LTC"
    Config = LitecoinConfig


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[DepositCoin]]:
    return [Bitcoin, Litecoin]
