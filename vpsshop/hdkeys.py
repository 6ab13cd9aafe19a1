"""Watch-only key derivation: BIP-32 public derivation, base58check and bech32 (BIP-173).

Coin plugins derive a deposit address per top-up from the reseller's *extended public key*
(xpub, zpub, tpub, vpub ...), so the server never holds a key that can spend. Only public
derivation (non-hardened child numbers) is possible, which is all a deposit address needs:
the reseller's wallet holds the account key ``m/84'/0'/0'`` and vpsshop derives
``<account>/0/<index>`` for top-up number ``index``.

Secp256k1 point arithmetic comes from ``coincurve`` (libsecp256k1). The EVM and TRON plugins
reuse :class:`ExtendedPublicKey` with their own address encodings.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from coincurve import PublicKey

_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}
HARDENED = 0x8000_0000

# SLIP-132 version bytes of extended *public* keys, by the prefix they print as.
PUBLIC_VERSIONS: dict[bytes, str] = {
    bytes.fromhex("0488b21e"): "xpub",
    bytes.fromhex("049d7cb2"): "ypub",
    bytes.fromhex("04b24746"): "zpub",
    bytes.fromhex("043587cf"): "tpub",
    bytes.fromhex("044a5262"): "upub",
    bytes.fromhex("045f1cf6"): "vpub",
    bytes.fromhex("019da462"): "Ltub",
    bytes.fromhex("01b26ef6"): "Mtub",
}
PRIVATE_VERSIONS = {
    bytes.fromhex(h) for h in ("0488ade4", "049d7878", "04b2430c", "04358394", "044a4e28", "045f18bc", "019d9cfe")
}


class KeyError_(ValueError):
    """An extended key or address that cannot be parsed."""


# ---- hashes and base58 ---------------------------------------------------------------------


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def hash160(data: bytes) -> bytes:
    """RIPEMD-160 of SHA-256: the key hash of P2PKH and P2WPKH outputs."""
    try:
        h = hashlib.new("ripemd160")
    except ValueError:  # pragma: no cover - OpenSSL 3 builds without the legacy provider
        from Crypto.Hash import RIPEMD160

        return RIPEMD160.new(sha256(data)).digest()
    h.update(sha256(data))
    return h.digest()


def b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = []
    while number:
        number, rem = divmod(number, 58)
        out.append(_B58_ALPHABET[rem])
    pad = len(data) - len(data.lstrip(b"\0"))
    return "1" * pad + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    number = 0
    for char in text:
        if char not in _B58_INDEX:
            raise KeyError_(f"not base58: {char!r}")
        number = number * 58 + _B58_INDEX[char]
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    pad = len(text) - len(text.lstrip("1"))
    return b"\0" * pad + body


def b58check_encode(payload: bytes) -> str:
    return b58encode(payload + sha256(sha256(payload))[:4])


def b58check_decode(text: str) -> bytes:
    raw = b58decode(text)
    if len(raw) < 5 or sha256(sha256(raw[:-4]))[:4] != raw[-4:]:
        raise KeyError_("bad base58check checksum")
    return raw[:-4]


# ---- bech32 / segwit addresses (BIP-173) -----------------------------------------------------

_BECH32_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_BECH32_GEN = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)


def _polymod(values: list[int]) -> int:
    chk = 1
    for value in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ value
        for i, gen in enumerate(_BECH32_GEN):
            if (top >> i) & 1:
                chk ^= gen
    return chk


def _hrp_expand(hrp: str) -> list[int]:
    return [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]


def _convert_bits(data: bytes | list[int], from_bits: int, to_bits: int, pad: bool) -> list[int]:
    acc = bits = 0
    out = []
    maxv = (1 << to_bits) - 1
    for value in data:
        acc = (acc << from_bits) | value
        bits += from_bits
        while bits >= to_bits:
            bits -= to_bits
            out.append((acc >> bits) & maxv)
    if pad and bits:
        out.append((acc << (to_bits - bits)) & maxv)
    elif not pad and (bits >= from_bits or ((acc << (to_bits - bits)) & maxv)):
        raise KeyError_("invalid bech32 padding")
    return out


def segwit_v0_address(hrp: str, program: bytes) -> str:
    """A bech32 (BIP-173) address of a version 0 witness program (P2WPKH: 20 bytes)."""
    data = [0, *_convert_bits(program, 8, 5, True)]
    checksum = _polymod(_hrp_expand(hrp) + data + [0] * 6) ^ 1
    data += [(checksum >> 5 * (5 - i)) & 31 for i in range(6)]
    return hrp + "1" + "".join(_BECH32_CHARSET[d] for d in data)


def decode_segwit_v0(hrp: str, address: str) -> bytes:
    """The witness program of a version 0 bech32 address for ``hrp``. Raises :class:`KeyError_`."""
    address = address.lower()
    pos = address.rfind("1")
    if address[:pos] != hrp or pos + 7 > len(address):
        raise KeyError_(f"not a {hrp} address")
    try:
        data = [_BECH32_CHARSET.index(c) for c in address[pos + 1 :]]
    except ValueError:
        raise KeyError_("not bech32") from None
    if _polymod(_hrp_expand(hrp) + data) != 1:
        raise KeyError_("bad bech32 checksum")
    if data[0] != 0:
        raise KeyError_("not a version 0 witness program")
    return bytes(_convert_bits(data[1:-6], 5, 8, False))


# ---- BIP-32 public derivation ------------------------------------------------------------------


@dataclass(frozen=True)
class ExtendedPublicKey:
    """A BIP-32 extended public key: derive non-hardened children without any private key."""

    version: bytes
    depth: int
    parent_fingerprint: bytes
    child_number: int
    chain_code: bytes
    public_key: bytes
    """33-byte compressed secp256k1 point."""

    @classmethod
    def parse(cls, text: str) -> ExtendedPublicKey:
        """Parse an xpub/ypub/zpub/tpub/upub/vpub/Ltub/Mtub. A private key is refused."""
        try:
            raw = b58check_decode(text.strip())
        except KeyError_ as exc:
            raise KeyError_(f"not an extended public key: {exc}") from None
        if len(raw) != 78:
            raise KeyError_("not an extended public key: wrong length")
        version = raw[:4]
        if version in PRIVATE_VERSIONS:
            raise KeyError_("this is a PRIVATE extended key: give the watch-only public key (xpub/zpub/vpub)")
        if version not in PUBLIC_VERSIONS:
            raise KeyError_(f"unknown extended key version {version.hex()}")
        key = raw[45:78]
        try:
            PublicKey(key)
        except Exception:  # noqa: BLE001 - coincurve raises ValueError/TypeError variants
            raise KeyError_("extended key holds an invalid public key") from None
        return cls(version, raw[4], raw[5:9], int.from_bytes(raw[9:13], "big"), raw[13:45], key)

    @property
    def kind(self) -> str:
        return PUBLIC_VERSIONS.get(self.version, "?")

    def serialize(self, version: bytes | None = None) -> str:
        raw = (
            (version or self.version)
            + bytes([self.depth])
            + self.parent_fingerprint
            + self.child_number.to_bytes(4, "big")
            + self.chain_code
            + self.public_key
        )
        return b58check_encode(raw)

    def fingerprint(self) -> bytes:
        return hash160(self.public_key)[:4]

    def child(self, index: int) -> ExtendedPublicKey:
        """CKDpub (BIP-32): the non-hardened child ``index``."""
        if not 0 <= index < HARDENED:
            raise ValueError("public derivation needs a non-hardened index (0 <= index < 2**31)")
        digest = hmac.new(self.chain_code, self.public_key + index.to_bytes(4, "big"), hashlib.sha512).digest()
        tweak, chain_code = digest[:32], digest[32:]
        # coincurve refuses a tweak >= n or a result at infinity: BIP-32 says skip to the next index.
        point = PublicKey(self.public_key).add(tweak)
        return ExtendedPublicKey(
            self.version, self.depth + 1, self.fingerprint(), index, chain_code, point.format(compressed=True)
        )

    def derive(self, *path: int) -> ExtendedPublicKey:
        node = self
        for index in path:
            node = node.child(index)
        return node

    def uncompressed(self) -> bytes:
        """65-byte uncompressed point (EVM and TRON addresses hash it)."""
        return PublicKey(self.public_key).format(compressed=False)


def p2wpkh_address(hrp: str, public_key: bytes) -> str:
    """The native segwit (BIP-84) address of a compressed public key."""
    return segwit_v0_address(hrp, hash160(public_key))


def p2wpkh_script(public_key_hash: bytes) -> bytes:
    return b"\x00\x14" + public_key_hash
