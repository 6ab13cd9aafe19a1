"""Typing: ``mypy vpsshop plugins`` with the settings of ``[tool.mypy]`` in pyproject.toml (strict).

Core and the default plugins are typed strictly, the plugins as a third-party plugin would be, against
vpsshop's public API; CI runs the whole suite, so a type error fails it like any other test. A cold run
(no ``.mypy_cache``) takes about 9 s on two cores (mypy reads web3's, SQLAlchemy's and pydantic's types
too), one with mypy's cache under 1 s.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_nothing_in_core_and_the_plugins() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "vpsshop", "plugins"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
