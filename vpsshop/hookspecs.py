"""The hooks through which plugins extend vpsshop.

Every hook is named ``vpsshop_<what>`` so that a plugin's implementations can be found with grep.
Plugin authors never import this module: they write ``from vpsshop import hookimpl`` and decorate
functions whose names match the specs below. A function decorated with ``hookimpl`` whose name
matches no spec stops start-up (see :func:`vpsshop.plugins.build_plugin_manager`).

Registration hooks (``vpsshop_register_*``) return *classes*. Core builds the instances from the
settings, so a plugin never reads configuration files itself and two plugins that claim the same
identifier (two classes with ``code = "BTC"``) are refused at start-up with a message naming both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vpsshop.markers import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:  # pragma: no cover - imports for type checkers only
    from vpsshop.catalog import CatalogSource
    from vpsshop.coins import PaymentCoin
    from vpsshop.context import AppContext
    from vpsshop.dns import DnsProvider
    from vpsshop.events import Event
    from vpsshop.hypervisor import HypervisorBackend
    from vpsshop.rates import RateSource
    from vpsshop.routing import ApiRoute
    from vpsshop.tasks import BackgroundTask

__all__ = ["PROJECT", "hookimpl", "hookspec"]  # the markers (vpsshop.markers), and the specs below


@hookspec
def vpsshop_register_coins() -> Iterable[type[PaymentCoin[Any]]]:  # type: ignore[empty-body]  # a hook specification: pluggy reads its signature, never calls it
    """Offer payment coin classes.

    Called once per :func:`vpsshop.create_app` (and once per ``vpsshop worker``), while the plugin
    manager is being built and before any setting is read.

    :return: an iterable of subclasses of :class:`vpsshop.PaymentCoin`. Each class carries a
        unique ``code`` (``"BTC"``, ``"XMR"``, ...). Core instantiates the classes whose coin is
        enabled in the settings, passing the validated ``Config`` of that coin. Returning a class
        whose ``code`` another plugin also returns stops start-up with an error naming both
        plugins.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_register_hypervisors() -> Iterable[type[HypervisorBackend]]:  # type: ignore[empty-body]  # a hook specification: pluggy reads its signature, never calls it
    """Offer hypervisor backend classes.

    Called once per :func:`vpsshop.create_app`, before settings are read.

    :return: an iterable of subclasses of :class:`vpsshop.HypervisorBackend`, each with a unique
        ``kind`` (``"libvirt"``). Core instantiates the backend named by the ``hypervisor.backend``
        setting. Two classes with one ``kind`` stop start-up with an error naming both plugins.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_register_catalog_sources() -> Iterable[type[CatalogSource[Any]]]:  # type: ignore[empty-body]  # a hook specification: pluggy reads its signature, never calls it
    """Offer catalog source classes.

    Called once per :func:`vpsshop.create_app`, before settings are read.

    :return: an iterable of subclasses of :class:`vpsshop.CatalogSource`, each with a unique
        ``name``. Core uses the one named by the ``catalog.source`` setting (``"file"``, the
        default plugin, unless the reseller chooses another) and computes prices from what it
        loads; a source never computes prices itself.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_register_rate_sources() -> Iterable[type[RateSource[Any]]]:  # type: ignore[empty-body]  # a hook specification: pluggy reads its signature, never calls it
    """Offer exchange-rate source classes.

    Called once per :func:`vpsshop.create_app`, before settings are read.

    :return: an iterable of subclasses of :class:`vpsshop.RateSource`, each with a unique
        ``name``. Core uses the one named by the ``rates.source`` setting (``"fixed"`` in the
        sandbox). Core caches its answers and enforces ``rates.max_age_seconds``; a source only
        fetches.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_register_dns_providers() -> Iterable[type[DnsProvider]]:  # type: ignore[empty-body]  # a hook specification: pluggy reads its signature, never calls it
    """Offer DNS provider classes (reverse DNS of servers' addresses).

    Called once per :func:`vpsshop.create_app`, before settings are read.

    :return: an iterable of subclasses of :class:`vpsshop.DnsProvider`, each with a unique
        ``name`` (``"powerdns"``). Core instantiates the one named by the ``dns.provider`` setting,
        if any (without it reverse DNS is not offered), and calls its ``set_ptr`` and ``clear_ptr``
        from server jobs. Two classes with one ``name`` stop start-up with an error naming both
        plugins.

    .. versionadded:: 1.1
    """


@hookspec
def vpsshop_routes(ctx: AppContext) -> Iterable[ApiRoute]:  # type: ignore[empty-body]  # a hook specification: pluggy reads its signature, never calls it
    """Add HTTP endpoints under the ``/v1`` base path.

    Called once per :func:`vpsshop.create_app`, after every registered class has been
    instantiated, so ``ctx`` already holds the coins, the hypervisor, the catalog and the database.

    :param ctx: the application context being assembled.
    :return: an iterable of :class:`vpsshop.ApiRoute`. Their request and response models appear in
        the OpenAPI document automatically. A path and method that another route already serves
        stops start-up.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_startup(ctx: AppContext) -> Any:
    """Run code when the service or a worker starts.

    Called in the application's lifespan (or at the start of ``vpsshop worker``) after the database
    schema is current and before the first request is served. May be a coroutine function; core
    awaits it. An exception stops start-up.

    :param ctx: the application context.
    :return: ignored.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_shutdown(ctx: AppContext) -> Any:
    """Release what :func:`vpsshop_startup` acquired.

    Called once when the service or worker stops, after background tasks have been cancelled. May
    be a coroutine function. Exceptions are logged and do not stop other plugins' shutdown.

    :param ctx: the application context.
    :return: ignored.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_background_tasks(ctx: AppContext) -> Iterable[BackgroundTask]:  # type: ignore[empty-body]  # a hook specification: pluggy reads its signature, never calls it
    """Declare periodic work (watching chains, provisioning servers, renewals).

    Called once when background work starts: inside ``vpsshop serve`` (unless ``--no-worker``)
    and in ``vpsshop worker``. Several processes may run the same task against one database at
    once, so a task must be safe to run concurrently with itself (claim rows in the database;
    never rely on being the only runner).

    :param ctx: the application context.
    :return: an iterable of :class:`vpsshop.BackgroundTask`. Names must be unique.

    .. versionadded:: 1.0
    """


@hookspec
def vpsshop_event(ctx: AppContext, event: Event) -> Any:
    """Act on an event (a top-up completed, a server suspended...) without polling.

    Called by the worker (``vpsshop worker``, or ``vpsshop serve`` with background tasks) after the
    change has committed, once per event and plugin, in the order the events happened. Each plugin
    reads the outbox from its own cursor, so it sees every event **at least once**: after a worker
    crash an event may come again (``event.id`` identifies it). A plugin installed later starts at
    the newest event.

    An exception is logged and the same event is offered again after ``events.hook_retry_seconds``
    (doubling), up to ``events.hook_max_attempts`` calls, then skipped with an error in the log. A
    failing plugin holds back only itself: webhook deliveries and other plugins go on. A plain
    function runs in a worker thread (blocking I/O is fine); a coroutine function is awaited.

    :param ctx: the application context (``ctx.db`` for the plugin's own tables, ``ctx.settings``).
    :param event: a :class:`vpsshop.Event`: ``id`` (``evt_...``), ``type`` (``"topup.completed"``,
        see ``docs/events.md``), ``timestamp``, ``account_id``, ``data`` (the resource as the API
        shows it, ``data["object"]`` naming it) and ``body`` (the JSON a webhook receives).
    :return: ignored.

    .. versionadded:: 1.1
    """
