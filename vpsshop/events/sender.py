"""Sending one webhook request without becoming a tool against the shop's own network (SSRF).

* The URL must be ``https`` (``http`` only where ``events.require_https`` is off, as in the
  sandbox), carry no credentials, and name a host. A host that is an address in any spelling
  (``127。0。0。1``, fullwidth digits, a zero-width space: IDNA maps them to ``127.0.0.1``; the
  numeric forms resolvers accept, ``0177.0.0.1``, ``0x7f.0.0.1``, ``127.1``) is read as that address,
  checked as below at registration already, and stored in its plain form.
* The host is resolved once per request, and **every** address it resolves to is checked: a
  loopback, private, link-local (``169.254.169.254``), shared, multicast, reserved or unspecified
  address is refused unless it falls in ``events.allowed_networks``, and so is an IPv6 address that
  carries such an IPv4 address (IPv4-mapped ``::ffff:0:0/96``, 6to4 ``2002::/16``, NAT64
  ``64:ff9b::/96``). The connection then goes to
  the checked address itself (a pinned network backend under httpcore): the name is never resolved
  a second time, so DNS rebinding has no window. TLS still verifies the certificate for the name.
* No redirect is followed (a 3xx is a failed attempt that says where it pointed), no proxy from the
  environment is used, the whole request has a deadline (``events.timeout_seconds``), and at most
  ``events.max_response_bytes`` of the answer are read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpcore

from vpsshop.events.settings import EventSettings

Resolver = Callable[[str, int], Awaitable[list[str]]]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
USER_AGENT = "vpsshop-webhooks/1.0"


class InvalidUrl(ValueError):
    """The URL can never be a webhook endpoint (bad scheme, credentials, a refused address)."""


class DestinationRefused(Exception):
    """The host resolved to an address webhooks may not reach."""


@dataclass(frozen=True)
class SendResult:
    outcome: str
    """``accepted`` (2xx), ``rejected`` (any other status), ``error`` (no answer), ``refused`` (address)."""
    status_code: int | None
    error: str | None
    excerpt: str | None
    duration_ms: int
    retry_after: float | None = None


async def system_resolve(host: str, port: int) -> list[str]:
    """The addresses of ``host`` as the operating system resolves them, in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): its last 32 bits are the IPv4 address it reaches."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a 6to4 (``2002::/16``) or NAT64 (``64:ff9b::/96``) address leads to."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal(address: str, allowed: Iterable[Network] = ()) -> str | None:
    """Why ``address`` may not be reached, as words that follow it ("a loopback address", "not a
    public address", "a 6to4 address of 127.0.0.1, a loopback address"), or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == net.version and ip in net for net in allowed):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and (inner := _embedded_ipv4(ip)) is not None:
        why = refusal(str(inner), allowed)
        if why is not None:
            return f"a {'6to4' if ip.sixtofour else 'NAT64'} address of {inner}, {why}"
    for reason, flag in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if flag:
            return f"a {reason} address"
    if not ip.is_global:
        return "not a public address"
    return None


def _ip_literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]").split("%", 1)[0]))
    except ValueError:
        return None


_NUMBER = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")


def _inet_number(label: str) -> int:
    """One part of a numeric IPv4 host: ``0x..`` hexadecimal, ``0..`` octal, else decimal.
    :raises ValueError: not a number of that form (``08``)."""
    if label[:2].lower() == "0x":
        return int(label[2:] or "0", 16)
    return int(label, 8 if len(label) > 1 and label[0] == "0" else 10)


def _numeric_ipv4(host: str) -> str | None:
    """The IPv4 address of a host written as numbers the way resolvers (``inet_aton``) and browsers
    (the WHATWG URL standard) read it: ``127.1``, ``0177.0.0.1``, ``0x7f.0.0.1``, ``2130706433``.
    None when the host does not end in a number (a name).

    :raises InvalidUrl: the host ends in a number but is no IPv4 address (``example.123``).
    """
    labels = host.removesuffix(".").split(".")
    if not _NUMBER.fullmatch(labels[-1]):
        return None
    try:
        if len(labels) > 4 or not all(_NUMBER.fullmatch(label) for label in labels):
            raise ValueError(host)
        *parts, last = [_inet_number(label) for label in labels]
        if any(n > 255 for n in parts) or last >= 256 ** (4 - len(parts)):
            raise ValueError(host)
    except ValueError:
        raise InvalidUrl(f"the host {host} ends in a number but is not an IPv4 address") from None
    return str(ipaddress.IPv4Address(last + sum(n << (8 * (3 - i)) for i, n in enumerate(parts))))


def normalize_url(url: str, settings: EventSettings) -> str:
    """The URL as it will be called (host in IDNA ASCII, no fragment). :raises InvalidUrl: why not."""
    url = url.strip()
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidUrl("the URL must not contain spaces, line breaks, control or invisible characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidUrl(f"not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise InvalidUrl("the URL must start with https:// (or http:// where the shop allows it)")
    if scheme == "http" and settings.require_https:
        raise InvalidUrl("this shop delivers webhooks over https only")
    if parts.username is not None or parts.password is not None:
        raise InvalidUrl("the URL must not carry a user name or password")
    host = parts.hostname
    if not host:
        raise InvalidUrl("the URL has no host")
    if port == 0:
        raise InvalidUrl("the URL's port must be 1 to 65535")
    literal = _ip_literal(host)
    if literal is None:
        try:
            host = host.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise InvalidUrl("the host name is not a valid domain name") from None
        # IDNA maps ideographic full stops, fullwidth digits and zero-width spaces to plain ASCII:
        # "127。0。0。1" is 127.0.0.1 now, and so are the numeric forms resolvers accept.
        literal = _ip_literal(host) or _numeric_ipv4(host)
    if literal is None:
        if host == "localhost" or host.endswith(".localhost"):
            if refusal("127.0.0.1", settings.networks()) is not None:
                raise InvalidUrl(f"{host} is a loopback name, which webhooks may not reach")
        elif "." not in host:
            raise InvalidUrl("the host must be a fully qualified domain name")
    else:
        why = refusal(literal, settings.networks())
        if why is not None:
            raise InvalidUrl(f"{literal} is {why}, which webhooks may not reach")
        host = f"[{literal}]" if ":" in literal else literal
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


async def check_destination(host: str, port: int, settings: EventSettings, resolver: Resolver | None = None) -> str:
    """Resolve ``host`` and return the address to connect to, every resolved address checked.

    :raises DestinationRefused: an address is not allowed, or the name does not resolve.
    """
    networks = settings.networks()
    literal = _ip_literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            with anyio.fail_after(settings.connect_timeout_seconds):
                addresses = await (resolver or system_resolve)(host, port)
        except TimeoutError:
            raise DestinationRefused(f"resolving {host} timed out") from None
        except OSError as exc:
            raise DestinationRefused(f"{host} does not resolve: {exc.strerror or exc}") from None
    if not addresses:
        raise DestinationRefused(f"{host} resolves to no address")
    for address in addresses:
        why = refusal(address, networks)
        if why is not None:
            raise DestinationRefused(f"{host} resolves to {address}, {why}, which webhooks may not reach")
    return addresses[0]


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects ``host`` to the one address that was checked, whatever DNS says meanwhile."""

    def __init__(self, host: str, address: str) -> None:
        self.host = host.strip("[]").lower()
        self.address = address
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if host.strip("[]").lower() != self.host:
            raise httpcore.ConnectError(f"connection to {host} was not checked")
        return await self._inner.connect_tcp(self.address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("webhooks never use unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


_SSL: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    global _SSL
    if _SSL is None:
        try:
            import certifi

            _SSL = ssl.create_default_context(cafile=certifi.where())
        except ImportError:  # pragma: no cover - certifi comes with httpx
            _SSL = ssl.create_default_context()
    return _SSL


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 7 * 86400 else None


async def post(
    url: str, headers: dict[str, str], body: bytes, settings: EventSettings, resolver: Resolver | None = None
) -> SendResult:
    """POST ``body`` to ``url`` under the rules of the module docs. Never raises for the network."""
    started = time.monotonic()

    def took() -> int:
        return int((time.monotonic() - started) * 1000)

    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    timeout = settings.timeout_seconds
    try:
        with anyio.fail_after(timeout):
            address = await check_destination(host, port, settings, resolver)
            request_headers = [
                ("Host", parts.netloc),
                ("User-Agent", USER_AGENT),
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                *headers.items(),
            ]
            limits = {"connect": settings.connect_timeout_seconds, "read": timeout, "write": timeout, "pool": timeout}
            async with (
                httpcore.AsyncConnectionPool(
                    ssl_context=_ssl_context(),
                    max_connections=1,
                    retries=0,
                    network_backend=PinnedBackend(host, address),
                ) as pool,
                pool.stream(
                    "POST", url, headers=request_headers, content=body, extensions={"timeout": limits}
                ) as response,
            ):
                read = b""
                if settings.max_response_bytes:
                    async for chunk in response.aiter_stream():
                        read += chunk
                        if len(read) >= settings.max_response_bytes:
                            break
                status = response.status
                answer = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
    except DestinationRefused as exc:
        return SendResult("refused", None, str(exc), None, took())
    except TimeoutError:
        return SendResult("error", None, f"no answer within {timeout:g} s", None, took())
    except httpcore.TimeoutException as exc:
        return SendResult("error", None, f"timed out: {type(exc).__name__}", None, took())
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, OSError, ssl.SSLError) as exc:
        return SendResult("error", None, f"{type(exc).__name__}: {exc}"[:500], None, took())
    excerpt = read[: settings.max_response_bytes].decode("utf-8", "replace")[:500] or None
    if 200 <= status < 300:
        return SendResult("accepted", status, None, excerpt, took())
    error = f"HTTP {status}"
    if 300 <= status < 400:
        error += f": redirect to {answer.get('location', '?')[:300]} not followed; register the final URL instead"
    return SendResult("rejected", status, error, excerpt, took(), _retry_after(answer.get("retry-after")))
