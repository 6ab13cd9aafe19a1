"""vpsshop: a framework for running a prepaid, crypto-funded VPS shop.

The public API, all a plugin author imports::

    from vpsshop import hookimpl, PaymentCoin, HypervisorBackend, CatalogSource, RateSource

Everything named in ``__all__`` is public and stable within a major version; other modules are
internal unless the docs say otherwise. Heavy modules (the web app) are imported only on first
use, so a plugin importing ``vpsshop`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vpsshop.catalog import CatalogData, CatalogSource, ImageSource, Location, OperatingSystem, Plan
from vpsshop.clock import Clock, FrozenClock
from vpsshop.coins import (
    STANDING_INDEX_BASE,
    DepositAddress,
    DepositCoin,
    DetectedPayment,
    PaymentCheck,
    PaymentCoin,
    ScanResult,
    WatchSet,
    X402Coin,
    X402Payment,
    X402Rejected,
    X402Settlement,
)
from vpsshop.component import Component, NoConfig, Readiness, ShopContext, ShopSecrets, require_reachable
from vpsshop.dns import DnsProvider, ptr_name
from vpsshop.errors import ApiError, BadRequest, ConfigError, NotFound, PluginError, StartupError
from vpsshop.hypervisor import (
    AddressPool,
    ConsoleStream,
    DomainState,
    FirewallRule,
    GuestReport,
    HostImages,
    HostInspection,
    HostKey,
    HypervisorBackend,
    InterfaceCounters,
    Ipv6Pool,
    KernelBootFiles,
    ServerHandle,
    ServerSpec,
    check_address_range,
    check_ipv6_prefix,
)
from vpsshop.markers import hookimpl
from vpsshop.rates import RateSource
from vpsshop.tasks import BackgroundTask
from vpsshop.version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.actors import Customer
    from vpsshop.app import create_app
    from vpsshop.assembly import build_context
    from vpsshop.cloudinit import compose_user_data, parse_ssh_public_key
    from vpsshop.context import AppContext
    from vpsshop.events import Event
    from vpsshop.plugin_state import PluginRecord, PluginState
    from vpsshop.routing import ApiModel, ApiRoute, Call, Header, Reply
    from vpsshop.settings import Settings, load_settings

_LAZY = {
    "create_app": "vpsshop.app",
    "Customer": "vpsshop.actors",
    "build_context": "vpsshop.assembly",
    "AppContext": "vpsshop.context",
    "PluginRecord": "vpsshop.plugin_state",
    "PluginState": "vpsshop.plugin_state",
    "Event": "vpsshop.events",
    "ApiModel": "vpsshop.routing",
    "ApiRoute": "vpsshop.routing",
    "Call": "vpsshop.routing",
    "Header": "vpsshop.routing",
    "Reply": "vpsshop.routing",
    "Settings": "vpsshop.settings",
    "load_settings": "vpsshop.settings",
    "compose_user_data": "vpsshop.cloudinit",
    "parse_ssh_public_key": "vpsshop.cloudinit",
}

__all__ = [
    "STANDING_INDEX_BASE",
    "AddressPool",
    "ApiError",
    "ApiModel",
    "ApiRoute",
    "AppContext",
    "BackgroundTask",
    "BadRequest",
    "Call",
    "CatalogData",
    "CatalogSource",
    "Clock",
    "Component",
    "ConfigError",
    "ConsoleStream",
    "Customer",
    "DepositAddress",
    "DepositCoin",
    "DetectedPayment",
    "DnsProvider",
    "DomainState",
    "Event",
    "FirewallRule",
    "FrozenClock",
    "GuestReport",
    "Header",
    "HostImages",
    "HostInspection",
    "HostKey",
    "HypervisorBackend",
    "ImageSource",
    "InterfaceCounters",
    "Ipv6Pool",
    "KernelBootFiles",
    "Location",
    "NoConfig",
    "NotFound",
    "OperatingSystem",
    "PaymentCheck",
    "PaymentCoin",
    "Plan",
    "PluginError",
    "PluginRecord",
    "PluginState",
    "RateSource",
    "Readiness",
    "Reply",
    "ScanResult",
    "ServerHandle",
    "ServerSpec",
    "Settings",
    "ShopContext",
    "ShopSecrets",
    "StartupError",
    "WatchSet",
    "X402Coin",
    "X402Payment",
    "X402Rejected",
    "X402Settlement",
    "__version__",
    "build_context",
    "check_address_range",
    "check_ipv6_prefix",
    "compose_user_data",
    "create_app",
    "hookimpl",
    "load_settings",
    "parse_ssh_public_key",
    "ptr_name",
    "require_reachable",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vpsshop' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
