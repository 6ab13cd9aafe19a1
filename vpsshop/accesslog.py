"""The access log of ``vpsshop serve``: one JSON line per request, cheap, never a secret.

Each line on standard error looks like::

    {"t":"2026-11-22T21:04:05.123Z","log":"access","method":"GET","path":"/v1/account","status":200,"us":420,"bytes":139}

What a line holds, and what it never holds:

* the method, the path (ids in it are not secrets), the status, the time spent in the app in
  microseconds (``us``) and the size of the response body;
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
import sys
import time
from typing import Any, TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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

    def add(self, method: str, path: str, status: int, size: int, elapsed: float) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime('{"t":"%Y-%m-%dT%H:%M:%S', time.gmtime(second))
        if '"' in path or "\\" in path or not path.isprintable():
            path = json.dumps(path)[1:-1]
        self.lines.append(
            f'{self._prefix}.{int((now - second) * 1000):03d}Z","log":"access","method":"{method}",'
            f'"path":"{path}","status":{status},"us":{int(elapsed * 1_000_000)},"bytes":{size}}}\n'
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


class AccessLog:
    """ASGI middleware feeding an :class:`AccessLogWriter` (see the module docstring)."""

    def __init__(self, app: ASGIApp, writer: AccessLogWriter) -> None:
        self.app = app
        self.writer = writer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        size = 0

        async def send_and_note(message: Message) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.writer.add(scope["method"], scope["path"], status, size, time.perf_counter() - started)
