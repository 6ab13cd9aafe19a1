"""Webhook endpoints, signed deliveries to a real HTTP receiver (verified with the `standardwebhooks`
library), backoff, disabling, the delivery log, redelivery, the SSRF rules and the vpsshop_event
hook, in process on a FrozenClock (SQLite and PostgreSQL). tests/test_webhooks_live.py runs the
same against `vpsshop serve` and `vpsshop worker` processes."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
from sqlmodel import select
from starlette.testclient import TestClient
from webhook_receiver import Receiver

from vpsshop import hookimpl
from vpsshop.events import delivery, dispatch, outbox, signing
from vpsshop.events.models import WebhookDelivery, WebhookEndpoint
from vpsshop.events.sender import InvalidUrl, normalize_url, post, refusal
from vpsshop.events.settings import build_settings
from vpsshop.testing import create_test_account


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def vpsshop_overrides() -> dict[str, Any]:
    return {
        "events": {
            "retry_base_seconds": 10,
            "retry_max_delay_seconds": 600,
            "retry_window_hours": 1,
            "disable_after_hours": 2,
            "timeout_seconds": 5,
            "max_endpoints_per_account": 3,
        },
        "hypervisor": {"simulator": {"boot_seconds": 0}},  # a server is active after its first job
    }


def run(client: TestClient) -> dict[str, int]:
    return asyncio.run(delivery.run_pass(client.app.state.ctx))


def register(client: TestClient, account: Any, receiver: Receiver, path: str, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/webhooks", headers=account.headers, json={"url": receiver.url(path), **body})
    assert response.status_code == 201, response.text
    created = response.json()
    receiver.secrets[path] = created["secret"]
    return created


def test_register_and_receive_signed_events(vpsshop_client: TestClient, receiver: Receiver) -> None:
    client = vpsshop_client
    account = create_test_account(client)
    a = register(client, account, receiver, "/a", event_types=["api_key.*"], description="keys only")
    b = register(client, account, receiver, "/b")
    assert a["secret"].startswith("whsec_") and len(signing.secret_key_bytes(a["secret"])) == 32
    created = client.post("/v1/webhooks", headers=account.headers, json={"url": receiver.url("/c")})
    assert created.headers["cache-control"] == "no-store"
    client.delete(f"/v1/webhooks/{created.json()['id']}", headers=account.headers)
    listed = client.get("/v1/webhooks", headers=account.headers).json()["webhooks"]
    assert [(w["id"], w["event_types"], w["status"]) for w in listed] == [
        (a["id"], ["api_key.*"], "enabled"),
        (b["id"], ["*"], "enabled"),
    ]
    assert "secret" not in json.dumps(listed)
    with client.app.state.ctx.db.session() as session:  # encrypted at rest, with the shop's encryption key
        row = session.get(WebhookEndpoint, a["id"])
        assert a["secret"] not in row.secret_enc
        assert signing.decrypt_secret(client.app.state.ctx, row.secret_enc) == a["secret"]

    key = client.post("/v1/keys", headers=account.headers).json()
    client.delete(f"/v1/keys/{key['id']}", headers=account.headers)
    account.credit("5")
    assert run(client)["succeeded"] == 8
    got = receiver.wait_for(lambda r: len(r) == 8)
    assert all(r.verified for r in got), [r.error for r in got]
    by_path = {p: sorted(r.json()["type"] for r in got if r.path == p) for p in ("/a", "/b")}  # sent concurrently
    assert by_path == {
        "/a": ["api_key.created", "api_key.revoked"],
        "/b": [
            "api_key.created",
            "api_key.revoked",
            "ledger.credit",
            "webhook.created",  # its own registration (a first event to check the endpoint with)
            "webhook.created",  # /c
            "webhook.deleted",  # /c again
        ],
    }  # account.created predates /b
    listed_events = client.get("/v1/events", headers=account.headers).json()["events"]
    for r in got:
        assert r.headers["webhook-id"] == r.json()["id"]
        assert r.json() in listed_events  # the same body as GET /v1/events shows
        assert r.headers["content-type"] == "application/json" and r.headers["user-agent"].startswith("vpsshop")
    assert run(client)["succeeded"] == 0  # accepted once: never sent again
    log = client.get(f"/v1/webhooks/{b['id']}/deliveries", headers=account.headers).json()
    assert [d["event_type"] for d in log["deliveries"]] == [
        "ledger.credit",
        "api_key.revoked",
        "api_key.created",
        "webhook.deleted",
        "webhook.created",
        "webhook.created",
    ]
    assert all(
        d["status"] == "succeeded" and [x["outcome"] for x in d["log"]] == ["accepted"] for d in log["deliveries"]
    )


def test_failures_back_off_give_up_and_disable_the_endpoint(
    vpsshop_client: TestClient, receiver: Receiver, vpsshop_clock: Any
) -> None:
    client = vpsshop_client
    receiver.plan = lambda path, msg_id, seen: (500, {}, 0.0)
    account = create_test_account(client)
    hook = register(client, account, receiver, "/down", event_types=["api_key.created"])
    client.post("/v1/keys", headers=account.headers)
    start = vpsshop_clock.now()
    delays = []
    while True:
        counts = run(client)
        assert counts["succeeded"] == 0 and counts["retry"] + counts["failed"] == 1
        assert run(client)["retry"] == 0  # nothing is due before its time
        with client.app.state.ctx.db.session() as session:
            row = session.exec(select(WebhookDelivery)).one()
        if row.status == "failed":
            break
        delays.append((row.next_attempt_at - vpsshop_clock.now()).total_seconds())
        vpsshop_clock.set(row.next_attempt_at)
    # 10 s doubling (+-10 %), capped at 600 s, tried for the hour of retry_window_hours
    for n, delay in enumerate(delays):
        assert 0.9 * min(10 * 2**n, 600) <= delay <= 1.1 * min(10 * 2**n, 600)
    assert (vpsshop_clock.now() - start).total_seconds() <= 3600 < sum(delays) + 660
    assert row.attempts == len(delays) + 1 and len(receiver.received) == row.attempts
    assert all(r.verified for r in receiver.received)
    assert len({r.headers["webhook-timestamp"] for r in receiver.received}) >= 1
    endpoint = client.get(f"/v1/webhooks/{hook['id']}", headers=account.headers).json()
    assert endpoint["status"] == "enabled" and datetime.fromisoformat(endpoint["failing_since"]) == start

    vpsshop_clock.set(start.replace() + (vpsshop_clock.now() - start) * 2 + (vpsshop_clock.now() - start) * 0)
    client.post("/v1/keys", headers=account.headers)  # a new event, failing on past the two hours
    while client.get(f"/v1/webhooks/{hook['id']}", headers=account.headers).json()["status"] == "enabled":
        run(client)
        vpsshop_clock.advance(minutes=10)
    endpoint = client.get(f"/v1/webhooks/{hook['id']}", headers=account.headers).json()
    assert endpoint["disabled_reason"].startswith("Every attempt since")
    told = client.get("/v1/events", headers=account.headers, params={"type": "webhook.disabled"}).json()["events"]
    assert [e["data"]["id"] for e in told] == [hook["id"]] and told[0]["data"]["status"] == "disabled"
    sent = len(receiver.received)
    client.post("/v1/keys", headers=account.headers)
    vpsshop_clock.advance(hours=1)
    run(client)
    assert len(receiver.received) == sent  # a disabled endpoint gets nothing
    again = client.patch(f"/v1/webhooks/{hook['id']}", headers=account.headers, json={"enabled": True}).json()
    assert (again["status"], again["disabled_reason"], again["failing_since"]) == ("enabled", None, None)


def test_410_disables_then_redeliver_after_reenabling(vpsshop_client: TestClient, receiver: Receiver) -> None:
    client = vpsshop_client
    receiver.plan = lambda path, msg_id, seen: (410, {}, 0.0) if seen == 0 else (204, {}, 0.0)
    account, other = create_test_account(client), create_test_account(client)
    hook = register(client, account, receiver, "/gone", event_types=["api_key.*"])
    client.post("/v1/keys", headers=account.headers)
    run(client)
    assert client.get(f"/v1/webhooks/{hook['id']}", headers=account.headers).json()["disabled_reason"] == (
        "The endpoint answered 410 Gone."
    )
    event_id = receiver.received[0].id
    redo = client.post(f"/v1/webhooks/{hook['id']}/redeliver", headers=account.headers, json={"event_id": event_id})
    assert (redo.status_code, redo.json()["error"]) == (409, "webhook_disabled")
    client.patch(f"/v1/webhooks/{hook['id']}", headers=account.headers, json={"enabled": True})
    their_event = client.get("/v1/events", headers=other.headers).json()["events"][0]["id"]
    assert (
        client.post(
            f"/v1/webhooks/{hook['id']}/redeliver", headers=account.headers, json={"event_id": their_event}
        ).status_code
        == 404
    )
    assert (
        client.post(
            f"/v1/webhooks/{hook['id']}/redeliver", headers=other.headers, json={"event_id": event_id}
        ).status_code
        == 404
    )
    redo = client.post(f"/v1/webhooks/{hook['id']}/redeliver", headers=account.headers, json={"event_id": event_id})
    assert redo.status_code == 202 and redo.json()["status"] == "pending" and redo.json()["redelivery"]
    assert run(client)["succeeded"] == 1
    assert [(r.id, r.status) for r in receiver.received] == [(event_id, 410), (event_id, 204)]
    log = client.get(f"/v1/webhooks/{hook['id']}/deliveries", headers=account.headers, params={"limit": 1}).json()
    assert log["has_more"] and log["deliveries"][0]["redelivery"] and log["deliveries"][0]["status"] == "succeeded"
    older = client.get(
        f"/v1/webhooks/{hook['id']}/deliveries", headers=account.headers, params={"before": log["cursor"]}
    ).json()["deliveries"]
    assert [(d["status"], d["log"][0]["status_code"], d["log"][0]["outcome"]) for d in older] == [
        ("pending", 410, "rejected")
    ]  # the first delivery waits for its retry: at least once


def test_endpoint_validation_limits_and_ownership(vpsshop_client: TestClient, receiver: Receiver) -> None:
    client = vpsshop_client
    account, other = create_test_account(client), create_test_account(client)
    for url, code in (
        ("ftp://example.com/x", "invalid_request"),
        ("https://user:pw@example.com/x", "invalid_url"),
        ("http://169.254.169.254/latest/meta-data", "invalid_url"),
        ("http://10.0.0.8/x", "invalid_url"),
        ("https://intranet/x", "invalid_url"),
    ):
        bad = client.post("/v1/webhooks", headers=account.headers, json={"url": url})
        assert bad.status_code == 400 and bad.json()["error"] in (code, "invalid_url"), bad.text
    bad = client.post("/v1/webhooks", headers=account.headers, json={"url": receiver.url(), "event_types": ["nope"]})
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_event_types")
    hooks = [register(client, account, receiver, f"/{n}") for n in range(3)]
    full = client.post("/v1/webhooks", headers=account.headers, json={"url": receiver.url()})
    assert (full.status_code, full.json()["error"]) == (409, "too_many_webhooks")
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/deliveries")):
        assert client.request(method, f"/v1/webhooks/{hooks[0]['id']}{path}", headers=other.headers).status_code == 404
    changed = client.patch(
        f"/v1/webhooks/{hooks[0]['id']}",
        headers=account.headers,
        json={"url": "https://hooks.example.com/v1", "event_types": ["topup.*", "topup.completed"]},
    )
    assert changed.json()["url"] == "https://hooks.example.com/v1"
    assert changed.json()["event_types"] == ["topup.*", "topup.completed"]
    client.post("/v1/keys", headers=account.headers)
    outbox.publish_pending(client.app.state.ctx.db)
    delivery.fan_out(client.app.state.ctx)
    deleted = client.delete(f"/v1/webhooks/{hooks[1]['id']}", headers=account.headers)
    assert deleted.json() == {"id": hooks[1]["id"], "deleted": True}
    with client.app.state.ctx.db.session() as session:
        states = {d.endpoint_id: d.status for d in session.exec(select(WebhookDelivery)).all()}
    assert states == {hooks[1]["id"]: "cancelled", hooks[2]["id"]: "pending"}  # hooks[0] takes top-ups only
    assert client.get(f"/v1/webhooks/{hooks[1]['id']}", headers=account.headers).status_code == 404


# ---- SSRF ----------------------------------------------------------------------------------------

PRODUCTION = build_settings({"timeout_seconds": 2}, sandbox=False)
SANDBOX = build_settings({"timeout_seconds": 2}, sandbox=True)


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]", "169.254.169.254", "0.0.0.0", "10.1.2.3", "100.64.0.1"],
)
def test_production_refuses_private_loopback_and_link_local(receiver: Receiver, host: str) -> None:
    result = asyncio.run(post(f"http://{host}:{receiver.port}/x", {}, b"{}", PRODUCTION))
    assert result.outcome == "refused", result
    assert "may not reach" in (result.error or "")
    with pytest.raises(InvalidUrl):  # refused at registration already
        normalize_url(f"https://{host}/x", PRODUCTION)
    assert receiver.received == []


def test_a_name_resolving_to_a_private_address_is_refused(receiver: Receiver) -> None:
    calls: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return {"public-then-private.test": ["93.184.216.34", "10.0.0.7"], "intranet.test": ["192.168.1.5"]}[host]

    for name in ("intranet.test", "public-then-private.test"):  # every address counts, not just the first
        result = asyncio.run(post(f"https://{name}/x", {}, b"{}", PRODUCTION, resolver))
        assert result.outcome == "refused" and "may not reach" in result.error, result
    assert calls == ["intranet.test", "public-then-private.test"]


def test_the_connection_goes_to_the_checked_address(receiver: Receiver) -> None:
    """The name is resolved once, checked, and the socket connects to that address: a second DNS
    answer (rebinding to an internal address) is never asked for."""
    answers = [["127.0.0.1"], ["169.254.169.254"]]
    asked: list[str] = []

    async def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return answers[len(asked) - 1]

    result = asyncio.run(
        post(f"http://rebind.test:{receiver.port}/pinned", {"webhook-id": "evt_x"}, b"{}", SANDBOX, rebinding)
    )
    assert result.outcome == "accepted" and asked == ["rebind.test"]
    assert receiver.received[0].headers["host"] == f"rebind.test:{receiver.port}"  # the name, on the checked address


def test_redirects_are_not_followed_and_reads_are_bounded(receiver: Receiver) -> None:
    target = Receiver()
    try:
        receiver.plan = lambda path, msg_id, seen: (
            (302, {"Location": target.url("/internal")}, 0.0) if path == "/redirect" else (200, {}, 3.0)
        )
        result = asyncio.run(post(receiver.url("/redirect"), {}, b"{}", SANDBOX))
        assert (result.outcome, result.status_code) == ("rejected", 302)
        assert "not followed" in result.error and target.received == []
        slow = asyncio.run(post(receiver.url("/slow"), {}, b"{}", SANDBOX))
        assert slow.outcome == "error" and slow.duration_ms < 2900
    finally:
        target.close()
    assert asyncio.run(post("http://169.254.169.254/latest/meta-data/", {}, b"{}", SANDBOX)).outcome == "refused"


def test_url_rules_by_mode() -> None:
    assert normalize_url("https://Hooks.Example.COM/a?b=1#frag", PRODUCTION) == "https://hooks.example.com/a?b=1"
    assert normalize_url("https://bücher.example/x", PRODUCTION) == "https://xn--bcher-kva.example/x"
    with pytest.raises(InvalidUrl, match="https only"):
        normalize_url("http://hooks.example.com/", PRODUCTION)
    assert normalize_url("http://127.0.0.1:9/x", SANDBOX) == "http://127.0.0.1:9/x"  # the sandbox tries it locally
    allowed = build_settings({"allowed_networks": ["10.20.0.0/16"]}, sandbox=False)
    assert normalize_url("https://10.20.1.2/x", allowed) == "https://10.20.1.2/x"
    with pytest.raises(InvalidUrl):
        normalize_url("https://10.21.1.2/x", allowed)


# ---- issue 22, items 6 and 10: a host in any spelling is the address it spells --------------------

# 10.1.2.3 (refused in the sandbox too) and 127.0.0.1 (refused in production) as resolvers and IDNA read them
INTERNAL_SPELLINGS = [
    "10\u30021\u30022\u30023",  # ideographic full stops
    "10\uff0e1\uff0e2\uff0e3",  # fullwidth full stops
    "\uff11\uff10.\uff11.\uff12.\uff13",  # fullwidth digits
    "012.1.2.3",  # octal
    "0xa.1.2.3",
    "0x0A.0x01.0x0203",
    "10.66051",  # 10.1.515 -> 10.1.2.3
    "167838211",  # one number
    "0xa010203",
    "10.1.2.3.",  # a trailing dot
    "[2002:a01:203::1]",  # 6to4 of 10.1.2.3
    "[64:ff9b::a01:203]",  # NAT64 of 10.1.2.3
    "[::ffff:10.1.2.3]",
    "0xa9.254.169.254",  # the metadata service
    "2852039166",
]
LOOPBACK_SPELLINGS = [
    "127\u30020\u30020\u30021",
    "\uff11\uff12\uff17.\uff10.\uff10.\uff11",
    "0177.0.0.1",
    "0x7f.0.0.1",
    "127.1",
    "2130706433",
    "[2002:7f00:1::1]",
    "[64:ff9b::7f00:1]",
]


def test_a_host_in_unicode_or_numeric_form_is_refused_at_registration(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    for host in INTERNAL_SPELLINGS:
        for url in (f"https://{host}:19151/h", f"http://{host}/h"):
            bad = vpsshop_client.post("/v1/webhooks", headers=account.headers, json={"url": url})
            assert bad.status_code == 400 and bad.json()["error"] == "invalid_url", (url, bad.text)
            assert "which webhooks may not reach" in bad.json()["message"], bad.text
    for host in LOOPBACK_SPELLINGS:
        with pytest.raises(InvalidUrl, match="loopback address"):
            normalize_url(f"https://{host}:19151/h", PRODUCTION)
        if not host.startswith("["):  # the sandbox allows loopback: it is stored as the plain address
            assert normalize_url(f"http://{host}:19151/h", SANDBOX) == "http://127.0.0.1:19151/h"
    for url in ("https://127.0.0.1\u200b/h", "https://exa\u200bmple.com/h", "https://example.com/a b"):
        with pytest.raises(InvalidUrl, match="invisible characters"):
            normalize_url(url, SANDBOX)
    assert vpsshop_client.get("/v1/webhooks", headers=account.headers).json()["webhooks"] == []
    # a public address in an odd spelling is stored as the address
    assert normalize_url("https://0x08.8.8.8/h", PRODUCTION) == "https://8.8.8.8/h"
    assert normalize_url("https://\uff18.\uff18.\uff18.\uff18/h", PRODUCTION) == "https://8.8.8.8/h"
    with pytest.raises(InvalidUrl, match="ends in a number but is not an IPv4 address"):
        normalize_url("https://hooks.example.123/h", PRODUCTION)


def test_6to4_and_nat64_of_an_internal_address_are_refused_at_delivery(receiver: Receiver) -> None:
    for host in ("[2002:7f00:1::1]", "[64:ff9b::7f00:1]", "[2002:a9fe:a9fe::]"):
        result = asyncio.run(post(f"http://{host}:{receiver.port}/x", {}, b"{}", PRODUCTION))
        assert result.outcome == "refused" and "may not reach" in (result.error or ""), (host, result)
    assert receiver.received == []


def test_url_refusals_are_said_in_words(vpsshop_client: TestClient) -> None:
    account = create_test_account(vpsshop_client)
    for url, says in (
        ("https://user:pw@example.com/x", "url: the URL must not carry a user name or password."),
        ("https://token@example.com/x", "url: the URL must not carry a user name or password."),
        ("https://100.64.0.1/x", "url: 100.64.0.1 is not a public address, which webhooks may not reach."),
        ("https://10.0.0.8/x", "url: 10.0.0.8 is a private address, which webhooks may not reach."),
        ("https://exa mple.com/x", "url: the URL must not contain spaces"),
    ):
        bad = vpsshop_client.post("/v1/webhooks", headers=account.headers, json={"url": url})
        assert bad.status_code == 400 and bad.json()["error"] == "invalid_url", bad.text
        assert bad.json()["message"].startswith(says), bad.json()["message"]
        assert "pattern" not in bad.json()["message"] and "^" not in bad.json()["message"]
    hook = vpsshop_client.post("/v1/webhooks", headers=account.headers, json={"url": "https://hooks.example.com/x"})
    changed = vpsshop_client.patch(
        f"/v1/webhooks/{hook.json()['id']}", headers=account.headers, json={"url": "https://u:p@hooks.example.com/x"}
    )
    assert changed.status_code == 400 and "user name or password" in changed.json()["message"], changed.text
    spec = vpsshop_client.get("/v1/openapi.json").json()["components"]["schemas"]["WebhookBody"]["properties"]["url"]
    assert spec["pattern"].startswith("^https?://")  # still documented for clients and schemathesis


# ---- fuzz: spellings of addresses -------------------------------------------------------------------

_DOTS = ["."] * 6 + ["\u3002", "\uff0e", "\uff61"]
_FULLWIDTH = str.maketrans("0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19")


def _spell(address: int, data: Any) -> str:
    """``address`` (an IPv4 address as an integer) spelt as resolvers or IDNA read it."""
    octets = list(address.to_bytes(4, "big"))
    parts = data.draw(st.sampled_from([4, 3, 2, 1]), label="parts")
    numbers = [*octets[: parts - 1], int.from_bytes(bytes(octets[parts - 1 :]), "big")]
    texts = []
    for number in numbers:
        form = data.draw(st.sampled_from(["dec", "oct", "hex", "HEX"]), label="form")
        texts.append(
            {"dec": str(number), "oct": "0" + format(number, "o"), "hex": hex(number)}.get(form, f"0X{number:X}")
        )
    dot = data.draw(st.sampled_from(_DOTS), label="dot")
    host = dot.join(texts) + data.draw(st.sampled_from(["", "", "."]), label="trailing dot")
    if data.draw(st.booleans(), label="fullwidth digits"):
        host = host.translate(_FULLWIDTH)
    return host


def test_fuzz_every_spelling_of_an_internal_address_is_refused_and_of_a_public_one_stored_plain() -> None:

    import hypothesis.strategies as st

    internal = st.sampled_from(["127.0.0.1", "10.1.2.3", "169.254.169.254", "192.168.0.1", "100.64.0.9", "0.0.0.0"])
    addresses = st.one_of(
        internal, st.integers(min_value=0, max_value=2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))
    )

    @hypothesis.settings(max_examples=400, deadline=None, derandomize=True, database=None)
    @hypothesis.given(address=addresses, data=st.data(), wrap=st.sampled_from(["v4", "v4", "6to4", "nat64", "mapped"]))
    def one(address: str, data: Any, wrap: str) -> None:
        ip = ipaddress.IPv4Address(address)
        if wrap == "v4":
            host = _spell(int(ip), data)
        else:
            v6 = {
                "6to4": (0x2002 << 112) | (int(ip) << 80),
                "nat64": (0x64FF9B << 96) | int(ip),
                "mapped": (0xFFFF << 32) | int(ip),
            }
            host = f"[{ipaddress.IPv6Address(v6[wrap])}]"
        try:
            stored = normalize_url(f"https://{host}/h", PRODUCTION)
        except InvalidUrl:
            stored = None
        if refusal(address) is not None:  # internal in any spelling: refused at registration
            assert stored is None, (host, stored)
        elif wrap == "v4":  # public: stored as the plain address, which delivery checks the same way
            assert stored == f"https://{address}/h", (host, stored)

    one()


# ---- the vpsshop_event hook ----------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @hookimpl
    def vpsshop_event(self, event: Any) -> None:
        self.seen.append((event.type, event.id))


class Flaky:
    """Fails twice on every api_key.created, then takes it; async, and takes the context too."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @hookimpl
    async def vpsshop_event(self, ctx: Any, event: Any) -> None:
        self.calls.append(event.type)
        if event.type == "api_key.created" and self.calls.count("api_key.created") <= 2:
            raise RuntimeError("chat service is down")


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def vpsshop_event(self, event: Any) -> None:
        self.calls += 1
        raise ValueError("always")


