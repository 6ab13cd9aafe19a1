"""BIP-39 seed and BIP-32 *private* derivation, for tests only.

The shop never holds these keys: tests use them to compute the account xpub of a well-known
mnemonic (the sandbox keys) and the private key of a deposit address (to spend from it, as a
reseller's sweep would). Private derivation is the textbook CKDpriv on libsecp256k1 (coincurve).
"""

from __future__ import annotations

import hashlib
import hmac
import unicodedata

from coincurve import PrivateKey

from vpsshop.hdkeys import HARDENED, ExtendedPublicKey, hash160

ABANDON_MNEMONIC = "abandon " * 11 + "about"
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def mnemonic_seed(mnemonic: str, passphrase: str = "") -> bytes:
    """BIP-39: PBKDF2-HMAC-SHA512, 2048 rounds, salt "mnemonic" + passphrase."""
    norm = unicodedata.normalize("NFKD", mnemonic)
    salt = unicodedata.normalize("NFKD", "mnemonic" + passphrase)
    return hashlib.pbkdf2_hmac("sha512", norm.encode(), salt.encode(), 2048)


def parse_path(path: str) -> list[int]:
    parts = path.split("/")
    assert parts[0] == "m"
    return [int(p[:-1]) + HARDENED if p.endswith("'") else int(p) for p in parts[1:]]


class PrivateNode:
    def __init__(
        self, key: bytes, chain_code: bytes, depth: int = 0, parent_fp: bytes = b"\0" * 4, child_number: int = 0
    ) -> None:
        self.key, self.chain_code, self.depth, self.parent_fp, self.child_number = (
            key,
            chain_code,
            depth,
            parent_fp,
            child_number,
        )

    @classmethod
    def from_seed(cls, seed: bytes) -> PrivateNode:
        digest = hmac.new(b"Bitcoin seed", seed, hashlib.sha512).digest()
        return cls(digest[:32], digest[32:])

    @property
    def public_key(self) -> bytes:
        return PrivateKey(self.key).public_key.format(compressed=True)

    def child(self, index: int) -> PrivateNode:
        if index >= HARDENED:
            data = b"\0" + self.key + index.to_bytes(4, "big")
        else:
            data = self.public_key + index.to_bytes(4, "big")
        digest = hmac.new(self.chain_code, data, hashlib.sha512).digest()
        key = (int.from_bytes(digest[:32], "big") + int.from_bytes(self.key, "big")) % SECP256K1_N
        return PrivateNode(key.to_bytes(32, "big"), digest[32:], self.depth + 1, hash160(self.public_key)[:4], index)

    def derive(self, path: str) -> PrivateNode:
        node = self
        for index in parse_path(path):
            node = node.child(index)
        return node

    def xpub(self) -> str:
        return ExtendedPublicKey(
            bytes.fromhex("0488b21e"), self.depth, self.parent_fp, self.child_number, self.chain_code, self.public_key
        ).serialize()


def account_node(path: str, mnemonic: str = ABANDON_MNEMONIC) -> PrivateNode:
    return PrivateNode.from_seed(mnemonic_seed(mnemonic)).derive(path)
