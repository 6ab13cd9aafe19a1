"""Lint: ``ruff check`` and ``ruff format --check`` over the tree, with the rules in pyproject.toml.

CI runs the whole suite, so a finding or an unformatted file fails it like any other test.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_finds_nothing() -> None:
    result = ruff("check", "--output-format", "concise", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_format_changes_nothing() -> None:
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
