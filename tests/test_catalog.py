"""The default catalog and the seed's pricing rule."""

from __future__ import annotations

from decimal import Decimal

import pytest

from vpsshop.catalog import CatalogData, price_cents


@pytest.fixture
def catalog(vpsshop_client):
    response = vpsshop_client.get("/v1/catalog")
    assert response.status_code == 200
    return response.json()


def test_catalog_facts_from_the_seed(catalog):
    assert len(catalog["plans"]) == 10
    cheapest = min(catalog["plans"], key=lambda p: p["base_price_usd"])
    assert cheapest["id"] == "pup"
    assert [loc["id"] for loc in catalog["locations"]] == ["nl", "fr", "ro", "bg", "se", "is", "ch", "my"]
    names = {os_["name"] for os_ in catalog["operating_systems"]}
    for required in ("Debian 12", "Debian 13", "Ubuntu 24.04 LTS", "Ubuntu 22.04 LTS", "AlmaLinux 9", "Rocky Linux 9"):
        assert required in names
    assert len(names) > 6
    assert catalog["cycles"] == ["monthly", "annual"]
    assert catalog["currency"] == "USD"
    assert catalog["topup_limits"] == {"min_usd": 25, "max_usd": 2000}


def test_every_price_follows_the_rule(catalog):
    plans = {p["id"]: Decimal(str(p["base_price_usd"])) for p in catalog["plans"]}
    modifiers = {loc["id"]: Decimal(str(loc["price_modifier"])) for loc in catalog["locations"]}
    assert len(catalog["pricing"]) == 80
    for price in catalog["pricing"]:
        monthly = (plans[price["plan"]] * modifiers[price["location"]]).quantize(Decimal("0.01"), "ROUND_HALF_UP")
        assert Decimal(str(price["monthly_usd"])) == monthly
        assert Decimal(str(price["annual_usd"])) == 10 * monthly


def test_payment_options_are_the_loaded_coins(vpsshop_client, catalog):
    loaded = set(vpsshop_client.app.state.ctx.coins)
    assert {o["coin"] for o in catalog["payment_options"]} == loaded


def test_catalog_needs_no_auth_and_is_cacheable(vpsshop_client):
    response = vpsshop_client.get("/v1/catalog")
    assert response.headers["cache-control"].startswith("public")


def test_price_rounding_is_half_up_to_the_cent():
    data = CatalogData.model_validate(
        {
            "plans": [
                {
                    "id": "p",
                    "name": "P",
                    "vcpu": 1,
                    "memory_mib": 512,
                    "disk_gib": 10,
                    "bandwidth_tb": 1,
                    "base_price_cents": 399,
                }
            ],
            "locations": [{"id": "bg", "name": "Sofia", "country": "BG", "price_modifier": "0.85"}],
            "operating_systems": [{"id": "d", "name": "D", "family": "debian", "image": "d.qcow2"}],
        }
    )
    # 399 x 0.85 = 339.15 cents -> 339; annual is exactly ten months.
    assert price_cents(data.plans[0], data.locations[0], "monthly") == 339
    assert price_cents(data.plans[0], data.locations[0], "annual") == 3390


def test_catalog_file_with_duplicate_ids_is_refused():
    with pytest.raises(ValueError, match="duplicate plans ids: p"):
        CatalogData.model_validate(
            {
                "plans": [
                    {
                        "id": "p",
                        "name": "P",
                        "vcpu": 1,
                        "memory_mib": 512,
                        "disk_gib": 10,
                        "bandwidth_tb": 1,
                        "base_price_cents": 1,
                    },
                    {
                        "id": "p",
                        "name": "Q",
                        "vcpu": 1,
                        "memory_mib": 512,
                        "disk_gib": 10,
                        "bandwidth_tb": 1,
                        "base_price_cents": 2,
                    },
                ],
                "locations": [{"id": "nl", "name": "A", "country": "NL", "price_modifier": "1"}],
                "operating_systems": [{"id": "d", "name": "D", "family": "debian", "image": "d.qcow2"}],
            }
        )


def test_reseller_catalog_file_replaces_the_shipped_one(tmp_path, vpsshop_settings):
    from vpsshop.assembly import build_context

    path = tmp_path / "catalog.toml"
    path.write_text(
        '[[plans]]\nid = "solo"\nname = "Solo"\nvcpu = 1\nmemory_mib = 1024\ndisk_gib = 20\nbandwidth_tb = 1\n'
        'base_price_cents = 500\n[[locations]]\nid = "is"\nname = "Reykjavik"\ncountry = "IS"\nprice_modifier = "1.2"\n'
        '[[operating_systems]]\nid = "debian-12"\nname = "Debian 12"\nfamily = "debian"\nimage = "d12.qcow2"\n'
    )
    settings = vpsshop_settings.model_copy(update={"catalog": {"source": "file", "file": {"path": str(path)}}})
    ctx = build_context(settings, environ={})
    assert [(p.plan, p.location, str(p.monthly_usd)) for p in ctx.catalog.pricing] == [("solo", "is", "6.00")]
