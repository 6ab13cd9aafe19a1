"""USDCBASE: USDC on Base paid by x402 (a signed EIP-3009 ``transferWithAuthorization``).

The customer never sends USDC to a deposit address: their client signs an authorization for the
exact amount to the shop's ``pay_to`` address and the shop settles it on chain during the request,
paying the gas. This module implements the coin side of core's x402 contract
(:class:`vpsshop.X402Coin`); core's top-up endpoint owns the HTTP exchange and the ledger.

Two settlement modes, chosen by ``[coins.USDCBASE] mode``:

``direct``
    The shop verifies the authorization itself (the reference verifier of the PyPI package ``x402``
    plus its own checks) and sends ``transferWithAuthorization`` from its relayer wallet over a
    Base JSON-RPC endpoint. The relayer's private key comes from an environment variable or from
    the settings, encrypted with Fernet under ``settings.encryption_key``. It is never logged.
``facilitator``
    An x402 facilitator (``POST /verify``, ``POST /settle``) checks and settles. ``rpc_url`` is
    required all the same: after a ``/settle`` whose outcome is unknown only the chain can say
    whether the USDC arrived (:meth:`USDCBASE.settlement_status`).

The relayer key, when stored encrypted, is decrypted with the shop's secrets that core hands to the
constructor (``uses_secrets``); the plugin has no start-up hook.

Error codes raised as :class:`vpsshop.X402Rejected` (``docs/x402.md`` lists them):
``invalid_payment`` (400: not base64 JSON of an x402 payment), ``unsupported_scheme``,
``wrong_network``, ``wrong_asset``, ``wrong_recipient``, ``wrong_amount``,
``authorization_not_yet_valid``, ``authorization_expired``, ``invalid_signature``, ``nonce_used``,
``insufficient_funds``, ``settlement_rejected`` (the simulation failed for another reason),
``settlement_reverted`` (the transaction was mined and reverted): 402; and
``settlement_unavailable`` (503: the facilitator or the Base node could not check the payment, nothing
was sent; the same payment may be re-sent).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from vpsshop import (
    PaymentCoin,
    PluginError,
    Readiness,
    ShopSecrets,
    X402Coin,
    X402Payment,
    X402Rejected,
    X402Settlement,
    hookimpl,
    require_reachable,
)
from vpsshop_x402.chain import (
    BaseChain,
    RelayerKey,
    checksum_address,
    decrypt_relayer_key,
    encrypt_relayer_key,
)

if TYPE_CHECKING:  # pragma: no cover
    from web3.types import TxReceipt
    from x402.http import HTTPFacilitatorClient
    from x402.schemas import PaymentPayload, PaymentRequirements
    from x402.schemas.v1 import PaymentPayloadV1, PaymentRequirementsV1

log = logging.getLogger("vpsshop.x402")

# ---- networks ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseNetwork:
    """A Base network: its x402 v1 name, CAIP-2 id (v2), chain id and USDC contract."""

    name: str
    caip2: str
    chain_id: int
    usdc: str
    eip712_name: str
    eip712_version: str


NETWORKS: dict[str, BaseNetwork] = {
    "base": BaseNetwork("base", "eip155:8453", 8453, "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "USD Coin", "2"),
    "base-sepolia": BaseNetwork(
        "base-sepolia", "eip155:84532", 84532, "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "USDC", "2"
    ),
}

SANDBOX_PAY_TO = "0x000000000000000000000000000000000000dEaD"
"""The sandbox's placeholder recipient, a burn address: nobody holds its key, so what settles there
is lost. check_ready says so (the sandbox still counts the coin ready: its 402s work)."""

SANDBOX_FACILITATOR_URL = "https://x402.org/facilitator"
"""The public test facilitator of the x402 project (Base Sepolia), used by the sandbox."""

SANDBOX_RPC_URL = "https://sepolia.base.org"
"""Base's public Base Sepolia JSON-RPC endpoint: the sandbox's ``rpc_url``, where
:meth:`USDCBASE.settlement_status` looks after a facilitator's ``/settle`` with an unknown outcome."""

