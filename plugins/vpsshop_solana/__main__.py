"""Reseller tools of the SOL plugin.

``python -m vpsshop_solana encrypt-mnemonic``
    Reads the deposit mnemonic (not echoed) and prints the ``seed_encrypted`` setting, encrypted with
    the ``encryption_key`` of the shop (``VPSSHOP_ENCRYPTION_KEY`` or the settings file).
``python -m vpsshop_solana sweep --from 1 --to 500 [--config vpsshop.toml]``
    Moves what deposit addresses 1..500 hold to ``coins.SOL.sweep_to`` (idempotent: run it again at will).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys

from vpsshop import ConfigError, load_settings
from vpsshop_solana import Solana, encrypt_mnemonic, mnemonic_to_seed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vpsshop_solana")
    parser.add_argument("--config", default=None, help="settings file (default: VPSSHOP_CONFIG or ./vpsshop.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("encrypt-mnemonic", help="print seed_encrypted for a deposit mnemonic read from the terminal")
    sweep = sub.add_parser("sweep", help="move deposit balances to coins.SOL.sweep_to")
    sweep.add_argument("--from", dest="first", type=int, default=1)
    sweep.add_argument("--to", dest="last", type=int, required=True)
    args = parser.parse_args(argv)
    settings = load_settings(args.config)
    key = settings.encryption_key.get_secret_value()
    if args.command == "encrypt-mnemonic":
        mnemonic = getpass.getpass("deposit mnemonic (not echoed): ") if sys.stdin.isatty() else sys.stdin.readline()
        try:
            mnemonic_to_seed(mnemonic)  # its words and checksum: a typo would derive someone else's wallet
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            return 2
        print(encrypt_mnemonic(key, mnemonic))
        return 0
    coin = Solana.from_settings(settings.coins.get("SOL"), sandbox=settings.sandbox, where="coins.SOL")
    assert isinstance(coin, Solana)
    coin.unlock(key)

    async def run() -> None:
        try:
            for result in await coin.sweep(range(args.first, args.last + 1)):
                if result.signature:
                    print(f"{result.index}\t{result.address}\t{result.lamports}\t{result.signature}")
        finally:
            await coin.close()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
