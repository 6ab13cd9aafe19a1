"""A local Base chain for a real ``vpsshop serve``, and an agent that orders a server paying by x402.

docs/x402.md ("A local chain, step by step") walks through it:

    .venv/bin/python examples/x402_local_chain.py chain WORKDIR --shop-port 8402   # keeps running
    .venv/bin/vpsshop serve --config WORKDIR/vpsshop.toml --port 8402              # another terminal
    .venv/bin/python examples/x402_local_chain.py order http://127.0.0.1:8402/v1 WORKDIR

``chain`` starts ``anvil --chain-id 8453 --block-time 1`` (npm ``@foundry-rs/anvil``, installed into
``.peers/npm`` on first use), deploys the test USDC of ``tests/contracts/TestUSDC.sol`` (EIP-712
domain "USD Coin" version "2", like USDC on Base), makes three wallets (the shop's ``pay_to``, a
relayer holding ETH for gas, a customer holding 100 USDC) and writes ``WORKDIR/vpsshop.toml``: a
sandbox-mode config (simulated hypervisor) whose ``[coins.USDCBASE]`` settles directly on this
chain, the relayer key encrypted under the config's ``encryption_key``. It prints what it made and
runs until interrupted.

``order`` is the customer: it creates an account (``POST /v1/account``), asks for a server with the
official PyPI ``x402HttpxClient`` (x402 v2) which pays the 402's deficit and re-sends the order, then
polls the server until it is active. It exits 1 if any step is off.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

USDC_UNIT = 10**6


def write_config(workdir: Path, shop_port: int, chain_url: str, asset: str, pay_to: str, relayer_key: str) -> Path:
    from cryptography.fernet import Fernet

    from vpsshop_x402 import encrypt_relayer_key

    encryption_key = Fernet.generate_key().decode()
    config = f'''# A sandbox shop (simulated servers) that takes USDCBASE on a local anvil chain.
# Written by examples/x402_local_chain.py; see docs/x402.md.
mode = "sandbox"
database_url = "sqlite:///{workdir / "shop.db"}"
public_url = "http://127.0.0.1:{shop_port}/v1"
secret_key = "{secrets.token_urlsafe(32)}"
encryption_key = "{encryption_key}"

[coins.USDCBASE]
mode = "direct"
network = "base"                       # anvil runs with chain id 8453, as Base
pay_to = "{pay_to}"
asset = "{asset}"                      # the test USDC deployed on anvil
rpc_url = "{chain_url}"
relayer_key_encrypted = "{encrypt_relayer_key(relayer_key, encryption_key)}"
max_timeout_seconds = 120
'''
    path = workdir / "vpsshop.toml"
    path.write_text(config)
    path.chmod(0o600)
    return path


def chain_command(args: argparse.Namespace) -> int:
    from x402_peers import start_chain

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    chain = start_chain(workdir)
    try:
        shop = chain.new_account()
        relayer = chain.new_account(eth_wei=10**18)
        customer = chain.new_account(usdc=100 * USDC_UNIT)
        (workdir / "customer.key").write_text("0x" + bytes(customer.key).hex())
        (workdir / "customer.key").chmod(0o600)
        (workdir / "chain.json").write_text(
            json.dumps({"rpc_url": chain.url, "asset": chain.asset, "shop": shop.address, "customer": customer.address})
        )
        path = write_config(
            workdir, args.shop_port, chain.url, chain.asset, shop.address, "0x" + bytes(relayer.key).hex()
        )
        print(f"anvil at {chain.url}, test USDC at {chain.asset}")
        print(f"shop pay_to {shop.address}, relayer {relayer.address} (1 ETH for gas)")
        print(f"customer {customer.address} with 100 USDC; its key is in {workdir / 'customer.key'}")
        print(f"wrote {path}; now run: vpsshop serve --config {path} --port {args.shop_port}", flush=True)
        stop = False

        def interrupted(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, interrupted)
        signal.signal(signal.SIGINT, interrupted)
        while not stop:
            time.sleep(0.2)
    finally:
        chain.anvil.stop()
    return 0


def order_command(args: argparse.Namespace) -> int:
    import httpx
    from eth_account import Account
    from x402 import x402Client
    from x402.http.clients import x402HttpxClient
    from x402.mechanisms.evm.exact import ExactEvmClientScheme

    workdir = Path(args.workdir).resolve()
    chain = json.loads((workdir / "chain.json").read_text())
    customer = Account.from_key((workdir / "customer.key").read_text().strip())
    base = args.api_url.rstrip("/")
    with httpx.Client(base_url=base, timeout=60) as http:
        account = http.post("/account").json()
        auth = {"Authorization": f"Bearer {account['api_key']}"}
        catalog = http.get("/catalog").json()
        order = {
            "plan": args.plan or catalog["plans"][0]["id"],
            "location": args.location or catalog["locations"][0]["id"],
            "os": args.os or catalog["operating_systems"][0]["id"],
        }
        print("account", account["user_id"], "balance", http.get("/account", headers=auth).json()["balance_usd"], "USD")

        client = x402Client()
        # The clients' spending limits (docs/x402.md): the PyPI client pays only the assets it knows
        # (Circle's USDC) up to $1 a payment unless told otherwise. This token is a local one.
        client.set_spend_controls(
            {
                "allowed_assets": [
                    {"network": "eip155:8453", "asset": chain["asset"], "max_amount_per_payment": str(50 * USDC_UNIT)}
                ]
            }
        )
        client.register("eip155:8453", ExactEvmClientScheme(customer))

        async def pay() -> httpx.Response:
            async with x402HttpxClient(client, timeout=60, headers=auth) as paying:
                return await paying.post(f"{base}/servers", json=order)

        answer = asyncio.run(pay())
        print("POST /v1/servers (paid by x402):", answer.status_code)
        if answer.status_code != 201:
            print(answer.text)
            return 1
        settled = json.loads(base64.b64decode(answer.headers["PAYMENT-RESPONSE"]))
        print("PAYMENT-RESPONSE:", settled)
        server = answer.json()["server"]
        print(f"server {server['id']}: {server['status']}, {server['price_usd']} USD paid from {customer.address}")
        deadline = time.monotonic() + 120
        while server["status"] != "active" and time.monotonic() < deadline:
            time.sleep(1)
            server = http.get(f"/servers/{server['id']}", headers=auth).json()
        print(f"server {server['id']}: {server['status']}, ip {server['ip']}")
        balance = http.get("/account", headers=auth).json()["balance_usd"]
        print("balance after the order:", balance, "USD")
        return 0 if server["status"] == "active" and settled["success"] and float(balance) == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chain = sub.add_parser("chain", help="run anvil with the test USDC and write WORKDIR/vpsshop.toml")
    chain.add_argument("workdir")
    chain.add_argument("--shop-port", type=int, default=8402, help="the port vpsshop serve will use (public_url)")
    chain.set_defaults(func=chain_command)
    order = sub.add_parser("order", help="the customer: order a server, paying by x402")
    order.add_argument("api_url")
    order.add_argument("workdir")
    order.add_argument("--plan")
    order.add_argument("--location")
    order.add_argument("--os")
    order.set_defaults(func=order_command)
    args = parser.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
