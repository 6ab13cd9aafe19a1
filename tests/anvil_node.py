"""The local EVM chain the EVM-coin and x402 tests share: anvil and solcjs from ``.peers/npm``.

``scripts/test.sh`` installs the npm packages listed in ``scripts/deps/npm-*.txt``; when pytest runs
on its own, :func:`npm_bin` installs whatever a test module's list names and is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NPM_DIR = ROOT / ".peers" / "npm"


def _package_dir(spec: str) -> Path:
    """``@scope/name@1.2`` -> node_modules/@scope/name; ``name@1.2`` -> node_modules/name."""
    name = spec[0] + spec[1:].split("@")[0]
    return NPM_DIR / "node_modules" / name


def npm_bin(deps_file: str) -> Path:
    """``.peers/npm/node_modules/.bin``, on PATH, after installing the packages of
    ``scripts/deps/<deps_file>`` that are missing."""
    wanted = [
        line.split("#")[0].strip()
        for line in (ROOT / "scripts" / "deps" / deps_file).read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    missing = [spec for spec in wanted if not _package_dir(spec).is_dir()]
    if missing:
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        if not (NPM_DIR / "package.json").exists():
            (NPM_DIR / "package.json").write_text('{"private":true}\n')
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent", *missing], cwd=NPM_DIR, check=True)
    bin_dir = NPM_DIR / "node_modules" / ".bin"
    if str(bin_dir) not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return bin_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rpc(url: str, method: str, params: list[Any] | None = None, timeout: float = 30) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer = json.loads(resp.read())
    if "error" in answer:
        raise RuntimeError(f"{method}: {answer['error']}")
    return answer["result"]


class AnvilNode:
    """A running ``anvil`` on a loopback port with ``chain_id`` and extra command-line ``args``."""

    def __init__(self, chain_id: int, args: tuple[str, ...], deps_file: str) -> None:
        exe = shutil.which("anvil", path=str(npm_bin(deps_file))) or shutil.which("anvil")
        if exe is None:
            raise RuntimeError("anvil is not installed (npm @foundry-rs/anvil into .peers/npm)")
        self.chain_id = chain_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [exe, "--host", "127.0.0.1", "--port", str(self.port), "--chain-id", str(chain_id), "--silent", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                if int(rpc(self.url, "eth_chainId", timeout=1), 16) == chain_id:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                self.stop()
                raise RuntimeError(f"anvil did not start: {err}")
            time.sleep(0.1)

    def mine(self, blocks: int = 1) -> None:
        rpc(self.url, "anvil_mine", [hex(blocks)])

    def height(self) -> int:
        return int(rpc(self.url, "eth_blockNumber"), 16)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
