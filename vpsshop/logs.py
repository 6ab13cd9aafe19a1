"""Log lines of ``vpsshop serve`` and ``vpsshop worker``: JSON objects, one per line, on standard error.

``[logging] format = "json"`` (the default) writes each record of the ``vpsshop`` and ``uvicorn``
loggers as::

    {"t":"2026-11-23T00:41:02.120Z","log":"app","level":"warning","logger":"vpsshop.payments.watcher","msg":"..."}

(with ``"exc"`` holding the traceback when there is one); ``format = "text"`` writes plain lines
for people. The access log (``vpsshop.accesslog``) is separate and always JSON.

No secret goes into a log line: the code never logs keys, tokens, passwords or mnemonics, and as a
second line of defence every line is passed through :func:`scrub`, which hides the user
information of URLs (``http://user:pass@node:8332`` becomes ``http://***@node:8332``), so a node
URL with credentials in an error message does not reach the log. No line holds a client's address
either: uvicorn's access log is off, and its WebSocket lines lose the address (:class:`NoClientAddress`).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.settings import Settings

_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s\"']+@")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_QUERY_SECRET = re.compile(r"(?i)([?&](?:ticket|token|key|api_key|secret)=)[^&\s\"']+")
_HANDLER_NAME = "vpsshop.logs"
CLI_HANDLER_NAME = "vpsshop.cli"
"""The root handler ``vpsshop`` commands install: it carries other loggers' lines (plugins, libraries)."""
QUIET_LIBRARIES = ("httpx", "httpx2", "httpcore")
"""Libraries that log every request at INFO, URL included (a node's URL can hold an API key in its
path): only their warnings are logged."""


def scrub(text: str) -> str:
    """``text`` without URL credentials, bearer tokens and credential-like query values (the
    console's ``?ticket=``, which uvicorn logs with the WebSocket path)."""
    return _QUERY_SECRET.sub(r"\1***", _BEARER.sub(r"\1***", _URL_USERINFO.sub(r"\1***@", text)))


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "t": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "log": "app",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        if record.exc_info:
            line["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(line, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class NoClientAddress(logging.Filter):
    """Takes the client's address out of uvicorn's WebSocket lines (``127.0.0.1:33100 - "WebSocket
    /v1/servers/7/console/ws?ticket=***" [accepted]``, logged whatever ``access_log`` says): no log line
    holds a client address (docs/configuration.md)."""

    PREFIX = '%s - "WebSocket '

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(self.PREFIX) and isinstance(record.args, tuple):
            record.msg, record.args = record.msg[len("%s - ") :], record.args[1:]
        return True


def formatter(settings: Settings) -> logging.Formatter:
    return JsonFormatter() if settings.logging.format == "json" else TextFormatter()


def configure_logging(settings: Settings) -> None:
    """Send the ``vpsshop`` logger to standard error in the configured format (uvicorn's own lines:
    :func:`uvicorn_log_config`), and a ``vpsshop`` command's root handler (other loggers: plugins,
    libraries) too. ``httpx`` and ``httpcore`` log only warnings.

    Idempotent: a second call (another app in the same process) replaces the handler.
    """
    level = settings.logging.level.upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter(settings))
    logger = logging.getLogger("vpsshop")
    for old in [h for h in logger.handlers if h.get_name() == _HANDLER_NAME]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    for root_handler in logging.getLogger().handlers:  # a command's: plugins' and libraries' lines alike
        if root_handler.get_name() == CLI_HANDLER_NAME:
            root_handler.setFormatter(formatter(settings))


def uvicorn_log_config(settings: Settings) -> dict[str, Any]:
    """``uvicorn.run(log_config=...)``: uvicorn's own lines in the configured format, without client
    addresses (:class:`NoClientAddress`)."""
    fmt = "vpsshop.logs.JsonFormatter" if settings.logging.format == "json" else "vpsshop.logs.TextFormatter"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vpsshop": {"()": fmt}},
        "filters": {"no_client_address": {"()": "vpsshop.logs.NoClientAddress"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "vpsshop",
                "filters": ["no_client_address"],
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": settings.logging.level.upper(), "propagate": False},
            "uvicorn.error": {"level": settings.logging.level.upper(), "propagate": True},
        },
    }
