"""The OpenAPI document: valid 3.1, version 1.0.0, and the app keeps to it under schemathesis."""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from openapi_spec_validator import validate
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.testclient import TestClient

from vpsshop import create_app, hookspecs
from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, TestAccount


def _build_app():
    """The app schemathesis drives: built at import, because schemathesis collects its cases then."""
    import tempfile
    from pathlib import Path

    from vpsshop.settings import load_settings

    db = Path(tempfile.mkdtemp(prefix="vpsshop-openapi-")) / "vpsshop.db"
    settings = load_settings(
        None,
        environ={},
        overrides={
            "database_url": f"sqlite:///{db}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "server": {"background": False},
            # generated cases send many wrong login tokens; the re-sign-in below must not meet the
            # sign-in limit (tests/test_dashboard.py tests the limit)
            "signin": {"failures_per_client": 10_000},
            # thousands of generated requests from one address, many with made-up keys, many writes:
            # the limits stay on but far away (tests/test_limits.py tests them)
            "ratelimit": {
                "signups_per_client": 1_000_000,
                "auth_failures_per_client": 1_000_000,
                "writes_per_account": 1_000_000,
                "max_servers_per_account": 100_000,
                "max_open_topups_per_account": 100_000,
            },
        },
    )
    return create_app(settings, background=False)


APP = _build_app()
# 402 is part of this API's contract for valid requests: an order the balance does not cover, and
# the x402 payment requirements of a USDCBASE top-up.
# An invalid request may also be refused with 413 (its body, a long string of escaped characters,
# is larger than the server takes: body_too_large, before anything reads it); never with a 5xx.
REJECTED = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
ST_CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {
        "checks": {
            # 410: the credentials of a server that generated cases terminated (DELETE /servers/{id}) are gone
            "positive_data_acceptance": {"expected-statuses": ["2xx", "3xx", 401, 402, 403, 404, 409, 410, 429]},
            "negative_data_rejection": {"expected-statuses": REJECTED},
        }
    }
)
schema = schemathesis.openapi.from_asgi("/v1/openapi.json", APP, config=ST_CONFIG)
with TestClient(APP) as _client:  # schemathesis asks for credentials while collecting
    _created = _client.post("/v1/account").json()
    # Funded, so generated orders reach the success path instead of stopping at 402.
    TestAccount(_created["user_id"], _created["api_key"], _created["login_token"], _created["key_id"], APP).credit(
        "1000000", "schemathesis funding"
    )
STATE: dict = {"key": _created["api_key"], "login_token": _created["login_token"]}


@schema.auth()
class BearerKey:
    """A valid key for the cases that should pass auth; schemathesis also sends cases without it."""

    def get(self, case, context):
        return STATE["key"]

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def live_app():
    with TestClient(APP) as client:
        STATE["client"] = client
        yield APP, STATE


def test_document_is_valid_openapi_31(vpsshop_client):
    document = vpsshop_client.get("/v1/openapi.json").json()
    validate(document)
    assert document["openapi"].startswith("3.1")
    assert document["info"]["version"] == "1.0.0"
    for path in ("/account", "/keys", "/keys/{id}", "/catalog", "/health"):
        assert path in document["paths"]
    assert document["paths"]["/account"]["post"]["responses"]["201"]
    assert "security" not in document["paths"]["/catalog"]["get"]
    assert document["paths"]["/account"]["get"]["security"] == [{"bearerAuth": []}]


def test_x402_operations_declare_the_x402_headers(vpsshop_client):
    """The three operations an x402 client pays: the payment headers they take, PAYMENT-REQUIRED on the 402,
    X-PAYMENT-RESPONSE and PAYMENT-RESPONSE on the success (validated as OpenAPI 3.1 above)."""
    paths = vpsshop_client.get("/v1/openapi.json").json()["paths"]
    for path, success in (("/topups", "201"), ("/servers", "201"), ("/servers/{id}/renew", "200")):
        operation = paths[path]["post"]
        taken = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert {"X-PAYMENT", "PAYMENT-SIGNATURE"} <= taken, path
        assert "PAYMENT-REQUIRED" in operation["responses"]["402"]["headers"], path
        assert {"X-PAYMENT-RESPONSE", "PAYMENT-RESPONSE"} <= set(operation["responses"][success]["headers"]), path
    assert "Cache-Control" in paths["/servers"]["post"]["responses"]["201"]["headers"]  # kept beside them
    unpaid = paths["/servers/{id}/start"]["post"]["responses"]
    assert not any("PAYMENT" in name for response in unpaid.values() for name in response.get("headers", {}))


def test_document_schemas_are_the_validating_models(vpsshop_client):
    from vpsshop.accounts import AccountOut, NewKeyInput

    schemas = vpsshop_client.get("/v1/openapi.json").json()["components"]["schemas"]
    assert set(schemas["AccountOut"]["required"]) == set(AccountOut.model_fields) - {"currency"}
    assert schemas["NewKeyBody"]["additionalProperties"] is False
    assert (
        schemas["NewKeyBody"]["properties"]["name"]["anyOf"][0]["maxLength"]
        == NewKeyInput.model_fields["name"].metadata[1].max_length
    )


