"""The deposit coin contract: what core relies on, as tests a coin plugin runs against its own chain.

Exposed through ``vpsshop.testing``. Subclass :class:`DepositCoinContract` in a test module as
``Test<YourCoin>`` and give it three fixtures; every contract test then runs against a real (or
development) node, one test per rule, so a failure names the rule that broke::

    import pytest
    from vpsshop.testing import DepositCoinContract

    class TestMyCoin(DepositCoinContract):
        @pytest.fixture
        def coin_settings(self, my_node):       # the [coins.<CODE>] table, node included
            return MyCoin, {"xpub": XPUB, "rpc_url": my_node.url, "confirmations": 2}

        @pytest.fixture
        def pay(self, my_node):                 # send amount_atomic to address; return the txid
            return my_node.send

        @pytest.fixture
        def mine(self, my_node):                # add n blocks (a chain that mines by itself waits)
            return my_node.mine

Optional fixture: ``payment_amount`` (atomic units each test pays, default ``10**decimals // 100``).

What the contract says (``docs/coin-plugins.md``, ``docs/chain-kit.md``):

* ``derive_address(n)`` is the same every time, differs for every ``n``, and its ``watch_key`` is
  unique; ``key_id()`` is short and stable; ``payment_uri`` names the address;
* ``scan(None, ...)`` starts at the tip: nothing paid in a block below it is reported;
* a payment to a watched key is reported once the chain has it, with the amount paid, tagged with
  the coin's code, and ``recheck`` then finds it present with the confirmations the chain shows;
* a payment to a key that is not watched is never reported;
* scanning again from an older cursor reports the same payment under the same identity;
* a scan that has nothing new returns its cursor unchanged, so core's loop ends;
* without a node configured the coin hands out the same addresses, ``can_scan`` is False and
  ``check_ready`` is ready.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from vpsshop.coins import DepositCoin, DetectedPayment
from vpsshop.errors import StartupError

MAX_SCANS = 50


def scan_until_idle(
    portal: BlockingPortal, coin: DepositCoin[Any], cursor: str | None, watched: set[str]
) -> tuple[str | None, list[tuple[str, DetectedPayment]]]:
    """Call ``scan`` as the watcher does, until the cursor stops moving; all that was found."""
    found: list[tuple[str, DetectedPayment]] = []
    for _ in range(MAX_SCANS):
        result = portal.call(coin.scan, cursor, watched)
        found.extend(result.payments)
        if result.cursor == cursor:
            return cursor, found
        cursor = result.cursor
    raise AssertionError(f"scan did not stop moving its cursor after {MAX_SCANS} calls")


class DepositCoinContract:
    """The contract tests; see the module docstring for the fixtures a subclass provides."""

    @pytest.fixture
    def coin_settings(self) -> tuple[type[DepositCoin[Any]], dict[str, Any]]:
        raise NotImplementedError("override the coin_settings fixture: (coin class, settings with a node)")

    @pytest.fixture
    def pay(self) -> Callable[[str, int], str]:
        raise NotImplementedError("override the pay fixture: (address, amount_atomic) -> txid")

    @pytest.fixture
    def mine(self) -> Callable[[int], Any]:
        raise NotImplementedError("override the mine fixture: add n blocks")

    @pytest.fixture
    def payment_amount(self, coin_settings: tuple[type[DepositCoin[Any]], dict[str, Any]]) -> int:
        hundredth: int = 10 ** coin_settings[0].decimals // 100  # int ** int is Any to typeshed (a float if negative)
        return max(hundredth, 1)

    @pytest.fixture
    def coin_portal(self) -> Iterator[BlockingPortal]:
        with start_blocking_portal() as portal:
            yield portal

    @pytest.fixture
    def deposit_coin(
        self, coin_settings: tuple[type[DepositCoin[Any]], dict[str, Any]], coin_portal: BlockingPortal
    ) -> Iterator[DepositCoin[Any]]:
        cls, settings = coin_settings
        coin = cls.from_settings(settings, sandbox=False, where=f"coins.{cls.code}")
        assert isinstance(coin, DepositCoin)
        yield coin
        coin_portal.call(coin.close)

    # ---- addresses ------------------------------------------------------------------------------

    def test_addresses_are_stable_distinct_and_named_in_the_uri(self, deposit_coin: DepositCoin[Any]) -> None:
        first = [deposit_coin.derive_address(i) for i in range(1, 6)]
        again = [deposit_coin.derive_address(i) for i in range(1, 6)]
        assert first == again, "derive_address must return the same address for the same index"
        assert len({a.address for a in first}) == 5 and len({a.watch_key for a in first}) == 5
        assert [a.index for a in first] == [1, 2, 3, 4, 5]
        key_id = deposit_coin.key_id()
        assert key_id == deposit_coin.key_id() and 0 < len(key_id) <= 64
        assert first[0].address in deposit_coin.payment_uri(first[0].address, 12345, "topup")

    def test_without_a_node_it_hands_out_the_same_addresses_only_in_the_sandbox(
        self,
        coin_settings: tuple[type[DepositCoin[Any]], dict[str, Any]],
        deposit_coin: DepositCoin[Any],
        coin_portal: BlockingPortal,
    ) -> None:
        """A sandbox may hand out addresses nobody watches; production refuses to start without a
        node (customers would pay addresses that are never credited), naming the setting."""
        cls, settings = coin_settings
        node_keys = {"rpc_url", "api_url", "wallet_rpc_url"}
        offline_settings = {k: v for k, v in settings.items() if k not in node_keys}
        sandbox = cls.from_settings(offline_settings, sandbox=True, where=f"coins.{cls.code}")
        production = cls.from_settings(offline_settings, sandbox=False, where=f"coins.{cls.code}")
        try:
            assert not sandbox.can_scan
            assert sandbox.derive_address(3) == deposit_coin.derive_address(3)
            assert sandbox.key_id() == deposit_coin.key_id()
            assert coin_portal.call(sandbox.check_ready).ok
            assert not coin_portal.call(production.check_ready).ok
            with pytest.raises(StartupError, match=f"coins\\.{cls.code}\\."):
                coin_portal.call(production.preflight)
        finally:
            coin_portal.call(sandbox.close)
            coin_portal.call(production.close)

    def test_node_is_ready(self, deposit_coin: DepositCoin[Any], coin_portal: BlockingPortal) -> None:
        assert deposit_coin.can_scan
        readiness = coin_portal.call(deposit_coin.check_ready)
        assert readiness.ok, readiness.detail

    # ---- scanning -------------------------------------------------------------------------------

    def test_first_scan_starts_at_the_tip(
        self,
        deposit_coin: DepositCoin[Any],
        coin_portal: BlockingPortal,
        pay: Callable[[str, int], str],
        mine: Callable[[int], Any],
        payment_amount: int,
    ) -> None:
        early = deposit_coin.derive_address(11)
        pay(early.address, payment_amount)
        mine(2)  # the payment's block, and one on top of it: the tip the first scan starts at
        cursor, found = scan_until_idle(coin_portal, deposit_coin, None, {early.watch_key})
        assert cursor is not None
        assert found == [], "a first scan (cursor None) must not report what was paid before it"

    def test_payment_is_found_confirmed_and_rechecked(
        self,
        deposit_coin: DepositCoin[Any],
        coin_portal: BlockingPortal,
        pay: Callable[[str, int], str],
        mine: Callable[[int], Any],
        payment_amount: int,
    ) -> None:
        watched_address, other = deposit_coin.derive_address(21), deposit_coin.derive_address(22)
        start, _ = scan_until_idle(coin_portal, deposit_coin, None, set())
        txid = pay(watched_address.address, payment_amount)
        pay(other.address, payment_amount)
        mine(max(deposit_coin.confirmations, 1))
        cursor, found = scan_until_idle(coin_portal, deposit_coin, start, {watched_address.watch_key})
        mine_found = [
            (code, p) for code, p in found if p.watch_key == watched_address.watch_key and p.confirmations > 0
        ]
        assert mine_found, f"the payment {txid} to a watched address was not reported"
        assert all(p.watch_key != other.watch_key for _, p in found), "a payment to an unwatched key was reported"
        code, payment = mine_found[-1]
        assert code == deposit_coin.code
        assert payment.amount_atomic == payment_amount
        assert payment.txid.lower().removeprefix("0x") == txid.lower().removeprefix("0x")
        (check,) = coin_portal.call(deposit_coin.recheck, [payment])
        assert check.identity == payment.identity and check.present
        assert check.confirmations >= max(deposit_coin.confirmations, 1)
        # Nothing new: the cursor stays, so core's loop of scan calls ends.
        assert coin_portal.call(deposit_coin.scan, cursor, {watched_address.watch_key}).cursor == cursor
        # Scanning again from the older cursor reports the same payment under the same identity.
        _, again = scan_until_idle(coin_portal, deposit_coin, start, {watched_address.watch_key})
        assert payment.identity in {p.identity for _, p in again}
