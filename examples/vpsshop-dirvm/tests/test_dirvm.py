"""vpsshop's hypervisor contract kit run against dirvm, what dirvm adds to it, and the public API check.

Run with ``pip install -e '.[test]'`` (vpsshop's pytest plugin and kit: ``vpsshop[testing]``)::

    python -m pytest
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from vpsshop_dirvm import DirVmBackend

from vpsshop import DomainState, PluginError, ServerHandle
from vpsshop.testing import HypervisorContract, assert_public_imports, contract_spec

PROJECT = Path(__file__).resolve().parents[1]


def dirvm_settings(state_dir: Path) -> dict[str, Any]:
    return {
        "state_dir": str(state_dir),
        "hosts": ["host-a", "host-b"],
        "locations": ["nl", "de"],
        "addresses": "10.98.0.0/24",
        "gateway": "10.98.0.1",
    }


class TestDirVm(HypervisorContract):
    @pytest.fixture
    def hypervisor_backend(
        self, vpsshop_context: Any, hypervisor_run: Callable[[Any], Any], tmp_path: Path
    ) -> Iterator[DirVmBackend]:
        backend = DirVmBackend.from_settings(
            dirvm_settings(tmp_path / "hosts"), sandbox=False, where="hypervisor.dirvm"
        )
        backend.bind(vpsshop_context)
        yield backend
        hypervisor_run(backend.close())

    @pytest.fixture
    def hypervisor_unserved_location(self) -> str:
        return "fr"


@pytest.fixture
def backend(vpsshop_context: Any, tmp_path: Path) -> DirVmBackend:
    built = DirVmBackend.from_settings(dirvm_settings(tmp_path / "hosts"), sandbox=False, where="hypervisor.dirvm")
    built.bind(vpsshop_context)
    return built


def test_destroy_with_an_empty_host_looks_on_every_host(backend: DirVmBackend, tmp_path: Path) -> None:
    spec = contract_spec("nl")
    handle = asyncio.run(backend.create(spec))
    assert (tmp_path / "hosts" / handle.host / spec.name / "disk.img").is_file()
    asyncio.run(backend.destroy(ServerHandle("", spec.name, location="nl")))  # a create that failed early
    assert asyncio.run(backend.state(handle)) == DomainState.MISSING
    assert not list((tmp_path / "hosts").glob(f"*/{spec.name}"))


def test_a_half_made_server_is_missing_finished_by_create_and_removed_by_destroy(
    backend: DirVmBackend, tmp_path: Path
) -> None:
    spec = contract_spec("nl")
    half = tmp_path / "hosts" / "host-b" / spec.name  # a create that crashed after the disk
    half.mkdir(parents=True)
    (half / "disk.img").write_text("the disk of the first attempt\n")
    handle = ServerHandle("host-b", spec.name, location="nl")
    assert asyncio.run(backend.state(handle)) == DomainState.MISSING
    asyncio.run(backend.stop(handle))  # stop and suspend: nothing runs, nothing to do
    asyncio.run(backend.suspend(handle))
    for verb in (backend.start, backend.reboot):
        with pytest.raises(PluginError):
            asyncio.run(verb(handle))
    again = asyncio.run(backend.create(spec))  # the retried job finishes it, on the same host and disk
    assert again.host == "host-b" and asyncio.run(backend.state(again)) == DomainState.RUNNING
    assert (half / "disk.img").read_text() == "the disk of the first attempt\n"
    asyncio.run(backend.destroy(again))
    assert not half.exists()


def test_no_password_is_written_on_a_host(backend: DirVmBackend, tmp_path: Path) -> None:
    spec = contract_spec("nl")
    handle = asyncio.run(backend.create(spec))
    files = (tmp_path / "hosts" / handle.host / spec.name).iterdir()
    assert all(spec.root_password not in path.read_text() for path in files)


def test_one_setting_serves_every_location(backend: DirVmBackend) -> None:
    assert [backend.serves(loc) for loc in ("nl", "de", "fr")] == [True, True, False]
    assert {backend.location_setting(loc) for loc in ("fr", "ro")} == {"hypervisor.dirvm.locations"}


def test_imports_only_the_public_api() -> None:
    assert_public_imports(PROJECT)  # the package and these tests
