"""Who acts: the customer account an operation is done for, or the operator doing it.

Every operation takes its actor first after the context. A front end makes one: the REST API and
the MCP server from the API key of the request (:class:`vpsshop.accounts.Authenticator`), the
dashboard from its session, the admin commands from the person running them.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from datetime import datetime

__all__ = ["AccountSummary", "Customer", "Operator"]


@dataclass(frozen=True, slots=True)
class AccountSummary:
    """The account as authentication read it, in the same query (``GET /v1/account`` answers from it)."""

    balance_micros: int
    totp_enabled: bool
    created_at: datetime
    servers: int
    """Servers of the account that are not terminated."""


@dataclass(frozen=True, slots=True)
class Customer:
    """The account an operation acts for."""

    account_id: int
    key_id: int | None = None
    """The API key of the request (None: a dashboard session)."""
    summary: AccountSummary | None = None
    """The account as read when the caller was authenticated (None: not read)."""


@dataclass(frozen=True, slots=True)
class Operator:
    """A person running the shop: recorded in the audit log with every change they make."""

    name: str
    role: str = "owner"
    """``owner`` may do everything; ``support`` only customer actions up to ``[console] support_limit_usd``
    (:func:`vpsshop.admin.adjust_balance`). Whoever runs ``vpsshop admin`` on the shop's machine is an owner."""

    @classmethod
    def from_environment(cls) -> Operator:
        """The operating-system user running the command; through ``sudo -u vpsshop``, the person too."""
        try:
            user = getpass.getuser()
        except Exception:  # noqa: BLE001 - no user name in this environment
            user = "unknown"
        by = os.environ.get("SUDO_USER", "")
        return cls((f"{by} (as {user})" if by and by != user else user)[:64])
