"""The TRON plugin (TRX and USDTTRC): BIP-44 TRON derivation against the known vector and tronpy, and
top-ups through the real engine against ``tests/tron_api_double.py``.

That server is a TEST DOUBLE of a java-tron full node's HTTP API (no TRON node exists in the registries):
it speaks the documented ``/wallet/getnowblock``, ``/wallet/getblockbynum``,
``/wallet/gettransactioninfobyblocknum`` and ``/wallet/broadcasttransaction`` responses, and every
transaction in it is built and signed here with ``tronpy`` and checked by the double (txID recomputed
from the protobuf raw data, signer recovered from the signature)."""

from __future__ import annotations

import json
import secrets
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from bip32_private import account_node
from coincurve import PrivateKey as CurveKey
from starlette.testclient import TestClient
from topup_helpers import balance, decode_qr, get, payments, run_pass
from tron_api_double import TronApiDouble, TronChainDouble
from tronpy import Tron
from tronpy.contract import Contract
from tronpy.keys import PrivateKey, to_base58check_address, to_hex_address

from vpsshop.errors import ConfigError
from vpsshop.hdkeys import b58check_encode
from vpsshop.testing import create_test_account
from vpsshop_tron import SANDBOX_XPUB, TetherTrc20, Tronix, address_to_hex

TRC20_TRANSFER_ABI = [
    {
        "name": "transfer",
        "type": "function",
        "stateMutability": "nonpayable",
        "inputs": [{"name": "to", "type": "address"}, {"name": "value", "type": "uint256"}],
        "outputs": [{"name": "", "type": "bool"}],
    },
    {
        "name": "batchTransfer",
        "type": "function",
        "stateMutability": "nonpayable",
        "inputs": [{"name": "to", "type": "address[]"}, {"name": "values", "type": "uint256[]"}],
        "outputs": [{"name": "", "type": "bool"}],
    },
]


def test_bip44_tron_vector_and_sandbox_key() -> None:
    """Account 0 of "abandon ... about" on m/44'/195'/0'/0/0 is TUEZSdKsoDHQMeZwihtdoBiN46zxhGWYdH."""
    assert account_node("m/44'/195'/0'").xpub() == SANDBOX_XPUB
    coin = Tronix.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.TRX")
    assert coin.derive_address(0).address == "TUEZSdKsoDHQMeZwihtdoBiN46zxhGWYdH"
    for index in (1, 5):
        key = PrivateKey(account_node(f"m/44'/195'/0'/0/{index}").key)
        derived = coin.derive_address(index)
        assert derived.address == key.public_key.to_base58check_address()
        assert derived.watch_key == key.public_key.to_hex_address()
    token = TetherTrc20.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.USDTTRC")
    assert token.contract == "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t"
    assert (
        token.derive_address(1).address
        == PrivateKey(account_node("m/44'/195'/0'/1/1").key).public_key.to_base58check_address()
    )
    assert (coin.network, coin.confirmations, token.decimals) == ("tron", 20, 6)


def test_payment_uris_and_settings() -> None:
    coin = Tronix.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.TRX")
    token = TetherTrc20.from_settings({"xpub": SANDBOX_XPUB}, sandbox=False, where="coins.USDTTRC")
    addr = coin.derive_address(1).address
    assert coin.payment_uri(addr, 200_000_000, "tp") == f"tron:{addr}?amount=200"
    assert (
        token.payment_uri(addr, 25_500_000, "tp") == f"tron:{addr}?token=TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6t&amount=25.5"
    )
    with pytest.raises(ConfigError, match="set contract"):
        TetherTrc20.from_settings({"xpub": SANDBOX_XPUB, "network": "shasta"}, sandbox=False, where="coins.USDTTRC")
    with pytest.raises(ConfigError, match=r"coins\.USDTTRC"):
        TetherTrc20.from_settings(
            {"xpub": SANDBOX_XPUB, "contract": "TR7NHqjeKQxGTCi8q8ZY4pL8otSzgjLj6T"},
            sandbox=False,
            where="coins.USDTTRC",
        )


