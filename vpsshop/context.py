"""The application context: settings, database, plugins and the components they provide.

Built by :meth:`AppContext.build`, once per app or worker. It is what every hook receives and what
every endpoint reaches through ``call.ctx``.

Settings layout of the components (``docs/configuration.md``)::

    [coins.BTC]            # one table per enabled coin; production enables exactly these
    [hypervisor]  backend = "libvirt"   and   [hypervisor.libvirt]  its settings
    [catalog]     source = "file"       and   [catalog.file]        its settings
    [rates]       source = "kraken"     and   [rates.kraken]        its settings
    [dns]         provider = "powerdns" and   [dns.powerdns]        its settings (optional)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from vpsshop.catalog import Catalog, CatalogData, CatalogSource, PaymentOption, build_catalog
from vpsshop.clock import Clock
from vpsshop.coins import PaymentCoin, link_scan_groups
from vpsshop.component import Component, Readiness, ShopSecrets
from vpsshop.db import Database
from vpsshop.dns import DnsProvider
from vpsshop.errors import ConfigError, StartupError
from vpsshop.hypervisor import HypervisorBackend
from vpsshop.plugins import Registered, blocked_from_env, build_plugin_manager, collect_classes
from vpsshop.rates import RateSource
from vpsshop.settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.fernet import MultiFernet

    from vpsshop.dashboard.web import Dashboard
    from vpsshop.events.settings import EventSettings
    from vpsshop.payments.engine import PaymentEngine
    from vpsshop.ratelimit import RateLimiter
    from vpsshop.routing import ApiRoute, Reply

log = logging.getLogger("vpsshop")

MIN_TOPUP_CENTS = 25_00
MAX_TOPUP_CENTS = 2000_00


@dataclass(frozen=True)
class LoadedComponent:
    kind: str
    key: str
    plugin: str
    component: Component | None
    """None when the sandbox runs without a component of this kind (health reports it)."""


@dataclass
class AppContext:
    settings: Settings
    pm: pluggy.PluginManager
    db: Database
    clock: Clock
    coins: dict[str, PaymentCoin]
    hypervisor: HypervisorBackend | None
    catalog_data: CatalogData
    catalog: Catalog
    rate_source: RateSource | None
    loaded: list[LoadedComponent]
    registered: dict[str, dict[str, Registered]]
    extras: dict[str, Any] = field(default_factory=dict)
    """Room for plugins to keep per-app state, under their own plugin name. Core keeps nothing here:
    its services are the typed fields below."""
    dns: DnsProvider | None = None
    """The reverse-DNS provider named by ``dns.provider``; None when the shop names none."""

    # ---- core services and per-app memory, built on first use by the module named --------------------
    payments: PaymentEngine | None = None
    """Top-ups and payments (:func:`vpsshop.payments.engine_for`)."""
    routes: list[ApiRoute] = field(default_factory=list)
    """The API's routes, core's and plugins' (set by :func:`vpsshop.app.create_app`)."""
    openapi: dict[str, Any] = field(default_factory=dict)
    """This app's OpenAPI document, and the same as JSON bytes (``GET /v1/openapi.json``)."""
    openapi_json: bytes = b""
    dashboard: Dashboard | None = None
    """The customer dashboard when it is mounted (:func:`vpsshop.dashboard.mount_dashboard`)."""
    events_settings: EventSettings | None = None
    """``[events]`` checked once (:func:`vpsshop.events.settings.event_settings`)."""
    request_limiter: RateLimiter | None = None
    """The per-request limits' counters (:func:`vpsshop.limits.limiter`)."""
    shared_limiter: RateLimiter | None = None
    """The database limiter shared by every process (:func:`vpsshop.ratelimit.limiter_for`)."""
    auth_blocked: dict[str, float] = field(default_factory=dict)
    """Client address -> when its authentication-failure block ends (:mod:`vpsshop.limits`)."""
    fernet: MultiFernet | None = None
    """``encryption_key`` then ``old_encryption_keys`` (:func:`vpsshop.encryption.fernet`)."""
    catalog_json: bytes = b""
    """``GET /v1/catalog``'s body, rendered once."""
    llms_txt: bytes = b""
    """``GET /llms.txt``'s body, rendered once."""
    health: tuple[float, Reply] | None = None
    """The last ``GET /v1/health`` answer and when it was made (answered again for a few seconds)."""
    readiness: tuple[float, list[tuple[LoadedComponent, Readiness]]] | None = None
    """The components' last readiness checks and when they ran (shared by health and metrics)."""
    sqlite_order_lock: threading.Lock = field(default_factory=threading.Lock)
    """On SQLite, orders of this process queue here instead of on the database's write lock."""

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        pm: pluggy.PluginManager | None = None,
        clock: Clock | None = None,
        environ: dict[str, str] | None = None,
    ) -> AppContext:
        if pm is None:
            pm = build_plugin_manager(
                blocked=[*settings.plugins.disabled, *blocked_from_env(environ)],
                modules=settings.plugins.modules,
            )
        registered = {
            "coins": collect_classes(pm, "vpsshop_register_coins", "code", "coin"),
            "hypervisors": collect_classes(pm, "vpsshop_register_hypervisors", "kind", "hypervisor backend"),
            "catalog_sources": collect_classes(pm, "vpsshop_register_catalog_sources", "name", "catalog source"),
            "rate_sources": collect_classes(pm, "vpsshop_register_rate_sources", "name", "rate source"),
            "dns_providers": collect_classes(pm, "vpsshop_register_dns_providers", "name", "DNS provider"),
        }
        sandbox = settings.sandbox
        loaded: list[LoadedComponent] = []

        secrets = ShopSecrets(
            settings.encryption_key.get_secret_value(),
            tuple(k.get_secret_value() for k in settings.old_encryption_keys),
        )
        coins = _build_coins(settings, registered["coins"], loaded, secrets)
        link_scan_groups(coins.values())

        catalog_source = _build_named(
            settings.catalog,
            "source",
            "catalog",
            registered["catalog_sources"],
            sandbox,
            "catalog source",
            loaded,
            default="file",
            secrets=secrets,
        )
        assert isinstance(catalog_source, CatalogSource)
        try:
            catalog_data = catalog_source.load()
        except Exception as exc:  # noqa: BLE001 - any failure to load is a start-up error
            raise StartupError(f"catalog source {catalog_source.name!r} failed to load: {exc}") from None

        rate_source = _build_named(
            settings.rates,
            "source",
            "rates",
            registered["rate_sources"],
            sandbox,
            "rate source",
            loaded,
            optional_in_sandbox=True,
            secrets=secrets,
        )
        hypervisor = _build_named(
            settings.hypervisor,
            "backend",
            "hypervisor",
            registered["hypervisors"],
            sandbox,
            "hypervisor backend",
            loaded,
            optional_in_sandbox=True,
            default=sandbox_choice(registered["hypervisors"]) if sandbox else None,
            secrets=secrets,
        )
        dns = None
        if settings.dns.get("provider") is not None:  # optional everywhere: no provider, no reverse DNS
            dns = _build_named(
                settings.dns, "provider", "dns", registered["dns_providers"], sandbox, "DNS provider", loaded
            )
        options = [PaymentOption(**coin.payment_option()) for coin in coins.values()]
        catalog = build_catalog(catalog_data, options, MIN_TOPUP_CENTS, MAX_TOPUP_CENTS)
        ctx = cls(
            settings=settings,
            pm=pm,
            db=Database(settings.database_url),
            clock=clock or Clock(),
            coins=coins,
            hypervisor=hypervisor,  # type: ignore[arg-type]
            catalog_data=catalog_data,
            catalog=catalog,
            rate_source=rate_source,  # type: ignore[arg-type]
            loaded=loaded,
            registered=registered,
            dns=dns,  # type: ignore[arg-type]
        )
        for item in loaded:
            if item.component is not None:
                item.component.bind(ctx)
        return ctx

    def components(self) -> Iterator[LoadedComponent]:
        return iter(self.loaded)

    def serves_location(self, location_id: str) -> bool:
        """Whether servers can be made in this catalog location: the hypervisor has hosts there (any
        location without a backend, as in a sandbox without one). Orders elsewhere are a 409."""
        return self.hypervisor is None or self.hypervisor.serves(location_id)

    async def close(self) -> None:
        for item in self.loaded:
            if item.component is not None:
                try:
                    await item.component.close()
                except Exception:
                    log.exception("closing %s %s failed", item.kind, item.key)
        await self.db.close_readers()
        self.db.dispose()