VALID_BEFORE_MARGIN_SECONDS = 6
"""An authorization must stay valid this long after verification (the reference verifier's rule)."""

_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")


# ---- settings ---------------------------------------------------------------------------------


class USDCBaseConfig(BaseModel):
    """Settings of ``[coins.USDCBASE]``."""

    model_config = ConfigDict(extra="forbid")

    network: Literal["base", "base-sepolia"] = Field("base", description="x402 v1 network name.")
    pay_to: str = Field(description="The shop's address receiving USDC (an account you hold the key of).")
    asset: str | None = Field(None, description="USDC contract; default: Circle's USDC of the network.")
    eip712_name: str | None = Field(None, description="EIP-712 domain name of the token; default per network.")
    eip712_version: str | None = Field(None, description='EIP-712 domain version of the token; default "2".')
    max_timeout_seconds: int = Field(300, ge=30, le=86_400, description="x402 maxTimeoutSeconds.")
    mode: Literal["direct", "facilitator"] = Field(description="Who verifies and settles authorizations.")
    facilitator_url: str | None = Field(None, description="Facilitator base URL (mode facilitator).")
    facilitator_timeout_seconds: float = Field(30.0, gt=0, le=300)
    rpc_url: str | None = Field(
        None, description="Base JSON-RPC URL (required: it settles in mode direct, finds unknown outcomes in both)."
    )
    rpc_timeout_seconds: float = Field(10.0, gt=0, le=120, description="Time limit of one RPC call.")
    receipt_timeout_seconds: float = Field(30.0, gt=0, le=600, description="How long to wait to be mined.")
    relayer_key_env: str | None = Field(None, description="Environment variable holding the relayer key.")
    relayer_key_encrypted: SecretStr | None = Field(
        None, description="The relayer key encrypted with Fernet under settings.encryption_key."
    )
    gas_limit: int = Field(150_000, ge=60_000, le=2_000_000, description="Gas limit of a settlement.")
    status_lookback_blocks: int = Field(
        200_000, ge=10, description="How far back settlement_status searches for the transfer."
    )

    @field_validator("pay_to", "asset")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not _ADDRESS.match(value):
            raise ValueError("must be a 0x-prefixed 20-byte hex address")
        return checksum_address(value)

    @model_validator(mode="after")
    def _mode_needs(self) -> USDCBaseConfig:
        if self.mode == "direct":
            if not self.rpc_url:
                raise ValueError("mode 'direct' needs rpc_url")
            if bool(self.relayer_key_env) == bool(self.relayer_key_encrypted):
                raise ValueError("mode 'direct' needs exactly one of relayer_key_env, relayer_key_encrypted")
        elif not self.facilitator_url:
            raise ValueError("mode 'facilitator' needs facilitator_url")
        elif not self.rpc_url:
            # without it a /settle whose outcome is unknown could never be resolved: the USDC may have
            # arrived, and nothing could find it to credit it
            raise ValueError("mode 'facilitator' needs rpc_url (to find a settlement whose outcome was unknown)")
        return self


# ---- errors of the reference verifier, mapped to ours -------------------------------------------

_REASONS = {
    "unsupported_scheme": "unsupported_scheme",
    "network_mismatch": "wrong_network",
    "invalid_exact_evm_payload_recipient_mismatch": "wrong_recipient",
    "invalid_exact_evm_payload_authorization_value_mismatch": "wrong_amount",
    "invalid_exact_evm_payload_authorization_valid_before": "authorization_expired",
    "invalid_exact_evm_payload_authorization_valid_after": "authorization_not_yet_valid",
    "invalid_exact_evm_payload_signature": "invalid_signature",
    "invalid_exact_evm_failed_to_verify_signature": "invalid_signature",
    "invalid_exact_evm_payload_undeployed_smart_wallet": "invalid_signature",
    "invalid_exact_evm_nonce_already_used": "nonce_used",
    "invalid_exact_evm_insufficient_balance": "insufficient_funds",
    "invalid_exact_evm_token_name_mismatch": "wrong_asset",
    "invalid_exact_evm_token_version_mismatch": "wrong_asset",
    "invalid_exact_evm_eip3009_not_supported": "wrong_asset",
    "transaction_failed": "settlement_reverted",
}

