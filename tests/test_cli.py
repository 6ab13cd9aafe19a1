"""The vpsshop command: init, plugins, admin credit, migrate, serve's sandbox."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx

VPSSHOP = str(Path(sys.executable).with_name("vpsshop"))


def run(*args, cwd, env=None, check=True):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    environ.update(env or {})
    return subprocess.run([VPSSHOP, *args], cwd=cwd, env=environ, capture_output=True, text=True, check=check)


def test_init_writes_a_private_production_config(tmp_path):
    result = run("init", cwd=tmp_path)
    config = tmp_path / "vpsshop.toml"
    assert "wrote vpsshop.toml" in result.stdout
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    data = tomllib.loads(config.read_text())
    assert data["mode"] == "production" and len(data["secret_key"]) >= 40
    assert run("init", cwd=tmp_path, check=False).returncode == 1  # never overwrites silently
    second = run("init", "other.toml", cwd=tmp_path)
    assert tomllib.loads((tmp_path / "other.toml").read_text())["secret_key"] != data["secret_key"]
    assert second.returncode == 0


def test_production_config_with_a_missing_setting_does_not_start(tmp_path):
    run("init", cwd=tmp_path)
    config = tmp_path / "vpsshop.toml"
    config.write_text(config.read_text().replace('public_url = "https://api.example.com/v1"\n', ""))
    result = run("plugins", "--config", str(config), cwd=tmp_path, check=False)
    assert result.returncode == 2
    assert "missing setting 'public_url'" in result.stderr
    assert "Traceback" not in result.stderr


def test_admin_credit_moves_the_balance_through_the_ledger(tmp_path):
    run("migrate", cwd=tmp_path)
    from starlette.testclient import TestClient

    from vpsshop import create_app
    from vpsshop.settings import load_settings

    settings = load_settings(None, environ={}, overrides={"database_url": f"sqlite:///{tmp_path}/vpsshop.db"})
    with TestClient(create_app(settings, background=False)) as client:
        account = client.post("/v1/account").json()
    result = run("admin", "credit", str(account["user_id"]), "30.25", "--reason", "support ticket 7", cwd=tmp_path)
    assert "balance now 30.25 USD" in result.stdout
    with TestClient(create_app(settings, background=False)) as client:
        me = client.get("/v1/account", headers={"Authorization": f"Bearer {account['api_key']}"}).json()
    assert me["balance_usd"] == 30.25
    bad = run("admin", "credit", "999", "5", "--reason", "x", cwd=tmp_path, check=False)
    assert bad.returncode == 1 and "no account 999" in bad.stderr
    assert run("admin", "credit", "1", "-5", "--reason", "x", cwd=tmp_path, check=False).returncode == 2
    assert run("admin", "credit", "1", "abc", "--reason", "x", cwd=tmp_path, check=False).returncode == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_without_config_is_a_sandbox_with_a_banner(tmp_path):
    port = _free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    proc = subprocess.Popen(
        [VPSSHOP, "serve", "--port", str(port)],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "server did not start"
                time.sleep(0.2)
        assert health.status_code == 200
        assert health.json()["mode"] == "sandbox"
        created = httpx.post(f"http://127.0.0.1:{port}/v1/account")
        assert created.status_code == 201
        assert (tmp_path / "vpsshop.db").exists()
    finally:
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
    assert "running as a SANDBOX" in output
    # where a person, a browser and an agent each go
    assert f"API         http://127.0.0.1:{port}/v1    web dashboard: http://127.0.0.1:{port}/dashboard/" in output
    assert f"MCP         http://127.0.0.1:{port}/mcp" in output
    assert created.json()["api_key"] not in output  # no secret in logs


def test_plugins_lists_defaults_with_their_hooks(tmp_path):
    result = run("plugins", cwd=tmp_path)
    assert "catalog  (vpsshop_catalog, default plugin)" in result.stdout
    assert "vpsshop_register_catalog_sources" in result.stdout
    assert "catalog_source:file" in result.stdout


def test_the_banner_and_health_say_what_is_really_loaded(tmp_path):
    """Without the simulator (blocked) the sandbox has no hypervisor: the banner and health say so."""
    port = _free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    environ["VPSSHOP_BLOCK_PLUGINS"] = "simulator,x402"
    proc = subprocess.Popen(
        [VPSSHOP, "serve", "--port", str(port)],
        cwd=tmp_path,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).json()
                httpx.get(f"http://127.0.0.1:{port}/v1/account", headers={"Authorization": "Bearer vpsk_nope"})
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
    assert health["status"] == "degraded"
    assert {
        k: v for k, v in next(c for c in health["components"] if c["kind"] == "hypervisor").items() if k != "detail"
    } == {"kind": "hypervisor", "id": "none", "plugin": "-", "ready": False}
    banner = output.split("Uvicorn running")[0]
    assert "hypervisor  none: NOT READY" in banner and "simulator" not in banner
    assert "USDCBASE" not in banner and "BTC (plugin bitcoin): bitcoin-testnet" in banner
    # The access log: one JSON line per request, no header, no key, no client address.
    lines = [json.loads(line) for line in output.splitlines() if '"log":"access"' in line]
    assert [(line["method"], line["path"], line["status"]) for line in lines][-2:] == [
        ("GET", "/v1/health", 200),
        ("GET", "/v1/account", 401),
    ]
    assert set(lines[-1]) == {"t", "log", "rid", "method", "path", "route", "status", "us", "bytes"}
    assert "vpsk_nope" not in output and "127.0.0.1:" not in "".join(str(line) for line in lines)
