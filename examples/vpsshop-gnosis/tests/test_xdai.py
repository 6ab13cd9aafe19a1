"""The coin contract of vpsshop (vpsshop.testing.DepositCoinContract) run against XDAI on anvil.

anvil (Foundry's development node, on PATH) stands in for a Gnosis Chain node: the chain speaks the
same Ethereum JSON-RPC. It mines only when told to, so every test decides what is confirmed.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from coincurve import PrivateKey
from vpsshop_gnosis import Xdai

from vpsshop.chains import b58check_encode
from vpsshop.testing import DepositCoinContract

CHAIN_ID = 10200  # chiado's id, so the settings need no chain_id


class Anvil:
    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        binary = shutil.which("anvil")
        assert binary, "anvil (Foundry) must be on PATH"
        self.process = subprocess.Popen(
            [binary, "--port", str(port), "--chain-id", str(CHAIN_ID), "--no-mining", "--silent"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sender = self.rpc("eth_accounts")[0]
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "anvil did not start"
                time.sleep(0.1)

    def rpc(self, method: str, *params: Any) -> Any:
        body = httpx.post(self.url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)}).json()
        assert "error" not in body, body
        return body["result"]

    def pay(self, to: str, wei: int) -> str:
        return str(self.rpc("eth_sendTransaction", {"from": self.sender, "to": to, "value": hex(wei)}))

    def mine(self, blocks: int) -> None:
        self.rpc("anvil_mine", hex(blocks))


@pytest.fixture(scope="module")
def anvil() -> Iterator[Anvil]:
    node = Anvil()
    try:
        yield node
    finally:
        node.process.terminate()
        node.process.wait(10)


def random_xpub() -> str:
    """A fresh account key (BIP-32 serialisation of a random public key), so tests share no address."""
    key = PrivateKey().public_key.format(compressed=True)
    depth_parent_child = bytes([3]) + b"\0" * 4 + (0x80000000).to_bytes(4, "big")
    return b58check_encode(bytes.fromhex("0488b21e") + depth_parent_child + secrets.token_bytes(32) + key)


class TestXdai(DepositCoinContract):
    @pytest.fixture
    def coin_settings(self, anvil: Anvil) -> tuple[type[Xdai], dict[str, Any]]:
        return Xdai, {"xpub": random_xpub(), "network": "chiado", "rpc_url": anvil.url, "confirmations": 2}

    @pytest.fixture
    def pay(self, anvil: Anvil) -> Callable[[str, int], str]:
        return anvil.pay

    @pytest.fixture
    def mine(self, anvil: Anvil) -> Callable[[int], Any]:
        return anvil.mine


def test_wrong_chain_is_not_ready(anvil: Anvil) -> None:
    import asyncio

    coin = Xdai.from_settings({"xpub": random_xpub(), "rpc_url": anvil.url}, sandbox=False, where="coins.XDAI")

    async def check() -> Any:
        try:
            return await coin.check_ready()
        finally:
            await coin.close()

    readiness = asyncio.run(check())
    assert not readiness.ok and "chain id 10200, settings say 100" in readiness.detail
