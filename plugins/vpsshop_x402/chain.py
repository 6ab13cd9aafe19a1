"""The Base chain as USDCBASE sees it: a JSON-RPC endpoint with time limits, and the relayer key.

Part of the ``vpsshop_x402`` plugin (see its module docstring); nothing here is called by core.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from vpsshop import PluginError, ShopSecrets

if TYPE_CHECKING:  # pragma: no cover
    from eth_account.signers.local import LocalAccount
    from eth_typing import ChecksumAddress, HexStr
    from web3.contract import Contract
    from web3.types import RPCEndpoint, RPCResponse, TxReceipt

# keccak256("AuthorizationUsed(address,bytes32)"), the EIP-3009 event of a used authorization
_AUTHORIZATION_USED_TOPIC = "0x98de503528ee59b575ef0c0a2576a82497bfc029a5685b209e9ec333479b10a5"


def usdc_abi() -> list[dict[str, Any]]:
    """What the shop calls on the USDC contract, from the x402 package's ABI fragments."""
    from x402.mechanisms.evm.constants import (
        AUTHORIZATION_STATE_ABI,
        BALANCE_OF_ABI,
        TRANSFER_WITH_AUTHORIZATION_VRS_ABI,
    )

    return [*AUTHORIZATION_STATE_ABI, *BALANCE_OF_ABI, *TRANSFER_WITH_AUTHORIZATION_VRS_ABI]


def checksum_address(value: str) -> ChecksumAddress:
    from eth_utils import to_checksum_address

    return to_checksum_address(value)


# ---- the relayer key --------------------------------------------------------------------------


class RelayerKey:
    """The relayer's private key, kept out of reprs, logs and tracebacks' locals."""

    __slots__ = ("_account",)

    def __init__(self, private_key: str) -> None:
        from eth_account import Account

        key = private_key.strip()
        try:
            self._account: LocalAccount = Account.from_key(key if key.startswith("0x") else "0x" + key)
        except Exception:  # noqa: BLE001 - never echo the key in the error
            raise PluginError("the relayer key is not a valid secp256k1 private key") from None

    @property
    def address(self) -> ChecksumAddress:
        return self._account.address

    def sign_transaction(self, tx: dict[str, Any]) -> bytes:
        return bytes(self._account.sign_transaction(tx).raw_transaction)

    def __repr__(self) -> str:
        return f"RelayerKey(address={self.address})"

    __str__ = __repr__


def encrypt_relayer_key(private_key: str, encryption_key: str) -> str:
    """The value of ``relayer_key_encrypted``: ``private_key`` encrypted with Fernet under the shop's
    ``encryption_key``."""
    RelayerKey(private_key)  # refuse to encrypt something that is not a key
    return ShopSecrets(encryption_key).encrypt(private_key.strip())


def decrypt_relayer_key(token: str, secrets: ShopSecrets | str) -> RelayerKey:
    """The relayer key of ``relayer_key_encrypted``, opened with the shop's secrets (or an
    ``encryption_key``). :raises vpsshop.ConfigError: not made with this shop's key."""
    if isinstance(secrets, str):
        secrets = ShopSecrets(secrets)
    return RelayerKey(secrets.decrypt(token, setting="coins.USDCBASE.relayer_key_encrypted"))


def _hex(value: str) -> HexStr:
    """A 0x-prefixed hex string (a transaction hash) as web3 types it."""
    from eth_typing import HexStr

    return HexStr(value)


