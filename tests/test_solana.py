"""The SOL plugin: SLIP-0010 deposit keys against the known vector and solders, the encrypted deposit
mnemonic, and top-ups and sweeps through the real engine against ``tests/solana_rpc_double.py``.

That server is a TEST DOUBLE of a Solana JSON-RPC endpoint: it answers the documented methods the plugin
calls, and every transaction in it is a real signed Solana transaction executed by LiteSVM
(``solders.litesvm``): the customers' payments built here with solders, the plugin's sweeps built by the
plugin itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bip32_private import ABANDON_MNEMONIC, mnemonic_seed
from bip_utils import Bip39MnemonicGenerator, Bip39WordsNum
from solana_rpc_double import SolanaRpcDouble
from solders.keypair import Keypair
from solders.message import Message
from solders.pubkey import Pubkey
from solders.system_program import TransferParams, transfer
from solders.transaction import Transaction
from starlette.testclient import TestClient
from topup_helpers import balance, decode_qr, get, payments, run_pass

from vpsshop.errors import ConfigError
from vpsshop.testing import TEST_ENCRYPTION_KEY, create_test_account
from vpsshop_solana import Solana, encrypt_mnemonic, parse_pubkey, pubsub_url


def random_mnemonic() -> str:
    """A fresh 12-word BIP-39 mnemonic (its checksum word right: the coin refuses one that is not)."""
    return str(Bip39MnemonicGenerator().FromWordsNumber(Bip39WordsNum.WORDS_NUM_12))


def test_deposit_keys_follow_phantom_derivation() -> None:
    """Sandbox account 0 is the known HAgk14... address; other indexes match solders' SLIP-0010."""
    coin = Solana.from_settings({}, sandbox=True, where="coins.SOL")
    assert coin.derive_address(0).address == "HAgk14JpMQLgt6rVgv7cBQFJWFto5Dqxi472uT3DKpqk"
    seed = mnemonic_seed(ABANDON_MNEMONIC)
    for index in (1, 2, 40):
        expected = Keypair.from_seed_and_derivation_path(seed, f"m/44'/501'/{index}'/0'").pubkey()
        assert coin.derive_address(index).address == str(expected)
    assert coin.payment_uri(coin.derive_address(1).address, 333_333_334, "tp") == (
        f"solana:{coin.derive_address(1).address}?amount=0.333333334"
    )


def test_pubsub_endpoint_is_derived_from_the_rpc_url_as_solanas_cli_does() -> None:
    """http -> ws, https -> wss, an explicit port + 1; ``ws_url`` wins, and ``""`` turns push off."""
    expected = {
        "http://127.0.0.1:8899/": "ws://127.0.0.1:8900/",
        "https://api.mainnet-beta.solana.com": "wss://api.mainnet-beta.solana.com",
        "https://rpc.example.net:8443/v1/KEY?x=1": "wss://rpc.example.net:8444/v1/KEY?x=1",
        "http://[::1]:8899": "ws://[::1]:8900",
    }
    for rpc_url, ws_url in expected.items():
        assert pubsub_url(rpc_url) == ws_url
        coin = Solana.from_settings({"rpc_url": rpc_url}, sandbox=True, where="coins.SOL")
        assert isinstance(coin, Solana) and coin.ws_url == ws_url
    chosen = {"rpc_url": "http://127.0.0.1:8899/", "ws_url": "wss://ws.example.net/"}
    assert Solana.from_settings(chosen, sandbox=True, where="coins.SOL").ws_url == "wss://ws.example.net/"  # type: ignore[attr-defined]
    off = Solana.from_settings({**chosen, "ws_url": ""}, sandbox=True, where="coins.SOL")
    assert off.ws_url is None and off.wake_channel() is None  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="ws_url"):
        Solana.from_settings({**chosen, "ws_url": "http://x/"}, sandbox=True, where="coins.SOL")


