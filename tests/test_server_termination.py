"""A customer ends a server: ``DELETE /v1/servers/{id}``, the MCP tool ``terminate_server`` and the
dashboard's confirmation page, over :mod:`vpsshop.servers.termination` (SQLite and PostgreSQL).

What is credited (the unused prepaid time of an active server, the whole order of one still
provisioning, nothing for one suspended for non-payment), once, whatever races it (other DELETEs, an
admin's refund, the lifecycle); the two-factor code; the event; that the destroy job leaves nothing of
the server on the (simulated) host and frees its address; and a served shop doing it over HTTP.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta
from decimal import Decimal
from html import unescape
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from served import active_server, serve, shop_env
from sqlmodel import select
from test_admin_support import _ctx, _order
from test_dashboard import D, post_form, sign_in

from vpsshop import admin, ledger, twofactor
from vpsshop.actors import Customer, Operator
from vpsshop.dashboard.web import format_usd
from vpsshop.hypervisor import HostInspection, ServerHandle
from vpsshop.models import LedgerEntry, Server
from vpsshop.servers.jobs import run_jobs
from vpsshop.servers.lifecycle import add_months, run_lifecycle
from vpsshop.servers.models import IpLease, ServerEvent, ServerJob
from vpsshop.testing import create_test_account

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}  # 3.99 a month
PRICE = 3_990_000
MCP = {"Accept": "application/json, text/event-stream", "Host": "127.0.0.1:8000"}


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {"hypervisor": {"simulator": {"boot_seconds": 0}}}


def _active(client, account) -> int:
    sid = _order(client, account)
    asyncio.run(run_jobs(_ctx(client)))
    assert client.get(f"/v1/servers/{sid}", headers=account.headers).json()["status"] == "active"
    return sid


def _row(ctx, sid: int) -> Server:
    with ctx.db.session() as session:
        return session.get(Server, sid)


def _refunds(ctx, sid: int) -> list[tuple[int, str | None]]:
    with ctx.db.session() as session:
        rows = session.exec(
            select(LedgerEntry).where(LedgerEntry.reason == "refund", LedgerEntry.ref == f"server:{sid}")
        )
        return [(e.amount_micros, e.dedupe_key) for e in rows]


def _balance(client, account) -> Decimal:
    return Decimal(str(client.get("/v1/account", headers=account.headers).json()["balance_usd"]))


def _jobs_of(ctx, sid: int) -> list[tuple[str, str]]:
    with ctx.db.session() as session:
        rows = session.exec(select(ServerJob).where(ServerJob.server_id == sid).order_by(ServerJob.id))
        return [(j.kind, j.status) for j in rows]


def _on_host(ctx, sid: int) -> HostInspection:
    row = _row(ctx, sid)
    handle = ServerHandle(host=row.host or "", domain=row.domain or "", ip=row.ip, location=row.location)
    return asyncio.run(ctx.hypervisor.inspect(handle))


def _lease(ctx, sid: int) -> str | None:
    with ctx.db.session() as session:
        return session.exec(select(IpLease.address).where(IpLease.server_id == sid)).first()


def _delete(client, account, sid: int, body: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
    return client.request("DELETE", f"/v1/servers/{sid}", headers={**account.headers, **headers}, json=body)


def _enable_totp(ctx, account, clock) -> str:
    customer = Customer(account.user_id)
    secret = asyncio.run(twofactor.begin_enrolment(ctx, customer)).secret
    asyncio.run(twofactor.confirm_enrolment(ctx, customer, twofactor.current_code(secret, clock.now().timestamp())))
    clock.advance(seconds=30)  # the next code is a new one
    return secret


# ---- the REST API -----------------------------------------------------------------------------------


def test_delete_ends_an_active_server_credits_its_unused_time_and_the_host_keeps_nothing(
    vpsshop_client, vpsshop_account, vpsshop_clock
):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    ordered_at = vpsshop_clock.now()
    sid = _active(client, account)
    address = _lease(ctx, sid)
    assert address and _on_host(ctx, sid).resources  # domain, disk and seed on the host
    vpsshop_clock.advance(days=10, hours=3)

    response = _delete(client, account, sid)
    assert response.status_code == 200, response.text
    body = response.json()
    shown = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
    assert body == {**shown, "refunded_usd": body["refunded_usd"]}  # the server as GET answers it, and the credit
    assert shown["status"] == "terminated" and "customer's request" in shown["status_reason"]
    # The current month pro rata to the microsecond, at most what was charged, once.
    end = add_months(ordered_at, 1)
    micro = timedelta(microseconds=1)
    expected = PRICE * ((end - vpsshop_clock.now()) // micro) // ((end - ordered_at) // micro)
    assert _refunds(ctx, sid) == [(expected, f"terminate-refund:{sid}")]
    assert 0 < expected < PRICE and Decimal(str(body["refunded_usd"])) == Decimal(expected) / 1_000_000
    assert _balance(client, account) == Decimal("6.01") + Decimal(expected) / 1_000_000
    assert client.get("/v1/account", headers=account.headers).json()["servers"] == 0

    # The event carries the server; the credit is its own ledger.credit.
    listed = client.get("/v1/events", headers=account.headers).json()["events"]
    terminated = [e for e in listed if e["type"] == "server.terminated"]
    assert [e["data"] for e in terminated] == [{"object": "server", **shown}]
    credits = [e["data"] for e in listed if e["type"] == "ledger.credit" and e["data"]["reason"] == "refund"]
    assert [(c["ref"], Decimal(str(c["amount_usd"]))) for c in credits] == [
        (f"server:{sid}", Decimal(expected) / 1_000_000)
    ]

    # The destroy job leaves nothing on the host, and the address goes back to the pool.
    assert _jobs_of(ctx, sid)[-1] == ("destroy", "queued")
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    assert _on_host(ctx, sid) == HostInspection()
    assert _lease(ctx, sid) is None
    ended = client.get(f"/v1/servers/{sid}", headers=account.headers).json()
    assert ended["power"] is None and ended["ip"] is None  # the address is no longer this server's
    with ctx.db.session() as session:
        kinds = [e.kind for e in session.exec(select(ServerEvent).where(ServerEvent.server_id == sid))]
    assert kinds[-3:] == ["terminated", "refunded", "destroyed"]
    other = _active(client, account)  # the freed address is leased again
    assert _lease(ctx, other) == address

    # Terminated already: a clear 409, nothing credited again.
    again = _delete(client, account, sid)
    assert again.status_code == 409 and again.json()["error"] == "server_terminated"
    assert len(_refunds(ctx, sid)) == 1


def test_a_server_still_provisioning_is_cancelled_and_its_order_refunded(vpsshop_client, vpsshop_account):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _order(client, account)  # no job has run: provisioning
    response = _delete(client, account, sid)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "terminated" and response.json()["refunded_usd"] == 3.99
    assert "before it was ready" in response.json()["status_reason"]
    assert _refunds(ctx, sid) == [(PRICE, f"refund:server:{sid}")]  # the key of a provisioning given up
    assert _balance(client, account) == Decimal("10")
    assert _jobs_of(ctx, sid) == [("provision", "cancelled"), ("destroy", "queued")]
    assert asyncio.run(run_jobs(ctx))["done"] == 1
    assert _on_host(ctx, sid) == HostInspection() and _lease(ctx, sid) is None


def test_a_server_suspended_for_nonpayment_is_ended_without_credit_one_the_shop_suspended_is_refused(
    vpsshop_client, vpsshop_account, vpsshop_clock
):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("3.99")
    lapsed = _active(client, account)
    vpsshop_clock.advance(days=32)  # nothing left to renew it with: suspended (not yet past the grace days)
    assert asyncio.run(run_lifecycle(ctx)).suspended == 1
    asyncio.run(run_jobs(ctx))
    response = _delete(client, account, lapsed)
    assert response.status_code == 200 and response.json()["refunded_usd"] == 0
    assert _refunds(ctx, lapsed) == []
    asyncio.run(run_jobs(ctx))
    assert _on_host(ctx, lapsed) == HostInspection()

    account.credit("3.99")
    held = _active(client, account)
    admin.set_server_state(ctx, Operator("support@test"), held, "suspend", "abuse report")
    refused = _delete(client, account, held)
    assert refused.status_code == 409 and refused.json()["error"] == "server_admin_suspended"
    assert _row(ctx, held).status == "suspended"


def test_two_factor_needs_a_fresh_code_and_nothing_is_done_without_it(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    secret = _enable_totp(ctx, account, vpsshop_clock)
    for body, error in (
        (None, "totp_required"),
        ({"totp_code": "  "}, "totp_required"),
        ({"totp_code": "000000"}, "invalid_totp_code"),
    ):
        refused = _delete(client, account, sid, body)
        assert refused.status_code == 401 and refused.json()["error"] == error, refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert _row(ctx, sid).status == "active" and _refunds(ctx, sid) == []
    code = twofactor.current_code(secret, vpsshop_clock.now().timestamp())
    done = _delete(client, account, sid, {"totp_code": code, "confirm_hostname": _row(ctx, sid).hostname.upper()})
    assert done.status_code == 200, done.text
    # A code works once.
    second = _active(client, account)
    used = _delete(client, account, second, {"totp_code": code})
    assert used.status_code == 401 and used.json()["error"] == "invalid_totp_code"


def test_refusals_are_clear_and_another_accounts_server_is_404(vpsshop_client, vpsshop_account):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    other = create_test_account(client)
    assert _delete(client, other, sid).status_code == 404
    assert _delete(client, account, 999_999).status_code == 404
    assert client.delete(f"/v1/servers/{sid}").status_code == 401
    for body, status, error in (
        ({"confirm_hostname": "someone-else"}, 400, "hostname_mismatch"),
        ({"confirm_hostname": ""}, 400, "invalid_confirm_hostname"),
        ({"confirm_hostname": 7}, 400, "invalid_confirm_hostname"),
        ({"totp_code": "1" * 65}, 400, "invalid_totp_code"),
        ({"force": True}, 400, "unknown_field"),
        ([], 400, "invalid_request"),
    ):
        refused = _delete(client, account, sid, body)
        assert (refused.status_code, refused.json()["error"]) == (status, error), (body, refused.text)
        assert refused.json()["message"]
    broken = client.request(
        "DELETE", f"/v1/servers/{sid}", headers={**account.headers, "Content-Type": "application/json"}, content=b"{"
    )
    assert broken.status_code == 400 and broken.json()["error"] == "invalid_json"
    text = client.request(
        "DELETE", f"/v1/servers/{sid}", headers={**account.headers, "Content-Type": "text/plain"}, content=b"x"
    )
    assert text.status_code == 415
    bad_key = _delete(client, account, sid, **{"Idempotency-Key": "with space"})
    assert bad_key.status_code == 400 and bad_key.json()["error"] == "invalid_idempotency_key"
    assert _row(ctx, sid).status == "active"
    assert _delete(client, account, sid, {"confirm_hostname": _row(ctx, sid).hostname}).status_code == 200


def test_an_idempotency_key_answers_the_first_termination_again(vpsshop_client, vpsshop_account):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    first = _delete(client, account, sid, **{"Idempotency-Key": "end-1"})
    assert first.status_code == 200 and "idempotent-replayed" not in first.headers
    again = _delete(client, account, sid, **{"Idempotency-Key": "end-1"})
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    other = _active(client, account)
    reused = _delete(client, account, other, **{"Idempotency-Key": "end-1"})
    assert reused.status_code == 409 and reused.json()["error"] == "idempotency_key_reused"
    assert _row(ctx, other).status == "active" and len(_refunds(ctx, sid)) == 1


@pytest.mark.parametrize("vpsshop_overrides", [{"ratelimit": {"writes_per_account": 3, "write_window_seconds": 60}}])
def test_a_termination_counts_as_a_write(vpsshop_client, vpsshop_account):
    client, account = vpsshop_client, vpsshop_account
    account.credit("10")
    sid = _order(client, account)  # 1
    assert client.post("/v1/keys", headers=account.headers).status_code == 201  # 2
    assert _delete(client, account, sid).status_code == 200  # 3
    limited = _delete(client, account, sid)
    assert limited.status_code == 429 and limited.json()["error"] == "rate_limited"


# ---- races: one termination, one credit ---------------------------------------------------------------


async def _deletes(app, headers: dict[str, str], sid: int, count: int, also: Any = None) -> list[Any]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop", timeout=120) as http:
        calls = [http.request("DELETE", f"/v1/servers/{sid}", headers=headers) for _ in range(count)]
        return await asyncio.gather(*calls, *([also] if also is not None else []), return_exceptions=True)


def test_concurrent_deletes_end_the_server_once_and_credit_once(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    vpsshop_clock.advance(days=3)
    answers = asyncio.run(_deletes(client.app, account.headers, sid, 12))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [409] * 11, [a.text for a in answers]
    assert {a.json()["error"] for a in answers if a.status_code == 409} == {"server_terminated"}
    [(refunded, _)] = _refunds(ctx, sid)
    [winner] = [a.json() for a in answers if a.status_code == 200]
    assert Decimal(str(winner["refunded_usd"])) == Decimal(refunded) / 1_000_000
    assert [k for k, _ in _jobs_of(ctx, sid)].count("destroy") == 1
    with ctx.db.session() as session:
        assert ledger.balance_from_entries(session, account.user_id) == 6_010_000 + refunded


def test_concurrent_retries_under_one_key_answer_one_termination(vpsshop_client, vpsshop_account):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    answers = asyncio.run(_deletes(client.app, {**account.headers, "Idempotency-Key": "same"}, sid, 8))
    assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
    assert len({a.text for a in answers}) == 1
    assert len(_refunds(ctx, sid)) == 1


def test_a_delete_racing_an_admin_refund_credits_once(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    vpsshop_clock.advance(days=5)

    async def admin_refund() -> str:
        return await asyncio.to_thread(
            admin.set_server_state, ctx, Operator("support@test"), sid, "terminate", "goodwill", refund_unused=True
        )

    *answers, by_admin = asyncio.run(_deletes(client.app, account.headers, sid, 4, admin_refund()))
    won = [a for a in answers if a.status_code == 200]
    assert len(won) + (0 if isinstance(by_admin, admin.AdminError) else 1) == 1, (answers, by_admin)
    assert all(a.status_code in (200, 409) for a in answers)
    assert len(_refunds(ctx, sid)) == 1 and _row(ctx, sid).status == "terminated"
    assert [k for k, _ in _jobs_of(ctx, sid)].count("destroy") == 1


def test_a_delete_racing_the_lifecycle_suspension_still_ends_the_server(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("3.99")
    sid = _active(client, account)
    vpsshop_clock.advance(days=32)  # expired, no balance to renew: the lifecycle suspends it
    *answers, passed = asyncio.run(_deletes(client.app, account.headers, sid, 3, run_lifecycle(ctx)))
    assert sorted(a.status_code for a in answers) == [200, 409, 409], [a.text for a in answers]
    assert _row(ctx, sid).status == "terminated" and _refunds(ctx, sid) == []  # its paid time was over
    assert passed.terminated == 0  # the lifecycle never terminated it a second time
    assert _balance(client, account) == 0


# ---- MCP ----------------------------------------------------------------------------------------------


def _tool(client, key: str, **arguments: Any) -> dict[str, Any]:
    answer = client.post(
        "/mcp",
        headers={**MCP, "Authorization": f"Bearer {key}"},
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "terminate_server", "arguments": arguments},
        },
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]


def test_the_mcp_tool_makes_the_agent_confirm_the_hostname(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    hostname = _row(ctx, sid).hostname
    for arguments, error in (
        ({"server_id": sid}, "invalid_confirm_hostname"),  # required for an agent
        ({"server_id": sid, "confirm_hostname": "other"}, "hostname_mismatch"),
    ):
        refused = _tool(client, account.api_key, **arguments)
        assert refused["isError"] is True and refused["structuredContent"]["error"] == error, refused
    assert _row(ctx, sid).status == "active"
    secret = _enable_totp(ctx, account, vpsshop_clock)
    needs_code = _tool(client, account.api_key, server_id=sid, confirm_hostname=hostname)
    assert needs_code["isError"] is True and needs_code["structuredContent"]["error"] == "totp_required"
    code = twofactor.current_code(secret, vpsshop_clock.now().timestamp())
    done = _tool(client, account.api_key, server_id=sid, confirm_hostname=hostname, totp_code=code)
    assert done.get("isError") is not True, done
    result = done["structuredContent"]
    assert result["status"] == "terminated" and result["refunded_usd"] > 0
    assert {k: v for k, v in result.items() if k != "refunded_usd"} == client.get(
        f"/v1/servers/{sid}", headers=account.headers
    ).json()
    listed = {
        t["name"]: t
        for t in client.post(
            "/mcp",
            headers={**MCP, "Authorization": f"Bearer {account.api_key}"},
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        ).json()["result"]["tools"]
    }
    tool = listed["terminate_server"]
    assert tool["annotations"]["destructiveHint"] is True
    assert "confirm_hostname" in tool["inputSchema"]["required"]


# ---- the dashboard ------------------------------------------------------------------------------------


def _alert(html: str) -> str:
    return unescape(" ".join(re.findall(r'role="alert"[^>]*>(.*?)</', html, re.S)))


def test_the_dashboard_asks_for_the_hostname_and_shows_the_credit(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _active(client, account)
    hostname = _row(ctx, sid).hostname
    vpsshop_clock.advance(days=2)
    assert sign_in(client, account.login_token).status_code == 303
    path = f"{D}/servers/{sid}"
    assert f'href="{path}/terminate"' in client.get(path).text
    page = client.get(f"{path}/terminate")
    assert page.status_code == 200 and "Terminate for good" in page.text and hostname in page.text
    assert "is credited to your balance" in page.text
    empty = post_form(client, f"{path}/terminate", {"hostname": ""}, page=f"{path}/terminate")
    assert empty.status_code == 400 and "Type the server's hostname" in _alert(empty.text)
    wrong = post_form(client, f"{path}/terminate", {"hostname": "not-" + hostname}, page=f"{path}/terminate")
    assert wrong.status_code == 400 and "not this server's hostname" in _alert(wrong.text)
    assert _row(ctx, sid).status == "active"
    done = post_form(client, f"{path}/terminate", {"hostname": f" {hostname} "}, page=f"{path}/terminate")
    assert done.status_code == 200, _alert(done.text)
    [(refunded, _)] = _refunds(ctx, sid)
    notice = unescape(re.search(r'id="terminated-notice">(.*?)</p>', done.text, re.S).group(1))
    assert "is terminated" in notice and format_usd(Decimal(refunded) / 1_000_000) in notice
    assert _row(ctx, sid).status == "terminated"
    assert f'href="{path}/terminate"' not in client.get(path).text


def test_with_totp_on_the_dashboard_asks_for_a_code_to_terminate(vpsshop_client, vpsshop_account, vpsshop_clock):
    client, account, ctx = vpsshop_client, vpsshop_account, _ctx(vpsshop_client)
    account.credit("10")
    sid = _order(client, account)
    hostname = _row(ctx, sid).hostname
    secret = _enable_totp(ctx, account, vpsshop_clock)
    assert sign_in(client, account.login_token).status_code == 303
    code_step = post_form(
        client, f"{D}/signin/code", {"code": twofactor.current_code(secret, vpsshop_clock.now().timestamp())}
    )
    assert code_step.status_code == 303
    vpsshop_clock.advance(seconds=30)
    path = f"{D}/servers/{sid}"
    no_code = post_form(client, f"{path}/terminate", {"hostname": hostname}, page=f"{path}/terminate")
    assert no_code.status_code == 401 and "authenticator app" in _alert(no_code.text)
    code = twofactor.current_code(secret, vpsshop_clock.now().timestamp())
    done = post_form(client, f"{path}/terminate", {"hostname": hostname, "code": code}, page=f"{path}/terminate")
    assert done.status_code == 200 and "$3.99 was credited" in done.text  # provisioning: the whole order
    assert _row(ctx, sid).status == "terminated"


# ---- OpenAPI ------------------------------------------------------------------------------------------


def test_openapi_describes_the_termination(vpsshop_client):
    operation = vpsshop_client.get("/v1/openapi.json").json()["paths"]["/servers/{id}"]["delete"]
    assert operation["operationId"] == "terminateServer"
    assert operation["requestBody"]["required"] is False
    assert operation["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/TerminateBody")
    assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ServerTerminated")
    assert {"400", "401", "404", "409", "429"} <= set(operation["responses"])
    assert "totp_required" in operation["responses"]["401"]["description"]
    assert "server_terminated" in operation["responses"]["409"]["description"]
    assert "pro rata" in operation["description"] and "non-refundable" in operation["description"]
    assert "Idempotency-Key" in {p["name"] for p in operation["parameters"]}


# ---- a served shop ------------------------------------------------------------------------------------


def test_a_served_shop_terminates_over_http_and_its_worker_destroys_the_server(
    vpsshop_database_url, vpsshop_context, tmp_path
):
    """``vpsshop serve`` (uvicorn, its own jobs task) on the test's database: DELETE over HTTP, from
    several connections at once, then the served worker's destroy job; the host is inspected here."""
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0",
    )
    ctx = vpsshop_context
    with serve(tmp_path, env) as api:
        headers, sid = active_server(api, tmp_path, env, ORDER, "terminate")
        assert _on_host(ctx, sid).resources and _lease(ctx, sid)

        async def together() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=30) as http:
                return await asyncio.gather(
                    *(http.request("DELETE", f"{api.base}/servers/{sid}", headers=headers) for _ in range(6))
                )

        answers = asyncio.run(together())
        assert sorted(a.status_code for a in answers) == [200] + [409] * 5, [a.text for a in answers]
        deadline = time.monotonic() + 30
        while httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()["power"] is not None:
            assert time.monotonic() < deadline, api.output()
            time.sleep(0.2)
        log = api.output()
    assert _on_host(ctx, sid) == HostInspection() and _lease(ctx, sid) is None
    assert len(_refunds(ctx, sid)) == 1
    with ctx.db.session() as session:
        destroyed = session.execute(
            sa.select(sa.func.count())
            .select_from(ServerEvent)
            .where(ServerEvent.server_id == sid, ServerEvent.kind == "destroyed")
        ).scalar_one()
    assert destroyed == 1
    assert "Traceback" not in log, log