def _build_coins(
    settings: Settings, registered: dict[str, Registered], loaded: list[LoadedComponent], secrets: ShopSecrets
) -> dict[str, PaymentCoin]:
    unknown = sorted(set(settings.coins) - set(registered))
    if unknown:
        offered = ", ".join(sorted(registered)) or "none"
        raise ConfigError(
            f"settings configure coins.{unknown[0]} but no loaded plugin offers coin {unknown[0]!r} "
            f"(offered: {offered})"
        )
    coins: dict[str, PaymentCoin] = {}

    # Highest default_priority first (the catalog lists coins in this order), then registration order.
    def rank(item: tuple[str, Registered]) -> tuple[bool, int]:
        priority = getattr(item[1].cls, "default_priority", None)
        return (priority is None, -(priority or 0))

    ranked = sorted(registered.items(), key=rank)
    for code, reg in ranked:
        section = settings.coins.get(code)
        if settings.sandbox:
            enabled = section is None or section.get("enabled", True)
        else:
            enabled = section is not None and section.get("enabled", True)
        if not enabled:
            continue
        coin = reg.cls.from_settings(section, sandbox=settings.sandbox, where=f"coins.{code}", secrets=secrets)
        coins[code] = coin  # type: ignore[assignment]
        loaded.append(LoadedComponent("coin", code, reg.plugin, coin))
    return coins


