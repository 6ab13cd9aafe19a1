"""A catalog location the hypervisor backend does not serve (SQLite and PostgreSQL where a database is
used): orders and quotes there are refused before any charge (409 location_unavailable), the API
description does not list it as orderable, the sandbox's banner warns of it, and production does not
start, naming the setting to add or the catalog to limit.

The backend is libvirt's test:///default driver with hosts for ``nl`` only, beside the shipped
catalog's eight locations (the audit's case: an order in ``fr`` was charged and never provisioned).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from importlib.resources import files
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import TEST_ENCRYPTION_KEY, VPSSHOP, free_port, serve, shop_env

from vpsshop.app import preflight
from vpsshop.assembly import build_context
from vpsshop.errors import StartupError
from vpsshop.settings import load_settings

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
NL_HOST = {
    "hosts": [{"uri": "test:///default", "name": "test", "max_memory_mib": 1048576}],
    "pool": "default-pool",
    "network": "network:default",
    "addresses": "10.98.0.0/24",
    "gateway": "10.98.0.1",
}
NL_ONLY = {"backend": "libvirt", "libvirt": {"domain_type": "test", "locations": {"nl": NL_HOST}}}
NL_ONLY_TOML = (
    '[hypervisor]\nbackend = "libvirt"\n[hypervisor.libvirt]\ndomain_type = "test"\n'
    '[hypervisor.libvirt.locations.nl]\npool = "default-pool"\nnetwork = "network:default"\n'
    'addresses = "10.98.0.0/24"\ngateway = "10.98.0.1"\n'
    '[[hypervisor.libvirt.locations.nl.hosts]]\nuri = "test:///default"\nname = "test"\nmax_memory_mib = 1048576\n'
)
UNSERVED = ["fr", "ro", "bg", "se", "is", "ch", "my"]


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": NL_ONLY}


def test_an_order_or_quote_where_no_host_serves_is_refused_before_any_charge(vpsshop_client, vpsshop_account):
    client, account = vpsshop_client, vpsshop_account
    account.credit("10")
    for path in ("/v1/servers/quote", "/v1/servers"):
        for body in ({**ORDER, "location": "fr"}, {**ORDER, "location": "fr", "ssh_keys": [], "cycle": "annual"}):
            refused = client.post(path, headers=account.headers, json=body)
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"] == "location_unavailable"
            assert "Roubaix (fr)" in refused.json()["message"] and "Nothing was charged" in refused.json()["message"]
    assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 10
    assert client.get("/v1/servers", headers=account.headers).json()["servers"] == []
    events = client.get("/v1/events", headers=account.headers).json()["events"]
    assert not [e for e in events if e["type"].startswith("server.") or e["type"] == "ledger.debit"]
    unknown = client.post("/v1/servers", headers=account.headers, json={**ORDER, "location": "mars"})
    assert unknown.json()["error"] == "invalid_location"  # not in the catalog at all: still a 400
    assert client.post("/v1/servers", headers=account.headers, json=ORDER).status_code == 201  # nl is served


def test_the_api_description_offers_only_served_locations(vpsshop_client):
    document = vpsshop_client.get("/v1/openapi.json").json()
    schemas = document["components"]["schemas"]
    for name in ("OrderBody", "QuoteBody"):
        assert schemas[name]["properties"]["location"]["enum"] == ["nl"], name
    assert "location_unavailable" in document["paths"]["/servers"]["post"]["responses"]["409"]["description"]
    catalog = vpsshop_client.get("/v1/catalog").json()  # the catalog itself still says what it sells
    assert len(catalog["locations"]) == 8


def test_preflight_names_each_unserved_location_and_its_setting(vpsshop_client):
    problems = asyncio.run(preflight(vpsshop_client.app.state.ctx))  # the sandbox: returned, not raised
    [problem] = [p for p in problems if "catalog sells" in p]
    assert problem.startswith("hypervisor libvirt (plugin libvirt): ")
    assert f"location(s) {', '.join(UNSERVED)}," in problem
    assert all(f"hypervisor.libvirt.locations.{loc}" in problem for loc in UNSERVED)
    assert "limit the catalog" in problem and "[catalog.file] path" in problem


def test_the_sandbox_banner_warns_and_the_served_shop_refuses(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text('mode = "sandbox"\n' + NL_ONLY_TOML)
    env = shop_env(f"sqlite:///{tmp_path}/shop.db")
    with serve(tmp_path, env, "--config", str(config)) as api:
        created = httpx.post(f"{api.base}/account").json()
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        quote = httpx.post(f"{api.base}/servers/quote", headers=headers, json={**ORDER, "location": "ch"})
        assert (quote.status_code, quote.json()["error"]) == (409, "location_unavailable")
        banner = api.output()
    flat = re.sub(r"\s+", " ", banner)
    assert "WARNING" in banner and "catalog sells location(s) fr, ro, bg, se, is, ch, my" in flat, banner
    assert "hypervisor.libvirt.locations.fr" in flat


def _production(tmp_path: Path, hypervisor: str, catalog: str = "") -> Path:
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f'mode = "production"\ndatabase_url = "sqlite:///{tmp_path}/shop.db"\nsecret_key = "s3cret-for-the-test"\n'
        f'encryption_key = "{TEST_ENCRYPTION_KEY}"\npublic_url = "https://shop.example/v1"\n'
        '[rates]\nsource = "fixed"\n[rates.fixed]\nprices = { BTC = "60000" }\n' + hypervisor + catalog
    )
    return config


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_production_does_not_start_selling_locations_without_hosts(tmp_path, command):
    config = _production(tmp_path, NL_ONLY_TOML)
    args = [VPSSHOP, command, "--config", str(config), *(["--port", str(free_port())] if command == "serve" else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    result = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, (result.stdout, result.stderr)
    message = re.sub(r"\s+", " ", result.stderr)
    assert "vpsshop: cannot start:" in message and "Traceback" not in message
    assert "the catalog sells location(s) fr, ro, bg, se, is, ch, my, where this backend has no hosts" in message
    assert "add hypervisor.libvirt.locations.fr, hypervisor.libvirt.locations.ro" in message


def _limited_catalog(tmp_path: Path) -> str:
    """The shipped catalog with its nl location only."""
    text = (files("vpsshop_catalog") / "catalog.toml").read_text()
    blocks = re.split(r"\n(?=\[\[)", text)
    kept = [b for b in blocks if not b.startswith("[[locations]]") or 'id = "nl"' in b]
    path = tmp_path / "catalog.toml"
    path.write_text("\n".join(kept))
    return f'[catalog]\nsource = "file"\n[catalog.file]\npath = "{path}"\n'


@pytest.mark.parametrize("remedy", ["catalog", "wildcard"])
def test_production_passes_once_the_catalog_or_the_hosts_match(tmp_path, remedy):
    if remedy == "catalog":
        config = _production(tmp_path, NL_ONLY_TOML, _limited_catalog(tmp_path))
    else:
        config = _production(tmp_path, NL_ONLY_TOML.replace("locations.nl", 'locations."*"'))
    ctx = build_context(load_settings(config, environ={}))
    try:
        served = [loc.id for loc in ctx.catalog_data.locations if ctx.hypervisor.serves(loc.id)]
        assert served == (["nl"] if remedy == "catalog" else ["nl", *UNSERVED])
        try:
            asyncio.run(preflight(ctx))
        except StartupError as exc:
            raise AssertionError(f"production refused a matching catalog: {exc}") from None
    finally:
        asyncio.run(ctx.close())


DIRVM = Path(__file__).resolve().parents[1] / "examples" / "vpsshop-dirvm"


def _dirvm(tmp_path: Path) -> str:
    """The example backend (examples/vpsshop-dirvm) as a one-file-style plugin, serving only nl with
    one list-valued setting: its location_setting is ``hypervisor.dirvm.locations`` for every location."""
    return (
        '[plugins]\nmodules = ["vpsshop_dirvm"]\n[hypervisor]\nbackend = "dirvm"\n'
        f'[hypervisor.dirvm]\nstate_dir = "{tmp_path}/hosts"\nhosts = ["a"]\nlocations = ["nl"]\n'
    )


def test_a_setting_shared_by_several_locations_is_named_once(tmp_path):
    """The sandbox banner and the production refusal name ``hypervisor.dirvm.locations`` once, not
    once per unserved location."""
    sandbox = tmp_path / "sandbox.toml"
    sandbox.write_text('mode = "sandbox"\n' + _dirvm(tmp_path))
    env = shop_env(f"sqlite:///{tmp_path}/shop.db", PYTHONPATH=str(DIRVM))
    with serve(tmp_path, env, "--config", str(sandbox)) as api:
        assert httpx.get(f"{api.base}/health").status_code == 200
        output = re.sub(r"\s+", " ", api.output())
    banner = output[output.index("is running as a SANDBOX") : output.index("`vpsshop init` writes")]
    assert "catalog sells location(s) fr, ro, bg, se, is, ch, my" in banner, output
    assert "add hypervisor.dirvm.locations, or limit the catalog" in banner
    assert banner.count("hypervisor.dirvm.locations") == 1, banner

    config = _production(tmp_path, _dirvm(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")} | {"PYTHONPATH": str(DIRVM)}
    result = subprocess.run(
        [VPSSHOP, "worker", "--config", str(config)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    message = re.sub(r"\s+", " ", result.stderr)
    assert "the catalog sells location(s) fr, ro, bg, se, is, ch, my, where this backend has no hosts" in message
    assert "add hypervisor.dirvm.locations, or limit the catalog" in message
    assert message.count("hypervisor.dirvm.locations") == 1, message
