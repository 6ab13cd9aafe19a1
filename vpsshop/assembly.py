"""Assembling a shop: the plugin manager, the components its plugins offer, the catalog, and the
context that holds them (:func:`build_context`).

Settings layout of the components (``docs/configuration.md``)::

    [coins.BTC]            # one table per enabled coin; production enables exactly these
    [hypervisor]  backend = "libvirt"   and   [hypervisor.libvirt]  its settings
    [catalog]     source = "file"       and   [catalog.file]        its settings
    [rates]       source = "kraken"     and   [rates.kraken]        its settings
    [dns]         provider = "powerdns" and   [dns.powerdns]        its settings (optional)
"""

from __future__ import annotations

import logging
from typing import Any, cast

import pluggy

# registers what the provisioning jobs call for an order whose x402 payment is held until the server is ready
import vpsshop.servers.held  # noqa: F401
from vpsshop.catalog import CatalogSource, PaymentOption, build_catalog
from vpsshop.clock import Clock
from vpsshop.coins import PaymentCoin, link_scan_groups
from vpsshop.component import Component, ShopSecrets
from vpsshop.context import AppContext, LoadedComponent, Registered
from vpsshop.db import Database
from vpsshop.dns import DnsProvider
from vpsshop.errors import ConfigError, StartupError
from vpsshop.hypervisor import HypervisorBackend
from vpsshop.money import MAX_TOPUP_CENTS, MIN_TOPUP_CENTS
from vpsshop.plugins import blocked_from_env, build_plugin_manager, collect_classes
from vpsshop.rates import RateSource
from vpsshop.settings import Settings

log = logging.getLogger("vpsshop")


def build_context(
    settings: Settings,
    *,
    pm: pluggy.PluginManager | None = None,
    clock: Clock | None = None,
    environ: dict[str, str] | None = None,
) -> AppContext:
    """The context of one shop: its plugins' components built from ``settings``, the catalog loaded
    and priced, each component bound to the context.

    :param pm: a plugin manager to use instead of building one (tests registering plugin objects).
    :param clock: the shop's clock (tests pass a :class:`vpsshop.FrozenClock`).
    :param environ: where ``VPSSHOP_BLOCK_PLUGINS`` is read (default ``os.environ``).
    :raises StartupError: a plugin clash, a missing or invalid setting, a catalog that fails to load.
    """
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
    options = [PaymentOption.model_validate(coin.payment_option()) for coin in coins.values()]
    catalog = build_catalog(catalog_data, options, MIN_TOPUP_CENTS, MAX_TOPUP_CENTS)
    ctx = AppContext(
        settings=settings,
        pm=pm,
        db=Database(settings.database_url),
        clock=clock or Clock(),
        coins=coins,
        # Each built from a class its registration hook offered, so of that hook's base class (hookspecs).
        hypervisor=cast("HypervisorBackend | None", hypervisor),
        catalog_data=catalog_data,
        catalog=catalog,
        rate_source=cast("RateSource[Any] | None", rate_source),
        loaded=loaded,
        registered=registered,
        dns=cast("DnsProvider | None", dns),
    )
    for item in loaded:
        if item.component is not None:
            item.component.bind(ctx)
    return ctx


def _build_coins(
    settings: Settings, registered: dict[str, Registered], loaded: list[LoadedComponent], secrets: ShopSecrets
) -> dict[str, PaymentCoin[Any]]:
    unknown = sorted(set(settings.coins) - set(registered))
    if unknown:
        offered = ", ".join(sorted(registered)) or "none"
        raise ConfigError(
            f"settings configure coins.{unknown[0]} but no loaded plugin offers coin {unknown[0]!r} "
            f"(offered: {offered})"
        )
    coins: dict[str, PaymentCoin[Any]] = {}

    # Highest default_priority first (the catalog lists coins in this order), then registration order.
    def rank(item: tuple[str, Registered]) -> tuple[bool, int]:
        priority = getattr(item[1].cls, "default_priority", None)
        return (priority is None, -(priority or 0))

    ranked = sorted(registered.items(), key=rank)
    for code, reg in ranked:
        section = settings.coins.get(code)
        if settings.sandbox:
            default = bool(getattr(reg.cls, "enabled_in_sandbox", True))
            enabled = section.get("enabled", True) if section is not None else default
        else:
            enabled = section is not None and section.get("enabled", True)
        if not enabled:
            continue
        built = reg.cls.from_settings(section, sandbox=settings.sandbox, where=f"coins.{code}", secrets=secrets)
        coin = cast("PaymentCoin[Any]", built)  # a class of vpsshop_register_coins: a PaymentCoin (hookspecs)
        coins[code] = coin
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
) -> Component[Any] | None:
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
