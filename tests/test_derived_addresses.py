"""Old against new: the default coins derive exactly the deposit addresses they derived before bip-utils.

``tests/vectors/derived_addresses.json`` was recorded from the hand-written key code (BIP-32, base58,
bech32, Ed25519 and Monero base58 written in vpsshop) by ``tests/vectors/record_derived_addresses.py``,
before bip-utils replaced it (issue 26): 4,000 addresses, a few hundred per coin and network, from
account keys in every SLIP-132 spelling the parser takes, at the first indices and spread up to the
largest. A customer who was handed one of them must still be credited, so every one must come out
the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vpsshop.testing import TEST_ENCRYPTION_KEY

VECTORS = json.loads((Path(__file__).parent / "vectors" / "derived_addresses.json").read_text())["cases"]


def coin_classes() -> dict[str, Any]:
    from vpsshop_bitcoin import Bitcoin, Litecoin
    from vpsshop_evm import Ether, TetherErc20
    from vpsshop_monero import Monero
    from vpsshop_solana import Solana
    from vpsshop_tron import TetherTrc20, Tronix

    return {c.code: c for c in (Bitcoin, Litecoin, Ether, TetherErc20, Monero, Solana, Tronix, TetherTrc20)}


def build(case: dict[str, Any]) -> Any:
    cls = coin_classes()[case["coin"]]
    if case["coin"] == "SOL":
        from vpsshop_solana import encrypt_mnemonic

        settings = {"seed_encrypted": encrypt_mnemonic(TEST_ENCRYPTION_KEY, case["mnemonic"])}
        coin = cls.from_settings(settings, sandbox=False, where="coins.SOL")
        coin.unlock(TEST_ENCRYPTION_KEY)
        return coin
    return cls.from_settings(case["settings"], sandbox=False, where=f"coins.{case['coin']}")


def case_id(case: dict[str, Any]) -> str:
    settings = case.get("settings", {})
    key = settings.get("xpub") or settings.get("address") or case.get("mnemonic", "")
    return f"{case['coin']}-{settings.get('network', 'default')}-{key[:8]}"


def test_the_vectors_cover_every_coin_and_network() -> None:
    covered: dict[tuple[str, str], int] = {}
    for case in VECTORS:
        where = (case["coin"], case.get("settings", {}).get("network", "default"))
        covered[where] = covered.get(where, 0) + len(case["addresses"])
    assert set(covered) >= {
        *((coin, net) for coin in ("BTC", "LTC") for net in ("mainnet", "testnet", "regtest")),
        *(("XMR", net) for net in ("mainnet", "stagenet", "testnet")),
        ("ETH", "default"),
        ("USDT", "default"),
        ("TRX", "default"),
        ("USDTTRC", "default"),
        ("SOL", "default"),
    }
    assert min(covered.values()) >= 150
    assert sum(covered.values()) == 4000


@pytest.mark.parametrize("case", VECTORS, ids=case_id)
def test_every_recorded_address_is_derived_again(case: dict[str, Any]) -> None:
    coin = build(case)
    differences: Iterator[str] = (
        f"index {index}: recorded {address} ({watch_key}), derived {got.address} ({got.watch_key})"
        for index, address, watch_key in case["addresses"]
        if ((got := coin.derive_address(index)).address, got.watch_key) != (address, watch_key)
    )
    assert list(differences) == []