def _rpc_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` means the RPC endpoint did not answer (an unknown outcome)."""
    import requests
    from web3.exceptions import TimeExhausted

    return isinstance(exc, (requests.Timeout, requests.ConnectionError, TimeExhausted, TimeoutError))


def _nonce_clash(exc: BaseException) -> bool:
    text = str(exc).lower()
    return (
        "nonce too low" in text
        or "replacement transaction underpriced" in text
        or "nonce has already been used" in text
    )


# ---- the chain ------------------------------------------------------------------------------


class BaseChain:
    """A Base JSON-RPC endpoint seen through web3, with a time limit on every call.

    Implements the ``FacilitatorEvmSigner`` protocol of the ``x402`` package (read-only part), so
    the reference verifier runs against it. ``rpc_seconds`` adds up the time spent waiting for the
    endpoint's answers and ``wait_seconds`` the sleeps while waiting to be mined (the benchmark
    subtracts both from the total to get the shop's own overhead).
    """

    def __init__(self, url: str, timeout: float, relayer: RelayerKey | None) -> None:
        from web3 import Web3

        self.w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": timeout}))
        # We sign raw transactions with an explicit chainId and never use ENS names: these two
        # middlewares would only add an eth_chainId round trip to every call.
        for name in ("validation", "ens_name_to_address"):
            try:
                self.w3.middleware_onion.remove(name)
            except (ValueError, KeyError):  # pragma: no cover - absent in another web3 version
                pass
        self.relayer = relayer
        self.rpc_seconds = 0.0
        self.wait_seconds = 0.0
        self._nonce_lock = threading.Lock()
        self._next_nonce: int | None = None
        self._chain_id: int | None = None
        self._tokens: dict[str, Contract] = {}
        self._read_contracts: dict[str, tuple[list[dict[str, Any]], Contract]] = {}
        provider = self.w3.provider
        plain = provider.make_request

        def timed(method: RPCEndpoint, params: Any) -> RPCResponse:
            started = time.perf_counter()
            try:
                return plain(method, params)
            finally:
                self.rpc_seconds += time.perf_counter() - started

        # on this provider instance only: web3 is imported lazily, so no HTTPProvider subclass here
        provider.make_request = timed  # type: ignore[method-assign]  # a timing wrapper of the same signature

    def token(self, address: str) -> Contract:
        contract = self._tokens.get(address)
        if contract is None:
            contract = self._tokens[address] = self.w3.eth.contract(address=checksum_address(address), abi=usdc_abi())
        return contract

    # FacilitatorEvmSigner (the parts the exact-scheme verifier uses)
    def get_addresses(self) -> list[str]:
        return [self.relayer.address] if self.relayer else []

    def get_chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self.w3.eth.chain_id)
        return self._chain_id

    def get_code(self, address: str) -> bytes:
        return bytes(self.w3.eth.get_code(checksum_address(address)))

    def read_contract(self, address: str, abi: list[dict[str, Any]], function_name: str, *args: Any) -> Any:
        key = f"{address}:{id(abi)}"
        cached = self._read_contracts.get(key)
        if cached is None:
            # the cache holds the ABI too, so its id() cannot be reused by another list
            cached = self._read_contracts[key] = (abi, self.w3.eth.contract(address=checksum_address(address), abi=abi))
        contract = cached[1]
        sender = {"from": self.relayer.address} if self.relayer else {}
        return getattr(contract.functions, function_name)(*args).call(sender)

    def get_balance(self, address: str, token_address: str) -> int:
        return int(self.token(token_address).functions.balanceOf(checksum_address(address)).call())

    def verify_typed_data(self, *args: Any, **kwargs: Any) -> bool:  # pragma: no cover - not used by exact v1
        raise NotImplementedError

    def write_contract(self, *args: Any, **kwargs: Any) -> str:  # pragma: no cover - settle sends itself
        raise NotImplementedError

    def send_transaction(self, to: str, data: bytes) -> str:  # pragma: no cover - no smart-wallet deployment
        raise NotImplementedError

    def wait_for_transaction_receipt(self, tx_hash: str) -> Any:  # pragma: no cover
        raise NotImplementedError

    # what the shop does itself
    def authorization_used(self, asset: str, payer: str, nonce: str) -> bool:
        return bool(
            self.token(asset).functions.authorizationState(checksum_address(payer), bytes.fromhex(nonce[2:])).call()
        )

    def send_transfer(self, asset: str, auth: dict[str, str], signature: bytes, gas_limit: int) -> str:
        """Sign and send ``transferWithAuthorization`` from the relayer; the transaction hash."""
        assert self.relayer is not None
        v, r, s = signature[64], signature[:32], signature[32:64]
        if v in (0, 1):
            v += 27
        data = self.token(asset).encode_abi(
            "transferWithAuthorization",
            [
                checksum_address(auth["from"]),
                checksum_address(auth["to"]),
                int(auth["value"]),
                int(auth["validAfter"]),
                int(auth["validBefore"]),
                bytes.fromhex(auth["nonce"][2:]),
                v,
                r,
                s,
            ],
        )
        gas_price = int(self.w3.eth.gas_price)
        chain_id = self.get_chain_id()
        with self._nonce_lock:
            if self._next_nonce is None:
                self._next_nonce = int(self.w3.eth.get_transaction_count(self.relayer.address, "pending"))
            tx = {
                "chainId": chain_id,
                "nonce": self._next_nonce,
                "to": checksum_address(asset),
                "data": data,
                "value": 0,
                "gas": gas_limit,
                "gasPrice": gas_price,
            }
            for attempt in range(3):
                try:
                    tx_hash = self.w3.eth.send_raw_transaction(self.relayer.sign_transaction(tx))
                    break
                except Exception as exc:
                    self._next_nonce = None  # ask the node again next time
                    # The node refused the transaction because another process of this shop used the
                    # relayer's nonce: nothing was broadcast, so sign again with the node's nonce.
                    if _rpc_timeout(exc) or attempt == 2 or not _nonce_clash(exc):
                        raise
                    tx["nonce"] = self._next_nonce = int(
                        self.w3.eth.get_transaction_count(self.relayer.address, "pending")
                    )
            self._next_nonce = int(tx["nonce"]) + 1
        return "0x" + bytes(tx_hash).hex()

    def transaction_receipt(self, tx_hash: str) -> TxReceipt:
        """The receipt of a mined transaction. :raises web3.exceptions.TransactionNotFound: not mined (yet)."""
        return self.w3.eth.get_transaction_receipt(_hex(tx_hash))

    def receipt(self, tx_hash: str, timeout: float) -> TxReceipt:
        """Wait for the transaction to be mined; the sleeps between polls add to ``wait_seconds``."""
        rpc_before, started = self.rpc_seconds, time.perf_counter()
        try:
            return self.w3.eth.wait_for_transaction_receipt(_hex(tx_hash), timeout=timeout, poll_latency=0.2)
        finally:
            self.wait_seconds += time.perf_counter() - started - (self.rpc_seconds - rpc_before)

    def find_authorization_use(self, asset: str, payer: str, nonce: str, lookback: int) -> str | None:
        """The hash of the transaction that used (payer, nonce) in the last ``lookback`` blocks."""
        latest = int(self.w3.eth.block_number)
        logs = self.w3.eth.get_logs(
            {
                "address": checksum_address(asset),
                "fromBlock": max(0, latest - lookback),
                "toBlock": latest,
                "topics": [_AUTHORIZATION_USED_TOPIC, "0x" + "00" * 12 + payer[2:].lower(), nonce.lower()],
            }
        )
        return "0x" + bytes(logs[-1]["transactionHash"]).hex() if logs else None
