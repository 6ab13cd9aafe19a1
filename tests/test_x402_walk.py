"""docs/x402.md's local-chain walk, command by command: ``examples/x402_local_chain.py chain``,
``vpsshop serve --config WORKDIR/vpsshop.toml`` and ``examples/x402_local_chain.py order``.

The walk's config file is the one the script writes (SQLite); the test also runs it on PostgreSQL
through ``VPSSHOP_DATABASE_URL``, which overrides the file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from served import free_port, serve, stop
from x402_peers import ROOT, npm_bin

pytestmark = pytest.mark.slow

SCRIPT = str(ROOT / "examples" / "x402_local_chain.py")


def relayer_gas(base: str) -> float:
    """The x402 relayer's balance as ``GET /metrics`` reports it (alongside USDCBASE's readiness)."""
    text = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=10).text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("vpsshop_component_ready", (("component", "USDCBASE"), ("kind", "coin")))] == 1
    return samples[
        ("vpsshop_component_figure", (("component", "USDCBASE"), ("kind", "coin"), ("name", "relayer_gas_wei")))
    ]


def test_the_local_chain_walk_orders_a_server_paid_by_x402(tmp_path: Path, vpsshop_database_url: str) -> None:
    npm_bin()  # anvil and solcjs in .peers/npm
    workdir = tmp_path / "walk"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    log = tmp_path / "chain.log"
    with log.open("w") as out:
        chain = subprocess.Popen(
            [sys.executable, SCRIPT, "chain", str(workdir), "--shop-port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        config = workdir / "vpsshop.toml"
        deadline = time.monotonic() + 120
        while "now run: vpsshop serve" not in log.read_text():
            assert chain.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        text = config.read_text()
        assert "[coins.USDCBASE]" in text and 'relayer_key_encrypted = "' in text
        assert oct(config.stat().st_mode)[-3:] == "600"
        shop_env = {**env, "VPSSHOP_DATABASE_URL": vpsshop_database_url}
        with serve(tmp_path, shop_env, "--config", str(config), port=port) as served:
            # the relayer key was opened when the coin was built: the start-up banner says it is ready
            banner = [line for line in served.output().splitlines() if "USDCBASE" in line]
            assert banner and not [line for line in banner if "NOT READY" in line], served.output()[-3000:]
            gas_before = relayer_gas(served.base)
            assert gas_before == 10**18  # the script gave the relayer 1 ETH
            done = subprocess.run(
                [sys.executable, SCRIPT, "order", served.base, str(workdir)],
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + served.output()[-3000:]
            time.sleep(2.1)  # past the few seconds readiness checks are answered again
            gas_after = relayer_gas(served.base)
            assert 0 < gas_after < gas_before  # the relayer paid the settlement's gas: /metrics shows it
        assert "POST /v1/servers (paid by x402): 201" in done.stdout
        assert "'success': True" in done.stdout and ": active, ip " in done.stdout
        assert "balance after the order: 0.0 USD" in done.stdout
    finally:
        stop(chain)  # type: ignore[arg-type]
