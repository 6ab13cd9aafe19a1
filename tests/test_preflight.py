"""Honest start-up: production refuses a backend or coin that cannot work, naming the remedy.

Each test runs the shipped commands (``vpsshop serve`` and ``vpsshop worker``) on a production
config and reads what an operator reads: the exit status and the message. The missing
libvirt-python binding is shown in ``tests/test_readme.py``, whose venv is a plain
``pip install .``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from served import TEST_ENCRYPTION_KEY, VPSSHOP, free_port, serve

SANDBOX_VPUB = __import__("vpsshop_bitcoin").SANDBOX_VPUB


def production_config(tmp_path: Path, body: str, mode: str = "production") -> Path:
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f'mode = "{mode}"\ndatabase_url = "sqlite:///{tmp_path}/shop.db"\nsecret_key = "s3cret-for-the-test"\n'
        f'encryption_key = "{TEST_ENCRYPTION_KEY}"\npublic_url = "https://shop.example/v1"\n'
        '[rates]\nsource = "fixed"\n[rates.fixed]\nprices = { BTC = "60000" }\n' + body
    )
    return config


def libvirt_table(uri: str = "test:///default", domain_type: str = "test", location: str = "nl") -> str:
    return (
        f'[hypervisor]\nbackend = "libvirt"\n[hypervisor.libvirt]\ndomain_type = "{domain_type}"\n'
        f'[hypervisor.libvirt.locations.{location}]\npool = "default-pool"\naddresses = "10.0.0.0/24"\n'
        f'[[hypervisor.libvirt.locations.{location}.hosts]]\nuri = "{uri}"\n'
    )


def clean_env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")} | extra


def start(tmp_path: Path, config: Path, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    args = [VPSSHOP, command, "--config", str(config)]
    if command == "serve":
        args += ["--port", str(free_port())]
    return subprocess.run(args, cwd=tmp_path, env=clean_env(**env), capture_output=True, text=True, timeout=60)


def refused(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "vpsshop: cannot start:" in result.stderr and "Traceback" not in result.stderr, result.stderr
    return result.stderr


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_libvirt_without_a_seed_image_tool_is_refused(tmp_path, command):
    config = production_config(tmp_path, libvirt_table())
    empty = tmp_path / "bin"
    empty.mkdir()
    message = refused(start(tmp_path, config, command, PATH=str(empty)))  # no genisoimage, no cloud-localds
    assert "genisoimage or cloud-localds" in message and "apt-get install genisoimage" in message


def test_libvirt_without_the_password_hasher_is_refused(tmp_path):
    """libpass (import name passlib) hides behind a package of the same name that fails to import."""
    config = production_config(tmp_path, libvirt_table())
    shadow = tmp_path / "shadow" / "passlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    message = refused(start(tmp_path, config, "worker", PYTHONPATH=str(shadow.parent)))
    assert "root password's hash" in message and "pip install 'vpsshop[libvirt]'" in message


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_libvirt_host_that_does_not_answer_is_named_with_its_setting(tmp_path, command):
    config = production_config(tmp_path, libvirt_table(f"qemu+tcp://127.0.0.1:{free_port()}/system", "kvm"))
    message = refused(start(tmp_path, config, command))
    assert "hypervisor.libvirt.locations.nl.hosts[0].uri" in message and "does not answer" in message


def test_every_problem_of_one_backend_is_listed_at_once(tmp_path):
    config = production_config(tmp_path, libvirt_table(f"qemu+tcp://127.0.0.1:{free_port()}/system", "kvm"))
    empty = tmp_path / "bin"
    empty.mkdir()
    message = refused(start(tmp_path, config, "worker", PATH=str(empty)))
    assert "genisoimage or cloud-localds" in message and "hypervisor.libvirt.locations.nl.hosts[0].uri" in message


def test_every_component_that_cannot_work_is_listed_at_once(tmp_path):
    port = free_port()
    config = production_config(
        tmp_path,
        libvirt_table(f"qemu+tcp://127.0.0.1:{free_port()}/system", "kvm")
        + f'[coins.BTC]\nxpub = "{SANDBOX_VPUB}"\nnetwork = "testnet"\nrpc_url = "http://user:pw@127.0.0.1:{port}"\n',
    )
    message = refused(start(tmp_path, config, "worker"))
    assert f"BTC node at http://127.0.0.1:{port} (setting coins.BTC.rpc_url) does not answer" in message
    assert "user:pw" not in message  # credentials of a URL never appear
    assert "hypervisor.libvirt.locations.nl.hosts[0].uri" in message


def test_production_refuses_the_simulator(tmp_path):
    config = production_config(tmp_path, '[hypervisor]\nbackend = "simulator"\n')
    message = refused(start(tmp_path, config, "serve"))
    assert "the simulator makes no real servers" in message and 'mode = "sandbox"' in message


def test_a_working_production_config_starts(tmp_path):
    """The libvirt test driver answers, genisoimage is installed and a "*" location serves every catalog
    location: nothing to refuse (hosts in nl alone would leave seven locations unserved:
    tests/test_server_locations.py)."""
    config = production_config(tmp_path, libvirt_table(location='"*"'))
    env = clean_env()
    with serve(tmp_path, env, "--config", str(config)) as served:
        import httpx

        health = httpx.get(f"{served.base}/health").json()
        assert health["mode"] == "production"
        assert {c["id"]: c["ready"] for c in health["components"]}["libvirt"] is True
    assert "SANDBOX" not in served.output()


def test_the_sandbox_warns_and_starts(tmp_path):
    """A sandbox that names libvirt on a machine without genisoimage starts, and its banner says why
    servers will fail."""
    config = production_config(tmp_path, libvirt_table(), mode="sandbox")
    empty = tmp_path / "bin"
    empty.mkdir()
    env = clean_env(PATH=str(empty))
    with serve(tmp_path, env, "--config", str(config)) as served:
        pass
    banner = served.output()
    assert "running as a SANDBOX" in banner and "WARNING" in banner and "apt-get install genisoimage" in banner


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_coin_without_its_node_is_refused(tmp_path, command):
    """Its addresses would be handed out and never watched: customers would pay and never be credited."""
    config = production_config(
        tmp_path, libvirt_table() + f'[coins.BTC]\nxpub = "{SANDBOX_VPUB}"\nnetwork = "testnet"\n'
    )
    message = refused(start(tmp_path, config, command))
    assert "coins.BTC.rpc_url is not set" in message and "never credited" in message


def test_the_sandbox_names_the_port_it_serves(tmp_path):
    """x402's resource URLs and /llms.txt point where `vpsshop serve --port` listens."""
    import httpx

    with serve(tmp_path, clean_env()) as served:  # served.base: http://127.0.0.1:<free port>/v1
        llms = httpx.get(served.base.removesuffix("/v1") + "/llms.txt").text
        required = httpx.post(
            f"{served.base}/topups",
            headers={"Authorization": f"Bearer {httpx.post(f'{served.base}/account').json()['api_key']}"},
            json={"amount": 25, "coin": "USDCBASE"},
        )
    assert f"{served.base}" in llms and "127.0.0.1:8000" not in llms
    assert required.status_code == 402
    assert required.json()["accepts"][0]["resource"] == f"{served.base}/topups"