class TestSandbox:
    @pytest.fixture
    def vpsshop_overrides(self) -> dict[str, Any]:
        return {}

    def test_sandbox_hands_out_nile_addresses_without_a_node(self, vpsshop_client: TestClient) -> None:
        account = create_test_account(vpsshop_client)
        for code in ("TRX", "USDTTRC"):
            response = vpsshop_client.post("/v1/topups", json={"amount": 50, "coin": code}, headers=account.headers)
            assert response.status_code == 201, response.text
            body = response.json()
            assert body["deposit_network"] == "nile"
            assert body["deposit_address"].startswith("T")
            assert address_to_hex(body["deposit_address"]).startswith("41")
            expected = {
                "TRX": f"tron:{body['deposit_address']}?amount=200",
                "USDTTRC": f"tron:{body['deposit_address']}?token=TXYZopYRdj2D9XRtbG411XZZ3kM5VkAeBf&amount=50",
            }
            assert decode_qr(body["qr_data_uri"]) == expected[code]
        ctx = vpsshop_client.app.state.ctx  # type: ignore[attr-defined]
        assert not ctx.coins["TRX"].can_scan and not ctx.coins["USDTTRC"].can_scan


# ---- top-ups against the java-tron HTTP API double --------------------------------------------------

USDT_HEX = "41" + secrets.token_hex(20)
OTHER_TOKEN_HEX = "41" + secrets.token_hex(20)


@pytest.fixture(scope="session")
def tron_node() -> Iterator[TronApiDouble]:
    server = TronApiDouble(TronChainDouble([USDT_HEX, OTHER_TOKEN_HEX]))
    try:
        yield server
    finally:
        server.stop()


def random_xpub() -> str:
    key = CurveKey().public_key.format(compressed=True)
    raw = (
        bytes.fromhex("0488b21e")
        + bytes([3])
        + b"\0" * 4
        + (0x80000000).to_bytes(4, "big")
        + secrets.token_bytes(32)
        + key
    )
    return b58check_encode(raw)


@pytest.fixture
def vpsshop_overrides(tron_node: TronApiDouble) -> dict[str, Any]:
    common = {"xpub": random_xpub(), "network": "tron-double", "api_url": tron_node.url, "confirmations": 3}
    return {
        "coins": {"TRX": dict(common), "USDTTRC": {**common, "contract": to_base58check_address(USDT_HEX)}},
        "topups": {"poll_min_seconds": 0, "expiry_minutes": 60},
    }


class Payer:
    """A TRON account whose transactions are built offline and signed by tronpy, then broadcast."""

    def __init__(self, node: TronApiDouble, trx_sun: int = 10**12, usdt: int = 10**12) -> None:
        self.node = node
        self.key = PrivateKey(secrets.token_bytes(32))
        self.address = self.key.public_key.to_base58check_address()
        self.client = Tron(network="nile")  # only builds offline: never reaches the network
        node.chain.fund(to_hex_address(self.address), trx_sun)
        node.chain.mint(USDT_HEX, to_hex_address(self.address), usdt)

    def _send(self, builder: Any) -> str:
        ref = self.node.chain.blocks[-1]["blockID"]
        tx = builder.build(offline=True, ref_block_id=ref).sign(self.key)
        answer = post(self.node.url, "/wallet/broadcasttransaction", tx.to_json())
        assert answer.get("result") is True, answer
        return str(answer["txid"])

    def pay_trx(self, to: str, sun: int) -> str:
        return self._send(self.client.trx.transfer(self.address, to, sun))

    def pay_token(self, to: str, units: int, contract_hex: str = USDT_HEX) -> str:
        contract = Contract(to_base58check_address(contract_hex), abi=TRC20_TRANSFER_ABI, client=self.client)
        return self._send(contract.functions.transfer.with_owner(self.address)(to, units).fee_limit(30_000_000))

    def pay_token_batch(self, payments: list[tuple[str, int]]) -> str:
        contract = Contract(to_base58check_address(USDT_HEX), abi=TRC20_TRANSFER_ABI, client=self.client)
        method = contract.functions.batchTransfer.with_owner(self.address)
        return self._send(method([to for to, _ in payments], [n for _, n in payments]).fee_limit(60_000_000))


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def new_topup(client: TestClient, headers: dict[str, str], coin: str, amount: int = 50) -> dict[str, Any]:
    response = client.post("/v1/topups", json={"amount": amount, "coin": coin}, headers=headers)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["deposit_network"] == "tron-double"
    return body


