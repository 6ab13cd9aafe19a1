"""README tells the truth: its walkthrough, run line by line against `vpsshop serve` from a plain
``pip install .`` (no extras, no system site packages), in a fresh venv made by this test.

Every step of the block is checked; a step this test does not know fails it, so README and test
change together. The same venv shows that production refuses the libvirt backend without its
binding, naming the remedy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from served import TEST_ENCRYPTION_KEY, free_port, serve

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@pytest.fixture(scope="session")
def plain_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with `pip install .` of this checkout: what `pip install vpsshop` gives a user."""
    tmp = tmp_path_factory.mktemp("plain")
    source = tmp / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv",
            ".peers",
            ".git",
            "node_modules",
            "__pycache__",
            "build",
            "*.egg-info",
            "*.db",
            "*.db-*",
            "*.keys",
            ".pytest_cache",
        ),
    )
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # pip reuses its cache, so in CI (after scripts/test.sh installed the same pins) this is quick.
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--disable-pip-version-check",
            "-c",
            str(ROOT / "constraints.txt"),
            str(source),
        ],
        check=True,
        timeout=900,
    )
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import libvirt"], capture_output=True)
    assert check.returncode != 0, "a plain install must not bring libvirt-python"
    return venv


def walkthrough_steps() -> list[str]:
    """The commands of README's walkthrough block, continuation lines joined, comments dropped."""
    text = README.read_text()
    block = re.search(r"<!-- walkthrough -->\n```sh\n(.*?)```", text, re.S)
    assert block, "README.md lost its walkthrough block (<!-- walkthrough --> then ```sh)"
    steps, current = [], ""
    for line in block.group(1).splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            steps.append(re.sub(r"\s{2,}#.*$", "", current).strip())  # a trailing comment
            current = ""
    return steps


def test_readme_walkthrough_on_a_plain_install(plain_venv: Path, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    env["PATH"] = f"{plain_venv / 'bin'}:{env['PATH']}"
    steps = walkthrough_steps()
    with serve(tmp_path, env, command=str(plain_venv / "bin" / "vpsshop")) as served:
        base = served.base.removesuffix("/v1")
        script = ["set +e"]
        for number, step in enumerate(steps):
            command = step.replace("http://127.0.0.1:8000", base).replace(
                ".venv/bin/vpsshop", str(plain_venv / "bin" / "vpsshop")
            )
            script += [command, f'printf "\\n@@STEP {number} $? $(date +%s.%N)@@\\n"']
        result = subprocess.run(
            ["bash", "-c", "\n".join(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        outputs = re.split(r"\n@@STEP (\d+) (\d+) ([\d.]+)@@\n", "\n" + result.stdout)
    banner = served.output()
    assert "running as a SANDBOX" in banner and "simulator" in banner, banner

    ran: dict[int, tuple[int, float, str]] = {}
    for i in range(0, len(outputs) - 1, 4):  # output, step number, exit status, time; then the next step
        ran[int(outputs[i + 1])] = (int(outputs[i + 2]), float(outputs[i + 3]), outputs[i].strip())
    assert sorted(ran) == list(range(len(steps))), result.stderr
    workdir: dict[str, Any] = {}
    for number, step in enumerate(steps):
        status, when, output = ran[number]
        assert status == 0, f"step {number} failed ({status}): {step}\n{output}\n{result.stderr}"
        check = next((c for pattern, c in CHECKS if re.search(pattern, step)), None)
        assert check is not None, f"no check for README step: {step}"
        check(step, output, tmp_path, workdir, when)
    # Done-when of issue 9: the server is active with an address within 10 s of the order.
    assert workdir["active_at"] - workdir["ordered_at"] < 10, workdir


def _json(output: str) -> Any:
    return json.loads(output)


def _account_created(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = json.loads((cwd / "account.json").read_text())
    assert body["api_key"].startswith("vpsk_") and body["login_token"].startswith("vpsl_")
    seen["account"] = body


def _assigned(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    assert output == ""


def _account(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = _json(output)
    assert body["user_id"] == seen["account"]["user_id"] and body["balance_usd"] == 0


def _catalog(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = _json(output)
    assert "pup" in [p["id"] for p in body["plans"]] and "nl" in [loc["id"] for loc in body["locations"]]


def _health(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = _json(output)
    assert body["status"] == "ok", body
    assert {"kind": "hypervisor", "id": "simulator"}.items() <= next(
        c for c in body["components"] if c["kind"] == "hypervisor"
    ).items()


def _topup(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = _json(output)
    assert body["coin"] == "LTC" and body["status"] == "pending" and body["deposit_address"].startswith("tltc1"), body
    assert body["qr_data_uri"].startswith("data:image/png;base64,")


def _credit(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    assert f"credited 50.00 USD to account {seen['account']['user_id']}" in output


def _order(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = json.loads((cwd / "order.json").read_text())
    assert body["server"]["status"] == "provisioning" and body["server"]["price_usd"] == 3.99
    seen["order"], seen["ordered_at"] = body, when


def _until_active(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    seen["active_at"] = when


def _server(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = _json(output)
    assert body["id"] == seen["order"]["server"]["id"] and body["status"] == "active"
    assert re.fullmatch(r"10\.99\.\d+\.\d+", body["ip"]), body


def _credentials(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = _json(output)
    assert body["username"] == "root" and body["password"] == seen["order"]["root_password"]
    assert re.fullmatch(r"10\.99\.\d+\.\d+", body["ip"])


def _events(step: str, output: str, cwd: Path, seen: dict[str, Any], when: float) -> None:
    body = _json(output)
    types = [e["type"] for e in body["events"]]
    assert {"account.created", "topup.created", "ledger.credit", "server.provisioning", "server.active"} <= set(types)
    assert all(e["account_id"] == seen["account"]["user_id"] for e in body["events"])


CHECKS: list[tuple[str, Callable[..., None]]] = [
    (r"POST \S+/v1/account > account\.json", _account_created),
    (r"^[A-Z_]+=\$\(", _assigned),
    (r"/v1/account -H", _account),
    (r"/v1/catalog$", _catalog),
    (r"/v1/health$", _health),
    (r"/v1/topups", _topup),
    (r"admin credit", _credit),
    (r"POST \S+/v1/servers .*> order\.json", _order),
    (r"^until ", _until_active),
    (r"/credentials -H", _credentials),
    (r"/v1/events -H", _events),
    (r"/v1/servers/\$SERVER_ID -H \"Authorization: Bearer \$KEY\"$", _server),
]


def test_production_without_libvirt_python_names_the_remedy(plain_venv: Path, tmp_path: Path):
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path}/shop.db"\nsecret_key = "s"\nencryption_key = "{TEST_ENCRYPTION_KEY}"\n'
        'public_url = "https://shop.example/v1"\n[rates]\nsource = "fixed"\n[rates.fixed]\nprices = { BTC = "1" }\n'
        '[hypervisor]\nbackend = "libvirt"\n[hypervisor.libvirt.locations.nl]\n'
        '[[hypervisor.libvirt.locations.nl.hosts]]\nuri = "qemu:///system"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    for command in (["worker"], ["serve", "--port", str(free_port())]):
        started = time.monotonic()
        result = subprocess.run(
            [str(plain_venv / "bin" / "vpsshop"), *command, "--config", str(config)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, (result.stdout, result.stderr)
        assert "needs libvirt-python, which is not installed" in result.stderr
        assert "pip install 'vpsshop[libvirt]'" in result.stderr and "libvirt-dev" in result.stderr
        assert "Traceback" not in result.stderr and time.monotonic() - started < 30
