"""Rate limits and quotas (vpsshop/limits.py): 429 rate_limited with Retry-After, counted in the
database so that they hold across two ``vpsshop serve`` processes; documented in OpenAPI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from served import VPSSHOP, serve, shop_env

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def _limited(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["error"] == "rate_limited"
    assert int(response.headers["retry-after"]) >= 1


def test_limits_hold_across_two_serve_processes(vpsshop_database_url, tmp_path: Path):
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__RATELIMIT__BACKEND="database",  # auto would be memory on SQLite
        VPSSHOP__RATELIMIT__SIGNUPS_PER_CLIENT="3",
        VPSSHOP__RATELIMIT__WRITES_PER_ACCOUNT="4",
        VPSSHOP__RATELIMIT__AUTH_FAILURES_PER_CLIENT="3",
        VPSSHOP__RATELIMIT__MAX_SERVERS_PER_ACCOUNT="1",
        VPSSHOP__RATELIMIT__MAX_OPEN_TOPUPS_PER_ACCOUNT="1",
    )
    with serve(tmp_path, env, "--no-worker", name="a") as a, serve(tmp_path, env, "--no-worker", name="b") as b:
        # Sign-ups per client address, counted across both processes.
        accounts = [httpx.post(f"{(a, b)[i % 2].base}/account") for i in range(3)]
        assert [r.status_code for r in accounts] == [201, 201, 201]
        _limited(httpx.post(f"{b.base}/account"))
        _limited(httpx.post(f"{a.base}/account"))
        keys = [{"Authorization": f"Bearer {r.json()['api_key']}"} for r in accounts]

        # Open top-ups per account.
        assert httpx.post(f"{a.base}/topups", headers=keys[0], json={"amount": 25, "coin": "BTC"}).status_code == 201
        _limited(httpx.post(f"{b.base}/topups", headers=keys[0], json={"amount": 25, "coin": "ETH"}))

        # Servers per account.
        credit = subprocess.run(
            [VPSSHOP, "admin", "credit", str(accounts[1].json()["user_id"]), "40", "--reason", "limits"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert credit.returncode == 0, credit.stderr
        assert httpx.post(f"{a.base}/servers", headers=keys[1], json=ORDER).status_code in (201, 202)
        _limited(httpx.post(f"{b.base}/servers", headers=keys[1], json={**ORDER, "hostname": "second"}))

        # Writes per account: the fifth key mint within the window is refused, whichever process gets it.
        mints = [httpx.post(f"{(a, b)[i % 2].base}/keys", headers=keys[2], json={"name": f"k{i}"}) for i in range(4)]
        assert [m.status_code for m in mints] == [201] * 4
        _limited(httpx.post(f"{a.base}/keys", headers=keys[2], json={"name": "k5"}))
        assert httpx.get(f"{b.base}/keys", headers=keys[2]).status_code == 200  # reads are not writes

        # Failed authentications per client address: then that address is refused, even with a good key.
        bad = {"Authorization": "Bearer vpsk_not-a-key"}
        assert [httpx.get(f"{(a, b)[i % 2].base}/account", headers=bad).status_code for i in range(3)] == [401] * 3
        _limited(httpx.get(f"{b.base}/account", headers=bad))
        _limited(httpx.get(f"{b.base}/account", headers=keys[0]))
        assert httpx.get(f"{a.base}/health").status_code == 200  # unauthenticated reads still answer


@pytest.fixture
def vpsshop_overrides():
    return {"ratelimit": {"auth_failures_per_client": 3}}


def test_only_a_sent_key_that_is_wrong_counts_as_a_failed_key(vpsshop_client, vpsshop_account):
    """Requests without an Authorization header guessed nothing: a hundred of them used to lock valid
    keys of that address out (issue 22, item 8)."""
    for _ in range(20):
        assert vpsshop_client.get("/v1/account").status_code == 401
        assert vpsshop_client.post("/v1/keys").status_code == 401
    assert vpsshop_client.get("/v1/account", headers=vpsshop_account.headers).status_code == 200
    for bad in ("Bearer vpsk_" + "x" * 43, "Bearer not-a-key", "Basic dXNlcjpwdw=="):  # unknown, malformed
        answer = vpsshop_client.get("/v1/account", headers={"Authorization": bad})
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
    _limited(vpsshop_client.get("/v1/account", headers={"Authorization": "Bearer vpsk_" + "y" * 43}))
    _limited(vpsshop_client.get("/v1/account", headers=vpsshop_account.headers))  # that address, for now


def test_429_is_in_openapi(vpsshop_client):
    paths = vpsshop_client.get("/v1/openapi.json").json()["paths"]
    for path, method in (
        ("/account", "post"),
        ("/login", "post"),
        ("/servers", "post"),
        ("/topups", "post"),
        ("/keys", "post"),
        ("/account", "get"),
    ):
        entry = paths[path][method]["responses"]["429"]
        assert "rate_limited" in entry["description"] and "Retry-After" in entry["headers"]
    assert "429" not in paths["/health"]["get"]["responses"]


def test_the_sandbox_counts_in_memory(vpsshop_app):
    from vpsshop import limits

    ctx = vpsshop_app.state.ctx
    expected = "MemoryRateLimiter" if ctx.db.dialect == "sqlite" else "DatabaseRateLimiter"
    assert type(limits.limiter(ctx)).__name__ == expected
