"""The import graph: default plugins use only vpsshop's public API, and core imports in one direction.

The public API (docs/plugins.md, "What a plugin may import"): the names in ``vpsshop.__all__``,
``vpsshop.chains`` (the chain kit) and ``vpsshop.testing`` (fixtures and contract kits, in tests).
Every other module of ``vpsshop`` is internal. The default plugins and the example plugins are held
to it by the check a third-party plugin runs on itself (``vpsshop.testing.assert_public_imports``,
tested in tests/test_importcheck.py). Imports are read with :mod:`ast`, so an import inside a
function or under ``TYPE_CHECKING`` (an import for type annotations only) counts too: core's modules
form no cycle, not even through type annotations, and import only from their own layer or below
(:data:`LAYERS`, docs/architecture.md).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import vpsshop
import vpsshop.chains
import vpsshop.testing
from vpsshop.testing import assert_public_imports

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "plugins"
CORE = ROOT / "vpsshop"
PUBLIC_MODULES = {
    "vpsshop": set(vpsshop.__all__),
    "vpsshop.chains": set(vpsshop.chains.__all__),
    "vpsshop.testing": set(vpsshop.testing.__all__),
}


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


PLUGIN_PACKAGES = sorted(path for path in PLUGINS.iterdir() if (path / "__init__.py").is_file())
EXAMPLE_PLUGINS = sorted(path for path in (ROOT / "examples").iterdir() if (path / "pyproject.toml").is_file())


@pytest.mark.parametrize("package", PLUGIN_PACKAGES, ids=lambda path: path.name)
def test_default_plugins_import_only_the_public_api(package: Path) -> None:
    """The check a third-party plugin runs on itself (``vpsshop.testing.assert_public_imports``)."""
    assert_public_imports(package)


@pytest.mark.parametrize("project", EXAMPLE_PLUGINS, ids=lambda path: path.name)
def test_example_plugins_and_their_tests_import_only_the_public_api(project: Path) -> None:
    assert_public_imports(project)


def test_every_default_plugin_is_checked() -> None:
    declared = {ep.value.split(":")[0] for ep in entry_points(group="vpsshop") if ep.dist and ep.dist.name == "vpsshop"}
    assert declared == {path.name for path in PLUGIN_PACKAGES}


def test_public_names_exist() -> None:
    for module, names in PUBLIC_MODULES.items():
        loaded = __import__(module, fromlist=["_"])
        assert [name for name in names if not hasattr(loaded, name)] == [], module


def core_graph() -> dict[str, set[str]]:
    """Every import between vpsshop's modules: at module level, inside functions and under
    ``TYPE_CHECKING``. ``from a import b`` is an edge to ``a.b`` when that is a module, else to ``a``."""
    modules = {module_name(path): path for path in CORE.rglob("*.py") if "migrations" not in path.parts}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.append(full if full in modules else node.module)
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


def test_core_imports_have_no_cycle_counting_type_only_imports() -> None:
    """Not one cycle among core's modules, counting the imports inside functions and those made only
    for type annotations: each module can be read, tested and replaced from the bottom up."""
    assert cycles(core_graph()) == []


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles between core's packages (``vpsshop.servers`` as one node) and top-level modules."""

    def node(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 or (CORE / parts[-1]).is_dir() else module

    packages: dict[str, set[str]] = {}
    for source, targets in graph.items():
        packages.setdefault(node(source), set()).update(node(t) for t in targets if node(t) != node(source))
    for targets in list(packages.values()):
        for target in targets:
            packages.setdefault(target, set())
    return cycles(packages)


def test_core_packages_have_no_cycle() -> None:
    """A package (servers/, payments/, x402/, events/ ...) depends on another one way only."""
    assert package_cycles(core_graph()) == []


LAYERS: list[tuple[str, set[str]]] = [
    (
        "foundation: values, tables, errors, inputs, who acts",
        {
            "vpsshop.version",
            "vpsshop.clock",
            "vpsshop.errors",
            "vpsshop.money",
            "vpsshop.models",
            "vpsshop.auth",
            "vpsshop.authcache",
            "vpsshop.hdkeys",
            "vpsshop.cloudinit",
            "vpsshop.qrcodes",
            "vpsshop.actors",
            "vpsshop.markers",
            "vpsshop.inputs",
            "vpsshop.idempotency",
        },
    ),
    (
        "platform: settings, database, the plugin contracts and the context that holds them",
        {
            "vpsshop.settings",
            "vpsshop.logs",
            "vpsshop.httpserver",
            "vpsshop.db",
            "vpsshop.backup",
            "vpsshop.component",
            "vpsshop.coins",
            "vpsshop.hypervisor",
            "vpsshop.catalog",
            "vpsshop.rates",
            "vpsshop.dns",
            "vpsshop.tasks",
            "vpsshop.chains",
            "vpsshop.push",
            "vpsshop.plugin_state",
            "vpsshop.context",
            "vpsshop.encryption",
            "vpsshop.ratelimit",
            "vpsshop.readiness",
            "vpsshop.metrics",
        },
    ),
    (
        "operations: the services every front end calls",
        {
            "vpsshop.events",
            "vpsshop.ledger",
            "vpsshop.limits",
            "vpsshop.accounts",
            "vpsshop.sessions",
            "vpsshop.twofactor",
            "vpsshop.signin",
            "vpsshop.wallets",
            "vpsshop.payments",
            "vpsshop.x402",
            "vpsshop.topups",
            "vpsshop.deposits",
            "vpsshop.servers",
            "vpsshop.admin",
            "vpsshop.operators",
            "vpsshop.shopview",
            "vpsshop.images",
        },
    ),
    (
        "front ends: the REST API, the dashboard, MCP",
        {
            "vpsshop.accesslog",
            "vpsshop.routing",
            "vpsshop.openapi",
            "vpsshop.api",
            "vpsshop.dashboard",
            "vpsshop.mcp",
            "vpsshop.backoffice",
        },
    ),
    (
        "assembly: the plugin contract, loading plugins, the app, the command line, the public facade",
        {
            "vpsshop.hookspecs",
            "vpsshop.plugins",
            "vpsshop.assembly",
            "vpsshop.app",
            "vpsshop.cli",
            "vpsshop.testing",
            "vpsshop.importcheck",
            "vpsshop",
        },
    ),
]
"""Core's layers, bottom up: a module imports from its own layer and those below, never above."""


def layer_of(module: str) -> int:
    for number, (_, members) in enumerate(LAYERS):
        if module in members or any(module.startswith(member + ".") for member in members if member != "vpsshop"):
            return number
    raise AssertionError(f"{module} is in no layer of LAYERS: place it")


def test_core_imports_point_down_the_layers() -> None:
    graph = core_graph()
    upward = [
        f"{source} (layer {layer_of(source) + 1}) imports {target} (layer {layer_of(target) + 1})"
        for source, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(source)
    ]
    assert upward == []
