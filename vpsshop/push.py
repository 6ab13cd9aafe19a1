"""Wake channels: how a node tells the watcher that something new happened (part of the chain kit).

A deposit coin declares its node's push channel in :meth:`vpsshop.DepositCoin.wake_channel`: an
async iterator that yields once as soon as it is connected and then once whenever the node has
something new (a block, a transaction in the mempool), and raises or ends when the channel is down.
Core's watcher runs a pass of the coin's scan group at every wake (several wakes during a pass make
one more pass), so a payment is seen and credited as soon as the node knows; when the channel is
down it polls every ``[topups] watch_interval_seconds`` and reconnects with back-off. A wake only
says "look now": the pass reads the chain from its cursor as always, so a missed or spurious wake
costs latency, never a payment.

The building blocks, re-exported by :mod:`vpsshop.chains`:

* :func:`long_poll_wakes`: a request the node holds until something changes (bitcoind's
  ``waitfornewblock``), asked again and again;
* :func:`datagram_wakes`: a local UDP port that a node's notify command (bitcoind's
  ``-walletnotify`` / ``-blocknotify``) sends a datagram to;
* :func:`websocket_wakes`: a JSON-RPC subscription over WebSocket (``eth_subscribe``, Solana's
  ``slotSubscribe``);
* :func:`zmq_sub_wakes`: a ZMQ publisher (monerod's ``--zmq-pub``, bitcoind's ``-zmqpub...``);
* :func:`merge_wakes`: several of these as one channel, down when any of them is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from vpsshop.errors import PluginError

WakeChannel = AsyncIterator[str]
"""What :meth:`vpsshop.DepositCoin.wake_channel` returns: yields a short reason per wake
(``"connected"`` first, then ``"block"``, ``"tx"`` ...)."""


IDLE = "idle"
"""What a channel yields to say the node is alive and nothing happened (no pass runs)."""


class ChannelDown(PluginError):
    """A wake channel lost its connection (the watcher falls back to polling and reconnects)."""


async def long_poll_wakes(
    wait: Callable[[], Awaitable[bool]], connect: Callable[[], Awaitable[None]] | None = None, what: str = "block"
) -> WakeChannel:
    """Wakes from a long poll: ``wait()`` returns when the node has something new (True) or its
    time limit passed (False), and raises when the node does not answer. It is called again at
    once after each answer, so an idle node sees one request per time limit. ``connect()``, when
    given, runs first (what the long poll compares with; it raises when the node does not answer):
    the channel is connected once it returned. A long poll that ends with nothing new yields
    ``"idle"``: the node is alive (core counts it as a good look at the chain, and runs no pass)."""
    if connect is not None:
        await connect()
    yield "connected"
    while True:
        yield what if await wait() else IDLE


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.queue.put_nowait(data)


async def datagram_wakes(
    host: str, port: int, accept: Callable[[bytes], bool] | None = None, what: str = "tx"
) -> WakeChannel:
    """Wakes from UDP datagrams to ``host:port`` (a node's notify command sends one per event:
    ``-walletnotify="python3 -c '...sendto(...)' %s %w"``). ``accept`` filters them by content
    (default: every datagram wakes). The port is bound until the iterator is closed.

    :raises ChannelDown: the port cannot be bound."""
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.create_datagram_endpoint(_Datagrams, local_addr=(host, port))
    except OSError as exc:
        raise ChannelDown(f"cannot listen for node notifications on udp {host}:{port}: {exc.strerror}") from None
    try:
        yield "connected"
        while True:
            data = await protocol.queue.get()
            if accept is None or accept(data):
                yield what
    finally:
        transport.close()


async def websocket_wakes(url: str, subscribe: dict[str, Any], what: str = "block") -> WakeChannel:
    """Wakes from a JSON-RPC subscription over WebSocket: sends ``subscribe`` and wakes at each
    notification of the subscription id the node answers (other messages are ignored). Both
    dialects in use have this shape: Ethereum's ``{"method": "eth_subscribe", "params":
    ["newHeads"]}`` (``eth_subscription`` notifications, a hex id) and Solana's PubSub
    ``{"method": "slotSubscribe"}`` (``slotNotification``, a numeric id), each notification
    ``{"method": ..., "params": {"subscription": <id>, "result": ...}}``.

    :raises ChannelDown: no connection, the subscription was refused, or the connection closed."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import WebSocketException

    request = {"jsonrpc": "2.0", "id": 1, **subscribe}
    try:
        async with connect(url, open_timeout=10, ping_interval=30, ping_timeout=20) as socket:
            await socket.send(json.dumps(request))
            answer = json.loads(await asyncio.wait_for(socket.recv(), 10))
            if not isinstance(answer, dict) or "result" not in answer:
                error = answer.get("error") if isinstance(answer, dict) else answer
                raise ChannelDown(f"the node refused the subscription {subscribe.get('method')}: {error}")
            subscription = answer["result"]
            yield "connected"
            async for message in socket:
                if _notifies(message, subscription):
                    yield what
    except (OSError, TimeoutError, WebSocketException) as exc:
        raise ChannelDown(f"WebSocket subscription closed: {type(exc).__name__}") from None


