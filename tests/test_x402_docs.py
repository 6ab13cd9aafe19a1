"""docs/x402.md and ``vpsshop init`` as an integrator reads them: the production config of a
USDCBASE-only shop builds a shop, the init template's USDCBASE block is valid once uncommented, and the
spending limits the docs name are the clients' own."""

from __future__ import annotations

import ast
import base64
import json
import re
import secrets
from pathlib import Path
from typing import Any

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


# ---- spend controls, as the docs give them, against the shop's own 402 (issue 22, item 9) -------------

TEST_TOKEN = "0x" + "5a" * 20
"""A token the clients do not know (a test USDC), for the documented allowed_assets entries."""
UNREACHABLE = "http://127.0.0.1:9"
USDC_ON_BASE = {
    "network": "base",
    "mode": "facilitator",
    "facilitator_url": UNREACHABLE,
    "rpc_url": UNREACHABLE,
    "pay_to": "0x000000000000000000000000000000000000bEEF",
}
"""[coins.USDCBASE] of a shop taking Circle's USDC on Base (payment requirements are made offline)."""


def spend_controls() -> tuple[dict[str, dict], str]:
    """The documented PyPI spend controls (``usdc``: the first call's; ``v1``, ``v2``: the allowed
    asset entries for another token) and @x402/fetch's ``spendControls`` expression."""
    match = re.search(r"<!-- spend-controls[^>]*-->\n```python\n(.*?)```\n\n```js\n(.*?)```", DOC, re.S)
    assert match, "docs/x402.md lost its spend-controls blocks"
    python, js = match.groups()
    usdc = re.search(r"^client\.set_spend_controls\((\{\"max_amount_per_payment\".*\})\)", python, re.M)
    entries = dict(re.findall(r"^(v1|v2) = (\{.*\})$", python, re.M))
    assert usdc and set(entries) == {"v1", "v2"} and "[v1]" in python and "[v2]" in python, python
    controls = {"usdc": ast.literal_eval(usdc.group(1))}
    for version, entry in entries.items():
        controls[version] = {"allowed_assets": [ast.literal_eval(entry.replace("0xYourTestUsdc", TEST_TOKEN))]}
    fetch = re.search(r"spendControls: (\{.*?\}),", js)
    assert fetch, js
    return controls, fetch.group(1)


@pytest.fixture(scope="module")
def shop_402(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    """The v1 ``accepts`` entry and the v2 ``PAYMENT-REQUIRED`` header of a 25 USD top-up, from a shop
    that takes USDC on Base (its requirements are made offline)."""
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.settings import load_settings
    from vpsshop.testing import TEST_ENCRYPTION_KEY, create_test_account

    settings = load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path_factory.mktemp('x402-docs')}/shop.db",
            "secret_key": "s3cret-for-the-docs-test",
            "encryption_key": TEST_ENCRYPTION_KEY,
            "coins": {"USDCBASE": USDC_ON_BASE},
        },
    )
    with TestClient(create_app(settings, background=False, check=False)) as client:
        account = create_test_account(client)
        asked = client.post("/v1/topups", json={"amount": 25, "coin": "USDCBASE"}, headers=account.headers)
    assert asked.status_code == 402, asked.text
    return asked.json()["accepts"][0], asked.headers["PAYMENT-REQUIRED"]


def _pypi_pays(version: int, requirements: dict, controls: dict | None) -> bool:
    """Whether the PyPI client, with ``controls`` (None: its defaults), makes a payment for ``requirements``."""
    from eth_account import Account
    from x402 import x402ClientSync
    from x402.mechanisms.evm.exact import ExactEvmClientScheme
    from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1
    from x402.schemas import PaymentRequired
    from x402.schemas.v1 import PaymentRequiredV1

    payer = Account.create()
    client = x402ClientSync()
    if controls is not None:
        client.set_spend_controls(controls)
    if version == 1:
        client.register_v1("base", ExactEvmSchemeV1(payer))
        required: Any = PaymentRequiredV1(x402_version=1, accepts=[requirements])
    else:
        client.register("eip155:8453", ExactEvmClientScheme(payer))
        required = PaymentRequired.model_validate(requirements)
    try:
        payload = client.create_payment_payload(required)
    except Exception as exc:  # noqa: BLE001 - the client's refusal, whatever its class
        assert "spend_controls" in str(exc), exc
        return False
    assert int(payload.model_dump(by_alias=True)["payload"]["authorization"]["value"]) == 25 * 10**6
    return True


