"""USDCSOL: USDC on Solana through x402's ``exact`` SVM scheme, paid by the official PyPI x402 client.

The chain is LiteSVM behind ``tests/solana_rpc_double.py`` (a TEST DOUBLE of the Solana JSON-RPC
endpoint; its transactions are real, executed by LiteSVM with the SPL Token program). The test USDC is
an SPL mint made in it; the payer's and the shop's token accounts are set in it. The payer's transaction
is built and signed by ``x402.mechanisms.svm.exact.ExactSvmClientScheme`` with a real keypair; the coin
verifies it with the package's facilitator scheme, co-signs as fee payer and sends it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import sys
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import serve, shop_env
from solana_rpc_double import SolanaChainDouble, SolanaRpcDouble
from solders.account import Account
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from x402 import x402Client
from x402.http.utils import decode_payment_required_header
from x402.mechanisms.svm.constants import TOKEN_PROGRAM_ADDRESS
from x402.mechanisms.svm.exact import ExactSvmClientScheme
from x402.mechanisms.svm.signers import KeypairSigner
from x402.mechanisms.svm.utils import derive_ata
from x402.schemas import PaymentRequired

from vpsshop import X402Rejected
from vpsshop_usdcsol import CAIP2 as NETWORKS
from vpsshop_usdcsol import USDCSOL

CAIP2 = NETWORKS["solana"]

FEE_PAYER_ENV = "TEST_X402_SVM_FEE_PAYER"
TOKEN = Pubkey.from_string(TOKEN_PROGRAM_ADDRESS)
UNIT = 10**6


class Ledger:
    """LiteSVM behind the RPC double, a test USDC mint, and a block produced within 0.2 s of each sent
    transaction (only then: LiteSVM takes only its latest blockhash, and a block rolls it)."""

    def __init__(self) -> None:
        self.chain = SolanaChainDouble()
        self.rpc = SolanaRpcDouble(self.chain)
        self.mint = self.new_mint()
        self._stop = threading.Event()
        self._blocks = threading.Thread(target=self._produce, daemon=True)
        self._blocks.start()

    def _produce(self) -> None:
        while not self._stop.wait(0.2):
            with self.chain.lock:
                if self.chain.pending:
                    self.chain.produce_block()

    def stop(self) -> None:
        self._stop.set()
        self._blocks.join()
        self.rpc.stop()

    def new_mint(self, decimals: int = 6) -> str:
        mint = Keypair().pubkey()
        data = struct.pack("<I32sQBBI32s", 0, bytes(32), 10**15, decimals, 1, 0, bytes(32))
        self._set(mint, data)
        return str(mint)

    def fund(self, owner: str, amount: int, mint: str | None = None) -> str:
        """A token account of ``owner`` for ``mint`` (its associated address) holding ``amount``."""
        mint = mint or self.mint
        ata = derive_ata(owner, mint, TOKEN_PROGRAM_ADDRESS)
        data = struct.pack(
            "<32s32sQI32sBIQQI32s",
            bytes(Pubkey.from_string(mint)),
            bytes(Pubkey.from_string(owner)),
            amount,
            0,
            bytes(32),
            1,
            0,
            0,
            0,
            0,
            bytes(32),
        )
        self._set(Pubkey.from_string(ata), data)
        return ata

    def token_balance(self, ata: str) -> int:
        account = self.chain.svm.get_account(Pubkey.from_string(ata))
        return 0 if account is None else int.from_bytes(bytes(account.data)[64:72], "little")

    def _set(self, address: Pubkey, data: bytes) -> None:
        with self.chain.lock:
            lamports = self.chain.svm.minimum_balance_for_rent_exemption(len(data))
            self.chain.svm.set_account(address, Account(lamports, data, TOKEN))


@pytest.fixture(scope="module")
def ledger() -> Iterator[Ledger]:
    started = Ledger()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def fee_payer(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> Keypair:
    keypair = Keypair()
    ledger.chain.airdrop(str(keypair.pubkey()), 10**9)
    monkeypatch.setenv(FEE_PAYER_ENV, str(keypair))
    return keypair


def usdcsol_section(ledger: Ledger, pay_to: str) -> dict[str, Any]:
    return {
        "network": "solana",
        "pay_to": pay_to,
        "mint": ledger.mint,
        "rpc_url": ledger.rpc.url,
        "fee_payer_key_env": FEE_PAYER_ENV,
    }


def documented_client() -> dict[str, Any]:
    """The functions of docs/x402.md's USDCSOL client block, as a reader would paste them."""
    text = (Path(__file__).parent.parent / "docs" / "x402.md").read_text()
    block = text.split("<!-- usdcsol-client:", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    names: dict[str, Any] = {}
    exec(compile(block, "docs/x402.md", "exec"), names)
    return names


def official_client(payer: Keypair, ledger: Ledger, spend: dict[str, Any]) -> x402Client:
    client = x402Client()
    client.set_spend_controls(spend)
    client.register("solana:*", ExactSvmClientScheme(KeypairSigner(payer), rpc_url=ledger.rpc.url))
    return client


def pay_header(coin: USDCSOL, ledger: Ledger, payer: Keypair, amount: int, asset: str | None = None) -> str:
    """The PAYMENT-SIGNATURE header the official client makes for the coin's own 402 entry."""
    accepts = coin.payment_requirements(amount, "http://shop/v1/topups", "top-up")
    v2 = coin.payment_requirements_v2(accepts)
    if asset is not None:
        v2["asset"] = asset
    required = PaymentRequired.model_validate(
        {"x402Version": 2, "resource": {"url": "http://shop/v1/topups"}, "accepts": [v2]}
    )
    spend = {
        "allowed_assets": [{"network": v2["network"], "asset": v2["asset"], "max_amount_per_payment": str(amount)}]
    }
    payload = asyncio.run(official_client(payer, ledger, spend).create_payment_payload(required))
    return base64.b64encode(json.dumps(payload.model_dump(by_alias=True, exclude_none=True)).encode()).decode()


def test_a_solana_payer_pays_and_the_same_transaction_settles_once(ledger: Ledger, fee_payer: Keypair) -> None:
    shop, payer = Keypair(), Keypair()
    shop_ata = ledger.fund(str(shop.pubkey()), 0)
    payer_ata = ledger.fund(str(payer.pubkey()), 50 * UNIT)
    coin = USDCSOL.from_settings(usdcsol_section(ledger, str(shop.pubkey())), sandbox=False, where="coins.USDCSOL")
    header = pay_header(coin, ledger, payer, 5 * UNIT)
    payment = coin.decode_payment(header, 2)
    assert payment.payer == str(payer.pubkey())
    assert payment.value_atomic == 5 * UNIT
    reqs = coin.payment_requirements(5 * UNIT, "http://shop/v1/topups", "top-up")
    settled = asyncio.run(coin.settle(payment, reqs))
    assert ledger.token_balance(shop_ata) == 5 * UNIT
    assert ledger.token_balance(payer_ata) == 45 * UNIT
    assert settled.transaction in ledger.chain.tx_slot
    found = asyncio.run(coin.settlement_status(payment))
    assert found is not None and found.transaction == settled.transaction
    with pytest.raises(X402Rejected) as replay:
        asyncio.run(coin.settle(coin.decode_payment(header, 2), reqs))
    assert replay.value.code in ("nonce_used", "settlement_rejected"), replay.value.message
    assert ledger.token_balance(shop_ata) == 5 * UNIT


def test_wrong_mint_and_short_amount_are_refused(ledger: Ledger, fee_payer: Keypair) -> None:
    shop, payer = Keypair(), Keypair()
    shop_ata = ledger.fund(str(shop.pubkey()), 0)
    other = ledger.new_mint()
    ledger.fund(str(payer.pubkey()), 50 * UNIT)
    ledger.fund(str(payer.pubkey()), 50 * UNIT, other)
    ledger.fund(str(shop.pubkey()), 0, other)
    coin = USDCSOL.from_settings(usdcsol_section(ledger, str(shop.pubkey())), sandbox=False, where="coins.USDCSOL")
    reqs = coin.payment_requirements(5 * UNIT, "http://shop/v1/topups", "top-up")
    wrong_mint = coin.decode_payment(pay_header(coin, ledger, payer, 5 * UNIT, asset=other), 2)
    with pytest.raises(X402Rejected) as refused:
        asyncio.run(coin.settle(wrong_mint, reqs))
    assert refused.value.code == "wrong_asset", refused.value.message
    short = coin.decode_payment(pay_header(coin, ledger, payer, 4 * UNIT), 2)
    with pytest.raises(X402Rejected) as refused:
        asyncio.run(coin.settle(short, reqs))
    assert refused.value.code == "wrong_amount", refused.value.message
    assert ledger.token_balance(shop_ata) == 0


def test_expired_blockhash_is_refused(ledger: Ledger, fee_payer: Keypair) -> None:
    """A transaction whose blockhash the chain no longer knows fails its simulation: refused, nothing sent."""
    shop, payer = Keypair(), Keypair()
    shop_ata = ledger.fund(str(shop.pubkey()), 0)
    ledger.fund(str(payer.pubkey()), 50 * UNIT)
    coin = USDCSOL.from_settings(usdcsol_section(ledger, str(shop.pubkey())), sandbox=False, where="coins.USDCSOL")
    stale = coin.decode_payment(pay_header(coin, ledger, payer, 5 * UNIT), 2)
    ledger.chain.produce_block()  # a new block, a new blockhash: LiteSVM no longer takes the payer's
    reqs = coin.payment_requirements(5 * UNIT, "http://shop/v1/topups", "top-up")
    with pytest.raises(X402Rejected) as refused:
        asyncio.run(coin.settle(stale, reqs))
    assert refused.value.code == "settlement_rejected", refused.value.message
    assert "blockhash" in refused.value.message.lower(), refused.value.message
    assert ledger.token_balance(shop_ata) == 0


def test_a_solana_payer_tops_up_through_vpsshop_serve(
    ledger: Ledger, fee_payer: Keypair, tmp_path: Path, vpsshop_database_url: str
) -> None:
    """``vpsshop serve`` with ``[coins.USDCSOL]``: docs/x402.md's client (the PyPI x402HttpxClient over
    ExactSvmClientScheme, a Solana keypair) pays the 402 of an account's top-up."""
    shop, payer = Keypair(), Keypair()
    shop_ata = ledger.fund(str(shop.pubkey()), 0)
    ledger.fund(str(payer.pubkey()), 50 * UNIT)
    section = usdcsol_section(ledger, str(shop.pubkey()))
    config = tmp_path / "vpsshop.toml"
    config.write_text("[coins.USDCSOL]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in section.items()))
    env = shop_env(vpsshop_database_url, **{FEE_PAYER_ENV: str(fee_payer)})
    with serve(tmp_path, env, "--config", str(config)) as served:
        account = httpx.post(f"{served.base}/account", timeout=30).json()
        key = {"Authorization": f"Bearer {account['api_key']}"}
        asked = httpx.post(f"{served.base}/topups", json={"amount": 25, "coin": "USDCSOL"}, headers=key, timeout=30)
        assert asked.status_code == 402, asked.text
        entry = asked.json()["accepts"][0]
        assert (entry["network"], entry["asset"], entry["payTo"]) == ("solana", ledger.mint, str(shop.pubkey()))
        assert entry["extra"]["feePayer"] == str(fee_payer.pubkey())
        documented = documented_client()
        client = documented["solana_client"](payer, ledger.rpc.url, ledger.mint, entry["maxAmountRequired"])
        paid = asyncio.run(documented["top_up"](served.base, account["api_key"], 25, client))
        assert paid["status"] == "completed", paid
        assert ledger.token_balance(shop_ata) == int(entry["maxAmountRequired"])
        balance = httpx.get(f"{served.base}/account", headers=key, timeout=30).json()
        assert float(balance["balance_usd"]) == 25.0, balance


def test_a_solana_payer_orders_a_server_from_a_402_listing_both_coins(
    ledger: Ledger, fee_payer: Keypair, tmp_path: Path, vpsshop_database_url: str
) -> None:
    """A shop with USDCBASE and USDCSOL: an order without an API key answers one 402 listing both coins
    (v1 body and v2 header); docs/x402.md's Solana client picks the Solana entry, pays the whole price,
    and gets the server and its wallet's account, whose key then shows the server."""
    shop, payer = Keypair(), Keypair()
    shop_ata = ledger.fund(str(shop.pubkey()), 0)
    payer_ata = ledger.fund(str(payer.pubkey()), 200 * UNIT)
    base = {
        "network": "base",
        "mode": "facilitator",
        "facilitator_url": "http://127.0.0.1:9/",
        "pay_to": "0x" + "ab" * 20,
    }
    sections = {"USDCBASE": base, "USDCSOL": usdcsol_section(ledger, str(shop.pubkey()))}
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        "".join(
            f"[coins.{code}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in section.items())
            for code, section in sections.items()
        )
    )
    env = shop_env(vpsshop_database_url, **{FEE_PAYER_ENV: str(fee_payer)})
    with serve(tmp_path, env, "--config", str(config)) as served:
        catalog = httpx.get(f"{served.base}/catalog", timeout=30).json()
        order = {
            "plan": catalog["plans"][0]["id"],
            "location": catalog["locations"][0]["id"],
            "os": catalog["operating_systems"][0]["id"],
        }
        price = next(
            Decimal(str(row["monthly_usd"]))
            for row in catalog["pricing"]
            if (row["plan"], row["location"]) == (order["plan"], order["location"])
        )
        asked = httpx.post(f"{served.base}/servers", json=order, timeout=30)
        assert asked.status_code == 402, asked.text
        body = asked.json()
        assert body["error"] == "payment_required"
        assert sorted((e["network"], e["maxAmountRequired"]) for e in body["accepts"]) == [
            ("base", str(int(price * UNIT))),
            ("solana", str(int(price * UNIT))),
        ]
        required = decode_payment_required_header(asked.headers["PAYMENT-REQUIRED"])
        assert sorted(a.network for a in required.accepts) == sorted(["eip155:8453", CAIP2])
        entry = next(e for e in body["accepts"] if e["network"] == "solana")
        documented = documented_client()
        client = documented["solana_client"](payer, ledger.rpc.url, ledger.mint, entry["maxAmountRequired"])
        answer = asyncio.run(documented["order_without_an_account"](served.base, order, client))
        account = answer["account"]
        assert account["created"] is True and account["address"] == str(payer.pubkey())  # base58, as written
        assert ledger.token_balance(shop_ata) == int(price * UNIT)
        assert ledger.token_balance(payer_ata) == 200 * UNIT - int(price * UNIT)
        key = {"Authorization": f"Bearer {account['api_key']}"}
        listed = httpx.get(f"{served.base}/servers", headers=key, timeout=30).json()["servers"]
        assert [s["id"] for s in listed] == [answer["server"]["id"]]
        # the same wallet orders again without a key: its own account, no new key, paid once more
        again = asyncio.run(documented["order_without_an_account"](served.base, order, client))
        assert again["account"]["user_id"] == account["user_id"] and again["account"]["api_key"] is None
        assert ledger.token_balance(shop_ata) == 2 * int(price * UNIT)
        balance = httpx.get(f"{served.base}/account", headers=key, timeout=30).json()
        assert Decimal(str(balance["balance_usd"])) == 0, balance


def test_without_the_solana_libraries_the_coin_names_the_install(
    ledger: Ledger, fee_payer: Keypair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain `pip install vpsshop` has no solana-py: configuring USDCSOL then stops with the remedy,
    not with an ImportError halfway through a payment."""
    from vpsshop import ConfigError

    section = usdcsol_section(ledger, str(Keypair().pubkey()))
    monkeypatch.setitem(sys.modules, "solana.rpc.api", None)  # what Python does for a module not installed
    with pytest.raises(ConfigError, match=r"pip install 'vpsshop\[solana\]'"):
        USDCSOL.from_settings(section, sandbox=False, where="coins.USDCSOL")