def _notifies(message: str | bytes, subscription: Any) -> bool:
    """Whether a WebSocket message is a notification of ``subscription``."""
    try:
        body = json.loads(message)
    except ValueError:
        return False
    params = body.get("params") if isinstance(body, dict) else None
    return isinstance(params, dict) and params.get("subscription") == subscription


def _zmtp_frame(body: bytes, command: bool = False) -> bytes:
    flags = (0x04 if command else 0) | (0x02 if len(body) > 255 else 0)
    size = len(body).to_bytes(8 if len(body) > 255 else 1, "big")
    return bytes([flags]) + size + body


async def _zmtp_read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    flags = (await reader.readexactly(1))[0]
    size = int.from_bytes(await reader.readexactly(8 if flags & 0x02 else 1), "big")
    if size > 16 * 1024 * 1024:
        raise ChannelDown("ZMQ publisher sent a frame over 16 MiB")
    return flags, await reader.readexactly(size)


def _keep_alive(writer: asyncio.StreamWriter) -> None:
    """TCP keep-alive probes after 30 s of silence, so a peer gone without a word (a host that lost
    power) closes the connection within about a minute instead of hours."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


async def zmq_sub_wakes(endpoint: str, topics: tuple[str, ...], what: str = "tx") -> WakeChannel:
    """Wakes from a ZMQ PUB socket (``tcp://host:port``: monerod's ``--zmq-pub``, bitcoind's
    ``-zmqpubhashtx``), subscribed to ``topics``: each message whose topic starts with one wakes.

    Speaks ZMTP 3.0 (NULL security) itself, so no libzmq is needed.

    :raises ChannelDown: no connection, or the connection closed."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    greeting = b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31
    ready = b"\x05READY" + b"\x0bSocket-Type" + (3).to_bytes(4, "big") + b"SUB"
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), 10)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ChannelDown(f"no connection to the ZMQ publisher at {endpoint}: {type(exc).__name__}") from None
    _keep_alive(writer)
    try:
        writer.write(greeting)
        await writer.drain()
        peer = await asyncio.wait_for(reader.readexactly(64), 10)
        if peer[0] != 0xFF or peer[9] != 0x7F or peer[10] < 3:
            raise ChannelDown(f"{endpoint} does not speak ZMTP 3")
        writer.write(_zmtp_frame(ready, command=True))
        for topic in topics:
            writer.write(_zmtp_frame(b"\x01" + topic.encode()))  # ZMTP 3.0 subscription message
        await writer.drain()
        yield "connected"
        wanted = tuple(t.encode() for t in topics)
        while True:
            flags, body = await _zmtp_read_frame(reader)
            more = flags & 0x01
            if not flags & 0x04 and body.startswith(wanted):
                yield what
            while more:  # the rest of a multipart message
                flags, _ = await _zmtp_read_frame(reader)
                more = flags & 0x01
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        raise ChannelDown(f"ZMQ publisher at {endpoint} closed: {type(exc).__name__}") from None
    finally:
        writer.close()


async def merge_wakes(*channels: WakeChannel) -> WakeChannel:
    """One channel of several: ``"connected"`` once all are, then every wake of each. Down (the
    error is raised again) as soon as any one is down; the others are closed."""
    queue: asyncio.Queue[tuple[str, BaseException | None]] = asyncio.Queue()
    connected: set[int] = set()

    async def pump(number: int, channel: WakeChannel) -> None:
        try:
            async for what in channel:
                await queue.put((f"{number}:{what}", None))
            await queue.put(("", ChannelDown("a wake channel ended")))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to the reader, which raises it
            await queue.put(("", exc))

    tasks = [asyncio.create_task(pump(i, c)) for i, c in enumerate(channels)]
    try:
        while True:
            tagged, error = await queue.get()
            if error is not None:
                raise error
            number, _, what = tagged.partition(":")
            if what == "connected":
                connected.add(int(number))
                if len(connected) == len(channels):
                    yield "connected"
            elif len(connected) == len(channels):
                yield what
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.aclose()  # type: ignore[attr-defined]
