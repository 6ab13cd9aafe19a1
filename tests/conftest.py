"""The suite runs every database-backed test on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vpsshop.testing import postgres_test_url, reset_postgres


@pytest.fixture(params=["sqlite", "postgresql"])
def vpsshop_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vpsshop.db'}"
    url = postgres_test_url()
    reset_postgres(url)
    return url


@pytest.fixture(scope="session")
def libvirtd_uri() -> Iterator[str]:
    """``qemu:///system`` answering, with QEMU probed (tests/libvirt_peer.py); stops what it started."""
    import libvirt
    import libvirt_peer

    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    started = libvirt_peer.system_libvirtd()
    yield libvirt_peer.URI
    libvirt_peer.stop(started)
