"""Settings: sandbox without a file, production never falls back, environment overrides."""

from __future__ import annotations

import os
import stat

import pytest

from vpsshop import ConfigError
from vpsshop.assembly import build_context
from vpsshop.settings import load_settings


def test_no_config_file_is_a_sandbox(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(None, environ={})
    assert settings.sandbox
    assert settings.database_url == "sqlite:///./vpsshop.db"
    assert settings.rates["source"] == "fixed"
    # No backend is named: the sandbox runs the registered one with the highest sandbox_priority,
    # the simulator, which needs nothing native (libvirt has none: it needs libvirt-python and a daemon).
    assert "backend" not in settings.hypervisor
    ctx = build_context(settings)
    try:
        assert ctx.hypervisor is not None and ctx.hypervisor.kind == "simulator"
    finally:
        ctx.db.dispose()
    # Sandbox secrets are generated once, kept beside the database with mode 0600, and reused.
    keys = tmp_path / "vpsshop.db.keys"
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600
    again = load_settings(None, environ={})
    assert again.secret_key.get_secret_value() == settings.secret_key.get_secret_value()
    assert settings.encryption_key.get_secret_value() not in repr(settings)


def test_production_names_every_missing_setting(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text('mode = "production"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(config, environ={})
    message = str(info.value)
    for name in ("database_url", "secret_key", "encryption_key", "public_url"):
        assert f"missing setting '{name}'" in message
    assert str(config) in message


def test_config_file_without_mode_is_production(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text('database_url = "sqlite:///x.db"\n')
    with pytest.raises(ConfigError, match="missing setting 'secret_key'"):
        load_settings(config, environ={})


def test_production_component_settings_do_not_fall_back(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path}/p.db"\nsecret_key = "s"\nencryption_key = "e"\n'
        'public_url = "https://shop.example/v1"\n[hypervisor]\nbackend = "libvirt"\n[rates]\nsource = "fixed"\n'
    )
    settings = load_settings(config, environ={})
    assert settings.mode == "production"
    # The fixed source has sandbox prices, but production must write them.
    with pytest.raises(ConfigError, match=r"missing\ setting\ 'rates\.fixed\.prices'"):
        build_context(settings, environ={})


def test_an_address_range_of_mixed_versions_names_the_setting(tmp_path):
    """A first-last range from IPv4 to IPv6 is a setting error naming the setting, as an empty range
    is (ipaddress raises TypeError comparing the two, which a pydantic validator lets through)."""
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f'mode = "sandbox"\ndatabase_url = "sqlite:///{tmp_path}/p.db"\n'
        '[hypervisor]\nbackend = "simulator"\n[hypervisor.simulator]\naddresses = "10.0.0.1-::5"\n'
    )
    with pytest.raises(ConfigError, match=r"hypervisor\.simulator\.addresses.*mixes IPv4 and IPv6"):
        build_context(load_settings(config, environ={}), environ={})


def test_production_requires_rate_source_and_hypervisor(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path}/p.db"\nsecret_key = "s"\nencryption_key = "e"\n'
        'public_url = "https://shop.example/v1"\n'
    )
    with pytest.raises(ConfigError, match=r"missing\ setting\ 'rates\.source'"):
        build_context(load_settings(config, environ={}), environ={})


def test_environment_overrides(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text('mode = "sandbox"\ndatabase_url = "sqlite:///from-file.db"\n[server]\nport = 9000\n')
    env = {
        "VPSSHOP_DATABASE_URL": f"sqlite:///{tmp_path}/from-env.db",
        "VPSSHOP__SERVER__PORT": "9100",
        "VPSSHOP__SERVER__BACKGROUND": "false",
        "VPSSHOP__COINS__btc__confirmations": "3",
        "VPSSHOP__PLUGINS__DISABLED": '["monero"]',
    }
    settings = load_settings(config, environ=env)
    assert settings.database_url.endswith("from-env.db")
    assert settings.server.port == 9100 and settings.server.background is False
    assert settings.coins == {"BTC": {"confirmations": 3}}
    assert settings.plugins.disabled == ["monero"]


def test_config_env_variable_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(None, environ={"VPSSHOP_CONFIG": str(tmp_path / "nope.toml")})


def test_unknown_setting_is_refused(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text('mode = "sandbox"\ndatabse_url = "sqlite:///typo.db"\n')
    with pytest.raises(ConfigError, match="unknown setting 'databse_url'"):
        load_settings(config, environ={})


def test_invalid_toml_is_a_clear_error(tmp_path):
    config = tmp_path / "vpsshop.toml"
    config.write_text("mode = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(config, environ={})
