"""Property-based fuzzing of every endpoint that reads a body: whatever arrives (any JSON, broken
JSON, odd bytes, wrong content types, duplicate keys, deep nesting, huge numbers), the answer is
never a 5xx, every error is the error body, and nothing in the ledger moves on a 4xx. User data
gets its own: YAML nested up to 9,000 deep in every form and numbers of every size and notation are
accepted or refused quickly, never a 5xx, and what is accepted can be written into a seed. The same for
every path with an id, the console's WebSocket included: any number in the id's place is a 4xx (or a
refused handshake), never a 5xx."""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import hypothesis.strategies as st
import sqlalchemy as sa

from vpsshop.api.spec import spec_of

JSON_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    None,
    "application/x-www-form-urlencoded",
    "application/merge-patch+json",
    "application/json-patch+json",
    "application/vnd.api+json",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(
        ["", " " * 12, "false", "0", "25.000000000000000001", "a\x00b", "x\u202ey", "vpsl_x.y", "LTC", "pup"]
    ),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)


def _field_bodies(route) -> st.SearchStrategy[Any]:
    """Objects using the model's own field names, so validation goes past the first unknown field."""
    names = list(route.body.model_fields)
    return st.dictionaries(st.sampled_from(names), json_values, max_size=len(names))


def _raw(value: Any) -> bytes:
    return json.dumps(value, default=str).encode()


def bodies(route) -> st.SearchStrategy[bytes]:
    return st.one_of(
        _field_bodies(route).map(_raw),
        json_values.map(_raw),
        st.binary(max_size=64),
        st.integers(min_value=1, max_value=3000).map(lambda n: b'{"a":' + b"[" * n + b"]" * n + b"}"),
        st.integers(min_value=30, max_value=6000).map(lambda n: b'{"amount": ' + b"9" * n + b"}"),
        st.sampled_from(
            [
                b'{"name": "a", "name": "b"}',
                b'{"amount": 1e999999}',
                b'{"amount": NaN}',
                b'{"auto_renew": "false"}',
                b"\xef\xbb\xbf{}",
                b"{",
                b"null",
                b"[]",
            ]
        ),
    )


def _ledger(ctx) -> tuple[Any, ...]:
    with ctx.db.engine.connect() as conn:
        entries = conn.execute(sa.text("SELECT count(*), coalesce(sum(amount_micros), 0) FROM ledger_entries")).one()
        balances = conn.execute(sa.text("SELECT coalesce(sum(balance_micros), 0) FROM accounts")).scalar()
    return (*tuple(entries), balances)


def test_no_body_gets_a_5xx_or_moves_the_ledger_on_a_4xx(vpsshop_client, vpsshop_account):
    ctx = vpsshop_client.app.state.ctx
    vpsshop_account.credit("500")
    headers = vpsshop_account.headers
    server = vpsshop_client.post(
        "/v1/servers", headers=headers, json={"plan": "pup", "location": "nl", "os": "ubuntu-24.04"}
    ).json()["server"]
    topup = vpsshop_client.post("/v1/topups", headers=headers, json={"amount": 30, "coin": "LTC"}).json()
    ids = {"{id}": str(server["id"]), "{ref}": topup["ref"]}
    routes = [r for r in spec_of(ctx).routes if r.body is not None]
    assert len(routes) >= 6, [r.path for r in routes]

    @hypothesis.settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(data=st.data())
    def one(data: st.DataObject) -> None:
        route = data.draw(st.sampled_from(routes), label="route")
        path = "/v1" + route.path
        for name, value in ids.items():
            path = path.replace(name, value)
        content = data.draw(bodies(route), label="body")
        content_type = data.draw(st.sampled_from(JSON_TYPES), label="content_type")
        sent = dict(headers)
        if content_type:
            sent["Content-Type"] = content_type
        before = _ledger(ctx)
        response = vpsshop_client.request(route.method, path, headers=sent, content=content)
        assert response.status_code < 500, (route.method, path, content[:200], response.text)
        media = (content_type or "").split(";")[0].strip().lower()
        if content.strip() and media != "application/json":  # no other type is taken as JSON
            assert response.status_code in (415, 429), (content_type, response.text)
        if response.status_code >= 400:
            assert response.headers["content-type"].startswith("application/json"), response.headers
            body = response.json()
            assert isinstance(body.get("error"), str) and isinstance(body.get("message"), str) and body["message"]
            assert _ledger(ctx) == before, (route.method, path, content[:200], response.text)

    one()