def test_double_refuses_a_transaction_signed_by_another_key(tron_node: TronApiDouble) -> None:
    payer = Payer(tron_node)
    ref = tron_node.chain.blocks[-1]["blockID"]
    tx = payer.client.trx.transfer(payer.address, payer.address, 5).build(offline=True, ref_block_id=ref)
    tx.sign(PrivateKey(secrets.token_bytes(32)))
    answer = post(tron_node.url, "/wallet/broadcasttransaction", tx.to_json())
    assert answer["code"] == "SIGERROR"


def test_trx_paid_mined_confirmed_credited_once(vpsshop_client: TestClient, tron_node: TronApiDouble) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h, "TRX")
    assert topup["deposit_amount"] == "200.000000"  # 50 USD at 0.25 USD/TRX
    txid = Payer(tron_node).pay_trx(topup["deposit_address"], 200_000_000)
    tron_node.chain.mine(1)
    one = get(vpsshop_client, h, topup["ref"])
    assert (one["payment_status"], one["confirmations"], one["amount_received"]) == ("seen", 1, "200.000000")
    tron_node.chain.mine(2)
    done = get(vpsshop_client, h, topup["ref"])
    assert (done["status"], done["credited_usd"]) == ("completed", 50)
    tron_node.chain.mine(3)
    run_pass(vpsshop_client)
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 50
    assert payments(vpsshop_client) == [("TRX", txid, "credited")]


def test_usdt_trc20_paid_credited_once_and_other_tokens_and_reverts_ignored(
    vpsshop_client: TestClient, tron_node: TronApiDouble
) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    topup = new_topup(vpsshop_client, h, "USDTTRC", 25)
    payer = Payer(tron_node)
    tron_node.chain.mint(OTHER_TOKEN_HEX, to_hex_address(payer.address), 10**9)
    txid = payer.pay_token(topup["deposit_address"], 25_000_000)
    payer.pay_token(topup["deposit_address"], 25_000_000, OTHER_TOKEN_HEX)  # another token: not USDT
    broke = Payer(tron_node, usdt=0)
    broke.pay_token(topup["deposit_address"], 25_000_000)  # reverts: no balance
    tron_node.chain.mine(3)
    block = tron_node.chain.blocks[-3]
    assert [t["ret"][0]["contractRet"] for t in block["transactions"]] == ["SUCCESS", "SUCCESS", "REVERT"]
    done = get(vpsshop_client, h, topup["ref"])
    assert (done["status"], done["credited_usd"], done["amount_received"]) == ("completed", 25, "25.000000")
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 25
    assert payments(vpsshop_client) == [("USDTTRC", f"{txid}:0", "credited")]


def test_reorg_before_confirmations_credits_nothing(vpsshop_client: TestClient, tron_node: TronApiDouble) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    trx = new_topup(vpsshop_client, h, "TRX")
    usdt = new_topup(vpsshop_client, h, "USDTTRC")
    payer = Payer(tron_node)
    payer.pay_trx(trx["deposit_address"], 200_000_000)
    payer.pay_token(usdt["deposit_address"], 50_000_000)
    tron_node.chain.mine(2)
    assert get(vpsshop_client, h, trx["ref"])["confirmations"] == 2
    tron_node.chain.reorg(depth=2, new_blocks=4)
    run_pass(vpsshop_client)
    for ref in (trx["ref"], usdt["ref"]):
        after = get(vpsshop_client, h, ref)
        assert (after["status"], after["payment_status"], after["credited_usd"]) == ("pending", "awaiting_payment", 0)
    assert balance(vpsshop_client, h) == 0


