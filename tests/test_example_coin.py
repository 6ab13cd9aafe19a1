"""The example coin plugin (examples/vpsshop-gnosis), built on the chain kit, installs with pip,
loads through its entry point, passes the coin contract kit on anvil and takes top-ups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from evm_peers import npm_bin

from vpsshop.testing import DepositCoinContract

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vpsshop-gnosis"
VPSSHOP = Path(sys.executable).with_name("vpsshop")


@pytest.fixture(scope="module")
def installed_example() -> Iterator[None]:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(EXAMPLE)], check=True)
    yield
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "vpsshop-gnosis"], check=True)


def test_example_coin_loads_through_its_entry_point(installed_example: None, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(VPSSHOP), "plugins", "--json"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["gnosis"]["origin"] == "entry point of vpsshop-gnosis 0.1.0"
    assert rows["gnosis"]["provides"] == ["coin:XDAI"]


def test_example_coin_passes_the_coin_contract_on_anvil(installed_example: None) -> None:
    env = {**os.environ, "PATH": f"{npm_bin()}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    kit_rules = [name for name in dir(DepositCoinContract) if name.startswith("test_")]
    assert f"{len(kit_rules) + 1} passed" in result.stdout  # every rule of the kit, and the example's own test


def test_sandbox_hands_out_xdai_addresses(installed_example: None, tmp_path: Path) -> None:
    script = f"""
import json
from starlette.testclient import TestClient
from vpsshop import create_app, load_settings
settings = load_settings(None, environ={{}}, overrides={{
    "database_url": "sqlite:///{tmp_path}/s.db", "secret_key": "k",
    "encryption_key": "3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    "rates": {{"fixed": {{"prices": {{"DAI": "1"}}}}}}}})
with TestClient(create_app(settings, background=False)) as client:
    key = client.post("/v1/account").json()["api_key"]
    auth = {{"Authorization": "Bearer " + key}}
    made = client.post("/v1/topups", json={{"amount": 30, "coin": "XDAI"}}, headers=auth)
    print(json.dumps({{"status": made.status_code, "body": made.json()}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["status"] == 201, out
    assert out["body"]["coin"] == "XDAI" and out["body"]["deposit_network"] == "chiado"
    assert out["body"]["deposit_address"].startswith("0x") and len(out["body"]["deposit_address"]) == 42