def test_plugins_see_events_and_a_failing_plugin_blocks_nobody(
    vpsshop_settings: Any, vpsshop_clock: Any, receiver: Receiver
) -> None:
    from vpsshop import create_app
    from vpsshop.plugins import build_plugin_manager
    from vpsshop.settings import _merge, load_settings

    settings = load_settings(
        None,
        environ={},
        overrides=_merge(
            vpsshop_settings.model_dump(mode="json")
            | {
                "secret_key": vpsshop_settings.secret_key.get_secret_value(),
                "encryption_key": vpsshop_settings.encryption_key.get_secret_value(),
                "config_path": None,
            },
            {"events": {"hook_retry_seconds": 30, "hook_max_attempts": 3}},
        ),
    )
    recorder, flaky, broken = Recorder(), Flaky(), Broken()
    pm = build_plugin_manager()
    for name, plugin in (("recorder", recorder), ("flaky", flaky), ("broken", broken)):
        pm.register(plugin, name=name)
    app = create_app(settings, pm=pm, clock=vpsshop_clock, background=False)
    with TestClient(app) as client:
        ctx = app.state.ctx
        account = create_test_account(client)
        register(client, account, receiver, "/w")
        client.post("/v1/keys", headers=account.headers)

        def hooks() -> int:
            return asyncio.run(dispatch.run_hooks(ctx))

        hooks()
        assert [t for t, _ in recorder.seen] == [
            "account.created",
            "api_key.created",
            "webhook.created",
            "api_key.created",
        ]
        assert flaky.calls == ["account.created", "api_key.created"] and broken.calls == 1
        assert run(client)["succeeded"] == 2  # webhooks do not wait for plugins (/w gets its own registration too)
        hooks()
        assert flaky.calls == ["account.created", "api_key.created"]  # waits hook_retry_seconds
        vpsshop_clock.advance(seconds=31)
        hooks()
        assert flaky.calls == ["account.created", "api_key.created", "api_key.created"]
        vpsshop_clock.advance(seconds=61)
        hooks()
        assert flaky.calls == [
            "account.created",
            "api_key.created",
            "api_key.created",
            "api_key.created",
            "webhook.created",
            "api_key.created",
        ]
        assert broken.calls == 3 + 1  # account.created given up after 3 calls, the next event tried at once
        for _ in range(6):
            vpsshop_clock.advance(minutes=10)
            hooks()
        assert broken.calls == 12  # every event offered hook_max_attempts times, then skipped
        assert len(recorder.seen) == 4 and len({i for _, i in recorder.seen}) == 4


