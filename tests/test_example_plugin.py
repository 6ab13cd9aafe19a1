"""The example third-party plugin installs with pip and loads through its entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vpsshop-hello"
VPSSHOP = Path(sys.executable).with_name("vpsshop")


@pytest.fixture(scope="module")
def installed_example():
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(EXAMPLE)],
        check=True,
    )
    yield
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "vpsshop-hello"], check=True)


def test_example_shows_in_vpsshop_plugins(installed_example, tmp_path):
    result = subprocess.run(
        [str(VPSSHOP), "plugins", "--json"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    hello = rows["hello"]
    assert hello["origin"] == "entry point of vpsshop-hello 0.1.0"
    assert hello["hooks"] == ["vpsshop_register_catalog_sources", "vpsshop_register_rate_sources", "vpsshop_routes"]
    assert hello["provides"] == ["catalog_source:hello", "rate_source:pegged"]
    assert rows["catalog"]["origin"] == "default plugin"


def test_example_serves_its_catalog_and_route(installed_example, tmp_path):
    catalog = {
        "plans": [
            {
                "id": "mini",
                "name": "Mini",
                "vcpu": 1,
                "memory_mib": 512,
                "disk_gib": 10,
                "bandwidth_tb": 1,
                "base_price_cents": 250,
            }
        ],
        "locations": [{"id": "is", "name": "Reykjavik", "country": "IS", "price_modifier": "2"}],
        "operating_systems": [{"id": "debian-12", "name": "Debian 12", "family": "debian", "image": "d.qcow2"}],
    }
    (tmp_path / "catalog.json").write_text(json.dumps(catalog))
    script = f"""
import json
from starlette.testclient import TestClient
from vpsshop import create_app
from vpsshop.settings import load_settings
settings = load_settings(None, environ={{}}, overrides={{
    "database_url": "sqlite:///{tmp_path}/s.db", "secret_key": "k", "encryption_key": "e",
    "catalog": {{"source": "hello", "hello": {{"path": "{tmp_path}/catalog.json"}}}},
    "rates": {{"source": "pegged"}}}})
with TestClient(create_app(settings, background=False)) as client:
    key = client.post("/v1/account").json()["api_key"]
    print(json.dumps({{
        "pricing": client.get("/v1/catalog").json()["pricing"],
        "hello": client.get("/v1/hello", headers={{"Authorization": "Bearer " + key}}).json(),
        "in_openapi": "/hello" in client.get("/v1/openapi.json").json()["paths"],
    }}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["pricing"] == [{"plan": "mini", "location": "is", "monthly_usd": 5.0, "annual_usd": 50.0}]
    assert out["hello"]["message"].startswith("Hello, account ")
    assert out["in_openapi"] is True
