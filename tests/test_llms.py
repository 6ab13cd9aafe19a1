"""``GET /llms.txt``: generated from the catalog, the coins and the OpenAPI description."""

from __future__ import annotations

from typing import Any

import pytest


def test_llms_txt_describes_the_shop_from_catalog_and_openapi(vpsshop_client: Any) -> None:
    answer = vpsshop_client.get("/llms.txt")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/markdown")
    text = answer.text
    assert text.startswith("# vpsshop\n\n> ")
    catalog = vpsshop_client.get("/v1/catalog").json()
    for plan in catalog["plans"]:
        assert f"`{plan['id']}` {plan['name']}" in text and f"{plan['base_price_usd']:.2f} USD/month" in text
    for location in catalog["locations"]:
        assert f"`{location['id']}`" in text
    for system in catalog["operating_systems"]:
        assert f"`{system['id']}`" in text
    cheapest = min(catalog["pricing"], key=lambda row: row["monthly_usd"])
    assert f"`{cheapest['plan']}` in `{cheapest['location']}` at {cheapest['monthly_usd']:.2f} USD/month" in text
    openapi = vpsshop_client.get("/v1/openapi.json").json()
    for path, operations in openapi["paths"].items():
        for method, operation in operations.items():
            assert f"`{method.upper()} /v1{path}`: {operation['summary']}" in text, (method, path)
    # the sandbox offers USDCBASE: the x402 way of ordering is described
    assert "PAYMENT-SIGNATURE" in text and "insufficient_balance" in text and "USDCBASE" in text
    assert vpsshop_client.head("/llms.txt").status_code == 200


@pytest.mark.parametrize("vpsshop_overrides", [{"coins": {"USDCBASE": {"enabled": False}}}])
def test_llms_txt_without_x402(vpsshop_client: Any) -> None:
    text = vpsshop_client.get("/llms.txt").text
    assert "x402" not in text and "USDCBASE" not in text and "BTC" in text


DEPOSIT_COINS = ("BTC", "XMR", "ETH", "USDTTRC", "LTC", "TRX", "SOL", "USDT")


@pytest.mark.parametrize("vpsshop_overrides", [{"coins": {code: {"enabled": False} for code in DEPOSIT_COINS}}])
def test_llms_txt_of_a_usdcbase_only_shop_names_only_usdcbase(vpsshop_client: Any) -> None:
    offered = {o["coin"] for o in vpsshop_client.get("/v1/catalog").json()["payment_options"]}
    assert offered == {"USDCBASE"}
    text = vpsshop_client.get("/llms.txt").text
    assert '`POST /v1/topups {"amount": 25, "coin": "USDCBASE"}`' in text and "2. Pay with x402 (USDCBASE" in text
    assert not [code for code in DEPOSIT_COINS if f'"{code}"' in text or f"coins: {code}" in text]


@pytest.mark.parametrize(
    "vpsshop_overrides", [{"coins": {"BTC": {"enabled": False}}, "topups": {"default_coin": "LTC"}}]
)
def test_llms_txt_tops_up_in_the_shops_default_coin(vpsshop_client: Any) -> None:
    text = vpsshop_client.get("/llms.txt").text
    assert '`POST /v1/topups {"amount": 25, "coin": "LTC"}`' in text and '"coin": "BTC"' not in text
    assert "3. Or pay with x402 (USDCBASE" in text
