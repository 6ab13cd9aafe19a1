"""USDCSOL: USDC on Solana paid by x402's ``exact`` SVM scheme (issue 29 part 4, work in progress).

The payer's client builds a transaction (compute-unit limit, compute-unit price, SPL
``TransferChecked`` of the exact amount of the mint to the shop's associated token account) with
the shop's ``feePayer`` as fee payer, signs it as the token authority and sends it partially signed.
The shop verifies it with the reference facilitator of the PyPI package ``x402``
(:class:`x402.mechanisms.svm.exact.ExactSvmScheme`, run in-process: "direct" settlement), co-signs
as fee payer and submits it to its Solana JSON-RPC endpoint.

Identity of a payment (core's (payer, nonce)): the token authority and the hash of the transaction
message; the settled transaction's id is the fee payer's signature, deterministic for one message.

Error codes (:class:`vpsshop.X402Rejected`): ``invalid_payment`` (400), ``unsupported_scheme``,
``wrong_network``, ``wrong_asset``, ``wrong_recipient``, ``wrong_amount``, ``invalid_transaction``,
``nonce_used`` (the same transaction again), ``settlement_rejected`` (the simulation failed: no
funds, an expired blockhash ...), ``settlement_reverted``: 402; ``settlement_unavailable`` (503).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import threading
from collections.abc import Iterable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vpsshop import (
    ConfigError,
    PaymentCoin,
    PluginError,
    Readiness,
    X402Coin,
    X402Payment,
    X402Rejected,
    X402Settlement,
    hookimpl,
    require_reachable,
)

log = logging.getLogger("vpsshop.x402.svm")

CAIP2 = {
    "solana": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
    "solana-devnet": "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1",
}
USDC_MINT = {
    "solana": "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v",
    "solana-devnet": "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU",
}
MAX_HEADER_LENGTH = 16_384
INSTALL_SOLANA = "pip install 'vpsshop[solana]' (solana-py and solders, which x402's SVM scheme uses)"


class USDCSolConfig(BaseModel):
    """Settings of ``[coins.USDCSOL]``."""

    model_config = ConfigDict(extra="forbid")

    network: Literal["solana", "solana-devnet"] = Field("solana", description="x402 v1 network name.")
    pay_to: str = Field(description="The shop's Solana address (owner of the USDC associated token account).")
    mint: str | None = Field(None, description="The USDC mint; default: Circle's USDC of the network.")
    decimals: int = Field(6, ge=0, le=18, description="The mint's decimals.")
    max_timeout_seconds: int = Field(60, ge=10, le=3600, description="x402 maxTimeoutSeconds.")
    mode: Literal["direct"] = Field("direct", description="Who settles: the shop itself (direct).")
    rpc_url: str = Field(description="Solana JSON-RPC URL the transactions are simulated and sent to.")
    fee_payer_key_env: str = Field(description="Environment variable holding the fee payer's base58 keypair.")

    @model_validator(mode="after")
    def _addresses(self) -> USDCSolConfig:
        from solders.pubkey import Pubkey

        for name in ("pay_to", "mint"):
            value = getattr(self, name)
            if value is not None:
                try:
                    Pubkey.from_string(value)
                except ValueError:
                    raise ValueError(f"{name} must be a base58 Solana address") from None
        return self


_REASONS = {
    "unsupported_scheme": "unsupported_scheme",
    "network_mismatch": "wrong_network",
    "invalid_exact_svm_payload_mint_mismatch": "wrong_asset",
    "invalid_exact_svm_payload_recipient_mismatch": "wrong_recipient",
    "invalid_exact_svm_payload_amount_insufficient": "wrong_amount",
    "duplicate_settlement": "nonce_used",
    "transaction_simulation_failed": "settlement_rejected",
    "transaction_failed": "settlement_reverted",
}

_MESSAGES = {
    "invalid_payment": "The payment header is not base64 JSON of an x402 exact SVM payment.",
    "unsupported_scheme": "Only the x402 'exact' scheme is accepted.",
    "wrong_network": "The payment is for another network than the one required.",
    "wrong_asset": "The transfer is of another mint than the one required.",
    "wrong_recipient": "The transfer does not pay the shop's associated token account.",
    "wrong_amount": "The transfer's amount must equal the required amount exactly.",
    "invalid_transaction": "The transaction is not an exact SVM payment (compute budget, TransferChecked).",
    "nonce_used": "This transaction has already been settled or is being settled.",
    "settlement_rejected": "The transaction would fail on chain (funds, an expired blockhash ...); nothing was "
    "sent. Sign a new one.",
    "settlement_reverted": "The transaction failed on chain; nothing moved. Sign a new one.",
    "settlement_unavailable": "The payment cannot be checked now; nothing was sent. Re-send it shortly.",
}


def _reject(code: str, detail: str = "", status: int = 402) -> X402Rejected:
    return X402Rejected(code, f"{_MESSAGES.get(code, 'The payment was refused.')} {detail}".strip(), status)


class USDCSOL(X402Coin):
    """USDC on Solana, paid by an x402 ``exact`` SVM transaction."""

    code: ClassVar[str] = "USDCSOL"
    name: ClassVar[str] = "USD Coin (Solana, x402)"
    decimals = 6
    rate_symbol: ClassVar[str] = "USDC"
    Config = USDCSolConfig
    enabled_in_sandbox: ClassVar[bool] = False  # offered only where [coins.USDCSOL] is configured

    config: USDCSolConfig

    def __init__(self, config: USDCSolConfig, *, sandbox: bool = False) -> None:
        super().__init__(config, sandbox=sandbox)
        try:  # only a shop that configures [coins.USDCSOL] needs them: not in a plain install
            import solana.rpc.api  # noqa: F401
            import solders.keypair  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"coins.USDCSOL needs {exc.name}, which is not installed: {INSTALL_SOLANA}") from None
        self.decimals = config.decimals
        self.mint = config.mint or USDC_MINT[config.network]
        self.caip2 = CAIP2[config.network]
        self._key = os.environ.get(config.fee_payer_key_env, "")
        self._fee_payer = ""
        if self._key:
            from solders.keypair import Keypair

            self._fee_payer = str(Keypair.from_base58_string(self._key).pubkey())
        self._scheme: Any = None
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()

    @property
    def network(self) -> str:
        return self.config.network

    def _facilitator(self) -> Any:
        if self._scheme is None:
            if not self._key:
                raise _reject("settlement_unavailable", status=503)
            from x402.mechanisms.svm.exact import ExactSvmFacilitatorScheme
            from x402.mechanisms.svm.signers import FacilitatorKeypairSigner

            self._scheme = ExactSvmFacilitatorScheme(
                FacilitatorKeypairSigner.from_base58([self._key], self.config.rpc_url)
            )
        return self._scheme

    # ---- the 402 answer ----

    def payment_requirements(self, amount_atomic: int, resource: str, description: str) -> dict[str, Any]:
        return {
            "scheme": "exact",
            "network": self.config.network,
            "maxAmountRequired": str(int(amount_atomic)),
            "resource": resource,
            "description": description,
            "mimeType": "application/json",
            "payTo": self.config.pay_to,
            "maxTimeoutSeconds": self.config.max_timeout_seconds,
            "asset": self.mint,
            "extra": {"feePayer": self._fee_payer},
        }

    def payment_requirements_v2(self, requirements: dict[str, Any]) -> dict[str, Any]:
        return {
            "scheme": "exact",
            "network": self.caip2,
            "amount": requirements["maxAmountRequired"],
            "asset": requirements["asset"],
            "payTo": requirements["payTo"],
            "maxTimeoutSeconds": requirements["maxTimeoutSeconds"],
            "extra": dict(requirements.get("extra") or {}),
        }

    def settlement_response(self, settlement: X402Settlement, version: int = 1) -> dict[str, Any]:
        answer = super().settlement_response(settlement, version)
        if version == 2:
            answer["network"] = self.caip2
            answer["amount"] = str(settlement.amount_atomic)
        return answer

    # ---- decoding ----

    def decode_payment(self, header_value: str, version: int = 1) -> X402Payment:
        """The payment header, its transaction decoded: no network."""
        from x402.mechanisms.svm.types import ExactSvmPayload
        from x402.mechanisms.svm.utils import (
            decode_transaction_from_payload,
            extract_transaction_info,
            transaction_message_hash,
        )

        if len(header_value) > MAX_HEADER_LENGTH:
            raise _reject("invalid_payment", "(too long)", 400)
        try:
            raw = json.loads(base64.b64decode(header_value, validate=True))
        except (binascii.Error, ValueError):
            raise _reject("invalid_payment", status=400) from None
        if not isinstance(raw, dict) or not isinstance(raw.get("payload"), dict):
            raise _reject("invalid_payment", "(payload is missing)", 400)
        if version == 2 and not isinstance(raw.get("accepted"), dict):
            raise _reject("invalid_payment", "(accepted is missing)", 400)
        transaction = raw["payload"].get("transaction")
        if not isinstance(transaction, str):
            raise _reject("invalid_payment", "(payload.transaction is missing)", 400)
        try:
            tx = decode_transaction_from_payload(ExactSvmPayload(transaction=transaction))
            info = extract_transaction_info(tx)
        except Exception:  # noqa: BLE001 - any failure to decode is the client's
            raise _reject("invalid_payment", "(payload.transaction is not a Solana transaction)", 400) from None
        if info is None:
            raise _reject("invalid_transaction")
        return X402Payment(
            payer=str(info.payer),
            nonce=transaction_message_hash(tx),
            value_atomic=int(info.amount),
            version=version,
            raw=raw,
        )

    # ---- settling ----

    async def settle(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        """Verify (the reference facilitator's checks, then the exact amount) and settle."""
        if payment.value_atomic != int(requirements["maxAmountRequired"]):
            raise _reject("wrong_amount", f"(expected {requirements['maxAmountRequired']}, got {payment.value_atomic})")
        with self._lock:
            if payment.nonce in self._in_flight:
                raise _reject("nonce_used", "(it is being settled now)")
            self._in_flight.add(payment.nonce)
        try:
            return await asyncio.to_thread(self._settle_blocking, payment, requirements)
        finally:
            with self._lock:
                self._in_flight.discard(payment.nonce)

    def _objects(self, payment: X402Payment, requirements: dict[str, Any]) -> tuple[Any, Any]:
        from x402.schemas import PaymentPayload, PaymentRequirements

        reqs = PaymentRequirements.model_validate(self.payment_requirements_v2(requirements))
        raw = payment.raw
        if payment.version == 1:
            if raw.get("scheme") != "exact":
                raise _reject("unsupported_scheme")
            if raw.get("network") != self.config.network:
                raise _reject("wrong_network")
            accepted = reqs.model_dump(by_alias=True)
            payload = PaymentPayload.model_validate({"x402Version": 2, "accepted": accepted, "payload": raw["payload"]})
        else:
            try:
                payload = PaymentPayload.model_validate(raw)
            except ValueError:
                raise _reject("invalid_payment", status=400) from None
        return payload, reqs

    def _settle_blocking(self, payment: X402Payment, requirements: dict[str, Any]) -> X402Settlement:
        scheme = self._facilitator()
        payload, reqs = self._objects(payment, requirements)
        try:
            verdict = scheme.verify(payload, reqs)
        except Exception as exc:  # noqa: BLE001 - nothing was sent
            log.warning("USDCSOL verification failed, nothing sent: %s", type(exc).__name__)
            raise _reject("settlement_unavailable", status=503) from None
        if not verdict.is_valid:
            code = _REASONS.get(verdict.invalid_reason or "", "invalid_transaction")
            raise _reject(code, f"({verdict.invalid_reason})")
        try:
            result = scheme.settle(payload, reqs)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(
                f"USDCSOL: sending the settlement failed ({type(exc).__name__}); outcome unknown"
            ) from None
        if not result.success:
            refused = _REASONS.get(result.error_reason or "")
            if refused in ("nonce_used", "settlement_rejected", "wrong_amount", "wrong_asset", "wrong_recipient"):
                raise _reject(refused, f"({result.error_reason})")
            raise PluginError(f"USDCSOL: settlement failed ({result.error_reason}); outcome unknown")
        return X402Settlement(
            payer=payment.payer,
            nonce=payment.nonce,
            transaction=result.transaction,
            network=self.config.network,
            amount_atomic=payment.value_atomic,
        )

    async def settlement_status(self, payment: X402Payment) -> X402Settlement | None:
        """Whether the fee payer's signature of this transaction is confirmed on chain."""
        return await asyncio.to_thread(self._status_blocking, payment)

    def _status_blocking(self, payment: X402Payment) -> X402Settlement | None:
        from solana.rpc.api import Client
        from solders.keypair import Keypair
        from solders.message import to_bytes_versioned
        from x402.mechanisms.svm.types import ExactSvmPayload
        from x402.mechanisms.svm.utils import decode_transaction_from_payload

        if not self._key:
            raise PluginError("USDCSOL: settlement_status needs the fee payer's key")
        tx = decode_transaction_from_payload(ExactSvmPayload(transaction=payment.raw["payload"]["transaction"]))
        signature = Keypair.from_base58_string(self._key).sign_message(to_bytes_versioned(tx.message))
        try:
            statuses = Client(self.config.rpc_url).get_signature_statuses([signature], search_transaction_history=True)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(f"USDCSOL: the Solana RPC endpoint failed: {type(exc).__name__}") from None
        status = statuses.value[0]
        if status is None or status.err is not None:
            return None
        return X402Settlement(
            payer=payment.payer,
            nonce=payment.nonce,
            transaction=str(signature),
            network=self.config.network,
            amount_atomic=payment.value_atomic,
        )

    # ---- health ----

    async def preflight(self) -> None:
        await require_reachable(self.config.rpc_url, setting="coins.USDCSOL.rpc_url", what="USDCSOL Solana node")

    async def check_ready(self) -> Readiness:
        if not self._key:
            return Readiness(
                False, f"environment variable {self.config.fee_payer_key_env} (fee_payer_key_env) is empty"
            )
        return Readiness(True, f"direct settlement on {self.config.network}, fee payer {self._fee_payer}")


@hookimpl(trylast=True)
def vpsshop_register_coins() -> Iterable[type[PaymentCoin[Any]]]:
    return [USDCSOL]


__all__ = ["USDCSOL", "USDCSolConfig"]
