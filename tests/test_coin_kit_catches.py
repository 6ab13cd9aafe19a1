"""The coin contract kit (vpsshop.testing.DepositCoinContract) catches broken coins: each deliberately
broken coin of tests/broken_coins.py fails the kit, on the rule it breaks and no other, with a message
that names the rule; the unbroken ETH and USDT coins pass the same run.

The kit runs as a plugin author runs it: pytest in a subprocess, on a real anvil, its results read from
a JUnit XML report.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BROKEN_COINS = ROOT / "tests" / "broken_coins.py"

# The kit's rule each broken coin must fail (a test of the kit, named for its rule), and no other.
CAUGHT_BY = {
    # credits twice: one payment under two identities
    "TestTetherNumberingLogsPerScan": {"test_a_payment_keeps_one_identity_across_scans_and_rescans"},
    "TestTetherMatchingCallsAndLogs": {"test_a_payment_keeps_one_identity_across_scans_and_rescans"},
    "TestEtherMarkingMempoolPayments": {"test_a_payment_keeps_one_identity_across_scans_and_rescans"},
    # loses a late payment
    "TestEtherSkippingTheTipBlock": {"test_a_payment_mined_after_a_scan_is_found_by_the_next_scan"},
    # derives an address twice
    "TestEtherCuttingIndexesTo16Bits": {"test_many_indexes_give_distinct_addresses"},
    "TestEtherHandingOutKeysInCallOrder": {"test_a_fresh_coin_derives_the_same_addresses_in_any_order"},
    # mis-converts units
    "TestEtherAmountsThroughFloat": {"test_amounts_are_reported_in_atomic_units_exactly"},
    "TestTetherRoundedToCents": {"test_amounts_are_reported_in_atomic_units_exactly"},
    "TestTetherScaledTo18Decimals": {
        "test_payment_is_found_confirmed_and_rechecked",
        "test_amounts_are_reported_in_atomic_units_exactly",
    },
}
UNBROKEN = ["TestEther", "TestTetherErc20"]

Outcomes = dict[str, dict[str, str | None]]
"""{test class: {test name: the failure message, None when it passed}}"""


@pytest.fixture(scope="module")
def kit_run(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    report = tmp_path_factory.mktemp("coin-kit") / "report.xml"
    options = ["-q", "-p", "no:cacheprovider", "-p", "vpsshop", f"--junitxml={report}"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options, str(BROKEN_COINS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 1, result.stdout[-4000:] + result.stderr[-2000:]  # 1: some tests failed
    outcomes: Outcomes = {}
    for case in ET.parse(report).iter("testcase"):
        test_class = case.attrib["classname"].rpartition(".")[2]
        problems = [e for e in case if e.tag in ("failure", "error", "skipped")]
        assert all(e.tag == "failure" for e in problems), f"{test_class}::{case.attrib['name']} did not run"
        outcomes.setdefault(test_class, {})[case.attrib["name"]] = (
            problems[0].attrib.get("message", "") if problems else None
        )
    return outcomes


def rule_of(test_name: str) -> str:
    """The rule a kit test holds a coin to, in the words its failure message starts with."""
    return test_name.removeprefix("test_").replace("_", " ")


@pytest.mark.parametrize("test_class", UNBROKEN)
def test_the_unbroken_coins_pass_the_kit_beside_the_broken_ones(kit_run: Outcomes, test_class: str) -> None:
    failed = {name: message for name, message in kit_run[test_class].items() if message is not None}
    assert not failed, failed
    assert len(kit_run[test_class]) >= 10


@pytest.mark.parametrize(("test_class", "rules"), sorted(CAUGHT_BY.items()), ids=sorted(CAUGHT_BY))
def test_the_kit_fails_a_broken_coin_on_the_rule_it_breaks(kit_run: Outcomes, test_class: str, rules: set[str]) -> None:
    outcomes = kit_run[test_class]
    assert set(outcomes) == set(kit_run[UNBROKEN[0]]), "every rule of the kit ran against the broken coin"
    failed = {name: message for name, message in outcomes.items() if message is not None}
    assert set(failed) == rules, failed
    for name, message in failed.items():
        assert message is not None and message.startswith(f"AssertionError: {rule_of(name)}: "), message


def test_every_broken_coin_is_run_and_checked(kit_run: Outcomes) -> None:
    assert set(kit_run) == set(CAUGHT_BY) | set(UNBROKEN)


def test_every_rule_of_the_kit_is_documented() -> None:
    """docs/chain-kit.md's table and the kit's docstring name each test of the kit, its rule."""
    from vpsshop.payments import contract

    table = (ROOT / "docs" / "chain-kit.md").read_text()
    for name in (n for n in dir(contract.DepositCoinContract) if n.startswith("test_")):
        assert f"| `{name}` |" in table, f"docs/chain-kit.md section 8 does not list {name}"
        assert f"``{name}``" in (contract.__doc__ or ""), f"the kit's docstring does not name {name}"
