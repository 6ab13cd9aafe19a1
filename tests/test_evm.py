"""The EVM plugin (ETH and USDT ERC-20): BIP-44 derivation and EIP-55 against known vectors, EIP-681 URIs,
and top-ups through the real engine on a real ``anvil`` started by this module with an ERC-20 test token
compiled from ``tests/contracts`` by ``solcjs``: pay, mine, confirm, credit once; a reorg before the
confirmations credits nothing; two token transfers in one transaction credit both."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from bip32_private import ABANDON_MNEMONIC, account_node
from evm_peers import CHAIN_ID, EvmChain, random_xpub, rpc, start_evm_chain
from starlette.testclient import TestClient
from topup_helpers import balance, decode_qr, get, payments, run_pass

from vpsshop.errors import ConfigError
from vpsshop.hdkeys import b58check_encode
from vpsshop.testing import create_test_account
from vpsshop_evm import SANDBOX_XPUB, Ether, TetherErc20, parse_address, to_checksum_address


def test_eip55_vectors() -> None:
    """The examples of EIP-55."""
    for address in (
        "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed",
        "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
        "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
        "0xD1220A0cf47c7B9Be7A2E6BA89F429762e7b9aDb",
    ):
        assert to_checksum_address(address.lower()) == address
        assert parse_address(address) == address
    with pytest.raises(ValueError, match="checksum"):
        parse_address("0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeD")


def test_bip44_ethereum_vector_and_sandbox_key() -> None:
    """Account 0 of "abandon ... about" is 0x9858EfFD...; the sandbox xpub is that mnemonic's m/44'/60'/0'."""
    from eth_account import Account

    assert account_node("m/44'/60'/0'").xpub() == SANDBOX_XPUB
    coin = Ether.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.ETH")
    assert coin.derive_address(0).address == "0x9858EfFD232B4033E47d90003D41EC34EcaEda94"
    Account.enable_unaudited_hdwallet_features()
    for index in (1, 2, 77):
        expected = Account.from_mnemonic(ABANDON_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}").address
        derived = coin.derive_address(index)
        assert derived.address == expected
        assert derived.watch_key == expected.lower()
    token = TetherErc20.from_settings(
        {"xpub": SANDBOX_XPUB, "contract": "0xdAC17F958D2ee523a2206206994597C13D831ec7"},
        sandbox=False,
        where="coins.USDT",
    )
    assert (
        token.derive_address(1).address
        == Account.from_mnemonic(ABANDON_MNEMONIC, account_path="m/44'/60'/0'/1/1").address
    )
    assert token.derive_address(1).address != coin.derive_address(1).address
    assert (coin.network, coin.chain_id, coin.confirmations, token.decimals) == ("ethereum", 1, 12, 6)


def test_payment_uris_are_eip681() -> None:
    coin = Ether.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.ETH")
    token = TetherErc20.from_settings(
        {"xpub": SANDBOX_XPUB, "contract": "0xdac17f958d2ee523a2206206994597c13d831ec7"},
        sandbox=False,
        where="coins.USDT",
    )
    addr = coin.derive_address(1).address
    assert coin.payment_uri(addr, 16666666666666667, "tp_x") == f"ethereum:{addr}@1?value=16666666666666667"
    assert token.payment_uri(addr, 50_000_000, "tp_x") == (
        f"ethereum:0xdAC17F958D2ee523a2206206994597C13D831ec7@1/transfer?address={addr}&uint256=50000000"
    )


def test_settings_are_checked() -> None:
    xprv = account_node("m/44'/60'/0'")
    raw_xprv = (
        bytes.fromhex("0488ade4")
        + bytes([xprv.depth])
        + xprv.parent_fp
        + xprv.child_number.to_bytes(4, "big")
        + xprv.chain_code
        + b"\0"
        + xprv.key
    )
    with pytest.raises(ConfigError, match="PRIVATE"):
        Ether.from_settings({"xpub": b58check_encode(raw_xprv)}, sandbox=False, where="coins.ETH")
    with pytest.raises(ConfigError, match="set chain_id"):
        Ether.from_settings({"xpub": SANDBOX_XPUB, "network": "mychain"}, sandbox=False, where="coins.ETH")
    with pytest.raises(ConfigError, match=r"coins\.USDT\.contract"):
        TetherErc20.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.USDT")
    with pytest.raises(ConfigError, match="checksum"):
        TetherErc20.from_settings(
            {"xpub": SANDBOX_XPUB, "contract": "0xdAC17F958D2ee523a2206206994597C13D831eC7"},
            sandbox=False,
            where="coins.USDT",
        )


class TestSandbox:
    @pytest.fixture
    def vpsshop_overrides(self) -> dict[str, Any]:
        return {}

    def test_sandbox_hands_out_sepolia_addresses_without_a_node(self, vpsshop_client: TestClient) -> None:
        sandbox_addresses(vpsshop_client)


def sandbox_addresses(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    for code, network in (("ETH", "sepolia"), ("USDT", "sepolia")):
        response = vpsshop_client.post("/v1/topups", json={"amount": 50, "coin": code}, headers=account.headers)
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["deposit_network"] == network
        assert parse_address(body["deposit_address"]) == body["deposit_address"]
        uri = decode_qr(body["qr_data_uri"])
        if code == "ETH":
            assert uri == f"ethereum:{body['deposit_address']}@11155111?value=16666666666666667"
        else:
            assert uri == (
                f"ethereum:0xaA8E23Fb1079EA71e0a56F48a2aA51851D8433D0@11155111/transfer?"
                f"address={body['deposit_address']}&uint256=50000000"
            )
    ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
    assert not ctx.coins["ETH"].can_scan and not ctx.coins["USDT"].can_scan


# ---- top-ups on a real anvil ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def evm_chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EvmChain]:
    chain = start_evm_chain(tmp_path_factory.mktemp("evm"))
    try:
        yield chain
    finally:
        chain.anvil.stop()


@pytest.fixture
def vpsshop_overrides(evm_chain: EvmChain) -> dict[str, Any]:
    xpub = random_xpub()
    common = {"xpub": xpub, "network": "anvil", "chain_id": CHAIN_ID, "rpc_url": evm_chain.url, "confirmations": 3}
    return {
        "coins": {"ETH": dict(common), "USDT": {**common, "contract": evm_chain.token.address, "decimals": 6}},
        "topups": {"poll_min_seconds": 0, "expiry_minutes": 60},
    }


def new_topup(client: TestClient, headers: dict[str, str], coin: str, amount: int = 50) -> dict[str, Any]:
    response = client.post("/v1/topups", json={"amount": amount, "coin": coin}, headers=headers)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["deposit_network"] == "anvil"
    assert parse_address(body["deposit_address"]) == body["deposit_address"]
    assert body["confirmations_required"] == 3
    return body


def atomic(amount: str, decimals: int) -> int:
    return int(Decimal(amount) * 10**decimals)


@pytest.mark.slow
def test_eth_paid_mined_confirmed_credited_once(vpsshop_client: TestClient, evm_chain: EvmChain) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)  # the watcher starts at the tip
    topup = new_topup(vpsshop_client, h, "ETH")
    assert topup["deposit_amount"] == "0.016666666666666667"  # 50 USD at 3000 USD/ETH, rounded up
    txid = evm_chain.pay_eth(topup["deposit_address"], atomic(topup["deposit_amount"], 18))
    evm_chain.anvil.mine(1)
    one = get(vpsshop_client, h, topup["ref"])
    assert (one["status"], one["payment_status"], one["confirmations"]) == ("pending", "seen", 1)
    assert one["amount_received"] == topup["deposit_amount"]
    evm_chain.anvil.mine(1)
    assert get(vpsshop_client, h, topup["ref"])["confirmations"] == 2
    assert balance(vpsshop_client, h) == 0
    evm_chain.anvil.mine(1)
    done = get(vpsshop_client, h, topup["ref"])
    assert (done["status"], done["payment_status"], done["credited_usd"]) == ("completed", "confirmed", 50)
    assert balance(vpsshop_client, h) == 50
    evm_chain.anvil.mine(5)
    for _ in range(3):
        run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 50
    assert payments(vpsshop_client) == [("ETH", txid.lower(), "credited")]


@pytest.mark.slow
def test_usdt_paid_confirmed_credited_once(vpsshop_client: TestClient, evm_chain: EvmChain) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h, "USDT", 25)
    assert topup["deposit_amount"] == "25.000000"
    txid = evm_chain.pay_token(topup["deposit_address"], 25_000_000)
    evm_chain.anvil.mine(2)
    seen = get(vpsshop_client, h, topup["ref"])
    assert (seen["payment_status"], seen["confirmations"], seen["amount_received"]) == ("seen", 2, "25.000000")
    evm_chain.anvil.mine(1)
    done = get(vpsshop_client, h, topup["ref"])
    assert (done["status"], done["credited_usd"]) == ("completed", 25)
    evm_chain.anvil.mine(3)
    run_pass(vpsshop_client)
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 25
    log_index = evm_chain.receipt(txid)["logs"][0]["logIndex"]
    assert payments(vpsshop_client) == [("USDT", f"{txid.lower()}:{log_index}", "credited")]


@pytest.mark.slow
def test_scan_tags_each_payment_with_the_coin_that_arrived(vpsshop_client: TestClient, evm_chain: EvmChain) -> None:
    """ETH sent to a USDT top-up's address is reported as ETH, USDT sent to an ETH one as USDT: the
    engine decides what a payment in the other coin of the group is worth (docs/payments.md)."""
    h = create_test_account(vpsshop_client).headers
    eth = new_topup(vpsshop_client, h, "ETH")
    usdt = new_topup(vpsshop_client, h, "USDT")
    start = evm_chain.w3.eth.get_block("latest")
    to_usdt_address = evm_chain.pay_eth(usdt["deposit_address"], 10**16)
    to_eth_address = evm_chain.pay_token(eth["deposit_address"], 7_000_000)
    evm_chain.anvil.mine(1)
    ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
    watched = {eth["deposit_address"].lower(), usdt["deposit_address"].lower()}
    cursor = f"{start['number']}:{start['hash'].to_0x_hex()}"
    result = vpsshop_client.portal.call(ctx.coins["USDT"].scan, cursor, watched)  # type: ignore[union-attr]
    found = sorted((code, p.txid, p.watch_key, p.amount_atomic) for code, p in result.payments)
    assert found == sorted(
        [
            ("ETH", to_usdt_address.lower(), usdt["deposit_address"].lower(), 10**16),
            ("USDT", to_eth_address.lower(), eth["deposit_address"].lower(), 7_000_000),
        ]
    )
    assert result.cursor == f"{start['number'] + 1}:{evm_chain.w3.eth.get_block('latest')['hash'].to_0x_hex()}"


@pytest.mark.slow
def test_reorg_before_confirmations_credits_nothing(vpsshop_client: TestClient, evm_chain: EvmChain) -> None:
    """The blocks holding an ETH and a USDT payment are replaced (evm_snapshot / evm_revert, then longer empty
    blocks) after the payments were seen with 1 and 2 confirmations out of 3: both are dropped."""
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    eth = new_topup(vpsshop_client, h, "ETH")
    usdt = new_topup(vpsshop_client, h, "USDT")
    snapshot = rpc(evm_chain.url, "evm_snapshot")
    fork_height = evm_chain.anvil.height()
    evm_chain.pay_token(usdt["deposit_address"], 25_000_000)
    evm_chain.anvil.mine(1)
    evm_chain.pay_eth(eth["deposit_address"], atomic(eth["deposit_amount"], 18))
    evm_chain.anvil.mine(1)
    assert get(vpsshop_client, h, eth["ref"])["payment_status"] == "seen"
    assert get(vpsshop_client, h, usdt["ref"])["confirmations"] == 2
    assert rpc(evm_chain.url, "evm_revert", [snapshot]) is True
    assert evm_chain.anvil.height() == fork_height
    rpc(evm_chain.url, "anvil_dropAllTransactions")
    evm_chain.anvil.mine(5)  # a longer chain without the payments
    for _ in range(2):
        run_pass(vpsshop_client)
    for ref in (eth["ref"], usdt["ref"]):
        after = get(vpsshop_client, h, ref)
        assert (after["status"], after["payment_status"], after["credited_usd"]) == ("pending", "awaiting_payment", 0)
    assert balance(vpsshop_client, h) == 0


@pytest.mark.slow
def test_reorg_that_mines_the_eth_payment_again_credits_it_once(
    vpsshop_client: TestClient, evm_chain: EvmChain
) -> None:
    """``anvil_reorg`` replaces the last 2 blocks and re-includes the payment in the new ones."""
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    eth = new_topup(vpsshop_client, h, "ETH")
    payer = evm_chain.new_payer()
    evm_chain.anvil.mine(1)
    raw_tx = {"to": eth["deposit_address"], "value": atomic(eth["deposit_amount"], 18)}
    from eth_account import Account

    nonce = evm_chain.w3.eth.get_transaction_count(payer.address)
    signed = Account.sign_transaction(
        {
            "chainId": CHAIN_ID,
            "nonce": nonce,
            "gas": 21_000,
            "maxFeePerGas": 10**10,
            "maxPriorityFeePerGas": 10**9,
            **raw_tx,
        },
        payer.key,
    )
    evm_chain.w3.eth.send_raw_transaction(signed.raw_transaction)
    evm_chain.anvil.mine(1)
    old_block = evm_chain.w3.eth.get_block("latest")
    evm_chain.anvil.mine(1)
    assert get(vpsshop_client, h, eth["ref"])["confirmations"] == 2
    rpc(evm_chain.url, "anvil_reorg", [2, [[signed.raw_transaction.to_0x_hex(), 1]]])
    assert evm_chain.w3.eth.get_block(old_block["number"])["hash"] != old_block["hash"]
    evm_chain.anvil.mine(2)
    done = get(vpsshop_client, h, eth["ref"])
    assert (done["status"], done["credited_usd"]) == ("completed", 50)
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 50


@pytest.mark.slow
def test_two_transfers_in_one_transaction_credit_both(vpsshop_client: TestClient, evm_chain: EvmChain) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    first = new_topup(vpsshop_client, h, "USDT", 30)
    second = new_topup(vpsshop_client, h, "USDT", 40)
    token, batch = evm_chain.token, evm_chain.batch
    token.functions.approve(batch.address, 70_000_000).transact({"from": evm_chain.deployer})
    evm_chain.anvil.mine(1)
    txid = (
        batch.functions.transferMany(
            token.address, [first["deposit_address"], second["deposit_address"]], [30_000_000, 40_000_000]
        )
        .transact({"from": evm_chain.deployer})
        .to_0x_hex()
    )
    evm_chain.anvil.mine(3)
    receipt = evm_chain.receipt(txid)
    assert receipt["status"] == 1 and len(receipt["logs"]) == 2
    run_pass(vpsshop_client)
    assert get(vpsshop_client, h, first["ref"])["credited_usd"] == 30
    assert get(vpsshop_client, h, second["ref"])["credited_usd"] == 40
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 70


class TestOneKeyOneBranch:
    """ETH and USDT on one node must not derive from the same key and branch (they would share addresses)."""

    @pytest.fixture
    def vpsshop_overrides(self, evm_chain: EvmChain) -> dict[str, Any]:
        common = {"xpub": random_xpub(), "network": "anvil", "chain_id": CHAIN_ID, "rpc_url": evm_chain.url}
        return {"coins": {"ETH": dict(common), "USDT": {**common, "branch": 0, "contract": evm_chain.token.address}}}

    def test_start_up_refuses_it(self, vpsshop_app: Any) -> None:
        with pytest.raises(ConfigError, match="same key and branch"), TestClient(vpsshop_app):
            pass


class TestProviderRefusingWideLogRanges:
    """A provider that refuses eth_getLogs over more than one block: the scan splits the range."""

    @pytest.fixture
    def front(self, evm_chain: EvmChain) -> Iterator[Any]:
        from evm_peers import RangeLimitedFront

        front = RangeLimitedFront(evm_chain.url, max_range=1)
        yield front
        front.stop()

    @pytest.fixture
    def vpsshop_overrides(self, evm_chain: EvmChain, front: Any) -> dict[str, Any]:
        common = {
            "xpub": random_xpub(),
            "network": "anvil",
            "chain_id": CHAIN_ID,
            "rpc_url": front.url,
            "confirmations": 3,
        }
        return {
            "coins": {"ETH": dict(common), "USDT": {**common, "contract": evm_chain.token.address}},
            "topups": {"poll_min_seconds": 0},
        }

    def test_payments_in_several_blocks_are_all_found(
        self, vpsshop_client: TestClient, evm_chain: EvmChain, front: Any
    ) -> None:
        h = create_test_account(vpsshop_client).headers
        run_pass(vpsshop_client)
        first = new_topup(vpsshop_client, h, "USDT", 25)
        second = new_topup(vpsshop_client, h, "USDT", 30)
        evm_chain.pay_token(first["deposit_address"], 25_000_000)
        evm_chain.anvil.mine(1)
        evm_chain.pay_token(second["deposit_address"], 30_000_000)
        evm_chain.anvil.mine(4)
        run_pass(vpsshop_client)
        assert front.refused > 0
        assert get(vpsshop_client, h, first["ref"])["credited_usd"] == 25
        assert get(vpsshop_client, h, second["ref"])["credited_usd"] == 30
        assert balance(vpsshop_client, h) == 55


def test_health_checks_chain_id_and_token_decimals(vpsshop_client: TestClient, evm_chain: EvmChain) -> None:
    health = {c["id"]: c for c in vpsshop_client.get("/v1/health").json()["components"] if c["kind"] == "coin"}
    assert health["ETH"]["ready"] and health["ETH"]["detail"].startswith("anvil at block ")
    assert health["USDT"]["ready"], health["USDT"]
    ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
    wrong = TetherErc20.from_settings(
        {
            "xpub": random_xpub(),
            "network": "anvil",
            "chain_id": CHAIN_ID,
            "rpc_url": evm_chain.url,
            "contract": evm_chain.token.address,
            "decimals": 18,
        },
        sandbox=False,
        where="coins.USDT",
    )
    readiness = vpsshop_client.portal.call(wrong.check_ready)  # type: ignore[union-attr]
    assert not readiness.ok and "6 decimals" in readiness.detail
    other_chain = Ether.from_settings(
        {"xpub": random_xpub(), "network": "sepolia", "rpc_url": evm_chain.url}, sandbox=False, where="coins.ETH"
    )
    readiness = vpsshop_client.portal.call(other_chain.check_ready)  # type: ignore[union-attr]
    assert not readiness.ok and "chain id 31337" in readiness.detail
    for coin in (wrong, other_chain):
        vpsshop_client.portal.call(coin.close)  # type: ignore[union-attr]
    assert ctx.coins["ETH"].group == ctx.coins["USDT"].group


def test_recheck_keeps_payments_above_a_lagging_node_tip(vpsshop_client: TestClient, evm_chain: EvmChain) -> None:
    """A payment seen by a backend ahead of this one (height above this node's tip) is kept, unconfirmed."""
    from vpsshop.coins import DetectedPayment

    ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
    ahead = evm_chain.anvil.height() + 5
    for code, identity in (("ETH", "0x" + "ab" * 32), ("USDT", "0x" + "ab" * 32 + ":3")):
        payment = DetectedPayment(identity, "0x" + "00" * 20, 1, "0x" + "ab" * 32, 1, ahead, "0x" + "cd" * 32)
        (check,) = vpsshop_client.portal.call(ctx.coins[code].recheck, [payment])  # type: ignore[union-attr]
        assert (check.present, check.confirmations, check.block_height) == (True, 0, ahead)
        gone = DetectedPayment(identity, "0x" + "00" * 20, 1, "0x" + "ab" * 32, 1, 1, "0x" + "cd" * 32)
        (check,) = vpsshop_client.portal.call(ctx.coins[code].recheck, [gone])  # type: ignore[union-attr]
        assert not check.present  # block 1 exists with another hash and the transaction is unknown


def test_node_urls_never_reach_logs_or_the_database() -> None:
    """A provider URL may carry an API key: scan group names (stored, logged) and errors hide it."""
    from vpsshop.errors import PluginError

    coin = Ether.from_settings(
        {"xpub": SANDBOX_XPUB, "rpc_url": "http://127.0.0.1:9/v3/SECRETKEY?key=SECRET2"},
        sandbox=False,
        where="coins.ETH",
    )
    assert "SECRET" not in coin.scan_group and len(coin.scan_group) <= 40
    import asyncio

    with pytest.raises(PluginError) as failure:
        asyncio.run(coin.scan(None, set()))
    assert "SECRET" not in str(failure.value) and "http://127.0.0.1:9" in str(failure.value)
