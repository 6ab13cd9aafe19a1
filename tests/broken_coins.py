"""Deliberately broken coins, and the coin contract kit (vpsshop.testing.DepositCoinContract) run against them.

Each broken coin is the default ETH or USDT coin of the EVM plugin with exactly one behaviour broken,
the way a coin plugin gets it wrong in production; it runs on a real anvil (tests/evm_peers.py) that
mines only when told to, as tests/test_coin_contract.py runs the real coins. This module is not
collected by the suite (its name does not start with ``test_``): tests/test_coin_kit_catches.py runs
it with pytest in a subprocess and checks that the kit fails each broken coin on the rule it breaks,
and passes the unbroken coins run beside them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from evm_peers import CHAIN_ID, EvmChain, random_xpub, start_evm_chain

from vpsshop import DepositAddress, DepositCoin, DetectedPayment, WatchSet
from vpsshop.chains import BlockCursor
from vpsshop.testing import DepositCoinContract
from vpsshop_evm import Ether, EvmCoin, TetherErc20

TRANSFER_SELECTOR = "0xa9059cbb"
"""keccak256("transfer(address,uint256)")[:4]: the calldata of an ERC-20 transfer starts with it"""

# ---- credits twice: one payment under two identities ------------------------------------------------


class TetherNumberingLogsPerScan(TetherErc20):
    """BROKEN: numbers each ``Transfer`` log by its place in the ``eth_getLogs`` answer instead of its
    ``logIndex`` in the block, so a rescan from an older cursor, which reads more logs before it,
    reports the same transfer under a new identity ``<tx>:<n>``: core credits it twice."""

    async def transfer_logs(self, first: int, last: int, contracts: list[str]) -> list[dict[str, Any]]:
        logs = await super().transfer_logs(first, last, contracts)
        return [{**log, "logIndex": hex(n)} for n, log in enumerate(logs)]


class EtherMarkingMempoolPayments(Ether):
    """BROKEN: shows payments still in the mempool (anvil's pending block) under the identity
    ``<tx>:mempool``, and the same payment once mined under ``<tx>``. Core credits both: the recheck of
    the mempool identity finds the transaction's receipt once it is mined."""

    async def scan_unconfirmed(
        self, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> list[tuple[str, DetectedPayment]]:
        block = await self.node.call("eth_getBlockByNumber", "pending", True)
        found = []
        for tx in (block or {}).get("transactions", []):
            to, value, txid = (tx.get("to") or "").lower(), int(tx["value"], 16), tx["hash"].lower()
            if to in watched and value > 0:
                found.append((self.code, DetectedPayment(f"{txid}:mempool", to, value, txid, 0)))
        return found


class TetherMatchingCallsAndLogs(TetherErc20):
    """BROKEN: finds a token payment twice in one scan: by its ``Transfer`` log (identity
    ``<tx>:<log index>``) and by the ``transfer(to, amount)`` call in the transaction (identity: the
    transaction hash), as a coin that decodes calls to catch transfers a log filter missed would.
    Core credits both identities."""

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        end, found = await super().scan_blocks(after, last, tip, watched, members)
        for height in range(after.height + 1, end.height + 1):
            block = await self.node.call("eth_getBlockByNumber", hex(height), True)
            for tx in block["transactions"]:
                data = tx.get("input") or ""
                if (tx.get("to") or "").lower() != self.contract_key or not data.startswith(TRANSFER_SELECTOR):
                    continue
                to, amount, txid = "0x" + data[34:74].lower(), int(data[74:138], 16), tx["hash"].lower()
                if to in watched and amount > 0:
                    payment = DetectedPayment(txid, to, amount, txid, tip - height + 1, height, block["hash"])
                    found.append((self.code, payment))
        return end, found


# ---- loses a late payment: a block never read -------------------------------------------------------


class EtherSkippingTheTipBlock(Ether):
    """BROKEN: reads blocks ``range(after + 1, last)`` (half open: the last block is left out) but
    moves its cursor to ``last``. The block at the tip when the watcher scans is never read, so a
    payment mined in it is never reported; it is found only when more blocks come in one go."""

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        found: list[tuple[str, DetectedPayment]] = []
        if last - 1 > after.height:
            _, found = await super().scan_blocks(after, last - 1, tip, watched, members)
        return BlockCursor(last, await self.block_hash(last)), found


# ---- derives an address twice ------------------------------------------------------------------------


class EtherCuttingIndexesTo16Bits(Ether):
    """BROKEN: derives the child key of ``index & 0xFFFF`` (a 16-bit field somewhere), so top-up 65537
    is handed the address of top-up 1, and a payment to it credits whichever core maps it to."""

    def derive_address(self, index: int) -> DepositAddress:
        return replace(super().derive_address(index & 0xFFFF), index=index)


class EtherHandingOutKeysInCallOrder(Ether):
    """BROKEN: hands out the next unused child key for each new index (remembered per instance) instead
    of the child key of the index, so the same index is a different address after a restart, or on
    another worker that was asked for the indexes in another order: payments are never matched."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed_out: dict[int, DepositAddress] = {}

    def derive_address(self, index: int) -> DepositAddress:
        if index not in self.handed_out:
            child = super().derive_address(len(self.handed_out) + 1)
            self.handed_out[index] = replace(child, index=index)
        return self.handed_out[index]


# ---- mis-converts units ------------------------------------------------------------------------------


class EvmAmountsMisconverted(EvmCoin):
    """What the unit-breaking coins share: every amount they report goes through :meth:`misconvert`."""

    def misconvert(self, amount_atomic: int) -> int:
        raise NotImplementedError

    async def scan_blocks(
        self, after: BlockCursor, last: int, tip: int, watched: WatchSet, members: Sequence[DepositCoin[Any]]
    ) -> tuple[BlockCursor, list[tuple[str, DetectedPayment]]]:
        end, found = await super().scan_blocks(after, last, tip, watched, members)
        return end, [(code, replace(p, amount_atomic=self.misconvert(p.amount_atomic))) for code, p in found]


class EtherAmountsThroughFloat(EvmAmountsMisconverted, Ether):
    """BROKEN: converts wei to ether as a float and back, so a non-round amount above 2**53 wei
    (0.009 ETH) loses its last units."""

    def misconvert(self, amount_atomic: int) -> int:
        wei_per_ether: int = 10**self.decimals
        return int(amount_atomic / wei_per_ether * wei_per_ether)


class TetherRoundedToCents(EvmAmountsMisconverted, TetherErc20):
    """BROKEN: rounds token amounts to cents (two decimals), as a price would be, so 0.010001 USDT is
    reported as 0.01."""

    def misconvert(self, amount_atomic: int) -> int:
        units_per_token: int = 10**self.decimals
        return int(round(amount_atomic / units_per_token, 2) * units_per_token)


class TetherScaledTo18Decimals(EvmAmountsMisconverted, TetherErc20):
    """BROKEN: reports token amounts in 18 decimals, as if every ERC-20 had them (USDT has 6): a
    payment is worth 10**12 times what was paid."""

    def misconvert(self, amount_atomic: int) -> int:
        factor: int = 10 ** (18 - self.decimals)
        return amount_atomic * factor


# ---- the kit, against them on anvil -------------------------------------------------------------------


@pytest.fixture(scope="module")
def evm_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvmChain]:
    chain = start_evm_chain(tmp_path_factory.mktemp("evm-broken-coins"))
    try:
        yield chain
    finally:
        chain.anvil.stop()


class EtherKit(DepositCoinContract):
    """The kit's fixtures for a coin of the ETH kind on anvil; ``coin`` names which."""

    coin: ClassVar[type[Ether]] = Ether

    @pytest.fixture
    def coin_settings(self, evm_chain: EvmChain) -> tuple[type[DepositCoin[Any]], dict[str, Any]]:
        settings = {"xpub": random_xpub(), "network": "anvil", "chain_id": CHAIN_ID, "rpc_url": evm_chain.url}
        return self.coin, {**settings, "confirmations": 2}

    @pytest.fixture
    def pay(self, evm_chain: EvmChain) -> Callable[[str, int], str]:
        return evm_chain.pay_eth

    @pytest.fixture
    def mine(self, evm_chain: EvmChain) -> Callable[[int], Any]:
        return evm_chain.anvil.mine


class TetherKit(DepositCoinContract):
    """The kit's fixtures for a coin of the USDT kind on anvil (the test token, 6 decimals)."""

    coin: ClassVar[type[TetherErc20]] = TetherErc20

    @pytest.fixture
    def coin_settings(self, evm_chain: EvmChain) -> tuple[type[DepositCoin[Any]], dict[str, Any]]:
        settings = {"xpub": random_xpub(), "network": "anvil", "chain_id": CHAIN_ID, "rpc_url": evm_chain.url}
        return self.coin, {**settings, "contract": evm_chain.token.address, "decimals": 6, "confirmations": 2}

    @pytest.fixture
    def pay(self, evm_chain: EvmChain) -> Callable[[str, int], str]:
        return evm_chain.pay_token

    @pytest.fixture
    def mine(self, evm_chain: EvmChain) -> Callable[[int], Any]:
        return evm_chain.anvil.mine


class TestEther(EtherKit):
    coin = Ether


class TestTetherErc20(TetherKit):
    coin = TetherErc20


class TestTetherNumberingLogsPerScan(TetherKit):
    coin = TetherNumberingLogsPerScan


class TestTetherMatchingCallsAndLogs(TetherKit):
    coin = TetherMatchingCallsAndLogs


class TestEtherMarkingMempoolPayments(EtherKit):
    coin = EtherMarkingMempoolPayments


class TestEtherSkippingTheTipBlock(EtherKit):
    coin = EtherSkippingTheTipBlock


class TestEtherCuttingIndexesTo16Bits(EtherKit):
    coin = EtherCuttingIndexesTo16Bits


class TestEtherHandingOutKeysInCallOrder(EtherKit):
    coin = EtherHandingOutKeysInCallOrder


class TestEtherAmountsThroughFloat(EtherKit):
    coin = EtherAmountsThroughFloat


class TestTetherRoundedToCents(TetherKit):
    coin = TetherRoundedToCents


class TestTetherScaledTo18Decimals(TetherKit):
    coin = TetherScaledTo18Decimals
