"""The public API check a plugin runs on itself: ``vpsshop.testing.check_public_imports`` and
``assert_public_imports``, on a plugin package written to ``tmp_path`` as a third party lays it out.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from vpsshop.testing import ImportViolation, assert_public_imports, check_public_imports

GOOD = """
from __future__ import annotations

from typing import TYPE_CHECKING

import vpsshop
from vpsshop import HypervisorBackend, PluginError, hookimpl
from vpsshop.chains import JsonRpcClient

from . import helpers
from .helpers import tool

if TYPE_CHECKING:
    from vpsshop import ShopContext


class Mine(HypervisorBackend):
    kind = "mine"

    def bind(self, ctx: ShopContext) -> None:
        self.state = vpsshop.PluginState(ctx, "mine")
        self.client = vpsshop.chains.JsonRpcClient


@hookimpl(trylast=True)
def vpsshop_register_hypervisors():
    return [Mine]
"""

BAD = """
import importlib
from typing import TYPE_CHECKING

import vpsshop
import vpsshop.settings
from vpsshop import Database, hookimpl
from vpsshop.hdkeys import derive
from vpsshop.chains import not_a_kit_name

if TYPE_CHECKING:
    from vpsshop.context import AppContext


def later():
    from vpsshop.servers import jobs
    ledger = importlib.import_module("vpsshop.ledger")
    return vpsshop.db.Database, vpsshop.PluginError, jobs, ledger


from vpsshop.testing import HypervisorContract
"""

TEST = """
import pytest

from vpsshop.testing import HypervisorContract, TestAccount, assert_public_imports
"""


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Path]:
    """A plugin project: ``vpsshop_mine/`` (clean code, a module with every kind of bad import, a
    helper) and ``tests/``, with ``tmp_path`` on ``sys.path``."""
    package = tmp_path / "vpsshop_mine"
    package.mkdir()
    (package / "__init__.py").write_text(GOOD)
    (package / "helpers.py").write_text("tool = None\n")
    (package / "bad.py").write_text(BAD)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mine.py").write_text(TEST)
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "ignored.py").write_text("from vpsshop.db import Database\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("vpsshop_mine", None)


def lines(violations: list[ImportViolation], root: Path) -> list[str]:
    return [f"{v.path.relative_to(root)}:{v.line}" for v in violations]


def test_a_clean_module_has_no_violation(plugin: Path) -> None:
    assert check_public_imports(plugin / "vpsshop_mine" / "__init__.py") == []


def test_every_import_past_the_public_api_is_found_with_its_line(plugin: Path) -> None:
    found = check_public_imports(plugin / "vpsshop_mine" / "bad.py")
    by_line = {v.line: v.message for v in found}
    assert sorted(by_line) == [6, 7, 8, 9, 12, 16, 17, 18, 21], [str(v) for v in found]
    assert by_line[6].startswith("imports vpsshop.settings, an internal module (public: vpsshop.__all__")
    assert by_line[7].startswith("imports vpsshop.Database, which is not in vpsshop.__all__")
    assert by_line[8].startswith("imports vpsshop.hdkeys, an internal module")
    assert by_line[9].startswith("imports vpsshop.chains.not_a_kit_name, which is not in vpsshop.chains.__all__")
    assert by_line[12].startswith("imports vpsshop.context, an internal module")  # under TYPE_CHECKING
    assert by_line[16].startswith("imports vpsshop.servers, an internal module")  # inside a function
    assert by_line[17].startswith("imports vpsshop.ledger, an internal module")  # importlib.import_module
    assert by_line[18].startswith("imports vpsshop.db, which is not in vpsshop.__all__")  # vpsshop.db.Database
    assert by_line[21] == "imports vpsshop.testing outside the plugin's tests (it needs pytest; tests only)"
    assert str(found[0]) == f"{plugin / 'vpsshop_mine' / 'bad.py'}:6: {by_line[6]}"


def test_vpsshop_testing_is_public_in_tests_only(plugin: Path) -> None:
    [violation] = check_public_imports(plugin / "tests")
    assert violation.line == 4
    assert violation.message.startswith("imports vpsshop.testing.TestAccount, which is not in vpsshop.testing.__all__")


def test_a_package_a_module_name_and_a_directory(plugin: Path) -> None:
    package = lines(check_public_imports(plugin / "vpsshop_mine"), plugin)
    assert package == [f"vpsshop_mine/bad.py:{n}" for n in (6, 7, 8, 9, 12, 16, 17, 18, 21)]
    assert lines(check_public_imports("vpsshop_mine"), plugin) == package  # found, not imported
    assert "vpsshop_mine" not in sys.modules
    module = importlib.import_module("vpsshop_mine")
    assert lines(check_public_imports(module), plugin) == package
    project = lines(check_public_imports(plugin), plugin)  # tests/ included, .venv skipped
    assert project == ["tests/test_mine.py:4", *package]


def test_assert_public_imports_lists_each_violation(plugin: Path) -> None:
    assert_public_imports(plugin / "vpsshop_mine" / "__init__.py")
    with pytest.raises(AssertionError) as failed:
        assert_public_imports(plugin / "vpsshop_mine")
    message = str(failed.value)
    assert message.startswith("9 import(s) outside vpsshop's public API")
    assert f"  {plugin / 'vpsshop_mine' / 'bad.py'}:8: imports vpsshop.hdkeys, an internal module" in message


def test_a_target_that_is_nothing_is_refused(tmp_path: Path) -> None:
    for target in ("vpsshop_no_such_plugin", str(tmp_path / "nowhere"), "no.such.module"):
        with pytest.raises(ValueError, match="neither a file, a directory nor an importable module"):
            check_public_imports(target)


def test_a_file_that_does_not_parse_is_a_violation(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(textwrap.dedent("def f(:\n    pass\n"))
    [violation] = check_public_imports(broken)
    assert violation.line == 1 and violation.message.startswith("cannot be read to check its imports")
