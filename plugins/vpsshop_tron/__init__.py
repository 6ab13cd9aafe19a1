"""TRX and USDT (TRC-20, coin code USDTTRC) deposits through the HTTP API of a TRON full node.

Deposit addresses are derived watch-only from the reseller's account extended public key of the BIP-44
TRON path (``m/44'/195'/0'``, the key TronLink and Ledger derive their accounts from): top-up number *n*
of TRX pays ``<account>/0/n``, of USDTTRC ``<account>/1/n`` (the ``branch`` setting), so the two coins
never hand out the same address. A TRON address is ``0x41`` followed by the last 20 bytes of the
Keccak-256 of the uncompressed public key, shown in base58check (``T...``); the watch key is its
lower-case hex form (``41...``), which is how the node's JSON names addresses.

Detection reads, for each new block, two endpoints every java-tron full node serves over HTTP (and
TronGrid, which fronts java-tron, serves the same):

* ``POST /wallet/getblockbynum {"num": n}``: the block with its transactions; a ``TransferContract``
  whose ``to_address`` is watched and whose ``ret[0].contractRet`` is ``SUCCESS`` is a TRX deposit
  (identity: the transaction id);
* ``POST /wallet/gettransactioninfobyblocknum {"num": n}``: the execution results of the block's
  transactions with their event logs; a ``Transfer(address,address,uint256)`` log emitted by the token
  contract to a watched address, in a transaction whose ``receipt.result`` is ``SUCCESS``, is a token
  deposit (identity: ``<transaction id>:<index of the log in the transaction>``). Reading logs rather
  than decoding ``TriggerSmartContract`` call data also finds ``transferFrom`` and batched payouts.

``POST /wallet/getnowblock`` gives the tip. The event API (``/v1/contracts/{contract}/events``) is not
used: it is served by TronGrid's event service, not by a plain java-tron node. The cursor is
``<height>:<blockID>``; reorganisations (TRON's are short: blocks are irreversible after 19 witnesses
confirm them) are handled like the EVM plugin: step back ``reorg_depth`` blocks when the cursor's block
changed, require each block's ``parentHash`` to be the previous ``blockID``, and drop a payment whose
block left the chain (a rescan finds it again if it was mined again).

Settings ``[coins.TRX]``::

    xpub = "xpub6..."           # account key m/44'/195'/0'; public only
    network = "tron"            # tron (mainnet), nile, shasta
    api_url = "http://127.0.0.1:8090/"   # java-tron HTTP API, or https://api.trongrid.io/
    api_key = "..."             # optional TRON-PRO-API-KEY header (TronGrid)
    confirmations = 20

``[coins.USDTTRC]``: the same, plus ``contract = "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t"`` (mainnet USDT,
the default on network "tron") and ``decimals = 6``. The sandbox uses the account key of the test
mnemonic "abandon ... about" on Nile and no node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any, ClassVar

from bip_utils import TrxAddrDecoder, TrxAddrEncoder
from pydantic import AliasChoices, Field, SecretStr, model_validator

from vpsshop import DepositAddress, DepositCoin, DetectedPayment, PluginError, WatchSet, hookimpl
from vpsshop.chains import (
    BlockCoin,
    BlockCursor,
    BlockScanConfig,
    HttpJsonClient,
    RpcError,
    XpubCoin,
    XpubConfig,
    b58check_encode,
    endpoint_id,
)

# Account key m/44'/195'/0' of the test mnemonic "abandon x11 about": public and useless for real money.
# Address 0 is TUEZSdKsoDHQMeZwihtdoBiN46zxhGWYdH.
SANDBOX_XPUB = (
    "xpub6D1AabNHCupeiLM65ZR9UStMhJ1vCpyV4XbZdyhMZBiJXALQtmn9p42VTQckoHVn8WNqS7dqnJokZHAHcHGoaQgmv8D45oNUKx6DZMNZBCd"
)
USDT_CONTRACTS = {
    "tron": "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t",
    "nile": "TXYZopYRdj2D9XRtbG411XZZ3kM5VkAeBf",
}
TRANSFER_TOPIC = "ddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
"""keccak256("Transfer(address,address,uint256)"), as java-tron prints topics (no 0x)."""


def public_key_to_address(uncompressed: bytes) -> str:
    """The base58check TRON address (``T...``) of a 65-byte uncompressed secp256k1 public key
    (bip-utils' encoder)."""
    address: str = TrxAddrEncoder.EncodeKey(uncompressed)
    return address


def address_to_hex(address: str) -> str:
    """``T...`` to the node's hex form ``41...`` (lower case). :raises ValueError: not a TRON address."""
    try:
        account: bytes = TrxAddrDecoder.DecodeAddr(address.strip())
    except ValueError as exc:  # bad base58, checksum, length or prefix (not 0x41)
        raise ValueError(f"not a TRON address: {exc}") from None
    return "41" + account.hex()


def hex_to_address(hex_address: str) -> str:
    return b58check_encode(bytes.fromhex(hex_address))


class TronCoinConfig(XpubConfig, BlockScanConfig):
    network: str = Field("tron", pattern=r"^[a-z0-9][a-z0-9-]{0,39}$", description="tron (mainnet), nile, shasta.")
    rpc_url: str | None = Field(
        None,
        validation_alias=AliasChoices("api_url"),
        description="HTTP API of a java-tron full node (or TronGrid); none: addresses only.",
    )
    api_key: SecretStr | None = Field(None, description="Sent as TRON-PRO-API-KEY (TronGrid).")
    confirmations: int = Field(20, ge=0, le=1000)
    reorg_depth: int = Field(30, ge=1, le=10_000)
    max_blocks_per_scan: int = Field(20, ge=1, le=1000)


class TronTokenConfig(TronCoinConfig):
    branch: int = Field(1, ge=0, lt=2**31, description="Derivation branch; differs from TRX's so no address is shared.")
    contract: str | None = Field(None, description="TRC-20 contract (T...); default: USDT on tron and nile.")
    decimals: int = Field(6, ge=0, le=36)

    @model_validator(mode="after")
    def _contract(self) -> TronTokenConfig:
        if self.contract is None:
            if self.network not in USDT_CONTRACTS:
                raise ValueError(f"set contract: no default USDT contract on network {self.network!r}")
            self.contract = USDT_CONTRACTS[self.network]
        address_to_hex(self.contract)
        return self


class TronApi(HttpJsonClient):
    """A client of the java-tron HTTP API (``/wallet/...``): JSON bodies, hex addresses."""

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        answer = await self.post_json(body or {}, path=path)
        if answer is None:
            return {}
        if isinstance(answer, dict) and "Error" in answer:
            raise RpcError(path, answer["Error"])
        return answer

    async def block(self, number: int) -> dict[str, Any] | None:
        answer = await self.post("/wallet/getblockbynum", {"num": number})
        return answer if isinstance(answer, dict) and answer.get("blockID") else None


def block_number(block: dict[str, Any]) -> int:
    return int(block["block_header"]["raw_data"].get("number", 0))


class TronCoin(XpubCoin[TronCoinConfig], BlockCoin[TronCoinConfig, TronApi]):
    """TRX or a TRC-20 token on one TRON node."""

    Config: ClassVar[type[TronCoinConfig]] = TronCoinConfig
    decimals = 6
    is_token: ClassVar[bool] = False
    node_name = "TRON node"
    node_setting = "api_url"

    def connect(self, url: str) -> TronApi:
        key = self.config.api_key.get_secret_value() if self.config.api_key else None
        return TronApi(
            url.rstrip("/"),
            name=self.node_name,
            timeout=self.config.timeout_seconds,
            headers={"TRON-PRO-API-KEY": key} if key else None,
        )

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"xpub": SANDBOX_XPUB, "network": "nile", "confirmations": 1}

    @property
    def network(self) -> str:
        return self.config.network

    @property
    def scan_group(self) -> str:
        """``tron:<hash of the API URL>``: one scan per node, without the URL's secrets (fits 40 characters)."""
        return f"tron:{endpoint_id(self.config.rpc_url)}" if self.config.rpc_url else self.code

    def derive_address(self, index: int) -> DepositAddress:
        address = public_key_to_address(self.receive.child(index).uncompressed())
        return DepositAddress(address, index, address_to_hex(address))

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """``tron:<address>?amount=<TRX>`` (TronLink, Trust Wallet)."""
        return f"tron:{address}?amount={_plain(amount_atomic, self.decimals)}"

    # ---- the chain ----------------------------------------------------------------------------------

    async def tip(self) -> int:
        now = await self.node.post("/wallet/getnowblock")
        if not isinstance(now, dict) or "block_header" not in now:
            raise PluginError("TRON node answered getnowblock without a block")
        return block_number(now)

    async def block_hash(self, height: int) -> str:
        block = await self.node.block(height)
        return str(block["blockID"]) if block else ""

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        """Block by block: ``getblockbynum`` for TRX transfers, ``gettransactioninfobyblocknum`` for
        token logs; stops before a block whose parent is not the previous block."""
        native = next((c for c in members if isinstance(c, TronCoin) and not c.is_token), None)
        tokens = {c.contract_hex: c for c in members if isinstance(c, TronToken)}
        found: list[tuple[str, DetectedPayment]] = []
        position = after
        for h in range(after.height + 1, last + 1):
            block = await self.node.block(h)
            if block is None or (
                position.hash and block["block_header"]["raw_data"].get("parentHash") != position.hash
            ):
                break  # the chain moved while we read it: stop here, the next call checks the cursor
            confirmations = tip - h + 1
            if native is not None:
                found.extend((native.code, p) for p in match_trx_transfers(block, watched, confirmations))
            if tokens:
                infos = await self.node.post("/wallet/gettransactioninfobyblocknum", {"num": h})
                found.extend(match_token_logs(infos, block, watched, tokens, confirmations))
            position = BlockCursor(h, block["blockID"])
        return position, found

    async def node_ready(self) -> str:
        return f"{self.network} at block {await self.tip()}"


