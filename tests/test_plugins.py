"""Plugin loading: defaults by name, blocking, misspelt hooks, duplicate identifiers."""

from __future__ import annotations

import types

import pytest

from vpsshop import CatalogSource, PaymentCoin, RateSource, StartupError, hookimpl
from vpsshop.assembly import build_context
from vpsshop.plugins import DEFAULT_PLUGINS, blocked_from_env, build_plugin_manager, collect_classes, default_plugins
from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY


def _settings(tmp_path, **extra):
    from vpsshop.settings import load_settings

    base = {
        "database_url": f"sqlite:///{tmp_path / 'p.db'}",
        "secret_key": TEST_SECRET_KEY,
        "encryption_key": TEST_ENCRYPTION_KEY,
    }
    base.update(extra)
    return load_settings(None, environ={}, overrides=base)


class FakeCoin(PaymentCoin):
    code = "FAKE"
    name = "Fake coin"
    decimals = 8
    rate_symbol = "FAKE"

    @property
    def network(self) -> str:
        return "fake-testnet"


def _plugin(name: str, **hooks) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        function.__name__ = hook_name
        setattr(module, hook_name, hookimpl(function))
    return module


def test_default_plugins_load_by_name_and_register_their_classes():
    pm = build_plugin_manager(entry_points=False)
    names = {name for name, _ in pm.list_name_plugin()}
    assert {name for name, _ in DEFAULT_PLUGINS} <= names
    sources = collect_classes(pm, "vpsshop_register_catalog_sources", "name", "catalog source")
    assert sources["file"].plugin == "catalog"


def test_every_hook_of_a_default_plugin_is_trylast():
    """docs/hooks.md: default plugins implement their hooks with ``@hookimpl(trylast=True)``, so an
    installed plugin is always asked first."""
    pm = build_plugin_manager(entry_points=False)
    defaults = {name for name, _ in default_plugins()}
    impls = [
        (impl, hook)
        for hook, caller in vars(pm.hook).items()
        if hook.startswith("vpsshop_")
        for impl in caller.get_hookimpls()
        if impl.plugin_name in defaults
    ]
    assert {impl.plugin_name for impl, _ in impls} == defaults  # each default plugin implements a hook
    assert [f"{impl.plugin_name}: {hook}" for impl, hook in impls if not impl.trylast] == []


def test_entry_points_do_not_register_defaults_twice():
    pm = build_plugin_manager(entry_points=True)
    modules = [plugin for _, plugin in pm.list_name_plugin()]
    assert len(modules) == len({id(m) for m in modules})


def test_blocked_plugin_is_not_loaded(tmp_path):
    pm = build_plugin_manager(blocked=["rates"])
    assert pm.get_plugin("rates") is None
    assert pm.is_blocked("rates")
    # Without a rate source the production config that names one fails, naming what is offered.
    settings = _settings(
        tmp_path,
        mode="production",
        public_url="https://x/v1",
        rates={"source": "fixed"},
        hypervisor={"backend": "libvirt"},
    )
    with pytest.raises(StartupError, match=r"rates\.source"):
        build_context(settings, pm=pm)


def test_block_env_variable_is_parsed():
    assert blocked_from_env({"VPSSHOP_BLOCK_PLUGINS": "bitcoin, monero  evm"}) == ["bitcoin", "monero", "evm"]
    assert blocked_from_env({}) == []


def test_misspelt_hook_implementation_fails_at_startup():
    bad = _plugin("typo_plugin", vpsshop_register_coin=lambda: [FakeCoin])  # missing "s"
    with pytest.raises(StartupError, match="vpsshop_register_coin"):
        build_plugin_manager(extra=[bad], entry_points=False)


def test_hook_with_unknown_argument_fails_at_startup():
    def vpsshop_routes(ctx, request):  # the spec has no "request" argument
        return []

    with pytest.raises(StartupError, match="typo_args"):
        build_plugin_manager(extra=[_plugin("typo_args", vpsshop_routes=vpsshop_routes)], entry_points=False)


def test_duplicate_coin_code_names_both_plugins(tmp_path):
    class OtherFake(FakeCoin):
        pass

    first = _plugin("first_coins", vpsshop_register_coins=lambda: [FakeCoin])
    second = _plugin("second_coins", vpsshop_register_coins=lambda: [OtherFake])
    pm = build_plugin_manager(extra=[first, second], entry_points=False)
    with pytest.raises(StartupError) as info:
        build_context(_settings(tmp_path), pm=pm)
    message = str(info.value)
    assert "'FAKE'" in message and "first_coins" in message and "second_coins" in message
    assert "VPSSHOP_BLOCK_PLUGINS" in message


