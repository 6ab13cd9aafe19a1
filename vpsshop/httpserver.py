"""uvicorn's HTTP protocol with the API's error body for requests it cannot parse.

uvicorn answers a request it cannot parse (a malformed request line, a bad header) itself, before
any application code runs, with ``400`` and the ``text/plain`` body "Invalid HTTP request
received." :func:`http_protocol` gives ``vpsshop serve`` the same protocol class with that one
answer replaced by the seed's error body, so every error a client sees is JSON.
"""

from __future__ import annotations

import json
from typing import Any

INVALID_REQUEST_BODY = json.dumps(
    {
        "error": "invalid_http_request",
        "message": "The request is not valid HTTP/1.1 (request line or headers could not be parsed).",
    }
).encode()


def _error_response() -> bytes:
    return b"".join(
        [
            b"HTTP/1.1 400 Bad Request\r\n",
            b"content-type: application/json\r\n",
            b"x-content-type-options: nosniff\r\n",
            b"content-length: ",
            str(len(INVALID_REQUEST_BODY)).encode(),
            b"\r\n",
            b"connection: close\r\n\r\n",
            INVALID_REQUEST_BODY,
        ]
    )


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - uvicorn[standard] brings httptools
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]  # h11's protocol in place of httptools': both define send_400_response and transport, all the subclass uses


class JsonErrorProtocol(_Base):
    """httptools' protocol when installed (as uvicorn's ``auto`` picks), else h11's, answering
    unparsable requests with the error body. A module-level class, so ``--workers`` can pickle it."""

    def send_400_response(self, msg: str) -> None:
        # uvicorn logs the reason (msg) itself; the client gets the error body and the connection closes.
        self.transport.write(_error_response())
        self.transport.close()


def http_protocol() -> type[Any]:
    """The protocol class for ``uvicorn.run(http=...)``."""
    return JsonErrorProtocol
