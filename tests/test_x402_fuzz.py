"""Property-based fuzzing of the x402 payment headers (``X-PAYMENT``, ``PAYMENT-SIGNATURE``) on every endpoint
that takes them: whatever a header holds (any JSON in base64, deep nesting, odd text, a real payment with a
field replaced), the answer is never a 500, every error is the error body, nothing moves in the ledger, and
nothing is left open (no ``settling`` record, no pending top-up).

The shop runs the real USDCBASE plugin in facilitator mode with the facilitator and the node on loopback
ports nobody listens on, so a well-formed payment gets as far as the shop can take it without any network:
503 ``settlement_unavailable``, nothing sent. The body fuzz of every endpoint is tests/test_fuzz_bodies.py.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
import sqlalchemy as sa
from test_fuzz_bodies import json_values
from x402_peers import free_port

ORDER = {"plan": "pup", "location": "nl", "os": "ubuntu-24.04"}
PAY_TO = "0x000000000000000000000000000000000000bEEF"
ASSET = "0x00000000000000000000000000000000000A11CE"
HEADER_TEXT = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {
        "ratelimit": {"enabled": False},  # every example reaches the endpoint
        "coins": {
            "USDCBASE": {
                "mode": "facilitator",
                "network": "base",
                "pay_to": PAY_TO,
                "asset": ASSET,
                "facilitator_url": f"http://127.0.0.1:{free_port()}",
                "facilitator_timeout_seconds": 2,
                "rpc_url": f"http://127.0.0.1:{free_port()}",
                "rpc_timeout_seconds": 2,
            }
        },
    }


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def payment(version: int, value: str) -> dict[str, Any]:
    """A payment of the shape USDCBASE accepts (the signature is not checked before the facilitator)."""
    authorization = {
        "from": "0x" + "12" * 20,
        "to": PAY_TO,
        "value": value,
        "validAfter": "0",
        "validBefore": str(int(time.time()) + 3600),
        "nonce": "0x" + "ab" * 32,
    }
    body: dict[str, Any] = {
        "x402Version": version,
        "payload": {"authorization": authorization, "signature": "0x" + "cd" * 65},
    }
    if version == 1:
        body.update(scheme="exact", network="base")
    else:
        body["accepted"] = {
            "scheme": "exact",
            "network": "eip155:8453",
            "amount": value,
            "asset": ASSET,
            "payTo": PAY_TO,
            "maxTimeoutSeconds": 300,
            "extra": {"name": "USD Coin", "version": "2"},
        }
        body["resource"] = {"url": "http://127.0.0.1:8000/v1/topups", "description": "", "mimeType": "application/json"}
    return body


@st.composite
def mutated_payments(draw: st.DrawFn) -> bytes:
    """A well-formed payment with up to three fields (at any depth) replaced, removed or added."""
    version = draw(st.sampled_from([1, 2]))
    body = payment(version, draw(st.sampled_from(["25000000", "3990000", "1", "0", "99999999999999999999"])))
    for _ in range(draw(st.integers(0, 3))):
        node: Any = body
        while isinstance(node, dict) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node)))
            if not isinstance(node[key], dict):
                break
            node = node[key]
        if not isinstance(node, dict):
            continue
        key = draw(st.one_of(st.sampled_from(sorted(node) or ["x"]), st.text(max_size=8)))
        if draw(st.booleans()):
            node[key] = draw(json_values)
        else:
            node.pop(key, None)
    return json.dumps(body, default=str).encode()


def nested(depth: int, opener: bytes, closer: bytes) -> bytes:
    return opener * depth + closer * depth


header_values = st.one_of(
    mutated_payments().map(b64),
    json_values.map(lambda value: b64(json.dumps(value, default=str).encode())),
    st.integers(1, 5000).map(lambda n: b64(nested(n, b"[", b"]"))),
    st.integers(1, 3000).map(lambda n: b64(b'{"x402Version":1,"payload":' + b'{"a":' * n + b"1" + b"}" * n + b"}")),
    st.integers(1, 3000).map(lambda n: b64(b'{"s":"' + b"[" * n + b'"}')),  # brackets inside a string
    st.binary(max_size=200).map(b64),
    st.text(HEADER_TEXT, min_size=1, max_size=80),
    st.integers(16_000, 17_000).map(lambda n: "A" * n),
    st.sampled_from(["=", "====", "e30", "e30=", "bnVsbA==", "W10=", "IiI=", "-_-_", "e30====="]),
)


def state(ctx: Any) -> tuple[Any, ...]:
    with ctx.db.engine.connect() as conn:
        ledger = conn.execute(sa.text("SELECT count(*), coalesce(sum(amount_micros), 0) FROM ledger_entries")).one()
        balances = conn.execute(sa.text("SELECT coalesce(sum(balance_micros), 0) FROM accounts")).scalar()
        servers = conn.execute(sa.text("SELECT count(*) FROM servers")).scalar()
    return (*tuple(ledger), balances, servers)


def left_open(ctx: Any) -> tuple[int, int]:
    with ctx.db.engine.connect() as conn:
        settling = conn.execute(sa.text("SELECT count(*) FROM x402_payments WHERE status = 'settling'")).scalar()
        pending = conn.execute(sa.text("SELECT count(*) FROM topups WHERE status = 'pending'")).scalar()
    return settling, pending


def test_no_payment_header_gets_a_500_moves_money_or_stays_open(vpsshop_client: Any, vpsshop_account: Any) -> None:
    ctx = vpsshop_client.app.state.ctx
    vpsshop_account.credit("5")
    headers = vpsshop_account.headers
    ordered = vpsshop_client.post("/v1/servers", headers=headers, json=ORDER)
    assert ordered.status_code == 201, ordered.text
    renew = f"/v1/servers/{ordered.json()['server']['id']}/renew"
    requests = [("/v1/topups", {"amount": 25, "coin": "USDCBASE"}), ("/v1/servers", ORDER), (renew, None)]
    answers: set[tuple[int, str]] = set()

    @hypothesis.settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(data=st.data())
    def one(data: st.DataObject) -> None:
        path, body = data.draw(st.sampled_from(requests), label="request")
        names = data.draw(st.sampled_from([["X-PAYMENT"], ["PAYMENT-SIGNATURE"], ["X-PAYMENT", "PAYMENT-SIGNATURE"]]))
        sent = dict(headers)
        for name in names:
            sent[name] = data.draw(header_values, label=name)
        before = state(ctx)
        response = vpsshop_client.post(path, headers=sent, json=body)
        shown = (path, {n: sent[n][:200] for n in names}, response.text)
        assert response.status_code != 500, shown
        if response.status_code >= 500:
            assert response.json()["error"] == "settlement_unavailable", shown
        assert response.status_code >= 400, shown  # nothing here is a payment that settles
        assert response.headers["content-type"].startswith("application/json"), shown
        error = response.json()
        assert isinstance(error.get("error"), str) and isinstance(error.get("message"), str) and error["message"]
        answers.add((response.status_code, error["error"]))
        assert state(ctx) == before, shown
        assert left_open(ctx) == (0, 0), shown

    one()
    # the examples reach every layer: the header's decoding, the coin's checks, and the facilitator
    assert {(400, "invalid_payment"), (402, "wrong_amount"), (503, "settlement_unavailable")} <= answers, answers