def test_mnemonic_is_encrypted_at_rest_and_required_in_production() -> None:
    mnemonic = random_mnemonic()
    token = encrypt_mnemonic(TEST_ENCRYPTION_KEY, mnemonic)
    assert mnemonic.split()[0] not in token
    coin = Solana.from_settings({"seed_encrypted": token}, sandbox=False, where="coins.SOL")
    with pytest.raises(Exception, match="locked"):
        coin.derive_address(1)
    coin.unlock(TEST_ENCRYPTION_KEY)
    expected = Keypair.from_seed_and_derivation_path(mnemonic_seed(mnemonic), "m/44'/501'/7'/0'").pubkey()
    assert coin.derive_address(7).address == str(expected)
    other = Solana.from_settings({"seed_encrypted": token}, sandbox=False, where="coins.SOL")
    with pytest.raises(ConfigError, match="encryption_key"):
        other.unlock("Vx1ZWl6q0sRrAXcxQzSa0wOmJ6Q8Pe8MmCeO_F7X6n0=")
    with pytest.raises(ConfigError, match="seed_encrypted"):
        Solana.from_settings({}, sandbox=False, where="coins.SOL")


class TestSandbox:
    @pytest.fixture
    def vpsshop_overrides(self) -> dict[str, Any]:
        return {}

    def test_sandbox_hands_out_devnet_addresses_without_a_node(self, vpsshop_client: TestClient) -> None:
        account = create_test_account(vpsshop_client)
        response = vpsshop_client.post("/v1/topups", json={"amount": 50, "coin": "SOL"}, headers=account.headers)
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["deposit_network"] == "solana-devnet"
        assert len(parse_pubkey(body["deposit_address"])) == 32
        assert body["deposit_amount"] == "0.333333334"
        assert decode_qr(body["qr_data_uri"]) == f"solana:{body['deposit_address']}?amount=0.333333334"
        assert not vpsshop_client.app.state.ctx.coins["SOL"].can_scan  # type: ignore[attr-defined]


# ---- top-ups against the JSON-RPC double on LiteSVM --------------------------------------------------------


@pytest.fixture
def collector() -> str:
    return str(Keypair().pubkey())


@pytest.fixture
def vpsshop_overrides(solana_node: SolanaRpcDouble, collector: str) -> dict[str, Any]:
    return {
        "coins": {
            "SOL": {
                "seed_encrypted": encrypt_mnemonic(TEST_ENCRYPTION_KEY, random_mnemonic()),
                "network": "solana-double",
                "rpc_url": solana_node.url,
                "confirmations": 3,
                "sweep_to": collector,
            }
        },
        "topups": {"poll_min_seconds": 0, "expiry_minutes": 60},
    }


def pay(node: SolanaRpcDouble, payer: Keypair, *transfers: tuple[str, int]) -> str:
    """One transaction of System Program transfers from ``payer``, signed with solders."""
    chain = node.chain
    instructions = [
        transfer(TransferParams(from_pubkey=payer.pubkey(), to_pubkey=Pubkey.from_string(to), lamports=n))
        for to, n in transfers
    ]
    tx = Transaction([payer], Message(instructions, payer.pubkey()), chain.svm.latest_blockhash())
    return chain.send(bytes(tx))


def funded_payer(node: SolanaRpcDouble) -> Keypair:
    payer = Keypair()
    node.chain.airdrop(str(payer.pubkey()), 100 * 10**9)
    return payer


def new_topup(client: TestClient, headers: dict[str, str], amount: int = 50) -> dict[str, Any]:
    response = client.post("/v1/topups", json={"amount": amount, "coin": "SOL"}, headers=headers)
    assert response.status_code == 201, response.text
    assert response.json()["deposit_network"] == "solana-double"
    return response.json()


