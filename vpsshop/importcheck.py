"""Does a plugin import only vpsshop's public API? (``vpsshop.testing.check_public_imports``)

The public API, stable within a major version (docs/plugins.md, "What a plugin may import"):

* the names in ``vpsshop.__all__``;
* ``vpsshop.chains``, the chain kit for coin plugins (the names in its ``__all__``);
* ``vpsshop.testing``, the fixtures and contract kits (its ``__all__``): in a plugin's tests only,
  never in the code a shop runs (it needs pytest, which ``pip install vpsshop`` does not bring).

Every other module of vpsshop is internal and may change in any release. The check reads the
files with :mod:`ast` and never imports them, so it sees every import: at module level, inside
functions, under ``TYPE_CHECKING``, ``import vpsshop`` followed by ``vpsshop.<name>``, and
``importlib.import_module("vpsshop....")`` with a literal name.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PUBLIC_SUBMODULES = ("vpsshop.chains", "vpsshop.testing")
"""The modules of vpsshop a plugin may import besides ``vpsshop`` itself."""
TESTS_ONLY = frozenset({"vpsshop.testing"})
"""Public modules a plugin may import in its tests only."""
SKIPPED_DIRECTORIES = frozenset({"__pycache__", "build", "dist", "node_modules", "site-packages"})
"""Directories never read (besides those whose name starts with a dot: ``.venv``, ``.git``)."""
_PUBLIC = "vpsshop.__all__, vpsshop.chains, and vpsshop.testing in tests"


@dataclass(frozen=True)
class ImportViolation:
    """One import of a name that is not part of vpsshop's public API."""

    path: Path
    line: int
    message: str
    """What is wrong and what is public instead: ``imports internal module vpsshop.hdkeys``."""

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def public_names() -> dict[str, frozenset[str]]:
    """Each public module of vpsshop and the names it offers (its ``__all__``)."""
    modules = {"vpsshop": importlib.import_module("vpsshop")}
    modules.update((name, importlib.import_module(name)) for name in PUBLIC_SUBMODULES)
    return {name: frozenset(getattr(module, "__all__", ())) for name, module in modules.items()}


def is_test_file(path: Path) -> bool:
    """A file of a test suite: ``test_*.py``, ``*_test.py``, ``conftest.py``, or any file under a
    directory named ``tests`` or ``test``."""
    name = path.name
    if name == "conftest.py" or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"):
        return True
    return any(part in ("tests", "test") for part in path.parent.parts)


def check_public_imports(target: ModuleType | str | os.PathLike[str]) -> list[ImportViolation]:
    """Every import of vpsshop's non-public API in a plugin's source, in file and line order.

    :param target: a package or module (``import vpsshop_mine; check_public_imports(vpsshop_mine)``),
        an importable module name (``"vpsshop_mine"``: found, not imported), or a path: a
        ``.py`` file, or a directory read recursively (a package, or a whole project with its
        ``tests/``; directories starting with a dot, ``build``, ``dist`` and ``site-packages`` are
        skipped).
    :return: one :class:`ImportViolation` per offending import (``str()`` of it reads
        ``path:line: message``); empty when the plugin keeps to the public API. ``vpsshop.testing``
        counts as public in test files (:func:`is_test_file`) only.
    :raises ValueError: ``target`` names no file, directory or importable module.
    """
    public = public_names()
    violations: list[ImportViolation] = []
    for path, root in _files(target):
        relative = path.relative_to(root) if root in path.parents else Path(path.name)
        violations.extend(_check_file(path, public, tests=is_test_file(relative)))
    return violations


def assert_public_imports(target: ModuleType | str | os.PathLike[str]) -> None:
    """Fail (``AssertionError``) listing each import of non-public API as ``path:line: message``.

    For a plugin's test suite::

        import vpsshop_mine
        from vpsshop.testing import assert_public_imports

        def test_imports_only_the_public_api():
            assert_public_imports(vpsshop_mine)
    """
    violations = check_public_imports(target)
    if violations:
        lines = "\n".join(f"  {violation}" for violation in violations)
        raise AssertionError(
            f"{len(violations)} import(s) outside vpsshop's public API (vpsshop.__all__, vpsshop.chains, "
            f"and vpsshop.testing in tests; see docs/plugins.md):\n{lines}"
        )


