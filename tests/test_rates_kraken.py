"""The ``kraken`` rate source against a local HTTP test double.

``KrakenTickerDouble`` is a test double, not Kraken: a loopback HTTP server answering
``GET /0/public/Ticker?pair=<PAIR>`` in the documented format of Kraken's public ticker
(``{"error": [], "result": {"<Kraken's own pair name>": {"a": [...], "b": [...], "c": ["<last>",
"<lot volume>"], ...}}}``, keyed by Kraken's name such as ``XXBTZUSD`` for ``XBTUSD``) and
``{"error": ["EQuery:Unknown asset pair"]}`` for pairs it does not list.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from starlette.testclient import TestClient

from vpsshop.testing import create_test_account

# Kraken's own names for the pairs asked (what its API returns as result keys).
KRAKEN_NAMES = {"XBTUSD": "XXBTZUSD", "LTCUSD": "XLTCZUSD", "XMRUSD": "XXMRZUSD", "TRXUSD": "TRXUSD"}


class KrakenTickerDouble:
    def __init__(self) -> None:
        self.last = {"XBTUSD": "64000.10000", "LTCUSD": "80.00", "XMRUSD": "160.00", "TRXUSD": "0.2500"}
        self.requests: list[str] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                pair = parse_qs(url.query).get("pair", [""])[0]
                double.requests.append(pair)
                if url.path != "/0/public/Ticker" or pair not in double.last:
                    return self._send({"error": ["EQuery:Unknown asset pair"]})
                price = double.last[pair]
                ticker = {
                    "a": [price, "1", "1.000"],
                    "b": [price, "2", "2.000"],
                    "c": [price, "0.01"],
                    "v": ["10", "20"],
                    "p": [price, price],
                    "t": [5, 9],
                    "l": [price, price],
                    "h": [price, price],
                    "o": price,
                }
                return self._send({"error": [], "result": {KRAKEN_NAMES[pair]: ticker}})

            def _send(self, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def kraken() -> Iterator[KrakenTickerDouble]:
    double = KrakenTickerDouble()
    try:
        yield double
    finally:
        double.stop()


@pytest.fixture
def vpsshop_overrides(kraken: KrakenTickerDouble) -> dict[str, Any]:
    return {"rates": {"source": "kraken", "kraken": {"base_url": kraken.url}}}


def test_source_reads_kraken_pair_names(kraken: KrakenTickerDouble) -> None:
    from vpsshop_rates.kraken import KrakenTicker

    source = KrakenTicker.from_settings({"base_url": kraken.url}, sandbox=False, where="rates.kraken")

    async def run() -> dict[str, Decimal]:
        try:
            return await source.fetch(["BTC", "XMR", "TRX", "NOPE"])
        finally:
            await source.close()

    assert asyncio.run(run()) == {"BTC": Decimal("64000.10000"), "XMR": Decimal("160.00"), "TRX": Decimal("0.2500")}
    assert "XBTUSD" in kraken.requests and "NOPEUSD" in kraken.requests


def test_topup_priced_by_kraken(vpsshop_client: TestClient, kraken: KrakenTickerDouble) -> None:
    account = create_test_account(vpsshop_client)
    response = vpsshop_client.post("/v1/topups", json={"amount": 40, "coin": "XMR"}, headers=account.headers)
    assert response.status_code == 201, response.text
    assert response.json()["deposit_amount"] == "0.250000000000"
    health = vpsshop_client.get("/v1/health").json()
    assert "BTC/USD ticker answered" in str(health)
