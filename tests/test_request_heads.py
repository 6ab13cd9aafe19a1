"""Request heads against the real ``vpsshop serve`` (vpsshop/httpserver.py): their size, their header
count and the time they take to arrive are bounded, so no unauthenticated client can grow the
process's memory with endless headers or hold connections open with slow ones. Loopback only; every
loop here is bounded."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import hypothesis
import hypothesis.strategies as st
import pytest
from served import serve, shop_env

MAX_HEADER_BYTES = 32 * 1024  # the defaults (docs/configuration.md)
MAX_HEADERS = 100
HEADER_TIMEOUT = 1.0  # lowered for the test: the default is 10 s


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("heads")
    env = shop_env(f"sqlite:///{cwd}/shop.db", VPSSHOP__SERVER__HEADER_TIMEOUT_SECONDS=str(HEADER_TIMEOUT))
    with serve(cwd, env, "--no-worker") as served:
        url = httpx.URL(served.base)
        served.address = (url.host, url.port)
        yield served


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _answer(conn: socket.socket, limit: float = 10) -> bytes:
    """Everything the server sends until it closes the connection (or ``limit`` seconds pass)."""
    conn.settimeout(limit)
    chunks = []
    try:
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _status(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower() or status < 400, raw[:300]
    return status, (json.loads(body) if status >= 400 else {})


def _head(headers: list[bytes], close: bool = True) -> bytes:
    """A GET with ``headers`` besides Host (and ``Connection: close``, so the answer ends the connection)."""
    sent = [b"Host: shop", *([b"Connection: close"] if close else []), *headers]
    return b"GET /v1/catalog HTTP/1.1\r\n" + b"".join(h + b"\r\n" for h in sent) + b"\r\n"


def _padded(total: int, lines: int = 1, close: bool = True) -> bytes:
    """A whole head of exactly ``total`` bytes with ``lines`` header lines besides Host (and Connection)."""
    pad = total - len(_head([b"X-%03d: " % i for i in range(lines)], close))
    assert pad >= 0
    return _head([b"X-%03d: " % i + (b"a" * pad if i == 0 else b"") for i in range(lines)], close)


def _response(conn: socket.socket) -> bytes:
    """One whole response (head and Content-Length body) from a kept-alive connection."""
    got = b""

    def more() -> bytes:
        chunk = conn.recv(65536)
        assert chunk, f"the server closed the connection mid-answer: {got[:300]!r}"
        return chunk

    while b"\r\n\r\n" not in got:
        got += more()
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += more()
    return head + b"\r\n\r\n" + body


def _send(shop, data: bytes) -> bytes:
    with socket.create_connection(shop.address, timeout=10) as conn:
        try:
            conn.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return _answer(conn)


# ---- size and count ------------------------------------------------------------------------------


def test_a_head_at_the_limits_is_served_one_past_them_is_431(shop):
    assert _status(_send(shop, _padded(MAX_HEADER_BYTES)))[0] == 200
    status, body = _status(_send(shop, _padded(MAX_HEADER_BYTES + 1)))
    assert status == 431 and body["error"] == "headers_too_large" and str(MAX_HEADER_BYTES) in body["message"]
    most = MAX_HEADERS - 2  # besides Host and Connection
    assert _status(_send(shop, _head([b"X-%d: v" % i for i in range(most)])))[0] == 200
    status, body = _status(_send(shop, _head([b"X-%d: v" % i for i in range(most + 1)])))
    assert status == 431 and body["error"] == "headers_too_large" and "header lines" in body["message"]


def test_the_limits_hold_per_request_on_a_kept_alive_connection(shop):
    near = _padded(MAX_HEADER_BYTES - 100, lines=MAX_HEADERS - 2, close=False)
    with socket.create_connection(shop.address, timeout=10) as conn:
        for _ in range(3):  # three heads near both limits, one after the other on one connection
            conn.sendall(near)
            assert _response(conn).startswith(b"HTTP/1.1 200 ")
        for _ in range(3):  # and small ones after them
            conn.sendall(_head([], close=False))
            assert _response(conn).startswith(b"HTTP/1.1 200 ")


def test_a_header_flood_does_not_grow_the_process(shop):
    """Two connections each sending up to 100 MB of headers without the final CRLF: the process's
    resident memory stays within 50 MB of its idle figure (before the bound it grew by ~290 MB)."""
    pid = shop.proc.pid
    idle = _rss_kib(pid)
    peak = idle
    sent = [0, 0]

    def flood(i: int) -> None:
        with socket.create_connection(shop.address, timeout=30) as conn:
            conn.sendall(b"GET /v1/catalog HTTP/1.1\r\nHost: shop\r\nX-Flood: ")
            chunk = b"a" * 65536
            try:
                while sent[i] < 100 * 1024 * 1024:
                    conn.sendall(chunk)
                    sent[i] += len(chunk)
            except OSError:  # the server refused the head and closed the connection
                pass

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, _rss_kib(pid))
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    time.sleep(0.5)
    peak = max(peak, _rss_kib(pid))
    assert peak - idle < 50 * 1024, f"RSS went from {idle} to {peak} KiB"
    assert max(sent) < 100 * 1024 * 1024, f"the server read every byte of the flood: {sent}"
    assert httpx.get(f"{shop.base}/health").status_code == 200


# ---- time ----------------------------------------------------------------------------------------


def _closed_within(conn: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[float, bytes]:
    """Seconds until the server closed ``conn``, sending ``trickle`` every 0.2 s meanwhile; and what it said."""
    started = time.monotonic()
    conn.settimeout(0.2)
    got = b""
    while time.monotonic() - started < seconds:
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            if trickle:
                try:
                    conn.sendall(trickle)
                except OSError:
                    break
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return time.monotonic() - started, got


def test_a_half_sent_request_line_is_answered_408_and_closed(shop):
    with socket.create_connection(shop.address) as conn:
        conn.sendall(b"GET /v1/cata")
        took, said = _closed_within(conn, 10)
    assert took < HEADER_TIMEOUT + 1.5, took
    status, body = _status(said)
    assert status == 408 and body["error"] == "header_timeout"


def test_a_header_line_every_so_often_does_not_hold_the_connection(shop):
    with socket.create_connection(shop.address) as conn:
        conn.sendall(b"GET /v1/catalog HTTP/1.1\r\nHost: shop\r\n")
        took, said = _closed_within(conn, 10, trickle=b"X-Slow: 1\r\n")
    assert took < HEADER_TIMEOUT + 1.5, took
    assert _status(said)[1]["error"] == "header_timeout"


def test_many_slow_connections_are_all_closed_and_the_shop_still_answers(shop):
    conns = [socket.create_connection(shop.address) for _ in range(40)]
    try:
        for i, conn in enumerate(conns):
            conn.sendall(b"GET /v1/catalog HTTP/1.1\r\n" if i % 2 else b"")  # half of them send nothing at all
        assert httpx.get(f"{shop.base}/catalog", timeout=5).status_code == 200
        deadline = time.monotonic() + HEADER_TIMEOUT + 3
        for conn in conns:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                while conn.recv(65536):
                    pass
            except ConnectionResetError:
                pass  # closed too
            except TimeoutError:
                pytest.fail("a slow connection was still open after the header time-out")
    finally:
        for conn in conns:
            conn.close()


# ---- fuzz: random heads, sent in random pieces ------------------------------------------------------


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
@hypothesis.given(
    lines=st.integers(min_value=0, max_value=MAX_HEADERS + 20),
    size=st.integers(min_value=0, max_value=MAX_HEADER_BYTES + 4096),
    pieces=st.integers(min_value=1, max_value=6),
)
def test_fuzz_heads_are_served_within_the_limits_and_refused_past_them(shop, lines, size, pieces):
    value = b"v" * (size // max(lines, 1))
    head = _head([b"X-%d: " % i + value for i in range(lines)])
    step = -(-len(head) // pieces)
    with socket.create_connection(shop.address, timeout=10) as conn:
        try:
            for start in range(0, len(head), step):
                conn.sendall(head[start : start + step])
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        said = _answer(conn)
    status, body = _status(said)
    within = len(head) <= MAX_HEADER_BYTES and lines + 2 <= MAX_HEADERS
    assert status == (200 if within else 431), (len(head), lines, said[:200])
    if not within:
        assert body["error"] == "headers_too_large"


def test_every_worker_process_takes_the_limits_from_the_settings(tmp_path):
    """``--workers 2``: each worker process builds its settings anew, and its protocol bounds heads by them."""
    env = shop_env(f"sqlite:///{tmp_path}/shop.db", VPSSHOP__SERVER__MAX_HEADER_BYTES="4096")
    with serve(tmp_path, env, "--no-worker", "--workers", "2") as served:
        url = httpx.URL(served.base)
        served.address = (url.host, url.port)
        for _ in range(4):  # connections land on either worker
            assert _status(_send(served, _padded(4096)))[0] == 200
            status, body = _status(_send(served, _padded(4097)))
            assert status == 431 and "4096 bytes" in body["message"]