def test_request_bodies_keep_the_names_clients_were_generated_with(vpsshop_client):
    """The operations call their inputs ...Input; the description publishes them under their 1.0
    names, so a client generated from it keeps its class names."""
    paths = vpsshop_client.get("/v1/openapi.json").json()["paths"]
    named = {
        (path, method): op["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        for path, ops in paths.items()
        for method, op in ops.items()
        if "requestBody" in op
    }
    assert named == {
        ("/keys", "post"): "NewKeyBody",
        ("/login", "post"): "LoginBody",
        ("/account/wallet-login", "post"): "WalletLoginBody",
        ("/topups", "post"): "TopupBody",
        ("/deposit-addresses", "post"): "DepositAddressBody",
        ("/servers", "post"): "OrderBody",
        ("/servers/quote", "post"): "QuoteBody",
        ("/servers/{id}", "patch"): "ServerPatch",
        ("/servers/{id}/renew", "post"): "RenewBody",
        ("/servers/{id}/renew/quote", "post"): "RenewBody",
        ("/servers/{id}/reinstall", "post"): "ReinstallBody",
        ("/servers/{id}/resize", "post"): "ResizeBody",
        ("/servers/{id}/resize/quote", "post"): "ResizeBody",
        ("/servers/{id}/firewall", "put"): "FirewallBody",
        ("/servers/{id}/snapshots", "post"): "SnapshotBody",
        ("/servers/{id}", "delete"): "TerminateBody",
        ("/ssh-keys", "post"): "SshKeyBody",
        ("/webhooks", "post"): "WebhookBody",
        ("/webhooks/{id}", "patch"): "WebhookPatch",
        ("/webhooks/{id}/redeliver", "post"): "RedeliverBody",
    }


def _checked_firewall_rules(rules: object) -> bool:
    """A firewall rule's ports and source are checked for what they hold (a port range within 1-65535,
    a prefix), and a server holds at most servers.firewall_max_rules: a random schema-valid value is
    rightly a 400 (tests/test_server_firewall.py covers them)."""
    if not isinstance(rules, list):
        return False
    named = any(isinstance(r, dict) and (r.get("ports") is not None or r.get("source") is not None) for r in rules)
    return named or len(rules) > 50


@schema.parametrize()
@hypothesis.settings(
    max_examples=25, deadline=None, suppress_health_check=list(hypothesis.HealthCheck), derandomize=True
)
def test_api_keeps_to_its_schema(case, live_app):
    _, state = live_app
    excluded = []
    if any(name.lower() in ("x-payment", "payment-signature") for name in (case.headers or {})):
        # A payment header is base64 of a signed JSON payload, which no schema can describe: a random
        # "valid string" is rightly refused with 400 invalid_payment (tests/test_x402*.py cover it).
        excluded.append(positive_data_acceptance)
    body = case.body if isinstance(case.body, dict) else {}
    if (
        body.get("public_key") is not None
        or body.get("user_data") is not None
        or body.get("ssh_keys")
        or (isinstance(body.get("periods"), int) and body["periods"] > 1)
        or body.get("confirm_hostname") is not None
        or body.get("totp_code") is not None
        or _checked_firewall_rules(body.get("rules"))
    ):
        # An SSH public key and cloud-init user data are checked for what they contain (key type and
        # size, YAML), ssh_keys name stored keys, periods meet the prepay horizon of the server's
        # expiry: a random schema-valid value is rightly a 400 (tests/test_server_access.py covers them). A
        # termination's confirm_hostname must be the server's hostname (400 hostname_mismatch), and a
        # totp_code is refused (401) or ignored by whether the account has two-factor on
        # (tests/test_server_termination.py covers both).
        excluded.append(positive_data_acceptance)
    response = case.call_and_validate(excluded_checks=excluded)
    assert response.status_code < 500
    if response.status_code in (400, 401, 402, 404, 405, 413):
        body = response.json()
        if "x402Version" in body:  # the x402 payment requirements, in the protocol's own shape
            assert body["accepts"] and body["error"]
        else:
            assert set(body) >= {"error", "message"}
    if case.method == "DELETE" and response.status_code == 200:
        # Generated ids may revoke our own key: sign in again so later cases stay authenticated.
        client = state["client"]
        if client.get("/v1/account", headers={"Authorization": f"Bearer {state['key']}"}).status_code == 401:
            state["key"] = client.post("/v1/login", json={"login_token": state["login_token"]}).json()["api_key"]


def test_every_hook_is_documented():
    from pathlib import Path

    hooks_doc = (Path(__file__).parent.parent / "docs" / "hooks.md").read_text()
    names = [n for n in dir(hookspecs) if n.startswith("vpsshop_")]
    assert names
    for name in names:
        assert f"## `{name}" in hooks_doc, f"docs/hooks.md has no section for {name}"
        assert getattr(hookspecs, name).__doc__.strip(), f"{name} has no docstring"
