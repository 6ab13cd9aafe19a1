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
