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

import hashlib
import json
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
from Crypto.Hash import keccak
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

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
from vpsshop.hdkeys import ExtendedPublicKey, KeyError_, b58check_decode, b58check_encode

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


def endpoint_label(url: str) -> str:
    """``scheme://host:port`` of a node URL, for messages and logs (never its path or query)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}"


def endpoint_id(url: str) -> str:
    """A short, stable, non-secret identifier of a node URL (scan group names are stored and logged)."""
    return hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]


def public_key_to_address(uncompressed: bytes) -> str:
    """The base58check TRON address (``T...``) of a 65-byte uncompressed secp256k1 public key."""
    if len(uncompressed) != 65 or uncompressed[0] != 4:
        raise ValueError("expected a 65-byte uncompressed public key")
    return b58check_encode(b"\x41" + keccak.new(digest_bits=256, data=uncompressed[1:]).digest()[-20:])


def address_to_hex(address: str) -> str:
    """``T...`` to the node's hex form ``41...`` (lower case). :raises ValueError: not a TRON address."""
    try:
        raw = b58check_decode(address.strip())
    except KeyError_ as exc:
        raise ValueError(f"not a TRON address: {exc}") from None
    if len(raw) != 21 or raw[0] != 0x41:
        raise ValueError("not a TRON address (0x41 prefix, 20 bytes)")
    return raw.hex()


def hex_to_address(hex_address: str) -> str:
    return b58check_encode(bytes.fromhex(hex_address))


class TronCoinConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    xpub: str = Field(description="Account extended public key of m/44'/195'/<account>'. Never a private key.")
    branch: int = Field(0, ge=0, lt=2**31, description="Derivation branch under the account key: <xpub>/<branch>/<n>.")
    network: str = Field("tron", pattern=r"^[a-z0-9][a-z0-9-]{0,39}$", description="tron (mainnet), nile, shasta.")
    api_url: str | None = Field(None, description="HTTP API of a java-tron full node (or TronGrid); none: addresses only.")
    api_key: SecretStr | None = Field(None, description="Sent as TRON-PRO-API-KEY (TronGrid).")
    confirmations: int = Field(20, ge=0, le=1000)
    start_block: int | None = Field(None, ge=0, description="First block scanned on the first run.")
    reorg_depth: int = Field(30, ge=1, le=10_000)
    max_blocks_per_scan: int = Field(20, ge=1, le=1000)
    timeout_seconds: float = Field(15, gt=0, le=300)

    @field_validator("xpub")
    @classmethod
    def _parse_xpub(cls, value: str) -> str:
        try:
            ExtendedPublicKey.parse(value)
        except KeyError_ as exc:
            raise ValueError(str(exc)) from None
        return value.strip()


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


