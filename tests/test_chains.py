"""The chain kit's pieces on their own: the JSON-RPC client against a real node (anvil), the error
family, the settings types, the cursor and the scan-group key check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from anvil_node import free_port
from evm_peers import CHAIN_ID, Anvil
from pydantic import TypeAdapter, ValidationError

from vpsshop import ConfigError, PluginError
from vpsshop.chains import (
    BlockCursor,
    JsonRpcClient,
    NodeError,
    RpcError,
    Xpub,
    check_distinct_keys,
    endpoint_id,
    endpoint_label,
)
from vpsshop_evm import SANDBOX_XPUB, Ether


async def with_client(url: str, work: Any) -> Any:
    client = JsonRpcClient(url, name="test node", timeout=5)
    try:
        return await work(client)
    finally:
        await client.close()


def test_call_and_batch_against_a_node(anvil: Anvil) -> None:
    async def work(client: JsonRpcClient) -> Any:
        chain_id = await client.call("eth_chainId")
        answers = await client.batch([("eth_chainId", []), ("eth_blockNumber", []), ("net_version", [])], chunk=2)
        return chain_id, answers

    chain_id, answers = asyncio.run(with_client(anvil.url, work))
    assert int(chain_id, 16) == CHAIN_ID
    assert int(answers[0], 16) == CHAIN_ID and int(answers[1], 16) >= 0 and answers[2] == str(CHAIN_ID)


def test_an_error_answer_is_an_rpc_error_with_its_code(anvil: Anvil) -> None:
    with pytest.raises(RpcError) as failure:
        asyncio.run(with_client(anvil.url, lambda c: c.call("no_such_method")))
    assert isinstance(failure.value, PluginError)
    assert failure.value.code == -32601 and failure.value.method == "no_such_method"
    with pytest.raises(RpcError, match="no_such_method"):
        asyncio.run(with_client(anvil.url, lambda c: c.batch([("eth_chainId", []), ("no_such_method", [])])))


def test_no_answer_is_a_node_error_naming_only_scheme_host_and_port() -> None:
    url = f"http://user:PASSWORD@127.0.0.1:{free_port()}/v3/SECRETKEY?key=SECRET2"
    with pytest.raises(NodeError) as failure:
        asyncio.run(with_client(url, lambda c: c.call("eth_chainId")))
    message = str(failure.value)
    assert isinstance(failure.value, PluginError)
    assert "SECRET" not in message and "PASSWORD" not in message and "user" not in message
    assert message.startswith("test node at http://127.0.0.1:") and "eth_chainId" in message
    assert endpoint_label(url) == f"http://127.0.0.1:{url.split(':')[3].split('/')[0]}"
    assert "SECRET" not in endpoint_id(url) and len(endpoint_id(url)) == 12


def test_xpub_setting_refuses_a_private_key_and_garbage() -> None:
    adapter = TypeAdapter(Xpub)
    assert adapter.validate_python(f"  {SANDBOX_XPUB}\n") == SANDBOX_XPUB
    with pytest.raises(ValidationError):
        adapter.validate_python("xpub-not-a-key")


def test_block_cursor_round_trip() -> None:
    cursor = BlockCursor(7, "0xab")
    assert str(cursor) == "7:0xab" and BlockCursor.parse("7:0xab") == cursor
    assert BlockCursor.parse("-1:") == BlockCursor(-1, "")


def test_a_scan_group_refuses_two_coins_on_one_key_and_branch() -> None:
    def eth(branch: int) -> Ether:
        return Ether.from_settings({"xpub": SANDBOX_XPUB, "branch": branch}, sandbox=False, where="coins.ETH")

    check_distinct_keys([eth(0), eth(1)])
    with pytest.raises(ConfigError, match="same key and branch"):
        check_distinct_keys([eth(0), eth(0)])


def test_a_coin_without_a_node_is_addresses_only() -> None:
    coin = Ether.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.ETH")
    assert not coin.can_scan
    assert asyncio.run(coin.check_ready()).detail == "ethereum: addresses only, no node configured (not watched)"
    with pytest.raises(PluginError, match="ETH: no rpc_url is configured"):
        asyncio.run(coin.scan(None, set()))
