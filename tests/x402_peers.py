"""Real peers of the x402 tests, started on loopback by session fixtures.

* ``anvil`` (npm ``@foundry-rs/anvil``) as a Base chain: ``--chain-id 8453 --block-time 1``;
* ``TestUSDC`` (``tests/contracts/TestUSDC.sol``) compiled with ``solcjs`` (npm ``solc``) and
  deployed with web3, EIP-712 domain "USD Coin" version "2";
* an x402 facilitator built from the PyPI ``x402`` package's facilitator classes, served over HTTP;
* :class:`StallingRpcFront`, a test double of a Base JSON-RPC endpoint that stops answering.

``scripts/test.sh`` installs the npm packages into ``.peers/npm``; when pytest runs directly,
:func:`npm_bin` does the same (from ``scripts/deps/npm-x402.txt``) and puts the binaries on PATH.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import secrets
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anvil_node import ROOT, AnvilNode, free_port
from anvil_node import npm_bin as _npm_bin
from anvil_node import rpc as _rpc

CONTRACT = ROOT / "tests" / "contracts" / "TestUSDC.sol"
CHAIN_ID = 8453
USDC_UNIT = 10**6


def npm_bin() -> Path:
    """``.peers/npm/node_modules/.bin``, installing the x402 npm packages first if missing."""
    return _npm_bin("npm-x402.txt")


def rpc(url: str, method: str, params: list[Any] | None = None, timeout: float = 10) -> Any:
    return _rpc(url, method, params, timeout)


class Anvil(AnvilNode):
    """A running ``anvil`` on a loopback port."""

    def __init__(self, block_time: int = 1) -> None:
        """``block_time`` 0: mine each transaction at once (anvil's automine)."""
        super().__init__(CHAIN_ID, ("--block-time", str(block_time)) if block_time else (), "npm-x402.txt")


# ---- the token ----------------------------------------------------------------------------------


def compile_test_usdc(out_dir: Path) -> tuple[list[dict[str, Any]], str]:
    """Compile ``TestUSDC.sol`` with solcjs: (abi, bytecode hex)."""
    solcjs = shutil.which("solcjs", path=str(npm_bin()))
    if solcjs is None:
        raise RuntimeError("solcjs is not installed in .peers/npm (npm solc)")
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            solcjs,
            "--bin",
            "--abi",
            "--optimize",
            "--base-path",
            str(ROOT),
            "-o",
            str(out_dir),
            str(CONTRACT.relative_to(ROOT)),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (abi_file,) = out_dir.glob("*TestUSDC.abi")
    (bin_file,) = out_dir.glob("*TestUSDC.bin")
    return json.loads(abi_file.read_text()), bin_file.read_text().strip()


@dataclass
class Chain:
    """What the tests hold on the chain: web3, the deployed token, funded accounts."""

    anvil: Anvil
    w3: Any
    token: Any
    abi: list[dict[str, Any]]
    bytecode: str
    deployer: str

    @property
    def url(self) -> str:
        return self.anvil.url

    @property
    def asset(self) -> str:
        return str(self.token.address)

    def deploy_token(self, name: str = "USD Coin", version: str = "2") -> Any:
        factory = self.w3.eth.contract(abi=self.abi, bytecode=self.bytecode)
        tx = factory.constructor(name, version).transact({"from": self.deployer})
        receipt = self.w3.eth.wait_for_transaction_receipt(tx, timeout=30, poll_latency=0.1)
        return self.w3.eth.contract(address=receipt["contractAddress"], abi=self.abi)

    def new_account(self, usdc: int = 0, eth_wei: int = 0) -> Any:
        """A fresh key pair (``eth_account.LocalAccount``) holding ``usdc`` base units and ``eth_wei``."""
        from eth_account import Account

        account = Account.from_key("0x" + secrets.token_hex(32))
        if eth_wei:
            rpc(self.url, "anvil_setBalance", [account.address, hex(eth_wei)])
        if usdc:
            self.mint(account.address, usdc)
        return account

    def mint(self, to: str, amount: int) -> None:
        tx = self.token.functions.mint(to, amount).transact({"from": self.deployer})
        self.w3.eth.wait_for_transaction_receipt(tx, timeout=30, poll_latency=0.1)

    def usdc(self, address: str) -> int:
        return int(self.token.functions.balanceOf(address).call())

    def used(self, payer: str, nonce: str) -> bool:
        return bool(self.token.functions.authorizationState(payer, bytes.fromhex(nonce[2:])).call())


def start_chain(work_dir: Path, block_time: int = 1) -> Chain:
    from web3 import Web3

    anvil = Anvil(block_time)
    try:
        abi, bytecode = compile_test_usdc(work_dir / "solc")
        w3 = Web3(Web3.HTTPProvider(anvil.url, request_kwargs={"timeout": 30}))
        deployer = w3.eth.accounts[0]
        chain = Chain(anvil, w3, None, abi, bytecode, deployer)
        chain.token = chain.deploy_token("USD Coin", "2")
        return chain
    except Exception:
        anvil.stop()
        raise


# ---- x402 client helpers (the official Python client) -----------------------------------------


def sign_v1_header(payer: Any, requirements: dict[str, Any], **authorization: str) -> str:
    """An ``X-PAYMENT`` header made by the PyPI ``x402`` v1 client (``ExactEvmSchemeV1``).

    ``authorization`` overrides fields of the signed authorization (``validAfter``...) to build
    failure cases; the signature then covers the changed fields (made by the same client code).
    """
    from x402 import x402ClientSync
    from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1
    from x402.schemas.v1 import PaymentRequiredV1

    scheme = ExactEvmSchemeV1(payer)
    if authorization:
        scheme = _OverridingScheme(scheme, authorization)
    client = x402ClientSync()
    # The local token is not one of the client's default assets: allow it, as a client of a shop
    # on a private chain would.
    client.set_spend_controls(
        {"allowed_assets": [{"network": requirements["network"], "asset": requirements["asset"]}]}
    )
    client.register_v1(requirements["network"], scheme)
    payload = client.create_payment_payload(PaymentRequiredV1(x402_version=1, accepts=[requirements]))
    data = payload.model_dump(by_alias=True, exclude_none=True)
    return base64.b64encode(json.dumps(data).encode()).decode()


class _OverridingScheme:
    """Wraps the official client scheme: signs an authorization with some fields replaced."""

    def __init__(self, inner: Any, overrides: dict[str, str]) -> None:
        self._inner = inner
        self._overrides = overrides
        self.scheme = inner.scheme

    def create_payment_payload(self, requirements: Any) -> dict[str, Any]:
        from x402.mechanisms.evm.types import ExactEIP3009Authorization, ExactEIP3009Payload

        made = ExactEIP3009Payload.from_dict(self._inner.create_payment_payload(requirements))
        fields = {
            "from_address": made.authorization.from_address,
            "to": made.authorization.to,
            "value": made.authorization.value,
            "valid_after": made.authorization.valid_after,
            "valid_before": made.authorization.valid_before,
            "nonce": made.authorization.nonce,
        }
        names = {"from": "from_address", "validAfter": "valid_after", "validBefore": "valid_before"}
        for key, value in self._overrides.items():
            fields[names.get(key, key)] = value
        auth = ExactEIP3009Authorization(**fields)
        signature = self._inner._sign_authorization(auth, requirements)
        return ExactEIP3009Payload(authorization=auth, signature=signature).to_dict()


# ---- a facilitator built from the x402 package ---------------------------------------------------


class Facilitator:
    """An x402 facilitator (``GET /supported``, ``POST /verify``, ``POST /settle``) on loopback.

    The verifying and settling is the ``x402`` package's own ``x402FacilitatorSync`` with its
    ``ExactEvmSchemeV1`` facilitator (v1) and ``ExactEvmScheme`` (v2) over ``FacilitatorWeb3Signer``;
    this class only serves it over HTTP. While ``stall_settle`` is above 0, ``/settle`` still settles but
    answers that many seconds late, as a congested facilitator does (the shop's call times out).
    """

    def __init__(self, rpc_url: str, private_key: str, network: str = "base") -> None:
        from x402 import x402FacilitatorSync
        from x402.mechanisms.evm import FacilitatorWeb3Signer
        from x402.mechanisms.evm.exact.facilitator import ExactEvmScheme
        from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1Facilitator

        signer = FacilitatorWeb3Signer(private_key=private_key, rpc_url=rpc_url, confirmation_timeout_seconds=30)
        self.facilitator = x402FacilitatorSync()
        self.facilitator.register_v1([network], ExactEvmSchemeV1Facilitator(signer))
        self.facilitator.register([f"eip155:{CHAIN_ID}"], ExactEvmScheme(signer))
        self.requests: list[str] = []
        self.stall_settle = 0.0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                owner.requests.append(f"GET {self.path}")
                if self.path.rstrip("/").endswith("/supported"):
                    supported = owner.facilitator.get_supported()
                    return self._answer(200, supported.model_dump(by_alias=True, exclude_none=True))
                self._answer(404, {"error": "not found"})

            def do_POST(self) -> None:
                owner.requests.append(f"POST {self.path}")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                payload, requirements = owner.parse(body)
                if self.path.rstrip("/").endswith("/verify"):
                    result = owner.facilitator.verify(payload, requirements)
                elif self.path.rstrip("/").endswith("/settle"):
                    result = owner.facilitator.settle(payload, requirements)
                    time.sleep(owner.stall_settle)
                else:
                    return self._answer(404, {"error": "not found"})
                self._answer(200, result.model_dump(by_alias=True, exclude_none=True))

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def parse(body: dict[str, Any]) -> tuple[Any, Any]:
        from x402.schemas import PaymentPayload, PaymentRequirements
        from x402.schemas.v1 import PaymentPayloadV1, PaymentRequirementsV1

        if body.get("x402Version") == 1:
            return (
                PaymentPayloadV1.model_validate(body["paymentPayload"]),
                PaymentRequirementsV1.model_validate(body["paymentRequirements"]),
            )
        return (
            PaymentPayload.model_validate(body["paymentPayload"]),
            PaymentRequirements.model_validate(body["paymentRequirements"]),
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---- a JSON-RPC endpoint that stops answering --------------------------------------------------


class StallingRpcFront:
    """Test double of a Base JSON-RPC endpoint that times out (named for what it is).

    It speaks JSON-RPC 2.0 over HTTP by forwarding every request unchanged to the real anvil
    behind it. While ``stall`` holds a method name, a request for that method is still forwarded
    (so a transaction really reaches the chain) but the answer is held back for ``stall_seconds``,
    as a congested provider does: the client times out without knowing the outcome.
    """

    def __init__(self, upstream: str, stall_seconds: float = 5.0) -> None:
        self.upstream = upstream
        self.stall: set[str] = set()
        self.stall_seconds = stall_seconds
        self.forward_when_stalling = True
        self.seen: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = json.loads(raw)
                methods = [r["method"] for r in request] if isinstance(request, list) else [request["method"]]
                owner.seen.extend(methods)
                stalled = bool(owner.stall.intersection(methods))
                answer = b""
                if not stalled or owner.forward_when_stalling:
                    req = urllib.request.Request(owner.upstream, raw, {"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        answer = resp.read()
                if stalled:
                    time.sleep(owner.stall_seconds)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the client gave up

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(check: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def sign_v2_header(payer: Any, requirements_v2: dict[str, Any], resource: str) -> str:
    """A ``PAYMENT-SIGNATURE`` header made by the PyPI ``x402`` v2 client (``ExactEvmScheme``)."""
    from x402 import x402ClientSync
    from x402.http.utils import encode_payment_signature_header
    from x402.mechanisms.evm.exact import ExactEvmClientScheme as ExactEvmScheme
    from x402.schemas import PaymentRequired, PaymentRequirements, ResourceInfo

    client = x402ClientSync()
    client.set_spend_controls(
        {"allowed_assets": [{"network": requirements_v2["network"], "asset": requirements_v2["asset"]}]}
    )
    client.register(requirements_v2["network"], ExactEvmScheme(payer))
    required = PaymentRequired(
        x402_version=2,
        accepts=[PaymentRequirements.model_validate(requirements_v2)],
        resource=ResourceInfo(url=resource, description="top-up", mime_type="application/json"),
    )
    return encode_payment_signature_header(client.create_payment_payload(required))


def run_node(script: str, request: dict[str, Any], timeout: float = 60) -> str:
    """What ``tests/node/<script>`` prints for ``request`` (JSON on its stdin), with the npm packages
    of ``scripts/deps/npm-x402.txt`` on its module path."""
    env = {**os.environ, "NODE_PATH": str(npm_bin().parent)}
    done = subprocess.run(
        ["node", str(ROOT / "tests" / "node" / script)],
        input=json.dumps(request).encode(),
        capture_output=True,
        env=env,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"node {script} failed: {done.stderr.decode()[-2000:]}")
    return done.stdout.decode()


def sign_npm_header(payer: Any, requirements: dict[str, Any], rpc_url: str) -> str:
    """An ``X-PAYMENT`` header made by the npm ``x402`` client with a viem wallet (Node.js)."""
    request = {"privateKey": "0x" + bytes(payer.key).hex(), "rpcUrl": rpc_url, "requirements": requirements}
    return run_node("x402_npm_client.cjs", request).strip()


# ---- a paid HTTP resource in front of the coin ---------------------------------------------------


class X402ResourceDouble:
    """Test double of core's x402 exchange on ``POST /v1/topups`` (the engine is built elsewhere),
    so that real x402 HTTP clients (PyPI ``x402HttpxClient``, npm ``x402-fetch``) drive the coin.

    It does what the engine is specified to do with the coin and nothing more: a request without a
    payment header gets 402 with ``{"x402Version": 1, "error", "accepts": [payment_requirements]}``
    (plus the v2 ``PAYMENT-REQUIRED`` header when ``offer_v2``); a re-send with ``X-PAYMENT`` (v1) or
    ``PAYMENT-SIGNATURE`` (v2) is decoded, settled and answered 200 with ``X-PAYMENT-RESPONSE`` /
    ``PAYMENT-RESPONSE``; a refusal is answered with the seed's error body ``{"error","message"}``.
    ``settled`` lists every settlement, keyed by (payer, nonce) as the engine keys the credit.
    """

    def __init__(self, coin: Any, amount_atomic: int, offer_v2: bool = False) -> None:
        self.coin = coin
        self.amount_atomic = amount_atomic
        self.offer_v2 = offer_v2
        self.settled: dict[tuple[str, str], Any] = {}
        self.answers: list[int] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                owner.answers.append(status)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                owner.handle(self)

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/topups"
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def handle(self, request: Any) -> None:
        import asyncio

        from vpsshop import PluginError, X402Rejected

        requirements = self.coin.payment_requirements(self.amount_atomic, self.url, "Top-up")
        v1_header, v2_header = request.headers.get("X-PAYMENT"), request.headers.get("PAYMENT-SIGNATURE")
        if not v1_header and not v2_header:
            headers = {}
            if self.offer_v2:
                required = {
                    "x402Version": 2,
                    "error": "PAYMENT-SIGNATURE header is required",
                    "resource": {"url": self.url, "description": "Top-up", "mimeType": "application/json"},
                    "accepts": [self.coin.payment_requirements_v2(requirements)],
                }
                headers["PAYMENT-REQUIRED"] = base64.b64encode(json.dumps(required).encode()).decode()
            body = {"x402Version": 1, "error": "X-PAYMENT header is required", "accepts": [requirements]}
            return request._answer(402, body, headers)
        version = 1 if v1_header else 2
        try:
            payment = self.coin.decode_payment(v1_header or v2_header, version)
            settlement = asyncio.run(self.coin.settle(payment, requirements))
        except X402Rejected as exc:
            return request._answer(exc.status, {"error": exc.code, "message": exc.message})
        except PluginError as exc:
            return request._answer(503, {"error": "settlement_unknown", "message": str(exc)})
        self.settled[(payment.payer, payment.nonce)] = settlement
        name = "X-PAYMENT-RESPONSE" if version == 1 else "PAYMENT-RESPONSE"
        value = base64.b64encode(json.dumps(self.coin.settlement_response(settlement, version)).encode()).decode()
        body = {"status": "completed", "transaction": settlement.transaction}
        request._answer(200, body, {name: value, "Access-Control-Expose-Headers": name})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fetch_with_npm_client(
    payer: Any,
    url: str,
    rpc_url: str,
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``POST url`` with the npm ``x402-fetch`` wrapper (viem wallet); its status, body and headers.

    ``body``: the JSON request body (default: a 25 USD USDCBASE top-up)."""
    request: dict[str, Any] = {
        "privateKey": "0x" + bytes(payer.key).hex(),
        "rpcUrl": rpc_url,
        "url": url,
        "headers": headers or {},
    }
    if body is not None:
        request["body"] = body
    return json.loads(run_node("x402_npm_client.cjs", request))
