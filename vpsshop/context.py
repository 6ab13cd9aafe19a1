"""The application context: settings, database, plugins and the components they provide.

Built by :func:`vpsshop.assembly.build_context`, once per app or worker. It is what every hook
receives and what every service takes first. It holds the settings, the database and the plugin
components, and nothing of the modules above it: each service keeps its own per-shop state with
:meth:`AppContext.state`.

"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pluggy

from vpsshop.catalog import Catalog, CatalogData
from vpsshop.clock import Clock
from vpsshop.coins import PaymentCoin
from vpsshop.component import Component
from vpsshop.db import Database
from vpsshop.dns import DnsProvider
from vpsshop.hypervisor import HypervisorBackend
from vpsshop.rates import RateSource
from vpsshop.settings import Settings

log = logging.getLogger("vpsshop")

T = TypeVar("T")


class StateKey(Generic[T]):
    """The name of one module's per-app state (:meth:`AppContext.state`); typed by what it holds.

    A module declares its key once (``ENGINE: StateKey[PaymentEngine] = StateKey("payments")``) and
    asks ``ctx.state(ENGINE, PaymentEngine)``: the context keeps the value without knowing its type,
    so the context imports no module above it.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"StateKey({self.name!r})"


@dataclass(frozen=True)
class Registered:
    """A class offered by a plugin through a ``vpsshop_register_*`` hook."""

    key: str
    cls: type[Component[Any]]
    """The class as the hook returned it: a subclass of the hook's base (:mod:`vpsshop.hookspecs`)."""
    plugin: str


@dataclass(frozen=True)
class LoadedComponent:
    kind: str
    key: str
    plugin: str
    component: Component[Any] | None
    """None when the sandbox runs without a component of this kind (health reports it)."""


@dataclass
class AppContext:
    settings: Settings
    pm: pluggy.PluginManager
    db: Database
    clock: Clock
    coins: dict[str, PaymentCoin[Any]]
    hypervisor: HypervisorBackend | None
    catalog_data: CatalogData
    catalog: Catalog
    rate_source: RateSource[Any] | None
    loaded: list[LoadedComponent]
    registered: dict[str, dict[str, Registered]]
    extras: dict[str, Any] = field(default_factory=dict)
    """Room for plugins to keep per-app state, under their own plugin name. Core keeps nothing here:
    its services keep theirs with :meth:`state`."""
    dns: DnsProvider | None = None
    """The reverse-DNS provider named by ``dns.provider``; None when the shop names none."""

    _state: dict[StateKey[Any], Any] = field(default_factory=dict, repr=False)
    _state_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def state(self, key: StateKey[T], build: Callable[[AppContext], T]) -> T:
        """The per-app state of ``key``, built by ``build(ctx)`` on first use (once, whichever thread asks first).

        Each service keeps what it needs for one shop here (the payment engine, the rate limiters'
        counters, caches) under a key of its own, instead of a field of the context.
        """
        found: T | None = self._state.get(key)
        if found is not None:
            return found
        with self._state_lock:
            if key not in self._state:
                self._state[key] = build(self)
            value: T = self._state[key]
            return value

    def put(self, key: StateKey[T], value: T) -> T:
        """Set the per-app state of ``key`` (what the app factory builds for its front ends)."""
        with self._state_lock:
            self._state[key] = value
        return value

    def components(self) -> Iterator[LoadedComponent]:
        return iter(self.loaded)

    def serves_location(self, location_id: str) -> bool:
        """Whether servers can be made in this catalog location: the hypervisor has hosts there (any
        location without a backend, as in a sandbox without one). Orders elsewhere are a 409."""
        return self.hypervisor is None or self.hypervisor.serves(location_id)

    def offers_os(self, location_id: str, os_image: str) -> bool:
        """Whether some host of this location holds the OS's base image, as the backend last saw it
        (``vpsshop images status``). Orders for an OS no host there holds are a 409 ``os_unavailable``."""
        return self.hypervisor is None or self.hypervisor.offers(location_id, os_image)

    def orderable_systems(self, location_id: str) -> list[str]:
        """The catalog's OS ids whose image some host of the location holds, in catalog order."""
        return [o.id for o in self.catalog_data.operating_systems if self.offers_os(location_id, o.image)]

    def unoffered_systems(self) -> dict[str, list[str]]:
        """Served location id -> the catalog OS ids it cannot offer (no host there holds the image)."""
        found = {}
        for loc in self.catalog_data.locations:
            if self.serves_location(loc.id):
                missing = [o.id for o in self.catalog_data.operating_systems if not self.offers_os(loc.id, o.image)]
                if missing:
                    found[loc.id] = missing
        return found

    def current_catalog(self) -> Catalog:
        """``GET /v1/catalog``: the catalog with each location's orderable systems as the hosts hold them now."""
        offered = {loc.id: self.orderable_systems(loc.id) for loc in self.catalog.locations}
        if all(loc.operating_systems == offered[loc.id] for loc in self.catalog.locations):
            return self.catalog
        locations = [loc.model_copy(update={"operating_systems": offered[loc.id]}) for loc in self.catalog.locations]
        return self.catalog.model_copy(update={"locations": locations})

    async def close(self) -> None:
        for item in self.loaded:
            if item.component is not None:
                try:
                    await item.component.close()
                except Exception:
                    log.exception("closing %s %s failed", item.kind, item.key)
        await self.db.close_readers()
        self.db.dispose()
