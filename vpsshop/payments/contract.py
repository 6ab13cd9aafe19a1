"""The deposit coin contract: what core relies on, as tests a coin plugin runs against its own chain.

Exposed through ``vpsshop.testing``. Subclass :class:`DepositCoinContract` in a test module as
``Test<YourCoin>`` and give it three fixtures; every contract test then runs against a real (or
development) node, one test per rule, so a failure names the rule that broke (the test's name, and
the first words of its message)::

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

Optional fixture: ``payment_amount`` (atomic units a test pays, default ``10**decimals // 100``;
the amounts rule also pays one unit more and a non-round amount above it).

What the contract says (``docs/coin-plugins.md``, ``docs/chain-kit.md``), one test per rule:

* addresses (``test_addresses_are_stable_distinct_and_named_in_the_uri``): ``derive_address(n)`` is
  the same every time, differs for every ``n``, and its ``watch_key`` is unique; ``key_id()`` is
  short and stable; ``payment_uri`` names the address;
* many indexes give distinct addresses (``test_many_indexes_give_distinct_addresses``): indexes 1 to
  100 and 2**8+1, 2**16+1, 2**24+1 give as many addresses and watch keys (an index cut to a few
  bits hands two top-ups one address);
* an address depends on its index alone
  (``test_a_fresh_coin_derives_the_same_addresses_in_any_order``): a new coin from the same
  settings, asked in the reverse order, derives the same addresses and has the same ``key_id()``
  (a restarted shop must watch the addresses it handed out before);
* ``scan(None, ...)`` starts at the tip (``test_first_scan_starts_at_the_tip``): nothing paid in a
  block below it is reported;
* a payment to a watched key is found (``test_payment_is_found_confirmed_and_rechecked``) once the
  chain has it, with the amount paid, tagged with the coin's code, and ``recheck`` then finds it
  present with the confirmations the chain shows; a payment to a key that is not watched is never
  reported; a scan that has nothing new returns its cursor unchanged, so core's loop ends;
* amounts are exact (``test_amounts_are_reported_in_atomic_units_exactly``): three payments, one of
  a non-round amount, are each reported with the atomic units paid (no float, no rounding, no
  decimals factor);
* nothing is lost between scans (``test_a_payment_mined_after_a_scan_is_found_by_the_next_scan``):
  a payment mined in the block right after a scan's cursor, to an address handed out after that
  scan, is found by the next scan from the returned cursor, and again after that;
* a payment is credited once (``test_a_payment_keeps_one_identity_across_scans_and_rescans``):
  reported in the mempool (if the coin shows it), once mined, by a scan with nothing new, and by
  rescans from older cursors (one of which also reads an earlier payment to another address), it
  always has the same identity;
* without a node (``test_without_a_node_it_hands_out_the_same_addresses_only_in_the_sandbox``) the
  coin hands out the same addresses, ``can_scan`` is False and ``check_ready`` is ready in the
  sandbox; in production it is not ready and ``preflight`` refuses to start, naming the setting;
* with a node, ``check_ready`` is ready (``test_node_is_ready``).

``tests/test_coin_kit_catches.py`` in vpsshop's repository runs this kit against deliberately
broken versions of the default ETH and USDT coins and checks that each fails the rule it breaks.
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
        rule = "addresses are stable distinct and named in the uri"
        assert first == again, f"{rule}: derive_address must return the same address for the same index"
        assert len({a.address for a in first}) == 5 and len({a.watch_key for a in first}) == 5, (
            f"{rule}: indexes 1 to 5 gave {first}"
        )
        assert [a.index for a in first] == [1, 2, 3, 4, 5], f"{rule}: each address carries its own index"
        key_id = deposit_coin.key_id()
        assert key_id == deposit_coin.key_id() and 0 < len(key_id) <= 64, f"{rule}: key_id() {key_id!r}"
        uri = deposit_coin.payment_uri(first[0].address, 12345, "topup")
        assert first[0].address in uri, f"{rule}: {uri!r} does not name {first[0].address}"

    def test_many_indexes_give_distinct_addresses(self, deposit_coin: DepositCoin[Any]) -> None:
        """Core allocates indexes 1, 2, 3 ... for ever; an index cut to 8, 16 or 24 bits (a field
        too narrow somewhere in the derivation) would hand two top-ups one address."""
        rule = "many indexes give distinct addresses"
        indexes = [*range(1, 101), 2**8 + 1, 2**16 + 1, 2**24 + 1]
        derived = [deposit_coin.derive_address(i) for i in indexes]
        assert [a.index for a in derived] == indexes, f"{rule}: each address carries its own index"
        for what in ("address", "watch_key"):
            first_index: dict[str, int] = {}
            for index, address in zip(indexes, derived, strict=True):
                value = getattr(address, what)
                assert value not in first_index, (
                    f"{rule}: indexes {first_index.get(value)} and {index} both derive the {what} {value}"
                )
                first_index[value] = index

    def test_a_fresh_coin_derives_the_same_addresses_in_any_order(
        self,
        coin_settings: tuple[type[DepositCoin[Any]], dict[str, Any]],
        deposit_coin: DepositCoin[Any],
        coin_portal: BlockingPortal,
    ) -> None:
        """An address depends on its index (and the settings) alone: the shop restarted, or another
        worker, asked for the indexes in another order, derives the addresses customers were given."""
        rule = "a fresh coin derives the same addresses in any order"
        cls, settings = coin_settings
        indexes = [*range(1, 21), 2**16 + 1]
        forward = {i: deposit_coin.derive_address(i) for i in indexes}
        fresh = cls.from_settings(settings, sandbox=False, where=f"coins.{cls.code}")
        try:
            backward = {i: fresh.derive_address(i) for i in reversed(indexes)}
            for i in indexes:
                assert forward[i] == backward[i], (
                    f"{rule}: index {i} derived {forward[i]} in order 1, 2, 3 ... and {backward[i]} "
                    f"on a fresh coin asked in the reverse order"
                )
            assert fresh.key_id() == deposit_coin.key_id(), f"{rule}: key_id() changed with a fresh coin"
        finally:
            coin_portal.call(fresh.close)

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
        rule = "without a node it hands out the same addresses only in the sandbox"
        try:
            assert not sandbox.can_scan, f"{rule}: can_scan is True without a node"
            offline, online = sandbox.derive_address(3), deposit_coin.derive_address(3)
            assert offline == online, f"{rule}: index 3 is {offline} without a node, {online} with one"
            assert sandbox.key_id() == deposit_coin.key_id(), f"{rule}: key_id() differs without a node"
            readiness = coin_portal.call(sandbox.check_ready)
            assert readiness.ok, f"{rule}: the sandbox is not ready without a node: {readiness.detail}"
            assert not coin_portal.call(production.check_ready).ok, f"{rule}: production is ready without a node"
            with pytest.raises(StartupError, match=f"coins\\.{cls.code}\\."):
                coin_portal.call(production.preflight)
        finally:
            coin_portal.call(sandbox.close)
            coin_portal.call(production.close)

    def test_node_is_ready(self, deposit_coin: DepositCoin[Any], coin_portal: BlockingPortal) -> None:
        assert deposit_coin.can_scan, "node is ready: can_scan is False with a node configured"
        readiness = coin_portal.call(deposit_coin.check_ready)
        assert readiness.ok, f"node is ready: {readiness.detail}"

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
        assert found == [], f"first scan starts at the tip: a first scan (cursor None) reported {found}, paid before it"

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
        rule = "payment is found confirmed and rechecked"
        assert mine_found, f"{rule}: the payment {txid} to a watched address was not reported"
        assert all(p.watch_key != other.watch_key for _, p in found), (
            f"{rule}: a payment to an unwatched key was reported"
        )
        code, payment = mine_found[-1]
        assert code == deposit_coin.code, f"{rule}: the payment was reported as {code}, not {deposit_coin.code}"
        assert payment.amount_atomic == payment_amount, (
            f"{rule}: paid {payment_amount} atomic units, reported {payment.amount_atomic}"
        )
        assert payment.txid.lower().removeprefix("0x") == txid.lower().removeprefix("0x"), (
            f"{rule}: paid in {txid}, reported as {payment.txid}"
        )
        (check,) = coin_portal.call(deposit_coin.recheck, [payment])
        assert check.identity == payment.identity and check.present, f"{rule}: recheck answered {check}"
        assert check.confirmations >= max(deposit_coin.confirmations, 1), f"{rule}: recheck answered {check}"
        # Nothing new: the cursor stays, so core's loop of scan calls ends.
        assert coin_portal.call(deposit_coin.scan, cursor, {watched_address.watch_key}).cursor == cursor, (
            f"{rule}: a scan with nothing new moved its cursor"
        )
        # Scanning again from the older cursor reports the same payment under the same identity.
        _, again = scan_until_idle(coin_portal, deposit_coin, start, {watched_address.watch_key})
        assert payment.identity in {p.identity for _, p in again}, (
            f"{rule}: a rescan from the older cursor did not report {payment.identity}"
        )

    def test_amounts_are_reported_in_atomic_units_exactly(
        self,
        deposit_coin: DepositCoin[Any],
        coin_portal: BlockingPortal,
        pay: Callable[[str, int], str],
        mine: Callable[[int], Any],
        payment_amount: int,
    ) -> None:
        """Core turns atomic units into money: one unit lost to a float, to rounding or to a
        decimals factor is a customer paid short or a shop paid twice."""
        rule = "amounts are reported in atomic units exactly"
        amounts = [payment_amount, payment_amount + 1, payment_amount + payment_amount // 7 + 1]
        addresses = [deposit_coin.derive_address(51 + n) for n in range(len(amounts))]
        watched = {a.watch_key for a in addresses}
        start, _ = scan_until_idle(coin_portal, deposit_coin, None, watched)
        for address, amount in zip(addresses, amounts, strict=True):
            pay(address.address, amount)
        mine(max(deposit_coin.confirmations, 1))
        _, found = scan_until_idle(coin_portal, deposit_coin, start, watched)
        paid = {a.watch_key: amount for a, amount in zip(addresses, amounts, strict=True)}
        reported = {p.watch_key: p.amount_atomic for _, p in found if p.confirmations > 0}
        assert reported == paid, f"{rule}: paid {paid}, reported {reported}"

    def test_a_payment_mined_after_a_scan_is_found_by_the_next_scan(
        self,
        deposit_coin: DepositCoin[Any],
        coin_portal: BlockingPortal,
        pay: Callable[[str, int], str],
        mine: Callable[[int], Any],
        payment_amount: int,
    ) -> None:
        """The watcher scans again and again from the cursor each scan returns: a block the cursor
        steps over (the tip when the scan ran, a block mined while it read) is never read again.
        The payment goes to an address handed out after the first scan, as a new top-up's does."""
        rule = "a payment mined after a scan is found by the next scan"
        first = deposit_coin.derive_address(41)
        cursor, _ = scan_until_idle(coin_portal, deposit_coin, None, {first.watch_key})
        late = deposit_coin.derive_address(42)
        watched = {first.watch_key, late.watch_key}
        for round_, address in enumerate((late, first), start=1):
            txid = pay(address.address, payment_amount)
            mine(1)
            after, found = scan_until_idle(coin_portal, deposit_coin, cursor, watched)
            assert any(p.watch_key == address.watch_key and p.confirmations > 0 for _, p in found), (
                f"{rule}: the payment {txid}, mined in the block after the cursor {cursor!r} (scan {round_}), "
                f"was not reported by the scans from it (which moved the cursor to {after!r})"
            )
            cursor = after

    def test_a_payment_keeps_one_identity_across_scans_and_rescans(
        self,
        deposit_coin: DepositCoin[Any],
        coin_portal: BlockingPortal,
        pay: Callable[[str, int], str],
        mine: Callable[[int], Any],
        payment_amount: int,
    ) -> None:
        """Core credits each identity once: the same payment under a second identity (numbered by
        its place in a scan rather than on the chain, marked as seen in the mempool ...) is
        credited twice. Scans may repeat a payment, always under one identity."""
        rule = "a payment keeps one identity across scans and rescans"
        address, other = deposit_coin.derive_address(61), deposit_coin.derive_address(62)
        watched = {address.watch_key}
        before, _ = scan_until_idle(coin_portal, deposit_coin, None, watched)
        pay(other.address, payment_amount)  # an earlier payment, to an unwatched address
        mine(1)
        middle, _ = scan_until_idle(coin_portal, deposit_coin, before, watched)
        txid = pay(address.address, payment_amount)
        reports: list[tuple[str, DetectedPayment]] = []

        def scan_from(label: str, cursor: str | None) -> str | None:
            end, found = scan_until_idle(coin_portal, deposit_coin, cursor, watched)
            reports.extend((label, p) for _, p in found if p.watch_key == address.watch_key)
            return end

        scan_from("scanned before it was mined", middle)
        mine(max(deposit_coin.confirmations, 1))
        after = scan_from("scanned once mined", middle)
        scan_from("scanned again with nothing new", after)
        scan_from("rescanned from the cursor before it", middle)
        scan_from("rescanned from an older cursor", before)
        mined = {label for label, p in reports if p.confirmations > 0}
        for label in ("scanned once mined", "rescanned from the cursor before it", "rescanned from an older cursor"):
            assert label in mined, f"{rule}: the payment {txid} was not reported when {label}"
        identities: dict[str, list[str]] = {}
        for label, p in reports:
            identities.setdefault(p.identity, []).append(label)
        assert len(identities) == 1, (
            f"{rule}: the payment {txid} was reported under {len(identities)} identities: "
            + "; ".join(f"{identity!r} ({', '.join(dict.fromkeys(labels))})" for identity, labels in identities.items())
        )
