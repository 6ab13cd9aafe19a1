"""Record the deposit addresses the default coin plugins derive, for tests/test_derived_addresses.py.

Run once on the hand-written key code (before bip-utils replaced it, issue 26) to write
``tests/vectors/derived_addresses.json``: every coin and network, a few hundred indices each, from
fixed keys. The test derives the same addresses with the code of the day and compares: an address
the shop handed out before the change is the address it derives after it.

    python tests/vectors/record_derived_addresses.py

It was run on the parent of the bip-utils change (commit 7232d03, the hand-written code). Running it
again records what the code of the day derives, which checks nothing: keep the recorded file.

Each case holds what builds the coin (its settings, or the mnemonic for SOL) and ``[index, address,
watch_key]`` triples, so the test needs nothing from this script.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent.parent)]

from bip32_private import account_node  # noqa: E402  (tests/bip32_private.py)

from vpsshop.chains import ExtendedPublicKey  # noqa: E402
from vpsshop_monero.addresses import hash_to_scalar, keys_from_spend_secret  # noqa: E402

OUTPUT = HERE / "derived_addresses.json"
OTHER_MNEMONIC = "legal winner thank year wave sausage worth useful legal winner thank yellow"
"""A BIP-39 test vector mnemonic: public, a second key besides "abandon ... about"."""

VERSIONS = {
    name: bytes.fromhex(hex_version)
    for name, hex_version in {
        "xpub": "0488b21e",
        "ypub": "049d7cb2",
        "zpub": "04b24746",
        "tpub": "043587cf",
        "upub": "044a5262",
        "vpub": "045f1cf6",
        "Ltub": "019da462",
        "Mtub": "01b26ef6",
    }.items()
}

# Per (coin, network): two account keys, each written in one SLIP-132 spelling; every spelling the
# parser takes appears at least once.
UTXO_KEYS = {
    ("BTC", "mainnet"): [("m/84'/0'/0'", None, "zpub"), ("m/84'/0'/1'", OTHER_MNEMONIC, "xpub")],
    ("BTC", "testnet"): [("m/84'/1'/0'", None, "vpub"), ("m/84'/1'/3'", OTHER_MNEMONIC, "tpub")],
    ("BTC", "regtest"): [("m/84'/1'/0'", OTHER_MNEMONIC, "upub"), ("m/49'/1'/0'", None, "tpub")],
    ("LTC", "mainnet"): [("m/84'/2'/0'", None, "Ltub"), ("m/84'/2'/0'", OTHER_MNEMONIC, "Mtub")],
    ("LTC", "testnet"): [("m/84'/1'/0'", None, "ypub"), ("m/84'/1'/1'", OTHER_MNEMONIC, "vpub")],
    ("LTC", "regtest"): [("m/84'/1'/2'", None, "zpub"), ("m/84'/1'/0'", OTHER_MNEMONIC, "tpub")],
}


def indices(count: int, first: int = 0, top: int = 2**31 - 1) -> list[int]:
    """``count`` indices: the first ones in a row (what a shop hands out), then a spread up to ``top``."""
    row = list(range(first, first + count - 24))
    spread = [first + count - 24 + (top - first - count) * k // 23 for k in range(24)]
    return row + spread


def account_xpub(path: str, mnemonic: str | None, kind: str) -> str:
    node = account_node(path) if mnemonic is None else account_node(path, mnemonic)
    return ExtendedPublicKey.parse(node.xpub()).serialize(VERSIONS[kind])


def triples(coin: Any, numbers: list[int]) -> list[list[Any]]:
    out = []
    for index in numbers:
        deposit = coin.derive_address(index)
        out.append([index, deposit.address, deposit.watch_key])
    return out


def utxo_cases() -> list[dict[str, Any]]:
    from vpsshop_bitcoin import Bitcoin, Litecoin

    classes = {"BTC": Bitcoin, "LTC": Litecoin}
    cases = []
    for (code, network), keys in UTXO_KEYS.items():
        for path, mnemonic, kind in keys:
            settings = {"xpub": account_xpub(path, mnemonic, kind), "network": network}
            coin = classes[code].from_settings(settings, sandbox=False, where=f"coins.{code}")
            cases.append({"coin": code, "settings": settings, "addresses": triples(coin, indices(150))})
    return cases


def account_chain_cases() -> list[dict[str, Any]]:
    from vpsshop_evm import SANDBOX_USDT_CONTRACT, Ether, TetherErc20
    from vpsshop_evm import SANDBOX_XPUB as EVM_XPUB
    from vpsshop_tron import SANDBOX_XPUB as TRON_XPUB
    from vpsshop_tron import TetherTrc20, Tronix

    other_evm = account_xpub("m/44'/60'/0'", OTHER_MNEMONIC, "xpub")
    other_tron = account_xpub("m/44'/195'/0'", OTHER_MNEMONIC, "xpub")
    plans: list[tuple[Any, dict[str, Any]]] = [
        (Ether, {"xpub": EVM_XPUB}),
        (Ether, {"xpub": other_evm, "network": "sepolia", "branch": 7}),
        (TetherErc20, {"xpub": EVM_XPUB, "network": "sepolia", "contract": SANDBOX_USDT_CONTRACT}),
        (TetherErc20, {"xpub": other_evm, "contract": SANDBOX_USDT_CONTRACT}),
        (Tronix, {"xpub": TRON_XPUB}),
        (Tronix, {"xpub": other_tron, "network": "nile"}),
        (TetherTrc20, {"xpub": TRON_XPUB, "network": "nile"}),
        (TetherTrc20, {"xpub": other_tron, "branch": 2}),
    ]
    cases = []
    for cls, settings in plans:
        coin = cls.from_settings(settings, sandbox=False, where=f"coins.{cls.code}")
        cases.append({"coin": cls.code, "settings": settings, "addresses": triples(coin, indices(150))})
    return cases


def solana_cases() -> list[dict[str, Any]]:
    from vpsshop_solana import SANDBOX_MNEMONIC, deposit_key, mnemonic_to_seed

    cases = []
    for mnemonic in (SANDBOX_MNEMONIC, OTHER_MNEMONIC):
        seed = mnemonic_to_seed(mnemonic)
        numbers = indices(150)
        addresses = [[index, deposit_key(seed, index).address, deposit_key(seed, index).address] for index in numbers]
        cases.append({"coin": "SOL", "mnemonic": mnemonic, "addresses": addresses})
    return cases


def monero_cases() -> list[dict[str, Any]]:
    from vpsshop_monero import SANDBOX_ADDRESS, SANDBOX_VIEW_KEY, Monero

    wallets = [("stagenet", SANDBOX_ADDRESS, SANDBOX_VIEW_KEY, 0)]
    for network in ("mainnet", "stagenet", "testnet"):
        for label, account in ((b"first", 0), (b"second", 3)):
            spend = hash_to_scalar(b"vpsshop derived-address vectors: " + network.encode() + b" " + label)
            address, view_key = keys_from_spend_secret(spend.to_bytes(32, "little"), network)
            wallets.append((network, address, view_key, account))
    cases = []
    for network, address, view_key, account in wallets:
        settings = {"address": address, "view_key": view_key, "network": network, "account_index": account}
        coin = Monero.from_settings(settings, sandbox=False, where="coins.XMR")
        numbers = indices(100, first=1, top=2**32 - 1)
        cases.append({"coin": "XMR", "settings": settings, "addresses": triples(coin, numbers)})
    return cases


def main() -> None:
    cases = utxo_cases() + account_chain_cases() + solana_cases() + monero_cases()
    body = {
        "about": "Deposit addresses derived by the hand-written key code before bip-utils (issue 26); "
        "made by tests/vectors/record_derived_addresses.py.",
        "cases": cases,
    }
    # One [index, address, watch_key] a line.
    text = re.sub(r"\[\n\s+(\d+),\n\s+(\S+),\n\s+(\S+)\n\s+\]", r"[\1, \2, \3]", json.dumps(body, indent=1)) + "\n"
    OUTPUT.write_text(text)
    count = sum(len(case["addresses"]) for case in cases)
    print(f"{OUTPUT}: {len(cases)} cases, {count} addresses, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