class TronToken(TronCoin):
    """A TRC-20 token: contract and decimals are settings."""

    Config: ClassVar[type[TronCoinConfig]] = TronTokenConfig
    config: TronTokenConfig
    is_token: ClassVar[bool] = True

    def __init__(self, config: TronTokenConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.decimals = config.decimals
        self.contract: str = config.contract or ""
        self.contract_hex = address_to_hex(self.contract)

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """``tron:<address>?token=<contract>&amount=<units>``."""
        return f"tron:{address}?token={self.contract}&amount={_plain(amount_atomic, self.decimals)}"


def _plain(amount_atomic: int, decimals: int) -> str:
    text = format(Decimal(amount_atomic).scaleb(-decimals), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def match_trx_transfers(block: dict[str, Any], watched: WatchSet, confirmations: int) -> list[DetectedPayment]:
    """Successful ``TransferContract`` transactions of ``block`` to watched addresses."""
    found = []
    h = block_number(block)
    for tx in block.get("transactions") or ():
        contracts: list[dict[str, Any]] = tx.get("raw_data", {}).get("contract") or []
        if len(contracts) != 1 or contracts[0].get("type") != "TransferContract":
            continue
        ret = (tx.get("ret") or [{}])[0]
        if ret.get("contractRet", "SUCCESS") != "SUCCESS":
            continue
        value = contracts[0].get("parameter", {}).get("value", {})
        to = str(value.get("to_address", "")).lower()
        amount = int(value.get("amount", 0))
        if amount > 0 and to in watched:
            found.append(DetectedPayment(tx["txID"], to, amount, tx["txID"], confirmations, h, block["blockID"]))
    return found


def match_token_logs(
    infos: Any, block: dict[str, Any], watched: WatchSet, tokens: dict[str, TronToken], confirmations: int
) -> list[tuple[str, DetectedPayment]]:
    """TRC-20 ``Transfer`` logs to watched addresses in a block's transaction infos."""
    if isinstance(infos, dict):  # java-tron answers {} for a block without transactions
        infos = infos.get("transactionInfo") or []
    h = block_number(block)
    found = []
    for info in infos or ():
        if int(info.get("blockNumber", h)) != h:
            continue
        if (info.get("receipt") or {}).get("result", "SUCCESS") != "SUCCESS" or info.get("result") == "FAILED":
            continue
        for index, log in enumerate(info.get("log") or ()):
            topics: list[str] = log.get("topics") or []
            if len(topics) != 3 or topics[0].lower().removeprefix("0x") != TRANSFER_TOPIC:
                continue
            token = tokens.get("41" + str(log.get("address", "")).lower().removeprefix("0x")[-40:])
            if token is None:
                continue
            to = "41" + topics[2].lower()[-40:]
            if to not in watched:
                continue
            amount = int(log.get("data") or "0", 16)
            if amount > 0:
                identity = f"{info['id']}:{index}"
                found.append(
                    (token.code, DetectedPayment(identity, to, amount, info["id"], confirmations, h, block["blockID"]))
                )
    return found


class Tronix(TronCoin):
    code = "TRX"
    name = "TRON"
    rate_symbol = "TRX"
    default_priority = 40


class TetherTrc20(TronToken):
    code = "USDTTRC"
    name = "Tether USD (TRC-20)"
    rate_symbol = "USDT"
    decimals = 6
    default_priority = 60


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[DepositCoin[Any]]]:
    return [Tronix, TetherTrc20]
