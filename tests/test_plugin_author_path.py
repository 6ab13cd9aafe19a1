"""A plugin author's path, as one walks it: a hypervisor plugin package outside this repository, a
fresh venv, ``pip install 'vpsshop[testing]'`` (this checkout) and the package with its test extra,
no libvirt-python (nothing compiles), and pytest run there: vpsshop's hypervisor contract kit
(``vpsshop.testing.HypervisorContract``, loaded through vpsshop's ``pytest11`` entry point) against
the backend, and the public API check (``vpsshop.testing.assert_public_imports``) against the package.

The package is ``examples/vpsshop-dirvm``, written from docs/plugins.md with only the public API.
pip uses its cache (and the network when the cache lacks something).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from vpsshop.testing import HypervisorContract

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vpsshop-dirvm"
CHECKOUT_IGNORED = shutil.ignore_patterns(
    ".venv", ".peers", ".git", "node_modules", "__pycache__", "build", "*.egg-info", "*.db", "*.db-*", ".pytest_cache"
)
OWN_TESTS = {
    "test_destroy_with_an_empty_host_looks_on_every_host",
    "test_a_half_made_server_is_missing_finished_by_create_and_removed_by_destroy",
    "test_no_password_is_written_on_a_host",
    "test_one_setting_serves_every_location",
    "test_imports_only_the_public_api",
}
KIT_TESTS = {name for name in dir(HypervisorContract) if name.startswith("test_")}


def run(*args: str | Path, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VPSSHOP", "PYTHONPATH"))}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_plugin_package_outside_the_repository_runs_the_kit_in_a_fresh_venv(tmp_path: Path) -> None:
    source, plugin, venv = tmp_path / "vpsshop-src", tmp_path / "vpsshop-dirvm", tmp_path / "venv"
    assert ROOT not in tmp_path.parents
    shutil.copytree(ROOT, source, ignore=CHECKOUT_IGNORED)
    shutil.copytree(EXAMPLE, plugin, ignore=CHECKOUT_IGNORED)

    made = run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = run(
        python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "-c", ROOT / "constraints.txt",
        f"{source}[testing]", f"{plugin}[test]",
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr

    libvirt = run(python, "-m", "pip", "show", "-q", "libvirt-python")
    assert libvirt.returncode != 0, "vpsshop[testing] must not bring libvirt-python (it compiles)"
    assert run(python, "-c", "import libvirt").returncode != 0
    assert run(python, "-c", "import pytest, httpx, vpsshop.testing").returncode == 0

    report = tmp_path / "report.xml"
    tested = run(python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}", cwd=plugin, timeout=300)
    assert tested.returncode == 0, tested.stdout[-4000:] + tested.stderr[-2000:]
    cases = ET.parse(report).getroot().iter("testcase")
    outcome = {
        case.get("name", ""): next((child.tag for child in case if child.tag != "system-out"), "passed")
        for case in cases
    }
    passed = {name for name, result in outcome.items() if result == "passed"}
    missing = (OWN_TESTS | KIT_TESTS) - passed  # every rule of the kit ran and held: none skipped
    assert not missing, {name: outcome.get(name, "not run") for name in missing}
    assert [name for name, result in outcome.items() if result in ("failure", "error")] == []
