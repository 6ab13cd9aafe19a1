"""Monero addresses, watch-only: subaddresses from the primary address and the secret view key.

A subaddress ``(major, minor)`` of a wallet with public spend key ``B`` and secret view key ``a``
is ``D = B + Hs("SubAddr\\0" || a || major || minor)·G`` (spend part) and ``C = a·D`` (view part),
written with Monero's block base58 and a Keccak-256 checksum. Computing it needs only ``B`` and
``a``: exactly what a view-only wallet holds, so the shop can hand out addresses with no node and
no spend key. ``monero-wallet-rpc``'s ``get_address`` must agree, and the plugin checks it does.

The Ed25519 arithmetic, the subaddress derivation and the address encoding are bip-utils'
(``Monero.FromWatchOnly``); this module adds what the plugin checks of a reseller's keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from bip_utils import (
    Base58XmrDecoder,
    Kekkak256,
    Monero,
    MoneroCoins,
    MoneroConf,
    XmrAddrDecoder,
)
from bip_utils import MoneroKeyError as _BipMoneroKeyError
from bip_utils.ecc import Ed25519Utils

# bip-utils' coin and its address prefixes, by network name.
COINS = {
    "mainnet": (MoneroCoins.MONERO_MAINNET, MoneroConf.MainNet),
    "stagenet": (MoneroCoins.MONERO_STAGENET, MoneroConf.StageNet),
    "testnet": (MoneroCoins.MONERO_TESTNET, MoneroConf.TestNet),
}


class MoneroKeyError(ValueError):
    """An address or key that is not valid Monero."""


def hash_to_scalar(data: bytes) -> int:
    """Monero's ``Hs``: Keccak-256 of ``data`` reduced modulo the group order."""
    reduced: bytes = Ed25519Utils.ScalarReduce(Kekkak256.QuickDigest(data))
    return int.from_bytes(reduced, "little")


@dataclass(frozen=True)
class ParsedAddress:
    network: str
    subaddress: bool
    spend_public: bytes
    view_public: bytes


def parse_address(address: str) -> ParsedAddress:
    """The network and public keys of a standard address or subaddress (not an integrated one)."""
    address = address.strip()
    try:
        prefix = Base58XmrDecoder.Decode(address)[:1]
    except ValueError:
        raise MoneroKeyError("not a standard Monero address (not base58)") from None
    for network, (_, conf) in COINS.items():
        if prefix in (conf.AddrNetVersion(), conf.SubaddrNetVersion()):
            try:
                keys: bytes = XmrAddrDecoder.DecodeAddr(address, net_ver=prefix)
            except ValueError:
                raise MoneroKeyError("not a standard Monero address (length, checksum or keys)") from None
            return ParsedAddress(network, prefix == conf.SubaddrNetVersion(), keys[:32], keys[32:])
    raise MoneroKeyError(f"unknown Monero address prefix {prefix.hex()}")


class ViewWallet:
    """Derives subaddresses from a primary address and its secret view key."""

    def __init__(self, primary_address: str, view_key_hex: str) -> None:
        parsed = parse_address(primary_address)
        if parsed.subaddress:
            raise MoneroKeyError("give the wallet's primary address, not a subaddress")
        try:
            view_secret = bytes.fromhex(view_key_hex)
        except ValueError:
            raise MoneroKeyError("the view key is 64 hex digits") from None
        try:
            wallet = Monero.FromWatchOnly(view_secret, parsed.spend_public, COINS[parsed.network][0])
        except _BipMoneroKeyError:
            raise MoneroKeyError("the view key is not a reduced 32-byte scalar") from None
        if wallet.PublicViewKey().RawCompressed().ToBytes() != parsed.view_public:
            raise MoneroKeyError("the view key does not belong to this address")
        self.network = parsed.network
        self.primary = primary_address.strip()
        self._wallet = wallet

    def subaddress(self, minor: int, major: int = 0) -> str:
        """Subaddress ``minor`` of account ``major``; (0, 0) is the primary address."""
        address: str = self._wallet.Subaddress(minor, major)
        return address


def keys_from_spend_secret(spend_secret: bytes, network: str) -> tuple[str, str]:
    """(primary address, secret view key hex) of a wallet, with Monero's view = Hs(spend) rule."""
    wallet = Monero.FromPrivateSpendKey(Ed25519Utils.ScalarReduce(spend_secret), COINS[network][0])
    address: str = wallet.PrimaryAddress()
    view_hex: str = wallet.PrivateViewKey().Raw().ToHex()
    return address, view_hex