class TronApi:
    """A client of the java-tron HTTP API (``/wallet/...``): JSON bodies, hex addresses."""

    def __init__(self, url: str, api_key: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.where = endpoint_label(url)
        """Scheme, host and port only: the path or query of a provider URL may hold an API key."""
        headers = {"TRON-PRO-API-KEY": api_key} if api_key else {}
        self.client = httpx.AsyncClient(timeout=timeout, headers=headers)

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = await self.client.post(f"{self.url}{path}", json=body or {})
        except httpx.HTTPError as exc:
            raise PluginError(f"TRON node at {self.where} did not answer {path}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise PluginError(f"TRON node answered {path} with HTTP {response.status_code}")
        try:
            answer = json.loads(response.content) if response.content.strip() else {}
        except ValueError:
            raise PluginError(f"TRON node answered {path} with something that is not JSON") from None
        if isinstance(answer, dict) and "Error" in answer:
            raise PluginError(f"{path}: {answer['Error']}")
        return answer

    async def block(self, number: int) -> dict[str, Any] | None:
        answer = await self.post("/wallet/getblockbynum", {"num": number})
        return answer if isinstance(answer, dict) and answer.get("blockID") else None

    async def close(self) -> None:
        await self.client.aclose()


def block_number(block: dict[str, Any]) -> int:
    return int(block["block_header"]["raw_data"].get("number", 0))




class TronCoin(DepositCoin):
    """TRX or a TRC-20 token on one TRON node."""

    Config: ClassVar[type[BaseModel]] = TronCoinConfig
    decimals = 6
    is_token: ClassVar[bool] = False

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        cfg: TronCoinConfig = config  # type: ignore[assignment]
        self.cfg = cfg
        self.account = ExtendedPublicKey.parse(cfg.xpub)
        self.receive = self.account.child(cfg.branch)
        key = cfg.api_key.get_secret_value() if cfg.api_key else None
        self.api = TronApi(cfg.api_url, key, cfg.timeout_seconds) if cfg.api_url else None
        self.group: list[TronCoin] = [self]
        """The coins sharing this coin's scan, linked by :func:`vpsshop_startup` (this one alone until then)."""

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        return {"xpub": SANDBOX_XPUB, "network": "nile", "confirmations": 1}

    @property
    def network(self) -> str:
        return self.cfg.network

    @property
    def scan_group(self) -> str:
        """``tron:<hash of the API URL>``: one scan per node, without the URL's secrets (fits 40 characters)."""
        return f"tron:{endpoint_id(self.cfg.api_url)}" if self.cfg.api_url else self.code

    @property
    def can_scan(self) -> bool:
        return self.api is not None

    def key_id(self) -> str:
        return f"{self.account.fingerprint().hex()}:{self.account.chain_code[:4].hex()}/{self.cfg.branch}"

    def derive_address(self, index: int) -> DepositAddress:
        address = public_key_to_address(self.receive.child(index).uncompressed())
        return DepositAddress(address, index, address_to_hex(address))

    def payment_uri(self, address: str, amount_atomic: int, label: str) -> str:
        """``tron:<address>?amount=<TRX>`` (TronLink, Trust Wallet)."""
        return f"tron:{address}?amount={_plain(amount_atomic, self.decimals)}"

    # ---- watching -----------------------------------------------------------------------------------

    def _node(self) -> TronApi:
        if self.api is None:
            raise PluginError(f"{self.code}: no api_url is configured")
        return self.api

    def group_members(self) -> list[TronCoin]:
        ordered = sorted(self.group, key=lambda c: (c.is_token, c.code))
        seen: dict[str, str] = {}
        for coin in ordered:
            if coin.key_id() in seen:
                raise PluginError(f"{coin.code} and {seen[coin.key_id()]} derive deposit addresses from the same "
                                  "key and branch: give one of them another 'branch' or another xpub")
            seen[coin.key_id()] = coin.code
        return ordered

    async def _tip(self) -> int:
        now = await self._node().post("/wallet/getnowblock")
        if not isinstance(now, dict) or "block_header" not in now:
            raise PluginError("TRON node answered getnowblock without a block")
        return block_number(now)

    async def _hash_at(self, height: int) -> str:
        if height < 0:
            return ""
        block = await self._node().block(height)
        return str(block["blockID"]) if block else ""

    async def scan(self, cursor: str | None, watched: WatchSet) -> ScanResult:
        api = self._node()
        cfg = self.cfg
        members = self.group_members()
        native = next((c for c in members if not c.is_token), None)
        tokens = {c.contract_hex: c for c in members if isinstance(c, TronToken)}
        tip = await self._tip()
        if cursor is None:
            start = cfg.start_block if cfg.start_block is not None else tip
            height = max(start - 1, -1)
            block_hash = await self._hash_at(height)
        else:
            height_text, block_hash = cursor.split(":", 1)
            height = int(height_text)
            if height > tip or (height >= 0 and await self._hash_at(height) != block_hash):
                height = max(min(height, tip) - cfg.reorg_depth, -1)
                return ScanResult(f"{height}:{await self._hash_at(height)}", [])
        found: list[tuple[str, DetectedPayment]] = []
        last = min(tip, height + cfg.max_blocks_per_scan)
        for h in range(height + 1, last + 1):
            block = await api.block(h)
            if block is None or (block_hash and block["block_header"]["raw_data"].get("parentHash") != block_hash):
                break  # the chain moved while we read it: stop here, the next call checks the cursor
            confirmations = tip - h + 1
            block_found: list[tuple[str, DetectedPayment]] = []
            if native is not None:
                block_found.extend((native.code, p) for p in match_trx_transfers(block, watched, confirmations))
            if tokens:
                infos = await api.post("/wallet/gettransactioninfobyblocknum", {"num": h})
                block_found.extend(match_token_logs(infos, block, watched, tokens, confirmations))
            found.extend(block_found)
            height, block_hash = h, block["blockID"]
        return ScanResult(f"{height}:{block_hash}", found)

    async def recheck(self, payments: list[DetectedPayment]) -> list[PaymentCheck]:
        tip = await self._tip()
        canonical: dict[int, str] = {}
        for h in sorted({p.block_height for p in payments if p.block_height is not None}):
            if h <= tip:
                block_hash = await self._hash_at(h)
                if block_hash:
                    canonical[h] = block_hash
        checks = []
        for payment in payments:
            h = payment.block_height
            if h is not None and h not in canonical:
                # The node is behind the block that held it: kept, no confirmations counted yet.
                checks.append(PaymentCheck(payment.identity, True, 0, h, payment.block_hash))
            elif h is not None and payment.block_hash and canonical[h] == payment.block_hash:
                checks.append(PaymentCheck(payment.identity, True, tip - h + 1, h, payment.block_hash))
            else:
                checks.append(PaymentCheck(payment.identity, False))
        return checks

    async def preflight(self) -> None:
        """Production refuses to start when the configured node does not answer at all."""
        url = self.config.api_url  # type: ignore[attr-defined]
        if url:
            await require_reachable(url, setting=f"coins.{self.code}.api_url", what=f"{self.code} node")

    async def check_ready(self) -> Readiness:
        if self.api is None:
            return Readiness(True, f"{self.network}: addresses only, no node configured (not watched)")
        try:
            tip = await self._tip()
            self.group_members()
        except PluginError as exc:
            return Readiness(False, str(exc))
        return Readiness(True, f"{self.network} at block {tip}")

    async def close(self) -> None:
        if self.api is not None:
            await self.api.close()


class TronToken(TronCoin):
    """A TRC-20 token: contract and decimals are settings."""

    Config: ClassVar[type[BaseModel]] = TronTokenConfig
    is_token: ClassVar[bool] = True

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        self.decimals = config.decimals  # type: ignore[attr-defined,misc]
        self.contract: str = config.contract  # type: ignore[attr-defined]
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
        contracts = tx.get("raw_data", {}).get("contract") or ()
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


def match_token_logs(infos: Any, block: dict[str, Any], watched: WatchSet, tokens: dict[str, TronToken],
                     confirmations: int) -> list[tuple[str, DetectedPayment]]:
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
            topics = log.get("topics") or ()
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
                found.append((token.code, DetectedPayment(identity, to, amount, info["id"], confirmations, h,
                                                          block["blockID"])))
    return found


class Tronix(TronCoin):
    code = "TRX"
    name = "TRON"
    rate_symbol = "TRX"


class TetherTrc20(TronToken):
    code = "USDTTRC"
    name = "Tether USD (TRC-20)"
    rate_symbol = "USDT"
    decimals = 6


@hookimpl
def vpsshop_startup(ctx: Any) -> None:
    """Link the coins of each scan group, so the one core asks to scan reads every coin's deposits."""
    groups: dict[str, list[TronCoin]] = {}
    for coin in ctx.coins.values():
        if isinstance(coin, TronCoin) and coin.can_scan:
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
    return [Tronix, TetherTrc20]