def test_sol_paid_confirmed_credited_once_then_swept(
    vpsshop_client: TestClient, solana_node: SolanaRpcDouble, collector: str
) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h)
    assert topup["deposit_amount"] == "0.333333334"  # 50 USD at 150 USD/SOL, rounded up
    signature = pay(solana_node, funded_payer(solana_node), (topup["deposit_address"], 333_333_334))
    solana_node.chain.produce_block(skipped_slots=2)
    one = get(vpsshop_client, h, topup["ref"])
    assert (one["payment_status"], one["confirmations"], one["amount_received"]) == ("seen", 1, "0.333333334")
    solana_node.chain.produce_block()
    solana_node.chain.produce_block(skipped_slots=1)
    done = get(vpsshop_client, h, topup["ref"])
    assert (done["status"], done["credited_usd"]) == ("completed", 50)
    assert payments(vpsshop_client) == [("SOL", f"{signature}:{topup['deposit_address']}", "credited")]

    coin = vpsshop_client.app.state.ctx.coins["SOL"]  # type: ignore[attr-defined]
    swept = vpsshop_client.portal.call(coin.sweep, [1, 2])  # type: ignore[union-attr]
    assert [(r.index, r.lamports) for r in swept] == [(1, 333_333_334 - 5000), (2, 0)]
    assert swept[0].signature and swept[1].signature is None
    assert vpsshop_client.portal.call(coin.sweep, [1])[0].signature is None  # type: ignore[union-attr]
    solana_node.chain.produce_block()
    assert solana_node.chain.balance(topup["deposit_address"]) == 0
    assert solana_node.chain.balance(collector) == 333_333_334 - 5000
    for _ in range(3):
        solana_node.chain.produce_block()
        run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 50
    assert len(payments(vpsshop_client)) == 1  # the sweep's outflow is no deposit


def test_two_transfers_in_one_transaction_credit_both(vpsshop_client: TestClient, solana_node: SolanaRpcDouble) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    first = new_topup(vpsshop_client, h, 30)
    second = new_topup(vpsshop_client, h, 45)
    pay(
        solana_node,
        funded_payer(solana_node),
        (first["deposit_address"], 200_000_000),
        (second["deposit_address"], 300_000_000),
    )
    for _ in range(3):
        solana_node.chain.produce_block()
    run_pass(vpsshop_client)
    assert get(vpsshop_client, h, first["ref"])["credited_usd"] == 30
    assert get(vpsshop_client, h, second["ref"])["credited_usd"] == 45
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 75


def test_refused_transaction_credits_nothing(vpsshop_client: TestClient, solana_node: SolanaRpcDouble) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h)
    poor = Keypair()
    solana_node.chain.airdrop(str(poor.pubkey()), 10_000_000)
    with pytest.raises(Exception, match="simulation failed"):
        pay(solana_node, poor, (topup["deposit_address"], 333_333_334))
    for _ in range(4):
        solana_node.chain.produce_block()
    run_pass(vpsshop_client)
    assert get(vpsshop_client, h, topup["ref"])["payment_status"] == "awaiting_payment"
    assert balance(vpsshop_client, h) == 0


def test_health_reports_the_node(vpsshop_client: TestClient, solana_node: SolanaRpcDouble) -> None:
    health = {c["id"]: c for c in vpsshop_client.get("/v1/health").json()["components"] if c["kind"] == "coin"}
    assert health["SOL"]["ready"] and health["SOL"]["detail"] == f"solana-double at slot {solana_node.chain.slot} (ok)"


def test_payment_on_an_abandoned_fork_credits_nothing(vpsshop_client: TestClient, solana_node: SolanaRpcDouble) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h)
    pay(solana_node, funded_payer(solana_node), (topup["deposit_address"], 333_333_334))
    solana_node.chain.produce_block()
    solana_node.chain.produce_block()
    assert get(vpsshop_client, h, topup["ref"])["confirmations"] == 2
    solana_node.chain.abandon_blocks(2)
    for _ in range(4):
        solana_node.chain.produce_block()
    run_pass(vpsshop_client)
    after = get(vpsshop_client, h, topup["ref"])
    assert (after["status"], after["payment_status"], after["credited_usd"]) == ("pending", "awaiting_payment", 0)
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 0


