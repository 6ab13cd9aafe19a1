"""The access log of ``vpsshop serve``: one JSON line per request, cheap, never a secret.

Each line on standard error looks like::

    {"t":"2026-11-22T21:04:05.123Z","log":"access","rid":"5f0c9a2e4b1d7c33","method":"GET","path":"/v1/servers/7",
     "route":"/v1/servers/{server_id}","status":200,"us":420,"bytes":139,"account":12}

What a line holds, and what it never holds:

* the request id (``rid``: the client's ``X-Request-ID`` when it is 1 to 64 characters of
  ``A-Z a-z 0-9 . _ -``, else one made here; echoed in the ``X-Request-ID`` response header), the
  method, the path (ids in it are not secrets), the route template that matched, the status, the
  time spent in the app in microseconds (``us``), the size of the response body and, when the
  request authenticated with an API key, the account id;
* never a header (the API key travels in ``Authorization``), never the query string, never a
  body, and not the client's address: a shop that asks no identity should not keep one by
  default. A reverse proxy in front is where addresses are logged, if the reseller wants them.

Why it is cheap (``docs/performance.md``): the middleware is plain ASGI (no logging module, no
record objects, no formatter), the timestamp prefix is formatted once per second, and lines are
collected in memory and written in one ``write`` per batch: when 256 lines are waiting or, at the
latest, a quarter of a second after the first of them. It is on by default; ``[server]
access_log = false`` (or ``VPSSHOP__SERVER__ACCESS_LOG=false``) turns it off.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
import time
from typing import Any, TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vpsshop import metrics

ACCOUNT_SCOPE_KEY = "vpsshop.account_id"
"""Where authentication leaves the account id in the ASGI scope, for this log."""
_CONVERTOR = re.compile(r"\{(\w+):[^}]*\}")
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._-]{1,64}")

_ids = random.Random()
"""Request ids need to be distinct, not secret: a seeded generator, no system call per request."""

BATCH_LINES = 256
FLUSH_AFTER_SECONDS = 0.25


class AccessLogWriter:
    """Collects the lines and writes them in batches (one per app; :meth:`flush` at shutdown)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.lines: list[str] = []
        self._second = -1
        self._prefix = ""
        self._timer: asyncio.TimerHandle | None = None

    def add(
        self,
        method: str,
        path: str,
        status: int,
        size: int,
        elapsed: float,
        rid: str = "",
        route: str = "",
        account: int | None = None,
    ) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime('{"t":"%Y-%m-%dT%H:%M:%S', time.gmtime(second))
        if '"' in path or "\\" in path or not path.isprintable():
            path = json.dumps(path)[1:-1]
        tail = f',"account":{account}}}\n' if account is not None else "}\n"
        self.lines.append(
            f'{self._prefix}.{int((now - second) * 1000):03d}Z","log":"access","rid":"{rid}","method":"{method}",'
            f'"path":"{path}","route":"{route}","status":{status},"us":{int(elapsed * 1_000_000)},"bytes":{size}' + tail
        )
        if len(self.lines) >= BATCH_LINES:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(FLUSH_AFTER_SECONDS, self.flush)
            except RuntimeError:  # no running loop: write at once
                self.flush()

    def flush(self) -> None:
        """Write what is waiting."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.lines:
            return
        text, self.lines = "".join(self.lines), []
        stream: Any = self.stream or sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not fail a request
            pass


def route_template(scope: Scope) -> str:
    """The template of the route that answered (``/v1/servers/{server_id}``), or ``unmatched``.

    Metrics label requests with it, so that ids in paths do not make a series per id.
    """
    route = scope.get("route")
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return "unmatched"
    if ":" in path:  # "{id:sid}" (a convertor) is "{id}" in the template
        path = _CONVERTOR.sub(r"{\1}", path)
    return scope.get("root_path", "") + path if scope.get("root_path") else path


def request_id(scope: Scope) -> str:
    """The client's ``X-Request-ID`` when it is well-formed, else a new random one."""
    headers: list[tuple[bytes, bytes]] = scope["headers"]  # ASGI: the request's headers, as bytes pairs
    for name, value in headers:
        if name == b"x-request-id":
            if _REQUEST_ID.fullmatch(value):
                return value.decode()
            break
    return f"{_ids.getrandbits(64):016x}"


NOSNIFF = (b"x-content-type-options", b"nosniff")


class AccessLog:
    """ASGI middleware: request id, the access line (when a writer is given) and request metrics.

    It also gives every response ``X-Content-Type-Options: nosniff``, so no browser guesses a type
    (a JSON error body echoing input is never run as HTML or script): one wrapper of ``send`` on
    the hot path rather than two.
    """

    def __init__(self, app: ASGIApp, writer: AccessLogWriter | None = None, observe: bool = True) -> None:
        self.app = app
        self.writer = writer
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        size = 0
        rid = request_id(scope)
        header = (b"x-request-id", rid.encode())

        async def send_and_note(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), header]
                if not any(name.lower() == NOSNIFF[0] for name, _ in headers):
                    headers.append(NOSNIFF)
                message["headers"] = headers
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            elapsed = time.perf_counter() - started
            route = route_template(scope)
            if self.writer is not None:
                self.writer.add(
                    scope["method"], scope["path"], status, size, elapsed, rid, route, scope.get(ACCOUNT_SCOPE_KEY)
                )
            if self.observe and route != "/metrics":
                metrics.observe_request(route, scope["method"], status, elapsed)
