"""The reference deployment end to end: ``up``, ``walk`` and ``down`` of examples/reference-deployment.

The three commands run as a user runs them, with free ports, a state dir of their own and a
PostgreSQL database of their own (``<test database>_refdeploy``), reusing this checkout's venv and
npm packages instead of installing them again. Each walk step's outcome is asserted from the JSON
the walk leaves behind, and after ``down`` no process of the deployment may be left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "examples" / "reference-deployment"


def _running(marks: tuple[str, ...]) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(mark in cmdline for mark in marks):
                found.append(cmdline)
    return found


def test_up_walk_down() -> None:
    pg = os.environ.get("VPSSHOP_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    admin, db = pg.replace("+psycopg", "").rsplit("/", 1)
    state = Path(tempfile.mkdtemp(prefix="vpsshop-refdeploy-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VPSSHOP", "REFDEPLOY"))}
    env.update(
        REFDEPLOY_STATE=str(state),
        REFDEPLOY_SKIP_APT="1",
        REFDEPLOY_VENV=str(Path(sys.executable).parent.parent),
        REFDEPLOY_NPM_DIR=str(ROOT / ".peers" / "npm"),
        REFDEPLOY_PG_ADMIN_URL=f"{admin}/{db}",
        REFDEPLOY_DB_NAME=f"{db}_refdeploy",
    )
    deployment: dict = {"pool_dir": str(state / "no-pool")}
    try:
        subprocess.run([str(DEPLOY / "down")], env=env, capture_output=True, timeout=120)  # nothing there: refuses
        up = subprocess.run([str(DEPLOY / "up")], env=env, capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "- /v1/health: ok" in up.stdout, up.stdout
        for ready in ("coin USDCBASE: ready", "coin LTC: ready", "coin XMR: ready", "hypervisor libvirt: ready"):
            assert ready in up.stdout
        deployment = json.loads((state / "deployment.json").read_text())
        status = subprocess.run(
            ["supervisorctl", "-c", deployment["supervisord_conf"], "status"], capture_output=True, text=True
        ).stdout
        for program in (
            "nginx",
            "prometheus",
            "vpsshop-worker",
            "anvil",
            "litecoind",
            "monerod",
            f"vpsshop-api-{deployment['ports']['api1']}",
            f"vpsshop-api-{deployment['ports']['api2']}",
        ):
            assert any(line.startswith(program) and "RUNNING" in line for line in status.splitlines()), status

        walk = subprocess.run([str(DEPLOY / "walk")], env=env, capture_output=True, text=True, timeout=1200)
        assert walk.returncode == 0, walk.stdout + walk.stderr
        results = json.loads((state / "walk.json").read_text())
        assert results["x402_required"] == 402
        assert results["x402"] == "completed"
        assert results["ltc"] == "completed" and results["xmr"] == "completed"
        assert results["order"] == 201 and results["active"] == "active"
        assert results["credentials"] == 200 and results["renew"] == 200
        assert "balance 75.0 USD" in walk.stdout  # 25 USDC + 25 in LTC + 25 in XMR, each credited once
        assert "balance 67.02 USD" in walk.stdout  # two cycles of pup (3.99) charged
        if deployment["metrics_toml"]:  # /metrics exists in this vpsshop (issue 12)
            assert results["metrics"] > 0, walk.stdout
            assert results["metrics_credited_usd_total"] == 75, walk.stdout  # three top-ups of 25
            assert results["metrics_orders_total"] == 1 and results["metrics_renewals_total"] == 1, walk.stdout
            assert results["prometheus_up"] == ["1", "1"], walk.stdout
    finally:
        down = subprocess.run([str(DEPLOY / "down")], env=env, capture_output=True, text=True, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "ps: no process of this deployment is running" in down.stdout
    assert not _running((str(state) + "/", deployment["pool_dir"] + "/"))
    assert not state.exists()
