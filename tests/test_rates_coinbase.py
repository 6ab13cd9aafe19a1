"""The ``coinbase`` rate source and the engine's rate cache, against a local HTTP test double.

``CoinbasePriceDouble`` is a test double, not Coinbase: a loopback HTTP server that answers
``GET /v2/prices/<BASE>-USD/spot`` in the documented response format of Coinbase's price API
(``{"data": {"amount": "<decimal string>", "base": "<BASE>", "currency": "USD"}}``), 404 for an
unknown pair, and can be switched to fail with HTTP 503.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from starlette.testclient import TestClient

from vpsshop.testing import create_test_account


class CoinbasePriceDouble:
    def __init__(self) -> None:
        self.prices = {"BTC": "50000.00", "LTC": "100.5", "XMR": "125"}
        self.failing = False
        self.requests: list[str] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                double.requests.append(self.path)
                parts = self.path.strip("/").split("/")
                if double.failing:
                    return self._send(503, {"errors": [{"id": "service_unavailable", "message": "down"}]})
                if len(parts) == 4 and parts[:2] == ["v2", "prices"] and parts[3] == "spot":
                    base, _, quote = parts[2].partition("-")
                    if quote == "USD" and base in double.prices:
                        return self._send(
                            200, {"data": {"amount": double.prices[base], "base": base, "currency": "USD"}}
                        )
                return self._send(404, {"errors": [{"id": "not_found", "message": "Invalid currency"}]})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def coinbase() -> Iterator[CoinbasePriceDouble]:
    double = CoinbasePriceDouble()
    try:
        yield double
    finally:
        double.stop()


@pytest.fixture
def vpsshop_overrides(coinbase: CoinbasePriceDouble) -> dict[str, Any]:
    return {
        "rates": {
            "source": "coinbase",
            "refresh_seconds": 60,
            "max_age_seconds": 300,
            "coinbase": {"base_url": coinbase.url},
        }
    }


def test_source_reads_the_documented_format(coinbase: CoinbasePriceDouble) -> None:
    import asyncio

    from vpsshop_rates.coinbase import CoinbaseSpot

    source = CoinbaseSpot.from_settings({"base_url": coinbase.url}, sandbox=False, where="rates.coinbase")

    async def run() -> dict[str, Decimal]:
        try:
            return await source.fetch(["BTC", "LTC", "DOGE"])
        finally:
            await source.close()

    assert asyncio.run(run()) == {"BTC": Decimal("50000.00"), "LTC": Decimal("100.5")}
    assert "/v2/prices/BTC-USD/spot" in coinbase.requests


def test_topups_use_cached_rates_and_refuse_stale_ones(
    vpsshop_client: TestClient, coinbase: CoinbasePriceDouble, vpsshop_clock: Any
) -> None:
    account = create_test_account(vpsshop_client)

    def btc_topup() -> Any:
        return vpsshop_client.post("/v1/topups", json={"amount": 50, "coin": "BTC"}, headers=account.headers)

    first = btc_topup()
    assert first.status_code == 201 and first.json()["deposit_amount"] == "0.00100000"
    coinbase.prices["BTC"] = "100000"
    vpsshop_clock.advance(seconds=30)
    assert btc_topup().json()["deposit_amount"] == "0.00100000"  # cached
    vpsshop_clock.advance(seconds=31)
    assert btc_topup().json()["deposit_amount"] == "0.00050000"  # refreshed
    coinbase.failing = True
    vpsshop_clock.advance(seconds=200)
    assert btc_topup().json()["deposit_amount"] == "0.00050000"  # source down, price 200 s old
    vpsshop_clock.advance(seconds=101)  # 301 s: past max_age_seconds
    stale = btc_topup()
    assert stale.status_code == 503 and stale.json()["error"] == "rate_unavailable"
    assert "old" in stale.json()["message"]
    # A pending top-up keeps its locked amount whatever the source does.
    ref = first.json()["ref"]
    assert vpsshop_client.get(f"/v1/topups/{ref}", headers=account.headers).json()["deposit_amount"] == "0.00100000"
    coinbase.failing = False
    assert btc_topup().status_code == 201


def test_unpriced_coin_is_refused(vpsshop_client: TestClient, coinbase: CoinbasePriceDouble) -> None:
    account = create_test_account(vpsshop_client)
    del coinbase.prices["XMR"]
    response = vpsshop_client.post("/v1/topups", json={"amount": 50, "coin": "XMR"}, headers=account.headers)
    assert response.status_code == 503 and response.json()["error"] == "rate_unavailable"
