"""Pay a vpsshop USDCBASE top-up with the official x402 Python client, on a local anvil chain.

    .venv/bin/python examples/x402_anvil.py          # the coin's side of the flow
    .venv/bin/python examples/x402_anvil.py --api    # the same over HTTP: POST /v1/topups

What it does (docs/x402.md explains each step):

1. starts ``anvil --chain-id 8453 --block-time 1`` on a loopback port (npm ``@foundry-rs/anvil``,
   installed into ``.peers/npm`` on first use) and deploys the test USDC (``tests/contracts/TestUSDC.sol``,
   EIP-712 domain "USD Coin" version "2"), minting 100 USDC to a new customer wallet;
2. configures ``[coins.USDCBASE]`` in direct mode: the shop's ``pay_to`` address, the local token as
   ``asset``, anvil as ``rpc_url`` and a relayer key (in an environment variable) holding ETH for gas;
3. asks for a $25 top-up and gets the x402 requirements (the 402 body);
4. lets the PyPI ``x402`` client (``ExactEvmSchemeV1``) sign the ``X-PAYMENT`` header;
5. settles it and prints the ``X-PAYMENT-RESPONSE`` value and the balances on chain.

With ``--api`` steps 3 to 5 go through a running vpsshop (``POST /v1/topups``, then the re-send with
``X-PAYMENT``); that needs the top-up engine, and the script says so if this build lacks it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from x402_peers import USDC_UNIT, free_port, sign_v1_header, start_chain

RELAYER_ENV = "EXAMPLE_X402_RELAYER_KEY"


def settings_section(chain, shop, relayer) -> dict:  # type: ignore[no-untyped-def]
    os.environ[RELAYER_ENV] = bytes(relayer.key).hex()
    return {
        "network": "base",
        "mode": "direct",
        "pay_to": shop.address,
        "asset": chain.asset,
        "rpc_url": chain.url,
        "relayer_key_env": RELAYER_ENV,
        "max_timeout_seconds": 120,
    }


def coin_flow(chain, shop, payer, section: dict) -> None:  # type: ignore[no-untyped-def]
    from vpsshop_x402 import USDCBASE

    coin = USDCBASE.from_settings(section, sandbox=False, where="coins.USDCBASE")
    print("readiness:", asyncio.run(coin.check_ready()))
    body = {"x402Version": 1, "error": "X-PAYMENT header is required", "accepts": [
        coin.payment_requirements(25 * USDC_UNIT, "http://127.0.0.1/v1/topups", "Top-up of $25.00")]}
    print("402 body:", json.dumps(body, indent=2))
    header = sign_v1_header(payer, body["accepts"][0])
    print("X-PAYMENT:", header[:60] + "...")
    payment = coin.decode_payment(header)
    settlement = asyncio.run(coin.settle(payment, body["accepts"][0]))
    response = coin.settlement_response(settlement)
    print("X-PAYMENT-RESPONSE:", base64.b64encode(json.dumps(response).encode()).decode())
    print("settled:", settlement)


def api_flow(chain, shop, payer, section: dict, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    import httpx
    import uvicorn

    from vpsshop.app import create_app
    from vpsshop.settings import load_settings

    settings = load_settings(None, environ={}, overrides={
        "mode": "sandbox", "database_url": f"sqlite:///{tmp / 'shop.db'}", "coins": {"USDCBASE": section},
        "server": {"background": False},
    })
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            key = http.post("/account").json()["api_key"]
            auth = {"Authorization": f"Bearer {key}"}
            first = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers=auth)
            if first.status_code == 404:
                print("This build has no POST /v1/topups yet (top-up engine); run without --api.")
                return
            print("first answer:", first.status_code, json.dumps(first.json(), indent=2))
            header = sign_v1_header(payer, first.json()["accepts"][0])
            paid = http.post("/topups", json={"amount": 25, "coin": "USDCBASE"}, headers={**auth, "X-PAYMENT": header})
            print("re-send:", paid.status_code, paid.json())
            print("X-PAYMENT-RESPONSE:", paid.headers.get("X-PAYMENT-RESPONSE"))
            print("account:", http.get("/account", headers=auth).json())
    finally:
        server.should_exit = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", action="store_true", help="go through POST /v1/topups over HTTP")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        print("starting anvil and deploying the test USDC ...")
        chain = start_chain(Path(tmp_dir))
        try:
            shop = chain.new_account()
            relayer = chain.new_account(eth_wei=10**18)
            payer = chain.new_account(usdc=100 * USDC_UNIT)
            print(f"anvil {chain.url}, USDC {chain.asset}\nshop {shop.address}\nrelayer {relayer.address}\n"
                  f"customer {payer.address} holding {chain.usdc(payer.address) / USDC_UNIT} USDC")
            section = settings_section(chain, shop, relayer)
            if args.api:
                api_flow(chain, shop, payer, section, Path(tmp_dir))
            else:
                coin_flow(chain, shop, payer, section)
            print(f"customer now holds {chain.usdc(payer.address) / USDC_UNIT} USDC, "
                  f"the shop {chain.usdc(shop.address) / USDC_UNIT} USDC; the customer paid no gas "
                  f"(ETH {chain.w3.eth.get_balance(payer.address)})")
        finally:
            chain.anvil.stop()


if __name__ == "__main__":
    main()