_MESSAGES = {
    "unsupported_scheme": "Only the x402 'exact' scheme is accepted.",
    "wrong_network": "The payment is for another network than the one required.",
    "wrong_asset": "The payment is for another token than the one required.",
    "wrong_recipient": "The authorization does not pay the shop's payTo address.",
    "wrong_amount": "The authorization's value must equal maxAmountRequired exactly.",
    "authorization_not_yet_valid": "The authorization's validAfter is in the future.",
    "authorization_expired": "The authorization expires too soon (validBefore must be at least 6 s ahead).",
    "invalid_signature": "The EIP-712 signature does not match the authorization and its payer.",
    "nonce_used": "This authorization (payer, nonce) has already been used or canceled.",
    "insufficient_funds": "The payer does not hold enough USDC.",
    "settlement_rejected": "The transfer would fail on chain; nothing was sent.",
    "settlement_reverted": "The settlement transaction reverted; nothing moved. Sign a new authorization.",
    "settlement_unavailable": "The payment cannot be checked now; nothing was sent or moved. "
    "Re-send the same request shortly.",
}


def _reject(code: str, detail: str = "") -> X402Rejected:
    message = _MESSAGES.get(code, "The payment was refused.")
    return X402Rejected(code, f"{message} {detail}".strip())


def _unavailable(cause: str) -> X402Rejected:
    """Nothing was sent: the payment could not be checked (core answers 503 and keeps no record).

    The cause goes to the log, not to the client (it names the facilitator or the node)."""
    log.warning("x402 payment not checked, nothing sent: %s", cause)
    return X402Rejected("settlement_unavailable", _MESSAGES["settlement_unavailable"], 503)


def _reject_reason(reason: str | None, detail: str | None = None) -> X402Rejected:
    code = _REASONS.get(reason or "", "settlement_rejected")
    return _reject(code, f"({reason}{': ' + detail if detail else ''})" if code == "settlement_rejected" else "")


# ---- the coin -------------------------------------------------------------------------------


