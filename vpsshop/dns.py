"""Base class of DNS providers: the reverse DNS (PTR) records of servers' addresses.

A shop names one in ``[dns] provider = "powerdns"`` (its settings in ``[dns.powerdns]``); with none,
reverse DNS is not offered and ``PATCH /servers/{id}`` answers ``409 not_supported`` for
``reverse_dns``. Core calls the provider only from server jobs, never inside a request, and
retries a call whose job failed, so both verbs must be idempotent.
"""

from __future__ import annotations

import ipaddress
from typing import Any, ClassVar

from vpsshop.component import Component


def ptr_name(ip: str) -> str:
    """The PTR owner name of ``ip``, fully qualified: ``10.100.51.198.in-addr.arpa.``."""
    return ipaddress.ip_address(ip).reverse_pointer + "."


class DnsProvider(Component[Any]):  # not generic: a provider declares its own `config: MyConfig`
    """Sets and clears the PTR record of a server's address.

    ``name`` identifies the provider in the ``dns.provider`` setting.

    .. versionadded:: 1.1
    """

    name: ClassVar[str]

    def holds(self, ip: str) -> bool:
        """Whether this provider can write ``ip``'s PTR record (one of its zones holds it). Core asks
        before naming a server's IPv6 address, which is left without a record when no zone of the
        provider holds it; the IPv4 address is always named (a missing zone is then an error the job
        reports). Default: True.

        .. versionadded:: 1.1
        """
        return True

    async def set_ptr(self, ip: str, hostname: str) -> None:
        """Make ``ip``'s PTR record point at ``hostname`` (a fully qualified name without the trailing
        dot), replacing any earlier one. Must be overridden.

        :raises vpsshop.PluginError: the provider cannot do it (no zone holds the address, the API
            refuses); core records the message and retries.
        """
        raise NotImplementedError

    async def clear_ptr(self, ip: str) -> None:
        """Remove ``ip``'s PTR record. Nothing there: nothing to do. Must be overridden.

        Called when a customer clears the name and after a server is terminated.
        """
        raise NotImplementedError
