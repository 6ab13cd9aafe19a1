"""Monero addresses, watch-only: subaddresses from the primary address and the secret view key.

A subaddress ``(major, minor)`` of a wallet with public spend key ``B`` and secret view key ``a``
is ``D = B + Hs("SubAddr\\0" || a || major || minor)·G`` (spend part) and ``C = a·D`` (view part),
written with Monero's block base58 and a Keccak-256 checksum. Computing it needs only ``B`` and
``a``: exactly what a view-only wallet holds, so the shop can hand out addresses with no node and
no spend key. ``monero-wallet-rpc``'s ``get_address`` must agree, and the plugin checks it does.

Ed25519 arithmetic is written here in plain Python (extended twisted Edwards coordinates): a
subaddress costs two scalar multiplications, a few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from Crypto.Hash import keccak

Q = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = (-121665 * pow(121666, Q - 2, Q)) % Q
SQRT_M1 = pow(2, (Q - 1) // 4, Q)

# Network prefixes (varint): (standard address, subaddress).
PREFIXES = {
    "mainnet": (18, 42),
    "testnet": (53, 63),
    "stagenet": (24, 36),
}

_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_ENCODED_BLOCK = [0, 2, 3, 5, 6, 7, 9, 10, 11]


class MoneroKeyError(ValueError):
    """An address or key that is not valid Monero."""


def keccak256(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def hash_to_scalar(data: bytes) -> int:
    return int.from_bytes(keccak256(data), "little") % L


# ---- ed25519 points: (X, Y, Z, T) with x = X/Z, y = Y/Z, xy = T/Z --------------------------------

Point = tuple[int, int, int, int]


def _add(p: Point, q: Point) -> Point:
    a = (p[1] - p[0]) * (q[1] - q[0]) % Q
    b = (p[1] + p[0]) * (q[1] + q[0]) % Q
    c = 2 * p[3] * q[3] * D % Q
    d = 2 * p[2] * q[2] % Q
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % Q, g * h % Q, f * g % Q, e * h % Q)


def _mul(scalar: int, p: Point) -> Point:
    result: Point = (0, 1, 1, 0)
    while scalar:
        if scalar & 1:
            result = _add(result, p)
        p = _add(p, p)
        scalar >>= 1
    return result


def _recover_x(y: int, sign: int) -> int:
    if y >= Q:
        raise MoneroKeyError("not a curve point")
    x2 = (y * y - 1) * pow(D * y * y + 1, Q - 2, Q) % Q
    if x2 == 0:
        if sign:
            raise MoneroKeyError("not a curve point")
        return 0
    x = pow(x2, (Q + 3) // 8, Q)
    if (x * x - x2) % Q:
        x = x * SQRT_M1 % Q
    if (x * x - x2) % Q:
        raise MoneroKeyError("not a curve point")
    if (x & 1) != sign:
        x = Q - x
    return x


def decode_point(raw: bytes) -> Point:
    if len(raw) != 32:
        raise MoneroKeyError("a public key is 32 bytes")
    y = int.from_bytes(raw, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _recover_x(y, sign)
    return (x, y, 1, x * y % Q)


def encode_point(p: Point) -> bytes:
    zinv = pow(p[2], Q - 2, Q)
    x, y = p[0] * zinv % Q, p[1] * zinv % Q
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


_GY = 4 * pow(5, Q - 2, Q) % Q
G: Point = (_recover_x(_GY, 0), _GY, 1, _recover_x(_GY, 0) * _GY % Q)


def public_from_secret(secret: bytes) -> bytes:
    return encode_point(_mul(int.from_bytes(secret, "little") % L, G))


# ---- Monero base58 ----------------------------------------------------------------------------


def b58encode(data: bytes) -> str:
    out = []
    for start in range(0, len(data), 8):
        block = data[start : start + 8]
        number = int.from_bytes(block, "big")
        chars = []
        for _ in range(_ENCODED_BLOCK[len(block)]):
            number, rem = divmod(number, 58)
            chars.append(_ALPHABET[rem])
        out.append("".join(reversed(chars)))
    return "".join(out)


def b58decode(text: str) -> bytes:
    out = bytearray()
    for start in range(0, len(text), 11):
        chunk = text[start : start + 11]
        if len(chunk) not in _ENCODED_BLOCK:
            raise MoneroKeyError("bad base58 length")
        size = _ENCODED_BLOCK.index(len(chunk))
        number = 0
        for char in chunk:
            idx = _ALPHABET.find(char)
            if idx < 0:
                raise MoneroKeyError(f"not base58: {char!r}")
            number = number * 58 + idx
        if number >= 1 << (8 * size):
            raise MoneroKeyError("bad base58 block")
        out += number.to_bytes(size, "big")
    return bytes(out)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_address(prefix: int, spend: bytes, view: bytes) -> str:
    body = _varint(prefix) + spend + view
    return b58encode(body + keccak256(body)[:4])


@dataclass(frozen=True)
class ParsedAddress:
    network: str
    subaddress: bool
    spend_public: bytes
    view_public: bytes


def parse_address(address: str) -> ParsedAddress:
    raw = b58decode(address.strip())
    if len(raw) != 69 or keccak256(raw[:-4])[:4] != raw[-4:]:
        raise MoneroKeyError("not a standard Monero address (length or checksum)")
    prefix = raw[0]
    for network, (standard, sub) in PREFIXES.items():
        if prefix in (standard, sub):
            return ParsedAddress(network, prefix == sub, raw[1:33], raw[33:65])
    raise MoneroKeyError(f"unknown Monero address prefix {prefix}")


class ViewWallet:
    """Derives subaddresses of account 0 from a primary address and its secret view key."""

    def __init__(self, primary_address: str, view_key_hex: str) -> None:
        parsed = parse_address(primary_address)
        if parsed.subaddress:
            raise MoneroKeyError("give the wallet's primary address, not a subaddress")
        try:
            view_secret = bytes.fromhex(view_key_hex)
        except ValueError:
            raise MoneroKeyError("the view key is 64 hex digits") from None
        if len(view_secret) != 32 or int.from_bytes(view_secret, "little") >= L:
            raise MoneroKeyError("the view key is not a reduced 32-byte scalar")
        if public_from_secret(view_secret) != parsed.view_public:
            raise MoneroKeyError("the view key does not belong to this address")
        self.network = parsed.network
        self.primary = primary_address.strip()
        self._spend = decode_point(parsed.spend_public)
        self._a = int.from_bytes(view_secret, "little")
        self._a_bytes = view_secret

    def subaddress(self, minor: int, major: int = 0) -> str:
        if major == 0 and minor == 0:
            return self.primary
        m = hash_to_scalar(b"SubAddr\x00" + self._a_bytes + major.to_bytes(4, "little") + minor.to_bytes(4, "little"))
        d_point = _add(self._spend, _mul(m, G))
        c_point = _mul(self._a, d_point)
        return encode_address(PREFIXES[self.network][1], encode_point(d_point), encode_point(c_point))


def keys_from_spend_secret(spend_secret: bytes, network: str) -> tuple[str, str]:
    """(primary address, secret view key hex) of a wallet, with Monero's view = Hs(spend) rule."""
    b = int.from_bytes(spend_secret, "little") % L
    spend = b.to_bytes(32, "little")
    view = hash_to_scalar(spend).to_bytes(32, "little")
    address = encode_address(PREFIXES[network][0], public_from_secret(spend), public_from_secret(view))
    return address, view.hex()