class USDCBASE(X402Coin):
    """USDC on Base, paid by an x402 ``exact`` authorization (EIP-3009)."""

    code: ClassVar[str] = "USDCBASE"
    name: ClassVar[str] = "USD Coin (Base, x402)"
    decimals = 6
    rate_symbol: ClassVar[str] = "USDC"
    Config = USDCBaseConfig
    uses_secrets = True

    config: USDCBaseConfig

    def __init__(self, config: USDCBaseConfig, *, sandbox: bool = False, secrets: ShopSecrets | None = None) -> None:
        """``secrets`` (core passes the shop's) open ``relayer_key_encrypted``.

        :raises vpsshop.ConfigError: the encrypted key was not made with this shop's ``encryption_key``.
        """
        super().__init__(config, sandbox=sandbox)
        net = NETWORKS[config.network]
        self.base_network = net
        self.asset = config.asset or checksum_address(net.usdc)
        self.eip712_name = config.eip712_name or net.eip712_name
        self.eip712_version = config.eip712_version or net.eip712_version
        self._relayer: RelayerKey | None = None
        self._key_problem = ""
        if config.mode == "direct" and config.relayer_key_env:
            value = os.environ.get(config.relayer_key_env, "")
            if value:
                self._relayer = RelayerKey(value)
            else:
                self._key_problem = f"environment variable {config.relayer_key_env} (relayer_key_env) is empty"
        elif config.mode == "direct" and config.relayer_key_encrypted is not None:
            if secrets is not None:
                self._relayer = decrypt_relayer_key(config.relayer_key_encrypted.get_secret_value(), secrets)
            else:
                self._key_problem = "relayer_key_encrypted needs the shop's secrets (the coin was built without them)"
        self._chain: BaseChain | None = None
        if config.rpc_url:
            self._chain = BaseChain(config.rpc_url, config.rpc_timeout_seconds, self._relayer)
        self._facilitator: HTTPFacilitatorClient | None = None
        self._in_flight: set[tuple[str, str]] = set()
        self._in_flight_lock = threading.Lock()

    # ---- set-up ----

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        """Base Sepolia through the x402 project's public test facilitator, no secret needed.

        ``pay_to`` is a placeholder nobody holds: set your own address to keep test USDC.
        """
        return {
            "network": "base-sepolia",
            "mode": "facilitator",
            "facilitator_url": SANDBOX_FACILITATOR_URL,
            "rpc_url": SANDBOX_RPC_URL,
            "pay_to": SANDBOX_PAY_TO,
        }

    @property
    def network(self) -> str:
        return self.config.network

    @property
    def chain(self) -> BaseChain | None:
        """The JSON-RPC view of the chain (None in facilitator mode without ``rpc_url``)."""
        return self._chain

    # ---- the 402 answer ----

    def payment_requirements(self, amount_atomic: int, resource: str, description: str) -> dict[str, Any]:
        """One ``accepts`` entry of the 402 body (x402 v1): works offline."""
        return {
            "scheme": "exact",
            "network": self.config.network,
            "maxAmountRequired": str(int(amount_atomic)),
            "resource": resource,
            "description": description,
            "mimeType": "application/json",
            "payTo": self.config.pay_to,
            "maxTimeoutSeconds": self.config.max_timeout_seconds,
            "asset": self.asset,
            "extra": {"name": self.eip712_name, "version": self.eip712_version},
        }

    def payment_requirements_v2(self, requirements: dict[str, Any]) -> dict[str, Any]:
        """The x402 v2 form of a v1 ``accepts`` entry (``PAYMENT-REQUIRED`` header's ``accepts``).

        v2 names the network in CAIP-2 (``eip155:8453``), the amount ``amount``, and moves
        ``resource``/``description``/``mimeType`` to the top-level ``resource`` object.
        """
        return {
            "scheme": "exact",
            "network": self.base_network.caip2,
            "amount": requirements["maxAmountRequired"],
            "asset": requirements["asset"],
            "payTo": requirements["payTo"],
            "maxTimeoutSeconds": requirements["maxTimeoutSeconds"],
            "extra": dict(requirements.get("extra") or {}),
        }

    def settlement_response(self, settlement: X402Settlement, version: int = 1) -> dict[str, Any]:
        """The settle result for ``X-PAYMENT-RESPONSE`` (v1, network ``base``) or
        ``PAYMENT-RESPONSE`` (v2, network ``eip155:8453`` and the ``amount``)."""
        answer = super().settlement_response(settlement, version)
        if version == 2:
            answer["network"] = self.base_network.caip2
            answer["amount"] = str(settlement.amount_atomic)
        return answer

    # ---- decoding ----

    def decode_payment(self, header_value: str, version: int = 1) -> X402Payment:
        """Parse ``X-PAYMENT`` (version 1) or ``PAYMENT-SIGNATURE`` (version 2); no network."""
        from vpsshop_x402.payment import parse_payment  # the x402 package loads on the first payment

        raw, parsed = parse_payment(header_value, version)
        auth = parsed.payload.authorization
        return X402Payment(
            payer=checksum_address(auth.from_),
            nonce=auth.nonce.lower(),
            value_atomic=int(auth.value),
            version=version,
            raw=raw,
            valid_before=int(auth.valid_before),
        )

    # ---- settling ----

    async def settle(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        """Verify and settle; see :class:`vpsshop.X402Coin`.

        Calling it twice for one authorization is safe: the second call raises
        ``X402Rejected("nonce_used")`` (at once while the first is in flight, or from the chain's
        ``authorizationState`` afterwards). It never returns a second settlement, so a caller that
        lost track of the first result must ask :meth:`settlement_status`.
        """
        self._check_payment(payment, requirements)
        key = (payment.payer.lower(), payment.nonce)
        with self._in_flight_lock:
            if key in self._in_flight:
                raise _reject("nonce_used", "(it is being settled now)")
            self._in_flight.add(key)
        try:
            if self.config.mode == "direct":
                return await asyncio.to_thread(self.settle_direct, payment, requirements)
            return await self._settle_facilitator(payment, requirements)
        finally:
            with self._in_flight_lock:
                self._in_flight.discard(key)

    async def verify(self, payment: X402Payment, requirements: dict[str, Any]) -> None:
        """Check without settling; see :class:`vpsshop.X402Coin`. Direct mode asks the chain
        (signature, funds, a simulated transfer, an unused nonce), facilitator mode its ``/verify``."""
        self._check_payment(payment, requirements)
        if self.config.mode == "direct":
            chain = self._chain
            if chain is None:
                raise _unavailable("direct verification is not configured: no rpc_url")
            await asyncio.to_thread(self._verify_direct, chain, payment, requirements)
        else:
            await self._verify_facilitator(payment, requirements)

    def _check_payment(self, payment: X402Payment, requirements: dict[str, Any]) -> None:
        """What can be checked without the network, identically in both modes."""
        if requirements.get("payTo", "").lower() != self.config.pay_to.lower() or (
            requirements.get("asset", "").lower() != self.asset.lower()
        ):
            raise PluginError("the requirements given to settle() are not this coin's")
        raw = payment.raw
        auth = raw["payload"]["authorization"]
        if payment.version == 1:
            scheme, network = raw["scheme"], raw["network"]
        else:
            accepted = raw["accepted"]
            scheme, network = accepted.get("scheme"), accepted.get("network")
            if str(accepted.get("asset", "")).lower() != self.asset.lower():
                raise _reject("wrong_asset")
            if str(accepted.get("amount")) != str(requirements["maxAmountRequired"]):
                raise _reject("wrong_amount")
            if str(accepted.get("payTo", "")).lower() != self.config.pay_to.lower():
                raise _reject("wrong_recipient")
        if scheme != "exact":
            raise _reject("unsupported_scheme")
        expected_network = self.config.network if payment.version == 1 else self.base_network.caip2
        if network != expected_network:
            raise _reject("wrong_network", f"(expected {expected_network}, got {network})")
        if auth["to"].lower() != self.config.pay_to.lower():
            raise _reject("wrong_recipient")
        if int(auth["value"]) != int(requirements["maxAmountRequired"]):
            raise _reject("wrong_amount", f"(expected {requirements['maxAmountRequired']}, got {auth['value']})")
        now = int(time.time())
        if int(auth["validAfter"]) > now:
            raise _reject("authorization_not_yet_valid")
        if int(auth["validBefore"]) < now + VALID_BEFORE_MARGIN_SECONDS:
            raise _reject("authorization_expired")

    def _v1_objects(
        self, payment: X402Payment, requirements: dict[str, Any]
    ) -> tuple[PaymentPayloadV1, PaymentRequirementsV1]:
        """The payment as the reference package's v1 types (a v2 payment is checked the same way)."""
        from x402.schemas.v1 import PaymentPayloadV1, PaymentRequirementsV1

        payload = PaymentPayloadV1(scheme="exact", network=self.config.network, payload=payment.raw["payload"])
        return payload, PaymentRequirementsV1.model_validate(requirements)

    def settle_direct(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        """Direct mode, blocking (``settle`` runs it in a thread): verify, send, wait for the receipt."""
        chain = self._chain
        if chain is None or chain.relayer is None:
            raise _unavailable(f"direct settlement is not configured: {self._key_problem or 'no rpc_url'}")
        auth = payment.raw["payload"]["authorization"]
        signature = bytes.fromhex(payment.raw["payload"]["signature"][2:])
        self._verify_direct(chain, payment, requirements)
        try:
            tx_hash = chain.send_transfer(self.asset, auth, signature, self.config.gas_limit)
        except Exception as exc:  # noqa: BLE001
            # A time-out may hide a transaction that was broadcast: the outcome is unknown.
            raise PluginError(
                f"USDCBASE: sending the settlement failed ({type(exc).__name__}); outcome unknown"
            ) from None
        log.info("x402 settlement sent: payer=%s nonce=%s tx=%s", payment.payer, payment.nonce, tx_hash)
        try:
            receipt = chain.receipt(tx_hash, self.config.receipt_timeout_seconds)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(f"USDCBASE: no receipt for {tx_hash} ({type(exc).__name__}); outcome unknown") from None
        if receipt["status"] != 1:
            log.warning("x402 settlement reverted: payer=%s nonce=%s tx=%s", payment.payer, payment.nonce, tx_hash)
            # Someone may have submitted the same authorization first (it pays payTo all the same):
            # then the money arrived and that transaction is the settlement.
            try:
                earlier = self.find_settlement(chain, payment)
            except Exception as exc:  # noqa: BLE001
                raise PluginError(f"USDCBASE: {tx_hash} reverted; checking who used the nonce failed: {exc}") from None
            if earlier is not None:
                return earlier
            raise _reject("settlement_reverted", f"(transaction {tx_hash})")
        return self._settlement_from_receipt(payment, tx_hash, receipt)

    def _verify_direct(self, chain: BaseChain, payment: X402Payment, requirements: dict[str, Any]) -> None:
        """Direct mode, blocking: the reference verifier's checks (signature, funds, simulation) and an
        unused nonce, against the chain; nothing is sent."""
        from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1Facilitator

        signature = bytes.fromhex(payment.raw["payload"]["signature"][2:])
        try:
            if chain.authorization_used(self.asset, payment.payer, payment.nonce):
                raise _reject("nonce_used")
            payload, reqs = self._v1_objects(payment, requirements)
            verdict = ExactEvmSchemeV1Facilitator(chain).verify(payload, reqs)
            if not verdict.is_valid:
                if verdict.invalid_reason == "invalid_exact_evm_transaction_simulation_failed":
                    balance = chain.get_balance(payment.payer, self.asset)
                    if balance < payment.value_atomic:
                        raise _reject("insufficient_funds")
                raise _reject_reason(verdict.invalid_reason, verdict.invalid_message)
            if len(signature) != 65:
                raise _reject("invalid_signature", "(only 65-byte EOA signatures are settled directly)")
        except X402Rejected:
            raise
        except Exception as exc:  # noqa: BLE001 - nothing was sent: the same payment may be re-sent
            raise _unavailable(f"the Base RPC endpoint failed during verification: {type(exc).__name__}") from None

    def _settlement_from_receipt(self, payment: X402Payment, tx_hash: str, receipt: TxReceipt) -> X402Settlement:
        from x402.mechanisms.evm.exact.eip3009_utils import verify_eip3009_transfer_event

        auth = payment.raw["payload"]["authorization"]
        if not verify_eip3009_transfer_event(
            list(receipt["logs"]),
            self.asset,
            from_address=auth["from"],
            to=self.config.pay_to,
            value=int(auth["value"]),
        ):
            raise PluginError(f"USDCBASE: transaction {tx_hash} has no Transfer to payTo of the authorized value")
        return X402Settlement(
            payer=payment.payer,
            nonce=payment.nonce,
            transaction=tx_hash,
            network=self.config.network,
            amount_atomic=int(auth["value"]),
        )

    async def _verify_facilitator(
        self, payment: X402Payment, requirements: dict[str, Any]
    ) -> tuple[PaymentPayload | PaymentPayloadV1, PaymentRequirements | PaymentRequirementsV1]:
        """Facilitator mode: the facilitator's ``POST /verify`` (nothing moves); the payment and the
        requirements as the reference package's types, for ``/settle``."""
        import httpx

        client = self._facilitator_client()
        payload: PaymentPayload | PaymentPayloadV1
        reqs: PaymentRequirements | PaymentRequirementsV1
        if payment.version == 1:
            payload, reqs = self._v1_objects(payment, requirements)
        else:
            from x402.schemas import PaymentPayload, PaymentRequirements

            payload = PaymentPayload.model_validate(payment.raw)
            reqs = PaymentRequirements.model_validate(self.payment_requirements_v2(requirements))
        if self._chain is not None:
            await self._check_on_chain(payment)
        try:
            verdict = await client.verify(payload, reqs)
        except (httpx.HTTPError, ValueError) as exc:  # /verify moves nothing: nothing was sent
            raise _unavailable(f"the facilitator's /verify failed: {type(exc).__name__}") from None
        if not verdict.is_valid:
            if self._chain is not None and _REASONS.get(verdict.invalid_reason or "") is None:
                await self._check_on_chain(payment, balance=True)
            raise _reject_reason(verdict.invalid_reason, verdict.invalid_message)
        return payload, reqs

    async def _settle_facilitator(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        import httpx

        client = self._facilitator_client()
        payload, reqs = await self._verify_facilitator(payment, requirements)
        try:
            result = await client.settle(payload, reqs)
        except (httpx.HTTPError, ValueError) as exc:
            raise PluginError(
                f"USDCBASE: the facilitator's /settle failed ({type(exc).__name__}); outcome unknown"
            ) from None
        if not result.success:
            code = _REASONS.get(result.error_reason or "")
            if code is None or code == "settlement_reverted":
                # The reference facilitator reports a time-out while waiting for the receipt the same
                # way as a revert ("transaction_failed"): only a receipt proves that nothing moved.
                if await self._reverted(result.transaction):
                    earlier = await self.settlement_status(payment)  # front-run: it paid us all the same
                    if earlier is not None:
                        return earlier
                    raise _reject("settlement_reverted", f"(transaction {result.transaction})")
                raise PluginError(
                    f"USDCBASE: the facilitator's /settle failed ({result.error_reason}, transaction "
                    f"{result.transaction or 'none'}); outcome unknown"
                )
            raise _reject_reason(result.error_reason, result.error_message)
        return X402Settlement(
            payer=payment.payer,
            nonce=payment.nonce,
            transaction=result.transaction,
            network=self.config.network,
            amount_atomic=payment.value_atomic,
        )

    async def _reverted(self, tx_hash: str | None) -> bool:
        """Whether ``tx_hash`` is mined and reverted (needs ``rpc_url``; False when unknown)."""
        chain = self._chain
        if chain is None or not tx_hash:
            return False
        try:
            receipt = await asyncio.to_thread(chain.transaction_receipt, tx_hash)
        except Exception:  # noqa: BLE001 - not found or no answer: unknown
            return False
        return int(receipt["status"]) == 0

    async def _check_on_chain(self, payment: X402Payment, balance: bool = False) -> None:
        """Facilitator mode with ``rpc_url``: give the same codes as direct mode for a used nonce
        and, after an unexplained refusal, for a payer without the funds."""
        chain = self._chain
        assert chain is not None

        def look() -> str | None:
            if chain.authorization_used(self.asset, payment.payer, payment.nonce):
                return "nonce_used"
            if balance and chain.get_balance(payment.payer, self.asset) < payment.value_atomic:
                return "insufficient_funds"
            return None

        try:
            code = await asyncio.to_thread(look)
        except Exception:  # noqa: BLE001 - the facilitator decides without our look-up
            return
        if code:
            raise _reject(code)

    def _facilitator_client(self) -> HTTPFacilitatorClient:
        if self._facilitator is None:
            from x402.http import FacilitatorConfig, HTTPFacilitatorClient

            self._facilitator = HTTPFacilitatorClient(
                FacilitatorConfig(
                    url=self.config.facilitator_url or "", timeout=self.config.facilitator_timeout_seconds
                )
            )
        return self._facilitator

    async def settlement_status(self, payment: X402Payment) -> X402Settlement | None:
        """Look on chain: the settlement if (payer, nonce) was used to pay ``pay_to`` the value.

        None means "not used (yet)": the authorization may still be settled until its
        ``validBefore``; after that, None is final.
        :raises vpsshop.PluginError: no ``rpc_url`` is configured, or the endpoint fails.
        """
        chain = self._chain
        if chain is None:
            raise PluginError("USDCBASE: settlement_status needs coins.USDCBASE.rpc_url")

        try:
            return await asyncio.to_thread(self.find_settlement, chain, payment)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(f"USDCBASE: the Base RPC endpoint failed: {type(exc).__name__}") from None

    def find_settlement(self, chain: BaseChain, payment: X402Payment) -> X402Settlement | None:
        """Blocking look-up behind :meth:`settlement_status` (any transaction that paid us counts)."""
        if not chain.authorization_used(self.asset, payment.payer, payment.nonce):
            return None
        tx_hash = chain.find_authorization_use(
            self.asset, payment.payer, payment.nonce, self.config.status_lookback_blocks
        )
        if tx_hash is None:
            return None
        try:
            return self._settlement_from_receipt(payment, tx_hash, chain.transaction_receipt(tx_hash))
        except PluginError:
            return None  # the authorization was canceled or paid someone else

    # ---- health ----

    async def preflight(self) -> None:
        """Production refuses to start when the Base node (direct) or the facilitator does not answer at all."""
        if self.sandbox and self.config.pay_to.lower() == SANDBOX_PAY_TO.lower():
            return  # the sandbox's placeholder settles nothing: no peer to check (the sandbox may be offline)
        if self.config.mode == "direct" and self.config.rpc_url:
            await require_reachable(self.config.rpc_url, setting="coins.USDCBASE.rpc_url", what="USDCBASE Base node")
        elif self.config.mode == "facilitator" and self.config.facilitator_url:
            await require_reachable(
                self.config.facilitator_url, setting="coins.USDCBASE.facilitator_url", what="USDCBASE x402 facilitator"
            )

    async def check_ready(self) -> Readiness:
        """Ready when payments can be settled now: says what is missing otherwise."""
        if self.config.pay_to.lower() == SANDBOX_PAY_TO.lower():
            # Not ready for real use; enough for a sandbox: the 402 and its payment requirements work.
            return Readiness(
                False,
                f"pay_to is the sandbox's placeholder {SANDBOX_PAY_TO}, a burn address nobody holds: a payment "
                "settled there is lost. "
                "Set coins.USDCBASE.pay_to to your own address (the 402s and payment requirements work meanwhile)",
                sandbox_ok=self.sandbox,
            )
        if self.config.mode == "direct":
            chain = self._chain
            if chain is None or chain.relayer is None:
                return Readiness(False, f"direct settlement not configured: {self._key_problem}")
            relayer = chain.relayer.address
            try:
                chain_id = await asyncio.to_thread(chain.get_chain_id)
                gas_wei = await asyncio.to_thread(chain.w3.eth.get_balance, relayer)
            except Exception as exc:  # noqa: BLE001
                return Readiness(False, f"Base RPC endpoint does not answer: {type(exc).__name__}")
            if chain_id != self.base_network.chain_id:
                return Readiness(False, f"RPC endpoint is chain {chain_id}, not {self.config.network}")
            figures = {"relayer_gas_wei": float(gas_wei)}  # /metrics: alert well before it runs dry
            if gas_wei < self.config.gas_limit * 10**6:  # not even one settlement at 0.001 gwei
                return Readiness(
                    False, f"relayer {relayer} has no ETH for gas: send some on {self.config.network}", figures=figures
                )
            return Readiness(
                True, f"direct settlement on {self.config.network} from relayer {relayer}", figures=figures
            )
        try:
            supported = await asyncio.to_thread(self._facilitator_client().get_supported)
        except Exception as exc:  # noqa: BLE001
            return Readiness(False, f"facilitator {self.config.facilitator_url} does not answer: {type(exc).__name__}")
        for kind in supported.kinds:
            if kind.scheme == "exact" and kind.network in (self.config.network, self.base_network.caip2):
                return Readiness(True, f"facilitator {self.config.facilitator_url} settles {self.config.network}")
        return Readiness(
            False, f"facilitator {self.config.facilitator_url} does not support exact on {self.config.network}"
        )

    async def close(self) -> None:
        if self._facilitator is not None:
            await self._facilitator.aclose()
            self._facilitator = None


# ---- hooks ----------------------------------------------------------------------------------


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[PaymentCoin[Any]]]:
    return [USDCBASE]


__all__ = [
    "NETWORKS",
    "USDCBASE",
    "BaseChain",
    "RelayerKey",
    "USDCBaseConfig",
    "decrypt_relayer_key",
    "encrypt_relayer_key",
]