def test_power_actions_and_changes_are_delivered(vpsshop_client: TestClient, receiver: Receiver) -> None:
    """A stop once its job has run, and a PATCH, reach the account's webhook like any other event."""
    from vpsshop.servers.jobs import run_jobs

    client = vpsshop_client
    account = create_test_account(client)
    account.credit("10")
    register(client, account, receiver, "/servers", event_types=["server.*"])
    server = client.post(
        "/v1/servers", headers=account.headers, json={"plan": "pup", "location": "nl", "os": "debian-12"}
    )
    assert server.status_code == 201, server.text
    sid = server.json()["server"]["id"]
    asyncio.run(run_jobs(client.app.state.ctx))  # provisioned: active
    assert client.post(f"/v1/servers/{sid}/stop", headers=account.headers).status_code == 202
    asyncio.run(run_jobs(client.app.state.ctx))  # the stop has run
    assert client.patch(f"/v1/servers/{sid}", headers=account.headers, json={"auto_renew": False}).status_code == 200
    assert run(client)["succeeded"] == 4
    got = receiver.wait_for(lambda r: len(r) == 4)
    assert all(r.verified for r in got)
    kinds = {r.json()["type"]: r.json()["data"] for r in got}
    assert set(kinds) == {"server.provisioning", "server.active", "server.stopped", "server.updated"}
    assert kinds["server.stopped"]["power"] == "stopped" and kinds["server.updated"]["auto_renew"] is False