path_ids = st.one_of(
    st.integers(min_value=0, max_value=2**31 + 10),
    st.integers(min_value=2**31 - 3, max_value=2**31 + 3),  # the database's integer ends here
    st.integers(min_value=0, max_value=10**40),
    st.sampled_from([2**63 - 1, 2**63, 2**64, 10**18 - 1, 10**18]),
).map(str) | st.sampled_from(["00000000001", "0" * 30, "1e3", "-1", "%31", "1.0"])


def test_no_path_id_gets_a_5xx(vpsshop_client, vpsshop_account):
    from starlette.websockets import WebSocketDisconnect

    ctx = vpsshop_client.app.state.ctx
    routes = [r for r in spec_of(ctx).routes if "{id}" in r.path]
    assert len(routes) >= 10, [r.path for r in routes]

    @hypothesis.settings(max_examples=300, deadline=None, derandomize=True, database=None)
    @hypothesis.given(data=st.data())
    def one(data: st.DataObject) -> None:
        route = data.draw(st.sampled_from(routes), label="route")
        server_id = data.draw(path_ids, label="id")
        path = "/v1" + route.path.replace("{id}", server_id).replace("{ref}", "x")
        body = b"{}" if route.body is not None else b""
        headers = {**vpsshop_account.headers, "Content-Type": "application/json"}
        response = vpsshop_client.request(route.method, path, headers=headers, content=body)
        assert response.status_code < 500, (route.method, path, response.text)
        if response.status_code >= 400:
            assert isinstance(response.json()["error"], str) and response.json()["message"], response.text
        try:  # the console's socket: a refused handshake, or closed for the bad ticket; never an error
            with vpsshop_client.websocket_connect(f"/v1/servers/{server_id}/console/ws?ticket=x") as ws:
                assert ws.receive()["code"] == 4401
        except WebSocketDisconnect:
            pass

    one()


yaml_numbers = st.one_of(
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
    st.integers(min_value=1, max_value=5000).map(lambda n: "-0x" + "f" * n),
    st.integers(min_value=1, max_value=16000).map(lambda n: "0b" + "1" * n),
    st.integers(min_value=1, max_value=3000).map(lambda n: "1" + ":30" * n),  # sexagesimal
    st.integers(min_value=1, max_value=5000).map(lambda n: "1_" + "0" * n),
    st.integers(min_value=1, max_value=400).map(lambda n: "1.5e" + "9" * n),
    st.sampled_from(["2001-13-45", "2001-02-29", "2001-01-01 25:00:00", ".inf", ".NaN", "0o17", "0777", "+1_2"]),
)


def _nest(kind: str, depth: int, inner: str) -> str:
    if kind == "flow":
        return "[" * depth + inner + "]" * depth
    if kind == "mapping":
        return "{a: " * depth + inner + "}" * depth
    if kind == "mixed":
        return "[{a: " * (depth // 2) + inner + "}]" * (depth // 2)
    return "\n" + "".join("  " * i + "- \n" for i in range(min(depth, 120))) + "  " * min(depth, 120) + "- " + inner


yaml_values = st.one_of(
    yaml_numbers,
    st.builds(
        _nest,
        st.sampled_from(["flow", "mapping", "mixed", "block"]),
        st.one_of(st.integers(min_value=1, max_value=70), st.integers(min_value=1, max_value=9000)),
        yaml_numbers | st.just("x"),
    ),
)
user_data = st.lists(yaml_values, min_size=1, max_size=4).map(
    lambda values: "#cloud-config\n" + "".join(f"k{i}: {v}\n" for i, v in enumerate(values))
)


def test_user_data_is_accepted_or_refused_quickly_and_never_a_5xx(vpsshop_client, vpsshop_account):
    import time

    from vpsshop.cloudinit import compose_user_data

    order = {"plan": "pup", "location": "nl", "os": "ubuntu-24.04"}

    @hypothesis.settings(max_examples=150, deadline=None, derandomize=True, database=None)
    @hypothesis.given(text=user_data)
    def one(text: str) -> None:
        started = time.perf_counter()
        answer = vpsshop_client.post(
            "/v1/servers/quote", headers=vpsshop_account.headers, json={**order, "user_data": text}
        )
        took = time.perf_counter() - started
        assert answer.status_code in (200, 400), (text[:200], answer.text)
        assert took < 1.0, (text[:200], took)  # no parser cost that grows with the square of the depth
        if answer.status_code == 400:
            assert answer.json()["error"] == "invalid_user_data", answer.text
        else:
            assert compose_user_data({"hostname": "h"}, text).startswith("#cloud-config\n")

    one()
