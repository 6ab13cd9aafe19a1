"""The import graph: default plugins use only vpsshop's public API, and core imports in one direction.

The public API (docs/plugins.md, "What a plugin may import"): the names in ``vpsshop.__all__``,
``vpsshop.chains`` (the chain kit) and ``vpsshop.testing`` (fixtures and contract kits). Every
other module of ``vpsshop`` is internal. Imports are read with :mod:`ast`, so an import inside a
function or under ``TYPE_CHECKING`` counts too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import vpsshop
import vpsshop.chains
import vpsshop.testing

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "plugins"
CORE = ROOT / "vpsshop"
PUBLIC_MODULES = {
    "vpsshop": set(vpsshop.__all__),
    "vpsshop.chains": set(vpsshop.chains.__all__),
    "vpsshop.testing": set(vpsshop.testing.__all__),
}

PENDING: dict[str, set[str]] = {}


def imports(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """(module, imported names, line) of every absolute import in a file; names are empty for
    ``import x``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, [alias.name for alias in node.names], node.lineno


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_default_plugins_import_only_the_public_api() -> None:
    problems, pending_seen = [], set()
    for path in sorted(PLUGINS.rglob("*.py")):
        where = str(path.relative_to(PLUGINS))
        for module, names, line in imports(path):
            if module != "vpsshop" and not module.startswith("vpsshop."):
                continue
            if module in PENDING.get(where, ()):
                pending_seen.add((where, module))
                continue
            if module not in PUBLIC_MODULES:
                problems.append(f"{where}:{line} imports internal module {module}")
                continue
            for name in names:
                if name not in PUBLIC_MODULES[module]:
                    problems.append(f"{where}:{line} imports {module}.{name}, which is not in its __all__")
    assert problems == []
    assert pending_seen == {(where, module) for where, modules in PENDING.items() for module in modules}, (
        "a PENDING exception is no longer needed: delete it"
    )


def test_public_names_exist() -> None:
    for module, names in PUBLIC_MODULES.items():
        loaded = __import__(module, fromlist=["_"])
        assert [name for name in names if not hasattr(loaded, name)] == [], module


def runtime_nodes(tree: ast.Module, late: bool) -> Iterator[ast.stmt]:
    """The import statements that run: module level, and with ``late`` those inside functions too;
    never those under ``if TYPE_CHECKING:``."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not late:
            if isinstance(node, ast.ClassDef):
                pending.extend(node.body)
        else:
            pending.extend(ast.iter_child_nodes(node))


def core_graph(late: bool = False) -> dict[str, set[str]]:
    """Imports between vpsshop's modules (``import a.b`` counts as an edge to a.b); with ``late``,
    imports inside functions count too."""
    modules = {module_name(path): path for path in CORE.rglob("*.py") if "migrations" not in path.parts}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in runtime_nodes(tree, late):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_default_plugin_module_is_imported_by_core() -> None:
    """Core names no plugin: no module of vpsshop imports a default plugin (they load through their
    entry points, see vpsshop.plugins)."""
    plugin_packages = {path.name for path in PLUGINS.iterdir() if (path / "__init__.py").is_file()}
    offenders = []
    for path in CORE.rglob("*.py"):
        for module, _, line in imports(path):
            if module.split(".")[0] in plugin_packages:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert offenders == []


def test_core_module_imports_have_no_cycle() -> None:
    """Package ``__init__`` re-exports aside (``vpsshop`` imports what it re-exports), core's
    module-level imports form no cycle."""
    graph = core_graph()
    graph["vpsshop"] = set()  # the public facade imports its parts; parts importing it is no cycle
    assert cycles(graph) == []


KNOWN_LATE_CYCLES: list[set[str]] = []
"""Cycles held apart only by imports inside functions. Each must go; the test fails when one is
gone and still listed, so the list only shrinks."""


def test_core_imports_have_no_cycle_counting_imports_inside_functions() -> None:
    graph = core_graph(late=True)
    graph["vpsshop"] = set()
    found = [set(c) for c in cycles(graph)]
    assert [c for c in found if not any(c <= known for known in KNOWN_LATE_CYCLES)] == []
    assert [known for known in KNOWN_LATE_CYCLES if not any(c <= known for c in found)] == [], (
        "a known cycle is gone: delete it from KNOWN_LATE_CYCLES"
    )
