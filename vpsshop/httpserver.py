"""uvicorn's HTTP protocol as ``vpsshop serve`` runs it: JSON error bodies, and bounded request heads.

uvicorn answers a request it cannot parse (a malformed request line, a bad header) itself, before
any application code runs, with ``400`` and the ``text/plain`` body "Invalid HTTP request
received." :class:`JsonErrorProtocol` answers with the seed's error body instead, so every error a
client sees is JSON.

uvicorn's httptools protocol also puts no bound on a request's head: a client may send headers
without end (httptools keeps them all in memory), any number of them, or one header line every few
seconds to hold a connection open for ever. The protocol here bounds all three, before any
application code runs, from ``[server]``:

* ``max_header_bytes``: the request line and headers together; a head still incomplete at that size
  is answered ``431 headers_too_large`` and the connection is closed. Bytes past the limit are never
  handed to the parser, so the memory a connection costs is bounded by the limit.
* ``max_headers``: header lines per request; one more is ``431 headers_too_large``.
* ``header_timeout_seconds``: a request head must be complete this long after the connection
  opened (the first request) or after its first byte arrived (a later request on a kept-alive
  connection); else ``408 header_timeout`` (when part of a head had arrived) and the connection is
  closed. Between requests uvicorn's own keep-alive time-out (5 s) closes an idle connection.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.settings import ServerSettings


def _error_response(status: str, error: str, message: str) -> bytes:
    body = json.dumps({"error": error, "message": message}).encode()
    return b"".join(
        [
            f"HTTP/1.1 {status}\r\n".encode(),
            b"content-type: application/json\r\n",
            b"x-content-type-options: nosniff\r\n",
            b"content-length: ",
            str(len(body)).encode(),
            b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


INVALID_REQUEST = _error_response(
    "400 Bad Request",
    "invalid_http_request",
    "The request is not valid HTTP/1.1 (request line or headers could not be parsed).",
)


@dataclass(frozen=True)
class HeadLimits:
    """The bounds of a request head (``[server]`` settings of the same names)."""

    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout_seconds: float = 10.0


class _HeadRefused(Exception):
    """Raised from a parser callback: httptools turns it into a parse error, which uvicorn answers
    through :meth:`JsonErrorProtocol.send_400_response` (that then sends the refusal instead)."""


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
    # h11 alone: only the byte bound holds (uvicorn's h11_max_incomplete_event_size, which cmd_serve sets).
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonErrorProtocol(H11Protocol):
        limits: ClassVar[HeadLimits] = HeadLimits()

        def send_400_response(self, msg: str) -> None:
            self.transport.write(INVALID_REQUEST)
            self.transport.close()

else:

    class JsonErrorProtocol(_Base):  # type: ignore[no-redef]
        """httptools' protocol with the error body and the head limits of the module docs. A
        module-level class, so ``--workers`` can pickle it; :func:`configure` sets its limits."""

        limits: ClassVar[HeadLimits] = HeadLimits()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = True
            """Bytes now arriving belong to a request head (not to a body)."""
            self._head_bytes = 0
            self._header_lines = 0
            self._heads_done = 0
            self._head_timer: asyncio.TimerHandle | None = None
            self._refusal: bytes | None = None

        # ---- the connection ----

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._time_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            while data:
                if not self._in_head:
                    super().data_received(data)
                    return
                if self._head_timer is None:
                    self._time_head()
                room = self.limits.max_header_bytes - self._head_bytes
                if len(data) <= room:
                    self._head_bytes += len(data)
                    super().data_received(data)
                    return
                # More than the head may still take: hand the parser only what fits. Unless the head
                # ends within it, the head is too large.
                done = self._heads_done
                self._head_bytes += room
                if room > 0:
                    super().data_received(data[:room])
                if self.transport.is_closing():
                    return
                if self._heads_done == done:
                    self._refuse(
                        "431 Request Header Fields Too Large",
                        "headers_too_large",
                        f"The request line and headers are larger than {self.limits.max_header_bytes} bytes.",
                    )
                    return
                data = data[room:]
                protocol = self.transport.get_protocol()
                if protocol is not self:  # upgraded to a WebSocket: the rest is the socket's
                    cast(asyncio.Protocol, protocol).data_received(data)
                    return

        # ---- parser callbacks ----

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_lines += 1
            if self._header_lines > self.limits.max_headers:
                self._refusal = _error_response(
                    "431 Request Header Fields Too Large",
                    "headers_too_large",
                    f"The request has more than {self.limits.max_headers} header lines.",
                )
                raise _HeadRefused
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._heads_done += 1
            self._stop_head_timer()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes, self._header_lines = True, 0, 0

        def send_400_response(self, msg: str) -> None:
            # uvicorn logs the reason (msg) itself; the client gets the error body and the connection closes.
            self.transport.write(self._refusal or INVALID_REQUEST)
            self.transport.close()

        # ---- the head's time limit ----

        def _time_head(self) -> None:
            self._stop_head_timer()
            self._head_timer = self.loop.call_later(self.limits.header_timeout_seconds, self._head_timed_out)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self._in_head or self.transport.is_closing() or self.transport.get_protocol() is not self:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                self._time_head()  # a pipelined head waits for the answer before it: time it from then
                return
            if self._head_bytes == 0:  # nothing was asked: nobody to answer
                self.transport.close()
                return
            self._refuse(
                "408 Request Timeout",
                "header_timeout",
                f"The request line and headers did not arrive within {self.limits.header_timeout_seconds:g} seconds.",
            )

        def _refuse(self, status: str, error: str, message: str) -> None:
            self._stop_head_timer()
            self.transport.write(_error_response(status, error, message))
            self.transport.close()


def configure(server: ServerSettings) -> None:
    """Set the head limits of this process's protocol from ``[server]`` (``vpsshop serve`` calls it,
    and so does each ``--workers`` process, which builds its settings anew)."""
    JsonErrorProtocol.limits = HeadLimits(server.max_header_bytes, server.max_headers, server.header_timeout_seconds)


def http_protocol(server: ServerSettings | None = None) -> type[Any]:
    """The protocol class for ``uvicorn.run(http=...)``, its limits from ``server`` when given."""
    if server is not None:
        configure(server)
    return JsonErrorProtocol
