"""Watch-only key derivation: BIP-32 public derivation, base58check and bech32 (BIP-173), on bip-utils.

Coin plugins derive a deposit address per top-up from the reseller's *extended public key*
(xpub, zpub, tpub, vpub ...), so the server never holds a key that can spend. Only public
derivation (non-hardened child numbers) is possible, which is all a deposit address needs:
the reseller's wallet holds the account key ``m/84'/0'/0'`` and vpsshop derives
``<account>/0/<index>`` for top-up number ``index``.

The cryptography and the encodings are bip-utils' (BIP-32 on libsecp256k1 through coincurve,
base58, segwit bech32); this module keeps vpsshop's names and policy over them: which SLIP-132
versions a setting may hold, that a private key is refused, one error type. The EVM and TRON
plugins reuse :class:`ExtendedPublicKey` with their own address encodings.
"""

from __future__ import annotations

from dataclasses import dataclass

from bip_utils import (
    Base58ChecksumError,
    Base58Decoder,
    Base58Encoder,
    Bip32KeyData,
    Bip32KeyError,
    Bip32KeyNetVersions,
    Bip32Secp256k1,
    Hash160,
    P2WPKHAddrEncoder,
    SegwitBech32Decoder,
)
from bip_utils.bip.bip32 import Bip32Base

HARDENED = 0x8000_0000

# SLIP-132 version bytes of extended keys: the public one, by the prefix it prints as, and the
# private one of the same kind (refused with its own message).
_SLIP132: dict[str, tuple[str, str]] = {
    "xpub": ("0488b21e", "0488ade4"),
    "ypub": ("049d7cb2", "049d7878"),
    "zpub": ("04b24746", "04b2430c"),
    "tpub": ("043587cf", "04358394"),
    "upub": ("044a5262", "044a4e28"),
    "vpub": ("045f1cf6", "045f18bc"),
    "Ltub": ("019da462", "019d9cfe"),
    "Mtub": ("01b26ef6", "01b26792"),
}
PUBLIC_VERSIONS: dict[bytes, str] = {bytes.fromhex(pub): name for name, (pub, _) in _SLIP132.items()}
PRIVATE_VERSIONS = {bytes.fromhex(prv) for _, prv in _SLIP132.values()}
_NET_VERSIONS = {
    bytes.fromhex(pub): Bip32KeyNetVersions(bytes.fromhex(pub), bytes.fromhex(prv)) for pub, prv in _SLIP132.values()
}


class KeyError_(ValueError):
    """An extended key or address that cannot be parsed."""


# ---- hashes and base58 ---------------------------------------------------------------------


def hash160(data: bytes) -> bytes:
    """RIPEMD-160 of SHA-256: the key hash of P2PKH and P2WPKH outputs."""
    digest: bytes = Hash160.QuickDigest(data)
    return digest


def b58encode(data: bytes) -> str:
    text: str = Base58Encoder.Encode(data)
    return text


def b58decode(text: str) -> bytes:
    """:raises KeyError_: a character outside the base58 alphabet."""
    try:
        raw: bytes = Base58Decoder.Decode(text)
    except ValueError:
        raise KeyError_("not base58") from None
    return raw


def b58check_encode(payload: bytes) -> str:
    text: str = Base58Encoder.CheckEncode(payload)
    return text


def b58check_decode(text: str) -> bytes:
    """The payload of a base58check string. :raises KeyError_: not base58, or a bad checksum."""
    try:
        payload: bytes = Base58Decoder.CheckDecode(text)
    except Base58ChecksumError:
        raise KeyError_("bad base58check checksum") from None
    except ValueError:
        raise KeyError_("not base58") from None
    return payload


# ---- segwit addresses (BIP-173) -------------------------------------------------------------


def decode_segwit_v0(hrp: str, address: str) -> bytes:
    """The witness program of a version 0 bech32 address for ``hrp``. Raises :class:`KeyError_`."""
    try:
        version, program = SegwitBech32Decoder.Decode(hrp, address.lower())
    except (ValueError, TypeError) as exc:  # bip-utils' Bech32ChecksumError is a ValueError too
        raise KeyError_(f"not a {hrp} segwit address: {exc}") from None
    if version != 0:
        raise KeyError_("not a version 0 witness program")
    witness_program: bytes = program
    return witness_program


def p2wpkh_address(hrp: str, public_key: bytes) -> str:
    """The native segwit (BIP-84) address of a compressed public key."""
    address: str = P2WPKHAddrEncoder.EncodeKey(public_key, hrp=hrp)
    return address


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
        text = text.strip()
        try:
            raw = b58check_decode(text)
        except KeyError_ as exc:
            raise KeyError_(f"not an extended public key: {exc}") from None
        if len(raw) != 78:
            raise KeyError_("not an extended public key: wrong length")
        version = raw[:4]
        if version in PRIVATE_VERSIONS:
            raise KeyError_("this is a PRIVATE extended key: give the watch-only public key (xpub/zpub/vpub)")
        if version not in PUBLIC_VERSIONS:
            raise KeyError_(f"unknown extended key version {version.hex()}")
        try:
            node = Bip32Secp256k1.FromExtendedKey(text, _NET_VERSIONS[version])
        except Bip32KeyError:
            raise KeyError_("extended key holds an invalid public key") from None
        return cls._of(node, version)

    @classmethod
    def _of(cls, node: Bip32Base, version: bytes) -> ExtendedPublicKey:
        return cls(
            version,
            node.Depth().ToInt(),
            node.ParentFingerPrint().ToBytes(),
            node.Index().ToInt(),
            node.ChainCode().ToBytes(),
            node.PublicKey().RawCompressed().ToBytes(),
        )

    def _node(self, version: bytes | None = None) -> Bip32Base:
        """This key as bip-utils' BIP-32 node, written with ``version`` (default: its own)."""
        version = version or self.version
        data = Bip32KeyData(self.depth, self.child_number, self.chain_code, self.parent_fingerprint)
        net_versions = _NET_VERSIONS.get(version) or Bip32KeyNetVersions(version, version)
        return Bip32Secp256k1.FromPublicKey(self.public_key, data, net_versions)

    @property
    def kind(self) -> str:
        return PUBLIC_VERSIONS.get(self.version, "?")

    def serialize(self, version: bytes | None = None) -> str:
        """The base58check text of this key, with its own version bytes or ``version`` (SLIP-132)."""
        text: str = self._node(version).PublicKey().ToExtended()
        return text

    def fingerprint(self) -> bytes:
        return hash160(self.public_key)[:4]

    def child(self, index: int) -> ExtendedPublicKey:
        """CKDpub (BIP-32): the non-hardened child ``index``."""
        if not 0 <= index < HARDENED:
            raise ValueError("public derivation needs a non-hardened index (0 <= index < 2**31)")
        return self._of(self._node().ChildKey(index), self.version)

    def derive(self, *path: int) -> ExtendedPublicKey:
        node = self
        for index in path:
            node = node.child(index)
        return node

    def uncompressed(self) -> bytes:
        """65-byte uncompressed point (EVM and TRON addresses hash it)."""
        point: bytes = self._node().PublicKey().RawUncompressed().ToBytes()
        return point
