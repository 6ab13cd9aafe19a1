"""XMR deposits through ``monero-wallet-rpc`` on a view-only wallet: one subaddress per top-up.

The reseller runs ``monero-wallet-rpc`` with a *view-only* wallet (made from the primary address
and the secret view key: ``monero-wallet-cli --generate-from-view-key``), so the server can see
incoming payments but never spend. Top-up number *n* pays subaddress ``(0, n)``, derived locally
(:mod:`vpsshop_monero.addresses`) and checked against the wallet's own ``get_address`` when it is
registered. The wallet scans the blocks; the plugin reads its incoming transfers once per pass
(``get_transfers`` from the cursor height, pool included) and keeps those whose subaddress index
is watched. Index 0 (the primary address, where the reseller's own change lands) is never watched.

Settings ``[coins.XMR]``::

    address = "4..."                 # primary address of the wallet
    view_key = "..."                 # secret view key (64 hex digits): sees payments, cannot spend
    network = "mainnet"              # mainnet, stagenet, testnet, or regtest (mainnet addresses)
    wallet_rpc_url = "http://127.0.0.1:18083/json_rpc"
    rpc_user = "..."                 # when monero-wallet-rpc runs with --rpc-login
    rpc_password = "..."
    confirmations = 10
    zmq_pub = "tcp://127.0.0.1:18084"  # optional: monerod's --zmq-pub; a pass when a block or pool tx arrives

With ``zmq_pub`` the watcher follows monerod's ZMQ publisher (``json-minimal-txpool_add`` and
``json-minimal-chain_main``): a payment is seen the moment it reaches monerod's pool and credited
the moment its last confirmation is mined; without it, or while it is down, the wallet is polled.

The sandbox uses a public stagenet test wallet (keys below) and no wallet RPC.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from decimal import Decimal
from typing import Any, ClassVar, Literal

import httpx
from pydantic import AliasChoices, Field, SecretStr, model_validator

from vpsshop import (
    DepositAddress,
    DepositCoin,
    DetectedPayment,
    PaymentCheck,
    PluginError,
    ScanResult,
    WatchSet,
    hookimpl,
)
from vpsshop.chains import JsonRpcClient, NodeCoin, NodeConfig, RpcError, zmq_sub_wakes
from vpsshop_monero.addresses import MoneroKeyError, ViewWallet

# A stagenet wallet made for the sandbox from the published seed text
# "vpsshop sandbox: public test wallet, never send real funds" (spend key = Hs(text)): public keys.
SANDBOX_ADDRESS = "59x87tTBFSVGC1igPsoBAci1Zr39cAfZNGQKHDT2wi7pT2j5HFi48HhSoCQ5EakoWC5tC2st6tQbsRzrdhkGQ7xoJZq1VVM"
SANDBOX_VIEW_KEY = "14e73c28e8a94403146b0d6dfdeae0b6c8fa517c3a640c188d95d00f5f73bc0a"
NETWORK_NAMES = {
    "mainnet": "monero",
    "stagenet": "monero-stagenet",
    "testnet": "monero-testnet",
    "regtest": "monero-regtest",
}
REORG_MARGIN = 10
"""Blocks below the cursor re-read each scan, so a transfer moved by a short reorg is seen again."""


class MoneroConfig(NodeConfig):
    address: str = Field(description="Primary address of the view-only wallet.")
    view_key: SecretStr = Field(description="Secret view key, 64 hex digits. Cannot spend.")
    network: Literal["mainnet", "stagenet", "testnet", "regtest"] = "mainnet"
    rpc_url: str | None = Field(
        None,
        validation_alias=AliasChoices("wallet_rpc_url"),
        description="monero-wallet-rpc JSON-RPC URL (…/json_rpc).",
    )
    rpc_user: str | None = None
    rpc_password: SecretStr | None = None
    account_index: int = Field(0, ge=0, description="Wallet account whose subaddresses are handed out.")
    confirmations: int = Field(10, ge=0, le=1000)
    timeout_seconds: float = Field(20, gt=0, le=300)
    zmq_pub: str | None = Field(
        None,
        pattern=r"^tcp://[^/]+:[0-9]{1,5}$",
        description="monerod's ZMQ publisher (its --zmq-pub): blocks and pool transactions wake the watcher.",
    )
    pool_poll_seconds: float = Field(
        0.5,
        ge=0,
        le=60,
        description="While an XMR top-up is open, ask the wallet for pool payments this often (0: never): monerod "
        "publishes a transaction only once Dandelion++ has fluffed it, which can be a minute after it arrived.",
    )

    @model_validator(mode="after")
    def _check_keys(self) -> MoneroConfig:
        try:
            wallet = ViewWallet(self.address, self.view_key.get_secret_value())
        except MoneroKeyError as exc:
            raise ValueError(str(exc)) from None
        expected = "mainnet" if self.network == "regtest" else self.network
        if wallet.network != expected:
            raise ValueError(f"the address is a {wallet.network} address but network is {self.network!r}")
        return self


class Monero(NodeCoin[MoneroConfig, JsonRpcClient]):
    """XMR on a view-only monero-wallet-rpc."""

    code = "XMR"
    name = "Monero"
    decimals = 12
    rate_symbol = "XMR"
    default_priority = 80
    Config: ClassVar[type[MoneroConfig]] = MoneroConfig
    node_name = "monero-wallet-rpc"
    node_what = "monero-wallet-rpc"
    node_setting = "wallet_rpc_url"
    standing_addresses = True
    """A standing XMR address is subaddress ``(account_index + 1, n)``: an account of its own beside the
    top-ups' (docs/payments.md, "Standing deposit addresses"), its watch key ``"<account>/<n>"``."""

    def __init__(self, config: MoneroConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.cfg = config
        self.wallet = ViewWallet(config.address, config.view_key.get_secret_value())

    def connect(self, url: str) -> JsonRpcClient:
        cfg = self.config
        auth = (
            httpx.DigestAuth(cfg.rpc_user, cfg.rpc_password.get_secret_value() if cfg.rpc_password else "")
            if cfg.rpc_user
            else None
        )
        return JsonRpcClient(url, named=True, name=self.node_name, timeout=cfg.timeout_seconds, auth=auth)

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"address": SANDBOX_ADDRESS, "view_key": SANDBOX_VIEW_KEY, "network": "stagenet", "confirmations": 1}

    @property
    def network(self) -> str:
        return NETWORK_NAMES[self.cfg.network]

    def key_id(self) -> str:
        return f"{self.cfg.address[:12]}:{self.cfg.account_index}"

    def derive_address(self, index: int) -> DepositAddress:
        if index < 1:
            raise ValueError("subaddress 0 is the primary address; top-ups start at 1")
        return DepositAddress(self.wallet.subaddress(index, self.cfg.account_index), index, str(index))

    @property
    def standing_account(self) -> int:
        """The wallet account whose subaddresses are standing deposit addresses."""
        return self.cfg.account_index + 1

    def derive_standing_address(self, number: int) -> DepositAddress:
        """Subaddress ``(account_index + 1, number)``: Monero indices are 32-bit per account, so a
        standing address gets an account of its own rather than an index range."""
        if number < 1:
            raise ValueError("standing addresses are numbered from 1")
        account = self.standing_account
        return DepositAddress(self.wallet.subaddress(number, account), number, f"{account}/{number}")

    def _watch_key(self, major: int, minor: int) -> str | None:
        if major == self.cfg.account_index:
            return str(minor)
        if major == self.standing_account:
            return f"{major}/{minor}"
        return None

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        amount = self.format_amount(amount_atomic).rstrip("0").rstrip(".")
        return f"monero:{address}?tx_amount={amount}&tx_description={label}"

    async def register_address(self, address: DepositAddress) -> None:
        """Make the wallet's subaddress table reach ``address.index`` (in the standing account for a
        standing address, made first if the wallet has no such account yet) and check it agrees."""
        rpc = self.node
        account = self.cfg.account_index
        if "/" in address.watch_key:
            account = self.standing_account
            while len((await rpc.call("get_accounts")).get("subaddress_accounts", [])) <= account:
                await rpc.call("create_account", label="vpsshop standing deposits")
        while True:
            current = await rpc.call("get_address", account_index=account)
            known = max(int(a["address_index"]) for a in current.get("addresses", [{"address_index": 0}]))
            if known >= address.index:
                break
            await rpc.call("create_address", account_index=account, count=min(address.index - known, 64))
        answer = await rpc.call("get_address", account_index=account, address_index=[address.index])
        theirs = answer["addresses"][0]["address"]
        if theirs != address.address:
            raise PluginError(
                f"XMR: the wallet's subaddress {address.index} differs from the derived one: the configured "
                "address/view_key do not match the wallet behind wallet_rpc_url"
            )

    def wake_channel(self) -> AsyncIterator[str] | None:
        """monerod's ZMQ publisher (``zmq_pub``): new pool transactions and new blocks."""
        if self._client is None or self.cfg.zmq_pub is None:
            return None
        return zmq_sub_wakes(self.cfg.zmq_pub, ("json-minimal-txpool_add", "json-minimal-chain_main"))

    @property
    def pending_poll_seconds(self) -> float | None:
        """``pool_poll_seconds`` while a top-up is open: a payment in monerod's pool is seen within it,
        stem phase or not (the wallet reads the pool from its own, unrestricted, node)."""
        if self._client is None or not self.cfg.pool_poll_seconds:
            return None
        return self.cfg.pool_poll_seconds

    @property
    def wake_sees_everything(self) -> bool:
        """monerod publishes blocks, and pool transactions once they are fluffed; one still in its
        stem phase is seen by the pool poll while a top-up is open (``pool_poll_seconds``), or with
        its block. With the pool poll off, the wallet is polled every watch interval as well."""
        return bool(self.cfg.pool_poll_seconds)

    async def scan(self, cursor: str | None, watched: WatchSet, members: Sequence[DepositCoin[Any]] = ()) -> ScanResult:
        rpc = self.node
        try:
            await rpc.call("refresh")
        except RpcError:
            pass  # a refresh already running: get_transfers still answers from what is scanned
        height = int((await rpc.call("get_height"))["height"])
        start = int(cursor) if cursor is not None else height
        answer = await rpc.call(
            "get_transfers",
            **{"in": True, "pool": True},
            all_accounts=True,  # the top-ups' account and the standing addresses' (account_index + 1)
            filter_by_height=True,
            min_height=max(start - REORG_MARGIN, 0),
            max_height=height + 1_000_000,
        )
        found = []
        for kind in ("in", "pool"):
            for transfer in answer.get(kind, ()):
                payment = self._payment(transfer, watched)
                if payment is not None:
                    found.append((self.code, payment))
        return ScanResult(str(height), found)

    def _payment(self, transfer: dict[str, Any], watched: WatchSet) -> DetectedPayment | None:
        index = transfer.get("subaddr_index") or {}
        key = self._watch_key(int(index.get("major", -1)), int(index.get("minor", -1)))
        if key is None or key not in watched or transfer.get("type") not in ("in", "pool"):
            return None
        txid = transfer["txid"]
        height = int(transfer.get("height") or 0) or None
        return DetectedPayment(
            identity=f"{txid}:{index['major']}:{index['minor']}",
            watch_key=key,
            amount_atomic=int(transfer["amount"]),
            txid=txid,
            confirmations=int(transfer.get("confirmations") or 0) if height else 0,
            block_height=height,
        )

    async def recheck(self, payments: list[DetectedPayment]) -> list[PaymentCheck]:
        rpc = self.node
        checks = []
        for payment in payments:
            _, major, minor = payment.identity.split(":")
            try:
                answer = await rpc.call("get_transfer_by_txid", txid=payment.txid, account_index=int(major))
            except RpcError:
                checks.append(PaymentCheck(payment.identity, False))
                continue
            transfers = answer.get("transfers") or [answer.get("transfer", {})]
            mine = [
                t
                for t in transfers
                if str((t.get("subaddr_index") or {}).get("minor")) == minor and t.get("type") in ("in", "pool")
            ]
            if not mine:
                checks.append(PaymentCheck(payment.identity, False))
                continue
            t = mine[0]
            height = int(t.get("height") or 0) or None
            checks.append(
                PaymentCheck(payment.identity, True, int(t.get("confirmations") or 0) if height else 0, height, None)
            )
        return checks

    async def node_ready(self) -> str:
        height = await self.node.call("get_height")
        primary = await self.node.call("get_address", account_index=0, address_index=[0])
        if primary["addresses"][0]["address"] != self.cfg.address:
            raise PluginError("the wallet behind wallet_rpc_url is not the configured address")
        return f"{self.network} wallet at height {height.get('height')}"


def xmr_to_atomic(amount: str | Decimal) -> int:
    return int((Decimal(amount) * 10**12).to_integral_exact())


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[DepositCoin[Any]]]:
    return [Monero]