def sandbox_choice(registered: dict[str, Registered]) -> str | None:
    """The registered class with the highest ``sandbox_priority`` (None: no class has one)."""
    ranked = [
        (reg.cls.sandbox_priority, key)
        for key, reg in registered.items()
        if getattr(reg.cls, "sandbox_priority", None) is not None
    ]
    return max(ranked)[1] if ranked else None


def _build_named(
    section: dict[str, Any],
    selector: str,
    where: str,
    registered: dict[str, Registered],
    sandbox: bool,
    label: str,
    loaded: list[LoadedComponent],
    *,
    default: str | None = None,
    optional_in_sandbox: bool = False,
    secrets: ShopSecrets | None = None,
) -> Component | None:
    name = section.get(selector, default)
    if name is None and sandbox and optional_in_sandbox:
        log.warning("sandbox: no plugin offers a %s; running without one", label)
        loaded.append(LoadedComponent(where, "none", "-", None))
        return None
    if name is None:
        raise ConfigError(f"missing setting '{where}.{selector}' (one of: {', '.join(sorted(registered)) or 'none'})")
    reg = registered.get(name)
    if reg is None:
        if sandbox and optional_in_sandbox:
            log.warning("sandbox: no plugin offers %s %r; running without one", label, name)
            loaded.append(LoadedComponent(where, name, "-", None))
            return None
        offered = ", ".join(sorted(registered)) or "none"
        raise ConfigError(
            f"setting '{where}.{selector}' names {label} {name!r}, which no loaded plugin offers (offered: {offered})"
        )
    options = section.get(name, {})
    if not isinstance(options, dict):
        raise ConfigError(f"setting '{where}.{name}' must be a table")
    component = reg.cls.from_settings(options, sandbox=sandbox, where=f"{where}.{name}", secrets=secrets)
    loaded.append(LoadedComponent(where, name, reg.plugin, component))
    return component
