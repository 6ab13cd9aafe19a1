"""Structured logs (vpsshop/accesslog.py, vpsshop/logs.py): JSON lines with request ids, and no secret
used in a whole flow through ``vpsshop serve`` + ``vpsshop worker`` appears in their output."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from served import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY, VPSSHOP, free_port, serve, shop_env, worker

from vpsshop.logs import JsonFormatter, scrub

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}
NODE_PASSWORD = "node-rpc-password-3f9c2a"
NODE_PATH_KEY = "node-path-api-key-51d0e7"
METRICS_TOKEN = "metrics-bearer-token-77aa01"


class WarmingUpNode(BaseHTTPRequestHandler):
    """Answers every JSON-RPC call as Bitcoin Core does while it loads its block index (-28)."""

    def do_POST(self) -> None:
        call = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = json.dumps(
            {"result": None, "error": {"code": -28, "message": "Loading block index..."}, "id": call["id"]}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def test_a_whole_flow_leaves_no_secret_in_the_logs(vpsshop_database_url, tmp_path: Path):
    node = ThreadingHTTPServer(("127.0.0.1", 0), WarmingUpNode)
    threading.Thread(target=node.serve_forever, daemon=True).start()
    dead_node = free_port()
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0.5",
        # A node URL with credentials that fails on every pass: its error is logged, scrubbed.
        VPSSHOP__COINS__BTC__RPC_URL=f"http://vpsshop:{NODE_PASSWORD}@127.0.0.1:{dead_node}/",
        # A node that answers every call with an error, at a URL with an API key in its path, as
        # hosted providers hand out: no line may carry that URL.
        VPSSHOP__COINS__LTC__RPC_URL=f"http://127.0.0.1:{node.server_address[1]}/{NODE_PATH_KEY}/",
        VPSSHOP__TOPUPS__WATCH_INTERVAL_SECONDS="0.5",
        VPSSHOP__METRICS__TOKEN=METRICS_TOKEN,
        VPSSHOP__METRICS__MULTIPROCESS_DIR=str(tmp_path / "metrics"),
    )
    secrets = [TEST_SECRET_KEY, TEST_ENCRYPTION_KEY, NODE_PASSWORD, NODE_PATH_KEY, METRICS_TOKEN]
    with serve(tmp_path, env, "--no-worker") as api, worker(tmp_path, env) as w:
        created = httpx.post(f"{api.base}/account").json()
        secrets += [created["api_key"], created["login_token"]]
        headers = {"Authorization": f"Bearer {created['api_key']}", "X-Request-ID": "flow-1"}
        credit = subprocess.run(
            [VPSSHOP, "admin", "credit", str(created["user_id"]), "40", "--reason", "logs"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert credit.returncode == 0, credit.stderr
        login = httpx.post(f"{api.base}/login", json={"login_token": created["login_token"]})
        assert login.status_code == 201
        secrets.append(login.json()["api_key"])
        minted = httpx.post(f"{api.base}/keys", headers=headers, json={"name": "ci"})
        assert minted.status_code == 201
        secrets.append(minted.json()["api_key"])
        assert httpx.post(f"{api.base}/login", json={"login_token": "vpsl_wrong-token-0000"}).status_code == 401
        assert httpx.get(f"{api.base}/account", headers={"Authorization": "Bearer vpsk_guessed-key"}).status_code == 401
        assert httpx.post(f"{api.base}/topups", headers=headers, json={"amount": 25, "coin": "BTC"}).status_code == 201
        sid = httpx.post(f"{api.base}/servers", headers=headers, json=ORDER).json()["server"]["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()["status"] != "active":
            assert time.monotonic() < deadline, api.output() + w.output()
            time.sleep(0.3)
        revealed = httpx.get(f"{api.base}/servers/{sid}/credentials", headers=headers)
        assert revealed.status_code == 200
        secrets.append(revealed.json()["password"])
        metrics = httpx.get(
            api.base.removesuffix("/v1") + "/metrics",
            headers={"Authorization": f"Bearer {METRICS_TOKEN}", "X-Forwarded-For": "198.51.100.7"},
        )
        assert metrics.status_code == 200
        # The node's failures were logged (so the scrubbing below was exercised).
        deadline = time.monotonic() + 30
        while f"127.0.0.1:{dead_node}" not in w.output() + api.output() or "Loading block index" not in w.output():
            assert time.monotonic() < deadline, w.output()
            time.sleep(0.3)
        time.sleep(0.5)  # the access log writes in batches
    node.shutdown()
    output = api.output() + w.output() + credit.stdout + credit.stderr
    for secret in [*secrets, "vpsl_wrong-token-0000", "vpsk_guessed-key"]:
        assert secret and secret not in output, f"a secret ({secret[:6]}...) is in the logs"
    # Every access line is JSON with a request id, the route and (when authenticated) the account.
    access = [json.loads(line) for line in api.output().splitlines() if '"log":"access"' in line]
    assert access and all(line["rid"] for line in access)
    flow = [line for line in access if line["rid"] == "flow-1"]
    assert {line["route"] for line in flow} >= {"/v1/topups", "/v1/servers", "/v1/servers/{id}"}
    assert all(line["account"] == created["user_id"] for line in flow)
    assert any(line["route"] == "/v1/servers/{id}/credentials" and line["status"] == 200 for line in flow)
    # The application's own lines are JSON too.
    app_lines = [json.loads(line) for line in (api.output() + w.output()).splitlines() if '"log":"app"' in line]
    assert any(line["logger"].startswith("uvicorn") for line in app_lines)
    # Libraries' lines too (the commands' root handler), and no line per HTTP call to a node.
    # The worker's start line too.
    assert not [line for line in w.output().splitlines() if line and not line.startswith("{")]
    assert any(line["msg"].startswith("vpsshop worker: running") for line in app_lines)
    assert "HTTP Request:" not in output


def test_request_ids_are_echoed_or_made(vpsshop_client):
    given = vpsshop_client.get("/v1/health", headers={"X-Request-ID": "abc.DEF_123-x"})
    assert given.headers["x-request-id"] == "abc.DEF_123-x"
    made = vpsshop_client.get("/v1/health", headers={"X-Request-ID": "bad id with spaces"})
    assert made.headers["x-request-id"] != "bad id with spaces" and len(made.headers["x-request-id"]) == 16
    assert vpsshop_client.get("/v1/nope").headers["x-request-id"]


def test_scrub_hides_query_credentials():
    line = '127.0.0.1:5 - "WebSocket /v1/servers/1/console?ticket=cT_abc123&cols=80" [accepted]'
    assert scrub(line) == '127.0.0.1:5 - "WebSocket /v1/servers/1/console?ticket=***&cols=80" [accepted]'


def test_scrub_hides_url_credentials_and_bearer_tokens():
    assert scrub("connect to http://user:pa55@node:8332/ failed") == "connect to http://***@node:8332/ failed"
    assert scrub("Authorization: Bearer vpsk_abcdef") == "Authorization: Bearer ***"
    record = logging.LogRecord("vpsshop.x", logging.WARNING, __file__, 1, "rpc %s down", ("https://a:b@h/",), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "rpc https://***@h/ down" and line["level"] == "warning" and line["log"] == "app"
