"""A real HTTP server that receives webhooks, for the event tests.

It runs in a thread of the test process on a free loopback port and verifies every request with
the PyPI ``standardwebhooks`` library (an implementation of the scheme this project did not write)
against the secret of the path it was sent to. ``plan`` decides each answer: status, extra headers
and a delay (a delay holds the request open, so a test can kill the sender mid-delivery).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    error: str | None
    status: int
    at: float

    @property
    def id(self) -> str:
        return self.headers.get("webhook-id", "")

    def json(self) -> Any:
        return json.loads(self.body)


Plan = Callable[[str, str, int], tuple[int, dict[str, str], float]]
"""(path, webhook-id, how many times this id reached this path before) -> (status, headers, delay)."""


def always_ok(path: str, msg_id: str, seen: int) -> tuple[int, dict[str, str], float]:
    return 200, {}, 0.0


@dataclass
class Receiver:
    plan: Plan = always_ok
    secrets: dict[str, str] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver._handle(self, self.path, headers, body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def _handle(self, handler: BaseHTTPRequestHandler, path: str, headers: dict[str, str], body: bytes) -> None:
        secret = self.secrets.get(path)
        verified, error = False, "no secret for this path"
        if secret is not None:
            try:
                Webhook(secret).verify(body, headers)
                verified, error = True, None
            except WebhookVerificationError as exc:
                error = str(exc)
        with self.lock:
            seen = sum(1 for r in self.received if r.path == path and r.id == headers.get("webhook-id"))
        status, extra, delay = self.plan(path, headers.get("webhook-id", ""), seen)
        record = Received(path, headers, body, verified, error, status, time.monotonic())
        with self.lock:
            self.received.append(record)
            self.arrived.notify_all()
        if delay:
            time.sleep(delay)
        answer = b'{"ok":true}' if 200 <= status < 300 else b'{"error":"planned failure"}'
        try:
            handler.send_response(status)
            for name, value in extra.items():
                handler.send_header(name, value)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(answer)))
            handler.end_headers()
            handler.wfile.write(answer)
        except OSError:  # the sender went away (killed mid-delivery)
            pass

    def wait_for(self, predicate: Callable[[list[Received]], bool], seconds: float = 60) -> list[Received]:
        deadline = time.monotonic() + seconds
        with self.lock:
            while not predicate(self.received):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"receiver never saw what was expected; got {len(self.received)}: "
                        f"{[(r.path, r.json().get('type'), r.status) for r in self.received]}"
                    )
                self.arrived.wait(min(left, 0.5))
            return list(self.received)

    def accepted(self, path: str | None = None) -> list[Received]:
        with self.lock:
            return [r for r in self.received if 200 <= r.status < 300 and (path is None or r.path == path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