def test_standing_address_receipts_are_announced_seen_dropped_held_then_credited(
    vpsshop_client: TestClient, solana_node: SolanaRpcDouble, vpsshop_clock: Any
) -> None:
    """A receipt at a standing address has no top-up until it is credited: the customer hears of it
    by ``deposit_address.*`` events (seen; dropped when its block leaves the chain; held below the
    5 USD minimum), and the admin's list of what waits shows it while held."""
    from vpsshop.admin import stuck
    from vpsshop.dashboard.event_pages import summary

    account = create_test_account(vpsshop_client)
    h = account.headers
    made = vpsshop_client.post("/v1/deposit-addresses", json={"coin": "SOL"}, headers=h)
    assert made.status_code == 200, made.text
    address = made.json()["address"]
    run_pass(vpsshop_client)
    payer = funded_payer(solana_node)
    chain = solana_node.chain

    def address_events() -> list[dict[str, Any]]:
        answer = vpsshop_client.get("/v1/events", params={"type": "deposit_address.*", "limit": 100}, headers=h)
        assert answer.status_code == 200, answer.text
        return [(e["type"], e["data"]) for e in answer.json()["events"]]

    signature = pay(solana_node, payer, (address, 20_000_000))  # 0.02 SOL at 150 USD: 3 USD
    chain.produce_block()
    run_pass(vpsshop_client)
    [(kind, data)] = address_events()
    assert (kind, data["object"], data["address"], data["held_amount"]) == (
        "deposit_address.payment_seen",
        "deposit_address",
        address,
        "0.000000000",
    )
    assert (data["payment"]["txid"], data["payment"]["amount"], data["payment"]["confirmations"]) == (
        signature,
        "0.020000000",
        1,
    )
    chain.abandon_blocks(1)  # its block leaves the chain
    chain.produce_block()
    run_pass(vpsshop_client)
    assert [k for k, _ in address_events()][1:] == ["deposit_address.payment_dropped"]
    assert ("SOL", f"{signature}:{address}", "dropped") in payments(vpsshop_client)

    again = pay(solana_node, payer, (address, 20_000_000))  # sent again: seen, confirmed, held
    for _ in range(3):
        chain.produce_block()
        run_pass(vpsshop_client)
    kinds = address_events()
    assert [k for k, _ in kinds][2:] == ["deposit_address.payment_seen", "deposit_address.payment_held"]
    held = kinds[-1][1]
    assert (held["payment"]["txid"], held["held_amount"], held["minimum_usd"]) == (again, "0.020000000", 5)
    assert balance(vpsshop_client, h) == 0
    assert summary({"data": held}) == (  # the dashboard's events page
        f"SOL deposit address {address}: a payment of 0.020000000 SOL (0.020000000 SOL held below the minimum)"
    )
    ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
    assert stuck(ctx, 30)["deposits"] == []  # held for less than half an hour yet
    vpsshop_clock.advance(minutes=31)
    [waiting] = stuck(ctx, 30)["deposits"]
    assert (waiting["address"], waiting["txid"], waiting["payment_status"]) == (address, again, "held")

    pay(solana_node, payer, (address, 20_000_000))  # 3 USD more: with the held 3 USD, credited together
    for _ in range(3):
        chain.produce_block()
        run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 6
    assert stuck(ctx, 30)["deposits"] == []
    assert [k for k, _ in address_events()][4:] == ["deposit_address.payment_seen"]
    answer = vpsshop_client.get("/v1/events", params={"type": "topup.completed"}, headers=h).json()
    assert [(e["data"]["credited_usd"], e["data"]["deposit_address"]) for e in answer["events"]] == [(6, address)]


