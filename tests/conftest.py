"""The suite runs every database-backed test on SQLite and on PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, postgres_test_url, reset_postgres


@pytest.fixture(params=["sqlite", "postgresql"])
def vpsshop_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vpsshop.db'}"
    url = postgres_test_url()
    reset_postgres(url)
    return url


@pytest.fixture(scope="module")
def anvil() -> Iterator[Any]:
    """A module's own ``anvil`` (:class:`evm_peers.Anvil`), mining only when told to."""
    from evm_peers import Anvil

    node = Anvil()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def background_app(vpsshop_settings: Any, vpsshop_clock: Any) -> Any:
    """The shop with its background tasks running, as in ``vpsshop serve``: the chain watchers run.
    A module uses it as its ``vpsshop_app``."""
    from vpsshop.app import create_app

    return create_app(vpsshop_settings, clock=vpsshop_clock, background=True)


@pytest.fixture(scope="session")
def solana_node() -> Iterator[Any]:
    """The Solana RPC double on LiteSVM with its PubSub endpoint (tests/solana_rpc_double.py), shared by
    the SOL tests; a test that stops its PubSub endpoint starts it again."""
    from solana_rpc_double import SolanaChainDouble, SolanaRpcDouble

    server = SolanaRpcDouble(SolanaChainDouble())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def libvirtd_uri() -> Iterator[str]:
    """``qemu:///system`` answering, with QEMU probed (tests/libvirt_peer.py); stops what it started."""
    import libvirt
    import libvirt_peer

    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    started = libvirt_peer.system_libvirtd()
    yield libvirt_peer.URI
    libvirt_peer.stop(started)


@pytest.fixture(scope="session")
def test_guest() -> Path:
    """The cached Debian guest of ``scripts/build-test-guest.sh`` (built now if this script version has
    none yet): the directory holding ``rootfs.raw``, ``vmlinuz``, ``initrd.img`` and ``cmdline``."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "build-test-guest.sh"
    out = subprocess.run([str(script)], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    path = Path(out.stdout.strip().splitlines()[-1])
    assert (path / "rootfs.raw").is_file() and (path / "vmlinuz").is_file()
    return path


# ---- no secret in any log of the whole run ----------------------------------------------------------

_SECRET_SHAPES = [
    re.compile(rb"vpsk_[A-Za-z0-9_-]{43}"),  # an API key (vpsshop/auth.py), not its 12-character prefix
    re.compile(rb"vpsl_[A-Za-z0-9_-]{12}\.[A-Za-z0-9_-]{43}"),  # a login token
    re.compile(rb"whsec_[A-Za-z0-9+/=]{24,}"),  # a webhook signing secret
    re.compile(re.escape(TEST_SECRET_KEY.encode())),
    re.compile(re.escape(TEST_ENCRYPTION_KEY.encode())),
]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every ``*.log`` the run's processes wrote under pytest's temporary directory (``vpsshop serve``
    and ``vpsshop worker`` output, access logs, the drills' and the deployment's logs) is searched
    for anything shaped like a key, a login token or a webhook secret, and for the test secrets. One
    found fails the run: the logs of a shop must never hold a credential."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or getattr(session.config, "workerinput", None) is not None:
        return
    try:
        base = factory.getbasetemp()
    except (OSError, ValueError):
        return
    leaks = []
    for log in base.rglob("*.log"):
        try:
            data = log.read_bytes()
        except OSError:
            continue
        for shape in _SECRET_SHAPES:
            found = shape.search(data)
            if found:
                leaks.append(f"{log}: {found.group()[:10].decode(errors='replace')}...")
    if leaks:
        session.config.get_terminal_writer().line(
            "A log of this run holds a secret:\n  " + "\n  ".join(leaks), red=True, bold=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