def _files(target: ModuleType | str | os.PathLike[str]) -> Iterator[tuple[Path, Path]]:
    """(file, the root it was found under) for every ``.py`` file of ``target``."""
    roots: list[Path]
    if isinstance(target, ModuleType):
        if hasattr(target, "__path__"):
            roots = [Path(p) for p in target.__path__]
        elif getattr(target, "__file__", None):
            roots = [Path(str(target.__file__))]
        else:
            raise ValueError(f"module {target.__name__} has no source files to check")
    elif Path(target).exists():
        roots = [Path(target)]
    elif isinstance(target, str) and all(part.isidentifier() for part in target.split(".")):
        try:
            spec = importlib.util.find_spec(target)
        except ImportError:
            spec = None
        if spec is None:
            raise ValueError(f"{target!r} is neither a file, a directory nor an importable module")
        if spec.submodule_search_locations:
            roots = [Path(p) for p in spec.submodule_search_locations]
        elif spec.origin:
            roots = [Path(spec.origin)]
        else:
            raise ValueError(f"module {target!r} has no source files to check")
    else:
        raise ValueError(f"{target!r} is neither a file, a directory nor an importable module")
    for root in roots:
        root = root.resolve()
        if root.is_file():
            yield root, root.parent
            continue
        for directory, subdirectories, files in os.walk(root):
            subdirectories[:] = sorted(
                d for d in subdirectories if not d.startswith(".") and d not in SKIPPED_DIRECTORIES
            )
            for name in sorted(files):
                if name.endswith(".py"):
                    yield Path(directory) / name, root


def _check_file(path: Path, public: Mapping[str, frozenset[str]], *, tests: bool) -> Iterator[ImportViolation]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        yield ImportViolation(path, getattr(exc, "lineno", None) or 1, f"cannot be read to check its imports: {exc}")
        return
    checker = _Checker(path, public, tests)
    checker.visit(tree)
    yield from sorted(checker.found, key=lambda v: v.line)


class _Checker(ast.NodeVisitor):
    def __init__(self, path: Path, public: Mapping[str, frozenset[str]], tests: bool) -> None:
        self.path = path
        self.public = public
        self.tests = tests
        self.found: list[ImportViolation] = []
        self.aliases: dict[str, str] = {}
        """Local names bound to a vpsshop module by ``import vpsshop[.x] [as y]``."""

    def report(self, node: ast.stmt | ast.expr, message: str) -> None:
        self.found.append(ImportViolation(self.path, node.lineno, message))

    def check_module(self, node: ast.stmt | ast.expr, module: str) -> bool:
        """Whether ``module`` (``vpsshop`` or below) may be imported here; reports it when not."""
        if module in self.public and (self.tests or module not in TESTS_ONLY):
            return True
        if module in TESTS_ONLY:
            self.report(node, f"imports {module} outside the plugin's tests (it needs pytest; tests only)")
        else:
            self.report(node, f"imports {module}, an internal module (public: {_PUBLIC})")
        return False

    def check_name(self, node: ast.stmt | ast.expr, module: str, name: str) -> None:
        """``module.name``, where ``module`` is public: the name must be in its ``__all__`` (or be
        a public submodule of ``vpsshop``)."""
        full = f"{module}.{name}"
        if full in self.public:
            self.check_module(node, full)
        elif name != "*" and name not in self.public[module]:
            self.report(node, f"imports {full}, which is not in {module}.__all__ (public: {_PUBLIC})")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not (alias.name == "vpsshop" or alias.name.startswith("vpsshop.")):
                continue
            if self.check_module(node, alias.name):
                # `import vpsshop.chains` binds `vpsshop`; `import vpsshop.chains as kit` binds `kit`
                self.aliases[alias.asname or "vpsshop"] = alias.name if alias.asname else "vpsshop"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or not (module == "vpsshop" or module.startswith("vpsshop.")):
            return
        if self.check_module(node, module):
            for alias in node.names:
                self.check_name(node, module, alias.name)
                if f"{module}.{alias.name}" in self.public:
                    self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"

    def visit_Attribute(self, node: ast.Attribute) -> None:
        """``vpsshop.<name>`` (and ``vpsshop.chains.<name>``) after ``import vpsshop``."""
        chain: list[str] = []
        value: ast.expr = node
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.aliases:
            module = self.aliases[value.id]
            for attr in reversed(chain):
                if f"{module}.{attr}" not in self.public:
                    self.check_name(node, module, attr)
                    break
                module = f"{module}.{attr}"
                if not self.check_module(node, module):
                    break
            return  # the whole chain is checked: do not visit its inner attributes again
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        """``importlib.import_module("vpsshop.x")`` and ``__import__("vpsshop.x")`` with a literal."""
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                module = first.value
                if module == "vpsshop" or module.startswith("vpsshop."):
                    self.check_module(node, module)
        self.generic_visit(node)
