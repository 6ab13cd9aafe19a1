"""Real peers of the EVM tests: ``anvil`` (npm ``@foundry-rs/anvil``) on a loopback port, and the test
contracts of ``tests/contracts`` compiled with ``solcjs`` (npm ``solc``) and deployed with web3.

``scripts/test.sh`` installs the npm packages of ``scripts/deps/npm-chains.txt`` into ``.peers/npm``;
when pytest runs directly, :func:`npm_bin` installs them there if they are missing and puts
``.peers/npm/node_modules/.bin`` on PATH. anvil runs without automine intervals (``--no-mining``):
tests mine blocks explicitly with ``anvil_mine`` so confirmations are exact.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anvil_node import ROOT, AnvilNode, rpc
from anvil_node import npm_bin as _npm_bin

CONTRACTS = ROOT / "tests" / "contracts"
CHAIN_ID = 31337


def npm_bin() -> Path:
    """``.peers/npm/node_modules/.bin`` holding anvil and solcjs, installing them first if missing."""
    return _npm_bin("npm-chains.txt")


class Anvil(AnvilNode):
    """A running ``anvil`` on a loopback port that mines only when told to."""

    def __init__(self, extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(CHAIN_ID, ("--no-mining", *extra_args), "npm-chains.txt")


def compile_contracts(out_dir: Path) -> dict[str, tuple[list[dict[str, Any]], str]]:
    """Compile every ``tests/contracts/*.sol`` with solcjs: {contract name: (abi, bytecode hex)}."""
    npm_bin()
    solcjs = shutil.which("solcjs")
    if solcjs is None:
        raise RuntimeError("solcjs is not installed (npm solc into .peers/npm)")
    out_dir.mkdir(parents=True, exist_ok=True)
    sources = [str(p.relative_to(ROOT)) for p in sorted(CONTRACTS.glob("*.sol"))]
    subprocess.run(
        [solcjs, "--bin", "--abi", "--optimize", "--base-path", str(ROOT), "-o", str(out_dir), *sources],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    compiled = {}
    for abi_file in out_dir.glob("*.abi"):
        name = abi_file.stem.rsplit("_", 1)[-1]
        bytecode = abi_file.with_suffix(".bin").read_text().strip()
        if bytecode:
            compiled[name] = (json.loads(abi_file.read_text()), bytecode)
    return compiled


@dataclass
class EvmChain:
    """What the tests hold on anvil: web3, the test token, the batch contract, a funded deployer."""

    anvil: Anvil
    w3: Any
    token: Any
    batch: Any
    deployer: str

    @property
    def url(self) -> str:
        return self.anvil.url

    def send(self, tx: dict[str, Any]) -> str:
        """Send from an anvil-unlocked account; returns the hash without mining."""
        return self.w3.eth.send_transaction(tx).to_0x_hex()

    def pay_eth(self, to: str, wei: int, sender: str | None = None) -> str:
        return self.send({"from": sender or self.deployer, "to": to, "value": wei})

    def pay_token(self, to: str, units: int, sender: str | None = None) -> str:
        return self.token.functions.transfer(to, units).transact({"from": sender or self.deployer}).to_0x_hex()

    def receipt(self, txid: str) -> Any:
        return self.w3.eth.get_transaction_receipt(txid)

    def new_payer(self, eth_wei: int = 10**18, token_units: int = 0) -> Any:
        """A fresh key pair (``eth_account.LocalAccount``) funded on anvil."""
        from eth_account import Account

        account = Account.from_key("0x" + secrets.token_hex(32))
        rpc(self.url, "anvil_setBalance", [account.address, hex(eth_wei)])
        if token_units:
            self.token.functions.mint(account.address, token_units).transact({"from": self.deployer})
            self.anvil.mine(1)
        return account

    def send_signed(self, account: Any, tx: dict[str, Any]) -> str:
        tx = {
            "chainId": CHAIN_ID,
            "nonce": self.w3.eth.get_transaction_count(account.address, "pending"),
            "gas": 200_000,
            "maxFeePerGas": 10**10,
            "maxPriorityFeePerGas": 10**9,
            **tx,
        }
        signed = account.sign_transaction(tx)
        return self.w3.eth.send_raw_transaction(signed.raw_transaction).to_0x_hex()


def start_evm_chain(work_dir: Path) -> EvmChain:
    from web3 import Web3

    anvil = Anvil()
    try:
        compiled = compile_contracts(work_dir / "solc")
        w3 = Web3(Web3.HTTPProvider(anvil.url, request_kwargs={"timeout": 30}))
        deployer = w3.eth.accounts[0]

        def deploy(name: str, *args: Any) -> Any:
            abi, bytecode = compiled[name]
            tx = w3.eth.contract(abi=abi, bytecode=bytecode).constructor(*args).transact({"from": deployer})
            anvil.mine(1)
            receipt = w3.eth.get_transaction_receipt(tx)
            assert receipt["status"] == 1
            return w3.eth.contract(address=receipt["contractAddress"], abi=abi)

        token = deploy("TestToken", "Tether USD", "USDT", 6)
        batch = deploy("BatchTransfer")
        token.functions.mint(deployer, 10**15).transact({"from": deployer})
        anvil.mine(1)
        return EvmChain(anvil, w3, token, batch, deployer)
    except Exception:
        anvil.stop()
        raise


class RangeLimitedFront:
    """A TEST DOUBLE of a hosted JSON-RPC provider in front of the real anvil: it forwards every request
    unchanged, except that it refuses ``eth_getLogs`` over more than ``max_range`` blocks with a
    JSON-RPC error, as hosted providers do (Alchemy, Infura: "query returned more than 10000 results",
    "block range too large")."""

    def __init__(self, upstream: str, max_range: int = 1) -> None:
        import http.server
        import threading

        self.upstream = upstream
        self.refused = 0
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                if isinstance(body, dict) and body.get("method") == "eth_getLogs":
                    query = body["params"][0]
                    if int(query["toBlock"], 16) - int(query["fromBlock"], 16) + 1 > max_range:
                        front.refused += 1
                        payload = json.dumps(
                            {
                                "jsonrpc": "2.0",
                                "id": body["id"],
                                "error": {"code": -32005, "message": "query returned more than 10000 results"},
                            }
                        ).encode()
                        return self._reply(payload)
                req = urllib.request.Request(front.upstream, raw, {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as resp:
                    self._reply(resp.read())

            def _reply(self, payload: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def random_xpub() -> str:
    """A fresh account-level xpub (depth 3, hardened child) per call, so tests sharing one chain never
    share an address."""
    from coincurve import PrivateKey

    from vpsshop.chains import b58check_encode

    key = PrivateKey().public_key.format(compressed=True)
    depth_parent_child = bytes([3]) + b"\0" * 4 + (0x80000000).to_bytes(4, "big")
    return b58check_encode(bytes.fromhex("0488b21e") + depth_parent_child + secrets.token_bytes(32) + key)
