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

With ``--api`` steps 3 to 5 go through vpsshop itself: the script serves the app with uvicorn on a
loopback port (SQLite in a temporary directory, ``[coins.USDCBASE]`` as above through the settings),
creates an account, ``POST /v1/topups`` answers 402, the re-send with ``X-PAYMENT`` answers 201 with the
completed top-up and ``X-PAYMENT-RESPONSE``, and ``GET /v1/account`` shows the 25 USD balance. The
script exits with status 1 if any of that, or the balances on chain, is not what it should be.
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
    body = {
        "x402Version": 1,
        "error": "X-PAYMENT header is required",
        "accepts": [coin.payment_requirements(25 * USDC_UNIT, "http://127.0.0.1/v1/topups", "Top-up of $25.00")],
    }
    print("402 body:", json.dumps(body, indent=2))
    header = sign_v1_header(payer, body["accepts"][0])
    print("X-PAYMENT:", header[:60] + "...")
    payment = coin.decode_payment(header)
    settlement = asyncio.run(coin.settle(payment, body["accepts"][0]))
    response = coin.settlement_response(settlement)
    print("X-PAYMENT-RESPONSE:", base64.b64encode(json.dumps(response).encode()).decode())
    print("settled:", settlement)


def api_flow(chain, shop, payer, section: dict, tmp: Path) -> bool:  # type: ignore[no-untyped-def]
    """The exchange through ``POST /v1/topups``; True when every step answered as it should."""
    import httpx
    import uvicorn

    from vpsshop.app import create_app
    from vpsshop.settings import load_settings

    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp / 'shop.db'}",
            "public_url": base,
            "coins": {"USDCBASE": section},
            "server": {"background": False},
        },
    )
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            print("vpsshop did not start")
            return False
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            key = http.post("/account").json()["api_key"]
            auth = {"Authorization": f"Bearer {key}"}
            order = {"amount": 25, "coin": "USDCBASE"}
            first = http.post("/topups", json=order, headers=auth)
            print("POST /v1/topups:", first.status_code, json.dumps(first.json(), indent=2))
            if first.status_code != 402:
                return False
            if "PAYMENT-REQUIRED" in first.headers:
                print("PAYMENT-REQUIRED (x402 v2):", json.loads(base64.b64decode(first.headers["PAYMENT-REQUIRED"])))
            header = sign_v1_header(payer, first.json()["accepts"][0])
            print("X-PAYMENT:", header[:60] + "...")
            paid = http.post("/topups", json=order, headers={**auth, "X-PAYMENT": header})
            print("re-send with X-PAYMENT:", paid.status_code, json.dumps(paid.json(), indent=2))
            if paid.status_code != 201 or paid.json()["status"] != "completed":
                return False
            settled = json.loads(base64.b64decode(paid.headers["X-PAYMENT-RESPONSE"]))
            print("X-PAYMENT-RESPONSE:", settled)
            receipt = chain.w3.eth.get_transaction_receipt(settled["transaction"])
            print(
                f"transaction {settled['transaction']} mined in block {receipt['blockNumber']}, status {receipt['status']}"
            )
            again = http.post("/topups", json=order, headers={**auth, "X-PAYMENT": header})
            print(
                "same X-PAYMENT again:",
                again.status_code,
                "same top-up:",
                again.json().get("ref") == paid.json()["ref"],
            )
            account = http.get("/account", headers=auth).json()
            print("GET /v1/account:", account)
            return (
                receipt["status"] == 1
                and settled["payer"] == payer.address
                and again.status_code == 201
                and again.json()["ref"] == paid.json()["ref"]
                and float(account["balance_usd"]) == 25.0
            )
    finally:
        server.should_exit = True
        thread.join(10)


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
            print(
                f"anvil {chain.url}, USDC {chain.asset}\nshop {shop.address}\nrelayer {relayer.address}\n"
                f"customer {payer.address} holding {chain.usdc(payer.address) / USDC_UNIT} USDC"
            )
            section = settings_section(chain, shop, relayer)
            ok = True
            if args.api:
                ok = api_flow(chain, shop, payer, section, Path(tmp_dir))
            else:
                coin_flow(chain, shop, payer, section)
            print(
                f"customer now holds {chain.usdc(payer.address) / USDC_UNIT} USDC, "
                f"the shop {chain.usdc(shop.address) / USDC_UNIT} USDC; the customer paid no gas "
                f"(ETH {chain.w3.eth.get_balance(payer.address)})"
            )
            ok = ok and chain.usdc(payer.address) == 75 * USDC_UNIT and chain.usdc(shop.address) == 25 * USDC_UNIT
        finally:
            chain.anvil.stop()
    if not ok:
        print("FAILED: the exchange did not end as it should (see above)")
        sys.exit(1)


if __name__ == "__main__":
    main()