def test_class_without_identifier_is_refused(tmp_path):
    class Nameless(RateSource):
        pass

    pm = build_plugin_manager(
        extra=[_plugin("nameless", vpsshop_register_rate_sources=lambda: [Nameless])], entry_points=False
    )
    with pytest.raises(StartupError, match="without a 'name'"):
        build_context(_settings(tmp_path), pm=pm)


def test_installed_plugin_wins_over_default_catalog(tmp_path):
    from vpsshop import CatalogData

    class TinyCatalog(CatalogSource):
        name = "tiny"

        def load(self) -> CatalogData:
            return CatalogData.model_validate(
                {
                    "plans": [
                        {
                            "id": "one",
                            "name": "One",
                            "vcpu": 1,
                            "memory_mib": 512,
                            "disk_gib": 10,
                            "bandwidth_tb": 1,
                            "base_price_cents": 100,
                        }
                    ],
                    "locations": [{"id": "nl", "name": "Amsterdam", "country": "NL", "price_modifier": "1.5"}],
                    "operating_systems": [
                        {"id": "debian-12", "name": "Debian 12", "family": "debian", "image": "d12.qcow2"}
                    ],
                }
            )

    pm = build_plugin_manager(
        extra=[_plugin("tiny", vpsshop_register_catalog_sources=lambda: [TinyCatalog])], entry_points=False
    )
    ctx = build_context(_settings(tmp_path, catalog={"source": "tiny"}), pm=pm)
    assert [p.id for p in ctx.catalog.plans] == ["one"]
    assert str(ctx.catalog.pricing[0].monthly_usd) == "1.50"


def test_coin_plugin_appears_in_catalog_payment_options(tmp_path):
    pm = build_plugin_manager(
        extra=[_plugin("fake_coins", vpsshop_register_coins=lambda: [FakeCoin])], entry_points=False
    )
    ctx = build_context(_settings(tmp_path), pm=pm)
    assert ctx.coins["FAKE"].network == "fake-testnet"
    assert {"coin": "FAKE", "name": "Fake coin", "network": "fake-testnet", "method": "deposit"} in [
        o.model_dump() for o in ctx.catalog.payment_options
    ]


def test_plugin_routes_are_served_and_documented(tmp_path):
    from pydantic import BaseModel
    from starlette.testclient import TestClient

    from vpsshop import ApiRoute, create_app

    class Motd(BaseModel):
        message: str

    async def motd(call):
        return Motd(message=f"hello account {call.account_id}")

    plugin = _plugin("motd", vpsshop_routes=lambda ctx: [ApiRoute("GET", "/motd", motd, "Message of the day", Motd)])
    pm = build_plugin_manager(extra=[plugin], entry_points=False)
    app = create_app(_settings(tmp_path), pm=pm, background=False)
    with TestClient(app) as client:
        assert client.get("/v1/motd").status_code == 401  # plugin routes are authenticated by default
        key = client.post("/v1/account").json()["api_key"]
        assert client.get("/v1/motd", headers={"Authorization": f"Bearer {key}"}).json()["message"].startswith("hello")
        assert "/motd" in client.get("/v1/openapi.json").json()["paths"]


def test_route_claimed_twice_fails_at_startup(tmp_path):
    from vpsshop import ApiRoute, create_app

    async def endpoint(call):
        raise AssertionError

    plugin = _plugin("clash", vpsshop_routes=lambda ctx: [ApiRoute("GET", "/account", endpoint, "clash", None)])
    with pytest.raises(StartupError, match="GET /v1/account is declared twice"):
        create_app(_settings(tmp_path), pm=build_plugin_manager(extra=[plugin], entry_points=False))


def test_startup_shutdown_and_background_hooks_run(tmp_path):
    import asyncio

    from starlette.testclient import TestClient

    from vpsshop import BackgroundTask, create_app

    events: list[str] = []

    async def startup(ctx):
        events.append("startup")

    def shutdown(ctx):
        events.append("shutdown")

    def tasks(ctx):
        async def tick():
            events.append("tick")

        return [BackgroundTask("tick", 0.01, tick)]

    plugin = _plugin("lifecycle", vpsshop_startup=startup, vpsshop_shutdown=shutdown, vpsshop_background_tasks=tasks)
    app = create_app(_settings(tmp_path), pm=build_plugin_manager(extra=[plugin], entry_points=False), background=True)
    with TestClient(app) as client:
        assert client.get("/v1/health").status_code == 200
        client.portal.call(asyncio.sleep, 0.05)
    assert events[0] == "startup" and events[-1] == "shutdown" and "tick" in events
