"""The shipped commands as tests run them: ``vpsshop serve`` and ``vpsshop worker`` in subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

VPSSHOP = str(Path(sys.executable).with_name("vpsshop"))
TEST_SECRET_KEY = "test-secret-key-not-for-production"
TEST_ENCRYPTION_KEY = "3q2-7wAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shop_env(database_url: str, **extra: str) -> dict[str, str]:
    """The environment of a sandbox shop on ``database_url``, without the caller's VPSSHOP settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VPSSHOP")}
    env.update(
        VPSSHOP_DATABASE_URL=database_url,
        VPSSHOP_SECRET_KEY=TEST_SECRET_KEY,
        VPSSHOP_ENCRYPTION_KEY=TEST_ENCRYPTION_KEY,
        VPSSHOP_MODE="sandbox",
    )
    env.update(extra)
    return env


class Served:
    def __init__(self, proc: subprocess.Popen[str], base: str, log: Path) -> None:
        self.proc = proc
        self.base = base
        self.log = log

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def wait_for(base: str, proc: subprocess.Popen[str], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code in (200, 503):
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"vpsshop serve exited with {proc.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"vpsshop serve did not answer within {timeout} s:\n{log.read_text()}")
        time.sleep(0.1)


@contextmanager
def serve(
    cwd: Path, env: dict[str, str], *args: str, command: str = VPSSHOP, name: str = "serve", port: int | None = None
) -> Iterator[Served]:
    """``vpsshop serve --port <free, or port> [args]`` until the block ends; its output goes to a log file."""
    port = port or free_port()
    log = cwd / f"{name}-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [command, "serve", "--port", str(port), *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    served = Served(proc, f"http://127.0.0.1:{port}/v1", log)
    try:
        wait_for(served.base, proc, log)
        yield served
    finally:
        stop(proc)


@contextmanager
def worker(cwd: Path, env: dict[str, str], command: str = VPSSHOP) -> Iterator[Served]:
    log = cwd / f"worker-{time.monotonic_ns()}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([command, "worker"], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        yield Served(proc, "", log)
    finally:
        stop(proc)


def active_server(
    served: Served, cwd: Path, env: dict[str, str], order: dict[str, str], reason: str
) -> tuple[dict[str, str], int]:
    """A new account on ``served``, funded with ``vpsshop admin credit`` (10 USD), that ordered ``order``
    and waited until it is active: (its authorization header, the server's id)."""
    created = httpx.post(f"{served.base}/account").json()
    headers = {"Authorization": f"Bearer {created['api_key']}"}
    credit = [VPSSHOP, "admin", "credit", str(created["user_id"]), "10", "--reason", reason]
    assert subprocess.run(credit, cwd=cwd, env=env, capture_output=True, timeout=60).returncode == 0
    sid = httpx.post(f"{served.base}/servers", headers=headers, json=order).json()["server"]["id"]
    deadline = time.monotonic() + 30
    while httpx.get(f"{served.base}/servers/{sid}", headers=headers).json()["status"] != "active":
        assert time.monotonic() < deadline, served.output()
        time.sleep(0.2)
    return headers, sid


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def revocation_windows(a: Served, b: Served, rounds: int = 20, settle: float = 0.0) -> list[float]:
    """Seconds, per revocation, from revoking a key through ``a`` (which refuses it at once) until
    ``b`` refuses it too; each key is used through ``b`` first, so ``b`` remembers it."""
    account = httpx.post(f"{a.base}/account").json()
    main = {"Authorization": f"Bearer {account['api_key']}"}
    windows = []
    with httpx.Client() as http:
        for _ in range(rounds):
            key = http.post(f"{a.base}/keys", headers=main).json()
            headers = {"Authorization": f"Bearer {key['api_key']}"}
            assert http.get(f"{b.base}/account", headers=headers).status_code == 200
            time.sleep(settle)
            assert http.get(f"{b.base}/account", headers=headers).status_code == 200  # remembered in b now
            assert http.delete(f"{a.base}/keys/{key['id']}", headers=main).status_code == 200
            assert http.get(f"{a.base}/account", headers=headers).status_code == 401  # a: at once
            started = time.monotonic()
            while http.get(f"{b.base}/account", headers=headers).status_code != 401:
                assert time.monotonic() - started < 5, "b never refused the revoked key"
            windows.append(time.monotonic() - started)
    return windows
