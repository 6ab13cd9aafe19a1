"""Exceptions of vpsshop: API errors rendered as the seed's error body, and start-up errors."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered to the client as ``{"error": code, "message": text, ...}``.

    Raise it anywhere inside an endpoint; the app renders it with ``status``. Extra keyword
    arguments become extra fields of the body (``insufficient_balance`` adds ``price``, ``balance``
    and ``deficit``).
    """

    def __init__(self, status: int, error: str, message: str, **extra: Any) -> None:
        super().__init__(f"{error}: {message}")
        self.status = status
        self.error = error
        self.message = message
        self.extra = extra
        self.headers: dict[str, str] = {}
        """Response headers to send with the error body (``Retry-After`` of a 429)."""

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "message": self.message, **self.extra}


class BadRequest(ApiError):
    def __init__(self, error: str, message: str, **extra: Any) -> None:
        super().__init__(400, error, message, **extra)


class Unauthorized(ApiError):
    def __init__(self, message: str = "A valid API key is required: Authorization: Bearer vpsk_...") -> None:
        super().__init__(401, "unauthorized", message)


class BadApiKey(Unauthorized):
    """An ``Authorization`` header was sent and holds no valid key (malformed, unknown or revoked):
    what the failed-authentication limit counts. A request without the header is refused without
    counting: it guessed nothing."""


class NotFound(ApiError):
    def __init__(self, what: str = "resource") -> None:
        super().__init__(404, "not_found", f"No such {what}.")


class Conflict(ApiError):
    def __init__(self, error: str, message: str, **extra: Any) -> None:
        super().__init__(409, error, message, **extra)


class StartupError(Exception):
    """The service cannot start as configured: a plugin clash, a misspelt hook, a missing setting.

    The message says what to change; the CLI prints it without a traceback.
    """


class ConfigError(StartupError):
    """A setting is missing or invalid. The message names the setting."""


class PluginError(Exception):
    """A plugin failed at run time (a node did not answer, a hypervisor refused).

    Plugins raise it (or a subclass) with a message safe to show an operator; core turns it into a
    ``503`` for the client where a request depended on it and never lets it become a ``500``.
    """
