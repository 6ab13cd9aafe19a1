"""The suite runs every database-backed test on SQLite and on PostgreSQL."""

from __future__ import annotations

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