def test_the_documented_spend_controls_let_the_pypi_client_pay_in_v1_and_v2(shop_402: tuple[dict, str]) -> None:
    """The docs' example for another token used the v2 network name, with which the PyPI v1 client
    refused every payment: each documented call is checked against the version it is for."""
    accepts, header = shop_402
    v2 = json.loads(base64.b64decode(header))
    controls = spend_controls()[0]
    for version, requirements in ((1, accepts), (2, v2)):  # USDC on Base: refused at $1, paid once raised
        assert not _pypi_pays(version, requirements, None)
        assert _pypi_pays(version, requirements, controls["usdc"])
    token = {**accepts, "asset": TEST_TOKEN}
    token_2 = {**v2, "accepts": [{**v2["accepts"][0], "asset": TEST_TOKEN}]}
    assert _pypi_pays(1, token, controls["v1"]) and _pypi_pays(2, token_2, controls["v2"])
    assert not _pypi_pays(1, token, controls["v2"])  # the other version's network name matches nothing


def test_the_documented_spend_controls_let_x402_fetch_pay(shop_402: tuple[dict, str]) -> None:
    """npm @x402/fetch (v2), with the config the docs give, pays the shop's 402; at its defaults it refuses."""
    from x402_peers import npm_bin, run_node

    from vpsshop_x402 import USDCBASE

    _, header = shop_402
    core = (npm_bin().parent / "@x402" / "core" / "dist" / "cjs" / "client" / "index.js").read_text()
    assert 'DEFAULT_MAX_AMOUNT_PER_PAYMENT = "$1"' in core and 'DEFAULT_MAX_AMOUNT_PER_PAYMENT = "$1"' in DOC
    refusal = "rejected by spendControls.maxAmountPerPayment"
    assert refusal in core and refusal in DOC

    def run(controls: str | None) -> dict:
        request = {"privateKey": "0x" + secrets.token_hex(32), "paymentRequired": header, "spendControls": controls}
        return json.loads(run_node("x402_fetch_spend.cjs", request, timeout=120))

    refused = run(None)
    assert "maxAmountPerPayment" in refused.get("error", ""), refused
    paid = run(spend_controls()[1])
    assert paid.get("paymentSignature"), paid
    coin = USDCBASE.from_settings(USDC_ON_BASE, sandbox=True, where="coins.USDCBASE")
    assert coin.decode_payment(paid["paymentSignature"], 2).value_atomic == 25 * 10**6  # the shop reads it


def test_health_and_the_docs_agree_on_the_sandbox_coin(vpsshop_client: Any) -> None:
    """The sandbox's USDCBASE pays to a burn address: health counts it ready (its 402s work) and says so."""
    [usdc] = [c for c in vpsshop_client.get("/v1/health").json()["components"] if c["id"] == "USDCBASE"]
    assert usdc["ready"] is True and "burn address" in usdc["detail"] and "lost" in usdc["detail"], usdc
    assert "reports the coin **ready**" in DOC and "burn address" in DOC
    assert "reports the coin not ready until you set your own" not in DOC


def test_the_error_table_gives_nonce_used_both_of_its_statuses() -> None:
    """409 when this shop already used the authorization for another request (another account, order or
    renewal: test_x402_engine.py, test_x402_orders.py), 402 when the chain or an earlier refusal rules it out."""
    assert sorted(re.findall(r"^\| `nonce_used` \| (\d+) \|", DOC, re.M)) == ["402", "409"]
