"""The deposit coin contract kit (vpsshop.testing.DepositCoinContract) run against default coins on anvil.

The same kit runs against the example plugin (examples/vpsshop-gnosis, tests/test_example_coin.py);
here it holds ETH and the ERC-20 token of the EVM plugin to it, on a real anvil that mines only
when told to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from evm_peers import CHAIN_ID, EvmChain, random_xpub, start_evm_chain

from vpsshop.testing import DepositCoinContract
from vpsshop_evm import Ether, TetherErc20


@pytest.fixture(scope="module")
def evm_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvmChain]:
    chain = start_evm_chain(tmp_path_factory.mktemp("evm-contract"))
    try:
        yield chain
    finally:
        chain.anvil.stop()


class TestEther(DepositCoinContract):
    @pytest.fixture
    def coin_settings(self, evm_chain: EvmChain) -> tuple[type[Ether], dict[str, Any]]:
        return Ether, {
            "xpub": random_xpub(),
            "network": "anvil",
            "chain_id": CHAIN_ID,
            "rpc_url": evm_chain.url,
            "confirmations": 2,
        }

    @pytest.fixture
    def pay(self, evm_chain: EvmChain) -> Callable[[str, int], str]:
        return evm_chain.pay_eth

    @pytest.fixture
    def mine(self, evm_chain: EvmChain) -> Callable[[int], Any]:
        return evm_chain.anvil.mine


class TestTetherErc20(TestEther):
    @pytest.fixture
    def coin_settings(self, evm_chain: EvmChain) -> tuple[type[TetherErc20], dict[str, Any]]:
        return TetherErc20, {
            "xpub": random_xpub(),
            "network": "anvil",
            "chain_id": CHAIN_ID,
            "rpc_url": evm_chain.url,
            "contract": evm_chain.token.address,
            "decimals": 6,
            "confirmations": 2,
        }

    @pytest.fixture
    def pay(self, evm_chain: EvmChain) -> Callable[[str, int], str]:
        return evm_chain.pay_token
