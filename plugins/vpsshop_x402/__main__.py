"""``python -m vpsshop_x402 encrypt-relayer-key``: the value of ``coins.USDCBASE.relayer_key_encrypted``.

Reads the relayer's private key without echoing it (or from standard input when it is not a
terminal) and prints it encrypted with Fernet under the shop's ``encryption_key``, taken from the
settings exactly as ``vpsshop serve`` reads them (``--config``, ``VPSSHOP_CONFIG``, ``./vpsshop.toml``,
``VPSSHOP_ENCRYPTION_KEY``).
"""

from __future__ import annotations

import argparse
import getpass
import sys

from vpsshop_x402 import RelayerKey, encrypt_relayer_key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vpsshop_x402")
    sub = parser.add_subparsers(dest="command", required=True)
    enc = sub.add_parser("encrypt-relayer-key", help="encrypt the relayer key for relayer_key_encrypted")
    enc.add_argument("--config", help="vpsshop config file (default: as vpsshop serve finds it)")
    args = parser.parse_args(argv)

    from vpsshop import StartupError, load_settings

    try:
        settings = load_settings(args.config)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if sys.stdin.isatty():
        key = getpass.getpass("relayer private key (hex): ")
    else:
        key = sys.stdin.readline()
    try:
        address = RelayerKey(key).address
    except Exception as exc:  # noqa: BLE001 - the message never contains the key
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"# relayer address {address}: fund it with a little ETH on Base for gas", file=sys.stderr)
    print(encrypt_relayer_key(key, settings.encryption_key.get_secret_value()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