def test_reorg_that_mines_the_payments_again_credits_them_once(
    vpsshop_client: TestClient, tron_node: TronApiDouble
) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    trx = new_topup(vpsshop_client, h, "TRX")
    usdt = new_topup(vpsshop_client, h, "USDTTRC")
    payer = Payer(tron_node)
    payer.pay_trx(trx["deposit_address"], 200_000_000)
    payer.pay_token(usdt["deposit_address"], 50_000_000)
    tron_node.chain.mine(2)
    assert get(vpsshop_client, h, usdt["ref"])["confirmations"] == 2
    tron_node.chain.reorg(depth=2, new_blocks=3, keep_transactions=True)
    run_pass(vpsshop_client)
    assert get(vpsshop_client, h, trx["ref"])["credited_usd"] == 50
    assert get(vpsshop_client, h, usdt["ref"])["credited_usd"] == 50
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 100


def test_health_reports_the_node(vpsshop_client: TestClient, tron_node: TronApiDouble) -> None:
    health = {c["id"]: c for c in vpsshop_client.get("/v1/health").json()["components"] if c["kind"] == "coin"}
    assert health["TRX"]["ready"] and health["TRX"]["detail"] == f"tron-double at block {tron_node.chain.height}"
    assert health["USDTTRC"]["ready"]


def test_two_transfers_in_one_transaction_credit_both(vpsshop_client: TestClient, tron_node: TronApiDouble) -> None:
    h = create_test_account(vpsshop_client).headers
    run_pass(vpsshop_client)
    first = new_topup(vpsshop_client, h, "USDTTRC", 30)
    second = new_topup(vpsshop_client, h, "USDTTRC", 40)
    txid = Payer(tron_node).pay_token_batch(
        [(first["deposit_address"], 30_000_000), (second["deposit_address"], 40_000_000)]
    )
    tron_node.chain.mine(3)
    run_pass(vpsshop_client)
    assert get(vpsshop_client, h, first["ref"])["credited_usd"] == 30
    assert get(vpsshop_client, h, second["ref"])["credited_usd"] == 40
    assert sorted(p[1] for p in payments(vpsshop_client)) == [f"{txid}:0", f"{txid}:1"]
    run_pass(vpsshop_client)
    assert balance(vpsshop_client, h) == 70


def test_recheck_keeps_payments_above_a_lagging_node_tip(vpsshop_client: TestClient, tron_node: TronApiDouble) -> None:
    from vpsshop.coins import DetectedPayment

    coin = vpsshop_client.app.state.ctx.coins["USDTTRC"]  # type: ignore[attr-defined]
    ahead = tron_node.chain.height + 5
    payment = DetectedPayment("ab" * 32 + ":0", "41" + "00" * 20, 1, "ab" * 32, 1, ahead, "cd" * 32)
    gone = DetectedPayment("ab" * 32 + ":1", "41" + "00" * 20, 1, "ab" * 32, 1, 0, "cd" * 32)
    checks = vpsshop_client.portal.call(coin.recheck, [payment, gone])  # type: ignore[union-attr]
    assert [(c.present, c.confirmations) for c in checks] == [(True, 0), (False, 0)]


def test_scan_tags_each_payment_with_the_coin_that_arrived(
    vpsshop_client: TestClient, tron_node: TronApiDouble
) -> None:
    """TRX sent to a USDTTRC top-up's address is reported as TRX, USDT sent to a TRX one as USDTTRC."""
    h = create_test_account(vpsshop_client).headers
    trx = new_topup(vpsshop_client, h, "TRX")
    usdt = new_topup(vpsshop_client, h, "USDTTRC")
    start = tron_node.chain.blocks[-1]
    payer = Payer(tron_node)
    to_usdt_address = payer.pay_trx(usdt["deposit_address"], 1_000_000)
    to_trx_address = payer.pay_token(trx["deposit_address"], 7_000_000)
    tron_node.chain.mine(1)
    coin = vpsshop_client.app.state.ctx.coins["TRX"]  # type: ignore[attr-defined]
    watched = {address_to_hex(trx["deposit_address"]), address_to_hex(usdt["deposit_address"])}
    cursor = f"{start['block_header']['raw_data']['number']}:{start['blockID']}"
    result = vpsshop_client.portal.call(coin.scan, cursor, watched)  # type: ignore[union-attr]
    found = sorted((code, p.txid, p.amount_atomic) for code, p in result.payments)
    assert found == sorted([("TRX", to_usdt_address, 1_000_000), ("USDTTRC", to_trx_address, 7_000_000)])
