"""A payment the shop cannot check (the facilitator's ``/verify`` or the Base node does not answer) moved no
money: the answer is 503 ``settlement_unavailable`` and nothing is left open (no ``settling`` record, no
pending top-up, nothing for the ``x402-settlements`` task to chase), so the same payment may be re-sent.

The shop is the real app with the real USDCBASE plugin in facilitator mode, as the sandbox runs it, but
with the facilitator and the node on loopback ports nobody listens on (the sandbox's public facilitator is
unreachable offline in the same way). Payments are signed by the PyPI ``x402`` v1 and v2 clients for the
402's own requirements (the payer holds nothing: nothing could have been settled anyway).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from x402_peers import free_port, sign_v1_header, sign_v2_header

ORDER = {"plan": "pup", "location": "nl", "os": "ubuntu-24.04"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {
        "coins": {
            "USDCBASE": {
                "mode": "facilitator",
                "network": "base-sepolia",
                "pay_to": "0x000000000000000000000000000000000000bEEF",
                "asset": "0x00000000000000000000000000000000000A11CE",  # not Circle's: no $1 client cap
                "facilitator_url": f"http://127.0.0.1:{free_port()}",
                "facilitator_timeout_seconds": 2,
                "rpc_url": f"http://127.0.0.1:{free_port()}",
                "rpc_timeout_seconds": 2,
            }
        }
    }


def left_behind(ctx: Any) -> tuple[int, int, int]:
    """(x402 records, of them settling, pending top-ups)."""
    with ctx.db.engine.connect() as conn:
        records = conn.execute(sa.text("SELECT count(*) FROM x402_payments")).scalar()
        settling = conn.execute(sa.text("SELECT count(*) FROM x402_payments WHERE status = 'settling'")).scalar()
        pending = conn.execute(sa.text("SELECT count(*) FROM topups WHERE status = 'pending'")).scalar()
    return records, settling, pending


def unavailable(answer: Any) -> None:
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert body["error"] == "settlement_unavailable" and "nothing was sent" in body["message"], body
    assert "127.0.0.1" not in body["message"]  # the facilitator's address stays in the log


def test_a_payment_the_facilitator_cannot_check_leaves_nothing_open(
    vpsshop_client: Any, vpsshop_account: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from eth_account import Account

    from vpsshop.x402.hooks import settlement_task

    ctx = vpsshop_client.app.state.ctx
    headers = vpsshop_account.headers
    payer = Account.create()
    caplog.set_level(logging.INFO)

    # a top-up (v1) and an order (v2), each paid for the 402's own requirements
    asked = vpsshop_client.post("/v1/topups", headers=headers, json={"amount": 25, "coin": "USDCBASE"})
    assert asked.status_code == 402
    topup_header = sign_v1_header(payer, asked.json()["accepts"][0])
    short = vpsshop_client.post("/v1/servers", headers=headers, json=ORDER)
    assert short.status_code == 402 and short.json()["error"] == "insufficient_balance"
    from x402.http.utils import decode_payment_required_header

    required = decode_payment_required_header(short.headers["PAYMENT-REQUIRED"])
    order_header = sign_v2_header(
        payer, required.accepts[0].model_dump(by_alias=True, exclude_none=True), required.resource.url
    )

    for _ in range(2):  # the same payment again: the same answer, not a 409 nor a record refused for good
        unavailable(
            vpsshop_client.post(
                "/v1/topups",
                headers={**headers, "X-PAYMENT": topup_header},
                json={"amount": 25, "coin": "USDCBASE"},
            )
        )
        unavailable(
            vpsshop_client.post("/v1/servers", headers={**headers, "PAYMENT-SIGNATURE": order_header}, json=ORDER)
        )
        assert left_behind(ctx) == (0, 0, 0)

    account = vpsshop_client.get("/v1/account", headers=headers).json()
    assert account["balance_usd"] == 0 and vpsshop_client.get("/v1/servers", headers=headers).json()["servers"] == []
    task = settlement_task(ctx)
    assert task is not None and asyncio.run(task.run()) == {"credited": 0}
    assert "still unresolved" not in caplog.text and "rpc_url" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "/verify failed" in caplog.text  # the operator sees why