def test_recheck_keeps_payments_above_a_lagging_node_tip(
    vpsshop_client: TestClient, solana_node: SolanaRpcDouble
) -> None:
    from vpsshop.coins import DetectedPayment

    coin = vpsshop_client.app.state.ctx.coins["SOL"]  # type: ignore[attr-defined]
    signature = str(Keypair().sign_message(b"never sent"))
    ahead = DetectedPayment(f"{signature}:x", "x", 1, signature, 1, solana_node.chain.slot + 5, "h")
    gone = DetectedPayment(f"{signature}:y", "y", 1, signature, 1, solana_node.chain.order[0], "h")
    checks = vpsshop_client.portal.call(coin.recheck, [ahead, gone])  # type: ignore[union-attr]
    assert [(c.present, c.confirmations) for c in checks] == [(True, 0), (False, 0)]


def test_reseller_tools_encrypt_the_mnemonic_and_sweep(
    tmp_path: Path, solana_node: SolanaRpcDouble, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m vpsshop_solana encrypt-mnemonic`` then ``sweep``, as a reseller runs them."""
    import io

    from vpsshop_solana import deposit_key, mnemonic_to_seed
    from vpsshop_solana.__main__ import main

    config = tmp_path / "vpsshop.toml"
    base = (
        f'mode = "sandbox"\nsecret_key = "s"\nencryption_key = "{TEST_ENCRYPTION_KEY}"\n'
        f'database_url = "sqlite:///{tmp_path / "db.sqlite"}"\n'
    )
    config.write_text(base)
    mnemonic = random_mnemonic()
    monkeypatch.setattr("sys.stdin", io.StringIO(mnemonic + "\n"))
    assert main(["--config", str(config), "encrypt-mnemonic"]) == 0
    token = capsys.readouterr().out.strip()
    # a mistyped word (the checksum no longer holds) is refused, not encrypted
    typo = " ".join(["abandon"] * 12)
    monkeypatch.setattr("sys.stdin", io.StringIO(typo + "\n"))
    assert main(["--config", str(config), "encrypt-mnemonic"]) == 2
    refused = capsys.readouterr()
    assert refused.out == "" and "not a valid BIP-39 mnemonic" in refused.err
    collector = str(Keypair().pubkey())
    config.write_text(
        base + f'[coins.SOL]\nseed_encrypted = "{token}"\nrpc_url = "{solana_node.url}"\nsweep_to = "{collector}"\n'
    )
    seed = mnemonic_to_seed(mnemonic)
    funded = [deposit_key(seed, i).address for i in (1, 3)]
    pay(solana_node, funded_payer(solana_node), (funded[0], 2_000_000), (funded[1], 3_000_000))
    solana_node.chain.produce_block()
    assert main(["--config", str(config), "sweep", "--to", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[:3] for line in lines] == [["1", funded[0], "1995000"], ["3", funded[1], "2995000"]]
    solana_node.chain.produce_block()
    assert solana_node.chain.balance(collector) == 1_995_000 + 2_995_000
    assert main(["--config", str(config), "sweep", "--to", "3"]) == 0  # again: nothing left to move
    assert capsys.readouterr().out.strip() == ""


def test_a_block_the_node_cannot_serve_yet_is_read_later(
    vpsshop_client: TestClient, solana_node: SolanaRpcDouble
) -> None:
    """getBlock answers -32004 for a block getBlocks listed: the scan stops before it and reads it later."""
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h)
    pay(solana_node, funded_payer(solana_node), (topup["deposit_address"], 333_333_334))
    slot = solana_node.chain.produce_block()
    for _ in range(3):
        solana_node.chain.produce_block()
    solana_node.chain.unavailable.add(slot)
    try:
        run_pass(vpsshop_client)
        assert get(vpsshop_client, h, topup["ref"])["payment_status"] == "awaiting_payment"
    finally:
        solana_node.chain.unavailable.discard(slot)
    run_pass(vpsshop_client)
    done = get(vpsshop_client, h, topup["ref"])
    assert (done["status"], done["credited_usd"]) == ("completed", 50)
