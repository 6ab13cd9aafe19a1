"""Loading plugins: core's own hooks by module, every plugin from the ``vpsshop`` entry-point group.

The default plugins (``plugins/`` in the source tree) are entry points of the ``vpsshop``
distribution itself, declared in its ``pyproject.toml`` exactly as a third-party plugin declares
its own: core names none of them. They are loaded even when third-party entry points are not
(``entry_points=False``), so tests and embedding code get a complete shop without the other
installed plugins.

Every call of :func:`build_plugin_manager` makes a new manager, so two apps in one process (tests,
a reseller running two shops) never share plugins. Nothing is loaded at import time.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Iterable
from typing import Any

import pluggy

from vpsshop import hookspecs
from vpsshop.context import Registered
from vpsshop.errors import StartupError

ENTRY_POINT_GROUP = "vpsshop"
BLOCK_ENV = "VPSSHOP_BLOCK_PLUGINS"

CORE_PLUGINS: tuple[tuple[str, str], ...] = (
    # core's own background work, offered through the hooks like any plugin's
    ("payments", "vpsshop.payments.hooks"),
    ("x402-settlements", "vpsshop.x402.hooks"),
    ("servers", "vpsshop.servers.hooks"),
    ("events", "vpsshop.events.hooks"),
)
"""(name, module) of core's own hook implementations, registered by module."""


def default_plugins() -> tuple[tuple[str, str], ...]:
    """(entry-point name, module) of the plugins the ``vpsshop`` distribution itself declares in
    the ``vpsshop`` entry-point group (the default plugins). Empty when vpsshop is not installed
    (imported from a source tree without ``pip install``)."""
    try:
        dist = importlib.metadata.distribution("vpsshop")
    except importlib.metadata.PackageNotFoundError:
        return ()
    return tuple((ep.name, ep.value) for ep in dist.entry_points if ep.group == ENTRY_POINT_GROUP)


DEFAULT_PLUGINS: tuple[tuple[str, str], ...] = CORE_PLUGINS + default_plugins()
"""Core's own hooks and the default plugins, by (name, module). They are registered by name
first, under the names their entry points use, so they are never registered twice."""


def blocked_from_env(environ: os._Environ[str] | dict[str, str] | None = None) -> list[str]:
    """Plugin names listed in ``VPSSHOP_BLOCK_PLUGINS`` (comma or space separated)."""
    raw = (environ if environ is not None else os.environ).get(BLOCK_ENV, "")
    return [name for name in raw.replace(",", " ").split() if name]


def build_plugin_manager(
    *,
    blocked: Iterable[str] = (),
    modules: Iterable[str] = (),
    extra: Iterable[Any] = (),
    entry_points: bool = True,
) -> pluggy.PluginManager:
    """A new plugin manager with the default plugins, ``modules``, ``extra`` objects and entry points.

    :param blocked: plugin names never to register (default or entry-point names).
    :param modules: importable module names to register as plugins (a one-file plugin on
        ``sys.path``, named by the ``plugins.modules`` setting).
    :param extra: plugin objects to register directly (tests).
    :param entry_points: load the ``vpsshop`` entry-point group.
    :raises StartupError: a hook implementation that matches no hook or has wrong arguments.
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in blocked:
        pm.set_blocked(name)
    try:
        for name, module in DEFAULT_PLUGINS:
            if not pm.is_blocked(name) and pm.get_plugin(name) is None:
                pm.register(_load_entry(module), name=name)
        for module in modules:
            if not pm.is_blocked(module):
                pm.register(_import_plugin_module(module), name=module)
        for plugin in extra:
            pm.register(plugin)
        if entry_points:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise StartupError(
            f"plugin {exc.plugin!r} is invalid: {exc}. Hook implementations must be named after a "
            f"hook in vpsshop.hookspecs (see docs/hooks.md) and take only that hook's arguments."
        ) from None
    return pm


def _load_entry(value: str) -> Any:
    """The object an entry-point value names (``module`` or ``module:attribute``)."""
    module, _, attribute = value.partition(":")
    loaded = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        loaded = getattr(loaded, part)
    return loaded


def _import_plugin_module(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise StartupError(f"plugin module {module!r} (setting plugins.modules) cannot be imported: {exc}") from None


def collect_classes(pm: pluggy.PluginManager, hook_name: str, key_attr: str, label: str) -> dict[str, Registered]:
    """Call a registration hook plugin by plugin and index the classes by ``key_attr``.

    :raises StartupError: a class without its identifier, or two plugins claiming one identifier
        (the message names both plugins and both classes).
    """
    found: dict[str, Registered] = {}
    caller = getattr(pm.hook, hook_name)
    for impl in reversed(caller.get_hookimpls()):  # registration order
        for cls in impl.function() or ():
            key = getattr(cls, key_attr, None)
            if not isinstance(key, str) or not key:
                raise StartupError(
                    f"plugin {impl.plugin_name!r} offers {_qualname(cls)} through {hook_name} "
                    f"without a {key_attr!r} class attribute"
                )
            if key in found and found[key].cls is not cls:
                first = found[key]
                raise StartupError(
                    f"{label} {key!r} is claimed by two plugins: {first.plugin!r} ({_qualname(first.cls)}) "
                    f"and {impl.plugin_name!r} ({_qualname(cls)}). Uninstall one, or block it with "
                    f"{BLOCK_ENV}={impl.plugin_name}"
                )
            found[key] = Registered(key, cls, impl.plugin_name)
    return found


def _qualname(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


def describe_plugins(pm: pluggy.PluginManager) -> list[dict[str, Any]]:
    """What ``vpsshop plugins`` prints: each plugin, where it comes from, which hooks it implements."""
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    default_names = {name for name, _ in DEFAULT_PLUGINS}
    rows = []
    for name, plugin in sorted(pm.list_name_plugin(), key=lambda item: item[0]):
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        if dist is not None:
            origin = f"entry point of {dist.project_name} {dist.version}"
        elif name in default_names:
            origin = "default plugin"
        else:
            origin = "registered directly"
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])
        rows.append(
            {
                "name": name,
                "module": getattr(plugin, "__name__", type(plugin).__name__),
                "file": getattr(plugin, "__file__", None),
                "origin": origin,
                "hooks": hooks,
            }
        )
    return rows
