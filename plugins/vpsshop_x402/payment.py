"""The payment headers USDCBASE reads, as pydantic models: ``X-PAYMENT`` (x402 v1) and
``PAYMENT-SIGNATURE`` (x402 v2), each carrying an ``exact`` EIP-3009 authorization.

Part of the ``vpsshop_x402`` plugin (see its module docstring); nothing here touches the network.
:func:`parse_payment` gives the JSON object a header encodes and its model, or raises
``X402Rejected("invalid_payment", ..., 400)`` with a message naming the field at fault
(``payload.authorization.nonce is missing or malformed.``). Numbers travel as strings, as x402 sends them.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PositiveInt, StringConstraints, ValidationError
from x402.schemas import BaseX402Model, PaymentRequirements, ResourceInfo

from vpsshop import X402Rejected

MAX_HEADER_LENGTH = 16_384
"""The longest payment header read, in characters of base64."""

MAX_PAYMENT_DEPTH = 32
"""How deep the JSON of a payment header may nest (a v2 payload echoing the ``bazaar`` extension's
schemas nests about 14 levels); deeper is a 400 ``invalid_payment`` before the JSON is parsed."""

Address = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{40}$")]
"""A 0x-prefixed 20-byte hex address, in any letter case."""
Bytes32 = Annotated[str, StringConstraints(pattern=r"^0x[0-9a-fA-F]{64}$")]
HexBytes = Annotated[str, StringConstraints(pattern=r"^0x(?:[0-9a-fA-F]{2})*$")]
Uint = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,78}$")]
"""An unsigned integer in decimal digits."""
Text = Annotated[str, StringConstraints(min_length=1)]

_EXACT = ConfigDict(strict=True, validate_by_name=False)
"""JSON types as sent (no "300" for 300, no true for 1), and the fields by their x402 names only."""

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


class Authorization(BaseX402Model):
    """The arguments of EIP-3009 ``transferWithAuthorization`` that the payer signed."""

    model_config = _EXACT

    from_: Address = Field(alias="from")
    to: Address
    value: Uint
    valid_after: Uint
    valid_before: Uint
    nonce: Bytes32


class ExactPayload(BaseX402Model):
    """``payload`` of the ``exact`` scheme on an EVM network: the authorization and its signature."""

    model_config = _EXACT

    signature: HexBytes
    authorization: Authorization


class PaymentV1(BaseX402Model):
    """``X-PAYMENT``, x402 v1: scheme and network beside the payload."""

    model_config = _EXACT

    x402_version: Literal[1]
    scheme: str
    network: str
    payload: ExactPayload


class AcceptedRequirements(PaymentRequirements):
    """x402 v2's ``PaymentRequirements`` as the client echoes them in ``accepted``, every required field
    present and of its type (the facilitator refuses a payload without them, after it was recorded)."""

    model_config = _EXACT

    scheme: Text
    network: Text
    asset: Text
    amount: Uint
    pay_to: Text
    max_timeout_seconds: PositiveInt


class PaymentV2(BaseX402Model):
    """``PAYMENT-SIGNATURE``, x402 v2: the x402 package's ``PaymentPayload`` with an ``exact`` payload."""

    model_config = _EXACT

    x402_version: Literal[2]
    accepted: AcceptedRequirements
    payload: ExactPayload
    resource: ResourceInfo | None = None
    extensions: dict[str, Any] | None = None


def parse_payment(header_value: str, version: int) -> tuple[dict[str, Any], PaymentV1 | PaymentV2]:
    """The JSON object of ``X-PAYMENT`` (``version`` 1) or ``PAYMENT-SIGNATURE`` (2), and its model.

    :raises vpsshop.X402Rejected: 400 ``invalid_payment``, saying what is wrong.
    """
    raw = _decode(header_value)
    if not isinstance(raw, dict):
        raise _invalid("The payment header must encode a JSON object.")
    try:
        return raw, (PaymentV1 if version == 1 else PaymentV2).model_validate(raw)
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors(include_url=False)[0]["loc"])
        if where == "x402Version":
            raise _invalid(f"The payment header must carry x402Version {version}.") from None
        raise _invalid(f"{where} is missing or malformed.") from None


def _decode(header_value: str) -> Any:
    """The JSON a header encodes in base64, within the limits on length and nesting."""
    text = (header_value or "").strip()
    if not text or len(text) > MAX_HEADER_LENGTH:
        raise _invalid("The payment header is empty or too long.")
    try:
        decoded = base64.b64decode(text + "=" * (-len(text) % 4), validate=True).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _invalid("The payment header is not base64-encoded JSON.") from None
    if json_nesting(decoded) > MAX_PAYMENT_DEPTH:
        raise _invalid(f"The payment header's JSON nests deeper than {MAX_PAYMENT_DEPTH} levels.")
    try:
        return json.loads(decoded)
    except ValueError:
        raise _invalid("The payment header is not base64-encoded JSON.") from None


def json_nesting(text: str) -> int:
    """How deeply the arrays and objects of the JSON ``text`` nest, counted without parsing it (so a
    payload nested thousands deep never reaches the recursive parser). Brackets inside strings do
    not count; malformed JSON gives some number and is refused by the parser afterwards."""
    depth = deepest = 0
    for char in _JSON_STRING.sub("", text):
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _invalid(message: str) -> X402Rejected:
    return X402Rejected("invalid_payment", message, 400)
