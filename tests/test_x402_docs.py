"""docs/x402.md and ``vpsshop init`` as an integrator reads them: the production config of a
USDCBASE-only shop builds a shop, the init template's USDCBASE block is valid once uncommented, and the
spending limits the docs name are the clients' own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "x402.md").read_text()


def production_block() -> str:
    match = re.search(r"<!-- production-config[^>]*-->\n```toml\n(.*?)```", DOC, re.S)
    assert match, "docs/x402.md lost its production-config block"
    return match.group(1)


def test_documented_production_config_builds_a_usdcbase_only_shop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vpsshop.assembly import build_context
    from vpsshop.settings import load_settings

    config = tmp_path / "vpsshop.toml"
    config.write_text(production_block())
    monkeypatch.setenv("VPSSHOP_X402_RELAYER_KEY", "0x" + "ab" * 32)
    settings = load_settings(str(config), environ={})
    assert settings.mode == "production"
    ctx = build_context(settings)
    assert list(ctx.coins) == ["USDCBASE"] and type(ctx.hypervisor).__name__ == "LibvirtBackend"
    coin = ctx.coins["USDCBASE"]
    assert coin.config.mode == "direct" and coin.chain is not None and coin.chain.relayer is not None
    # each section the docs call required is: without it the shop does not start, and says which
    from vpsshop.errors import StartupError

    for section in ("[rates]", "[hypervisor]"):
        text = production_block()
        start = text.index(section)
        end = text.index("[coins.USDCBASE]") if section == "[hypervisor]" else text.index("[topups]")
        config.write_text(text[:start] + text[end:])
        with pytest.raises(StartupError, match=section.strip("[]")):
            build_context(load_settings(str(config), environ={}))


def test_init_template_has_a_usdcbase_block_that_validates(tmp_path: Path) -> None:
    import tomllib

    from vpsshop.cli import main
    from vpsshop_x402 import USDCBaseConfig

    path = tmp_path / "vpsshop.toml"
    assert main(["init", str(path)]) == 0
    text = path.read_text()
    block = text[text.index("# [coins.USDCBASE]") :]
    lines = [line[2:] for line in block.splitlines() if line.startswith("# ") and not line.startswith("# #")]
    lines = [line for line in lines if not line.startswith("relayer_key_encrypted")]  # one of the two ways
    section = tomllib.loads("\n".join(lines))["coins"]["USDCBASE"]
    assert section["pay_to"] == "0xYourShopAddress"  # the placeholder to replace with one's own address
    section["pay_to"] = "0x000000000000000000000000000000000000bEEF"
    config = USDCBaseConfig.model_validate(section)
    assert config.mode == "direct" and config.relayer_key_env == "VPSSHOP_X402_RELAYER_KEY"
    assert 'source = "fixed"' in text and "USDCBASE still" in text


def test_the_spending_limits_in_the_docs_are_the_clients_defaults() -> None:
    from x402.client import DEFAULT_MAX_AMOUNT_PER_PAYMENT
    from x402_peers import npm_bin

    assert f'DEFAULT_MAX_AMOUNT_PER_PAYMENT = "{DEFAULT_MAX_AMOUNT_PER_PAYMENT}"' in DOC
    assert "set_spend_controls" in DOC
    fetch = (npm_bin().parent / "x402-fetch" / "dist" / "cjs" / "index.js").read_text()
    assert "maxValue = BigInt(0.1 * 10 ** 6)" in fetch and "`maxValue = BigInt(0.1 * 10 ** 6)`" in DOC
    assert "Payment amount exceeds maximum allowed" in fetch and "Payment amount exceeds maximum allowed" in DOC
