"""Real chain peers for the top-up tests, started by the suite on loopback ports in temp dirs.

* :class:`Litecoind`: Debian's ``litecoind`` in ``-regtest`` with a wallet that mines and pays;
* :class:`MoneroRegtest`: Debian's ``monerod --regtest --offline --fixed-difficulty 1`` and two
  ``monero-wallet-rpc`` processes: a sender wallet that mines and pays, and the shop's view-only
  wallet (made from a receiver wallet's primary address and secret view key).

Both are session fixtures in the test modules; processes are stopped by their own pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

from coincurve import PrivateKey
from starlette.testclient import TestClient

from vpsshop.hdkeys import b58check_encode
from vpsshop.payments import engine_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_udp() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any], auth: tuple[str, str] | None = None, timeout: float = 60) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    if auth:
        import base64

        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read(), parse_float=Decimal)
    except urllib.error.HTTPError as exc:  # bitcoind answers RPC errors with HTTP 500 + JSON
        return json.loads(exc.read(), parse_float=Decimal)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Litecoind:
    """litecoind -regtest with a funded wallet named ``miner``."""

    user, password = "vpsshop", "regtest-only-password"

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("litecoind") or "/usr/bin/litecoind"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.datadir = workdir / "litecoind"
        self.datadir.mkdir(parents=True)
        # The node's notify commands send "<txid> <wallet>" / "<block hash>" to a UDP port: what a
        # shop with `notify_listen` (push_settings) wakes on.
        self.notify_port = free_port_udp()
        send = (
            f"{sys.executable} -S -c \"import socket,sys; socket.socket(2,2).sendto(' '.join(sys.argv[1:]).encode(), "
            f"('127.0.0.1', {self.notify_port}))\""
        )
        self.argv = [
            binary,
            "-regtest",
            f"-datadir={self.datadir}",
            f"-rpcport={self.port}",
            f"-port={free_port()}",
            "-rpcbind=127.0.0.1",
            "-rpcallowip=127.0.0.1",
            f"-rpcuser={self.user}",
            f"-rpcpassword={self.password}",
            "-listen=0",
            "-server",
            "-fallbackfee=0.0002",
            "-printtoconsole=0",
            "-walletrbf=1",
            "-mempoolreplacement=1",
            f"-walletnotify={send} %s %w",
            f"-blocknotify={send} %s",
        ]
        self._start()
        self.rpc("createwallet", "miner")
        self.mine_address = self.rpc("getnewaddress", "", "bech32", wallet="miner")
        # 120, not 101: twenty mature coinbase outputs, so a payment never waits on the change of the one
        # before it (after a restart the node reloads its mempool in the background, and a payment sent
        # meanwhile found no spendable change: "Insufficient funds")
        self.mine(120)

    def _start(self) -> None:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                self.rpc("getblockcount")
                break
            except (OSError, RuntimeError):
                if time.time() > deadline or self.process.poll() is not None:
                    _stop(self.process)
                    raise RuntimeError("litecoind did not start") from None
                time.sleep(0.1)

    def restart(self) -> None:
        """Start the node again after :meth:`stop`, with its wallet ``miner`` loaded."""
        self._start()
        self.rpc("loadwallet", "miner")

    def rpc(self, method: str, *params: Any, wallet: str | None = None) -> Any:
        url = f"{self.url}wallet/{wallet}" if wallet else self.url
        body = _post(
            url, {"jsonrpc": "1.0", "id": 1, "method": method, "params": list(params)}, (self.user, self.password)
        )
        if body.get("error"):
            raise RuntimeError(f"{method}: {body['error']}")
        return body["result"]

    def mine(self, blocks: int = 1) -> list[str]:
        return self.rpc("generatetoaddress", blocks, self.mine_address)

    def pay(self, address: str, amount: str, replaceable: bool = False) -> str:
        return self.rpc("sendtoaddress", address, amount, "", "", False, replaceable, wallet="miner")

    def settings(self, xpub: str, confirmations: int = 2) -> dict[str, Any]:
        return {
            "xpub": xpub,
            "network": "regtest",
            "rpc_url": self.url,
            "rpc_user": self.user,
            "rpc_password": self.password,
            "confirmations": confirmations,
        }

    def push_settings(self, xpub: str, confirmations: int = 2) -> dict[str, Any]:
        """:meth:`settings` with the node's notifications: mempool payments are pushed. The shop
        then loads a second wallet on the node (wallet calls of tests name theirs: ``wallet=``)."""
        return {**self.settings(xpub, confirmations), "notify_listen": f"127.0.0.1:{self.notify_port}"}

    def stop(self) -> None:
        if self.process.poll() is None:
            try:  # gettxoutsetinfo flushes the chain state: a node that takes too long to stop and is
                self.rpc("gettxoutsetinfo")  # killed keeps its blocks (it came back at height 0)
            except (OSError, RuntimeError):
                pass
        started = time.monotonic()
        _stop(self.process)
        self.stopped_in = time.monotonic() - started


class MoneroRegtest:
    """monerod --regtest --offline, a mining/paying sender wallet and the shop's view-only wallet."""

    def __init__(self, workdir: Path) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        try:
            self._begin(workdir)
        except BaseException:  # a node or wallet already started must not outlive the failed set-up
            self.stop()
            raise

    def _begin(self, workdir: Path) -> None:
        self.workdir = workdir / "monero"
        self.workdir.mkdir(parents=True)
        self.daemon_port = free_port()
        self.zmq_pub = f"tcp://127.0.0.1:{free_port()}"
        self._start(
            [
                shutil.which("monerod") or "/usr/bin/monerod",
                "--regtest",
                "--offline",
                "--fixed-difficulty",
                "1",
                "--non-interactive",
                "--no-igd",
                "--data-dir",
                str(self.workdir / "chain"),
                "--p2p-bind-ip",
                "127.0.0.1",
                "--p2p-bind-port",
                str(free_port()),
                "--rpc-bind-ip",
                "127.0.0.1",
                "--rpc-bind-port",
                str(self.daemon_port),
                "--zmq-rpc-bind-port",
                str(free_port()),
                "--zmq-pub",
                self.zmq_pub,
                "--log-level",
                "0",
            ],
            f"http://127.0.0.1:{self.daemon_port}/json_rpc",
            "get_info",
        )
        self.sender_url = self._wallet_rpc("sender")
        self.shop_url = self._wallet_rpc("shop")
        self.call(self.sender_url, "create_wallet", filename="sender", language="English")
        self.sender_address = self.call(self.sender_url, "get_address", account_index=0)["address"]
        # The receiving wallet exists only long enough to give its keys; the shop gets a view-only copy.
        self.call(self.shop_url, "create_wallet", filename="receiver", language="English")
        self.address = self.call(self.shop_url, "get_address", account_index=0)["address"]
        self.view_key = self.call(self.shop_url, "query_key", key_type="view_key")["key"]
        self.call(self.shop_url, "close_wallet")
        self.call(
            self.shop_url,
            "generate_from_keys",
            filename="shop-view-only",
            address=self.address,
            viewkey=self.view_key,
            password="",
            restore_height=0,
        )
        # The tests decide when wallets sync (the plugin calls `refresh` in each scan): a background
        # refresh racing the plugin's would show a block one pass late and make assertions flaky.
        for url in (self.sender_url, self.shop_url):
            self.call(url, "auto_refresh", enable=False)
        # Coinbase outputs unlock after 60 blocks. 80 blocks left so few unlocked outputs that the
        # sender wallet's decoy picker spun for minutes building its sixth transfer (the "hang" of a
        # second shop's payments, or of the latency bench's sixth sample); with 330 it never does.
        for _ in range(11):  # in calls of 30: each answers well within its timeout on a loaded machine
            self.mine(30)

    def _start(self, argv: list[str], probe_url: str, probe_method: str) -> None:
        log = open(self.workdir / f"{Path(argv[0]).name}-{len(self.processes)}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        deadline = time.time() + 90
        while True:
            try:
                self.call(probe_url, probe_method)
                return
            except (OSError, RuntimeError):
                if time.time() > deadline or process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{argv[0]} did not start") from None
                time.sleep(0.3)

    def _wallet_rpc(self, name: str) -> str:
        port = free_port()
        wallet_dir = self.workdir / f"wallets-{name}"
        wallet_dir.mkdir()
        url = f"http://127.0.0.1:{port}/json_rpc"
        self._start(
            [
                shutil.which("monero-wallet-rpc") or "/usr/bin/monero-wallet-rpc",
                "--daemon-address",
                f"127.0.0.1:{self.daemon_port}",
                "--trusted-daemon",
                "--disable-rpc-login",
                "--wallet-dir",
                str(wallet_dir),
                "--rpc-bind-ip",
                "127.0.0.1",
                "--rpc-bind-port",
                str(port),
                "--non-interactive",
                "--log-level",
                "0",
            ],
            url,
            "get_version",
        )
        return url

    @staticmethod
    def call(url: str, method: str, **params: Any) -> Any:
        body = _post(url, {"jsonrpc": "2.0", "id": "0", "method": method, "params": params}, timeout=120)
        if "error" in body:
            raise RuntimeError(f"{method}: {body['error']}")
        return body.get("result", {})

    def mine(self, blocks: int = 1) -> None:
        self.call(
            f"http://127.0.0.1:{self.daemon_port}/json_rpc",
            "generateblocks",
            amount_of_blocks=blocks,
            wallet_address=self.sender_address,
        )

    def mine_until_mined(self, txid: str, tries: int = 10) -> float:
        """Mine single blocks until ``txid`` is in one (a block template may predate the tx).
        Returns when (``time.monotonic()``) the block that holds it was asked for."""
        daemon = f"http://127.0.0.1:{self.daemon_port}"
        for _ in range(tries):
            asked = time.monotonic()
            self.mine(1)
            answer = _post(f"{daemon}/get_transactions", {"txs_hashes": [txid]})
            txs = answer.get("txs") or []
            if txs and not txs[0].get("in_pool") and int(txs[0].get("block_height") or 0) > 0:
                return asked
            time.sleep(0.2)
        raise RuntimeError(f"{txid} was not mined")

    def drop(self, txid: str, blocks: int) -> None:
        """Pop the last ``blocks`` blocks and flush ``txid`` from the pool: it is gone."""
        daemon = f"http://127.0.0.1:{self.daemon_port}"
        _post(f"{daemon}/pop_blocks", {"nblocks": blocks})
        self.call(f"{daemon}/json_rpc", "flush_txpool", txids=[txid])

    def pay(self, address: str, atomic: int) -> str:
        self.call(self.sender_url, "refresh")
        answer = self.call(
            self.sender_url,
            "transfer",
            destinations=[{"address": address, "amount": atomic}],
            account_index=0,
            priority=0,
            get_tx_key=False,
        )
        return str(answer["tx_hash"])

    def settings(self, confirmations: int = 2) -> dict[str, Any]:
        return {
            "address": self.address,
            "view_key": self.view_key,
            "network": "regtest",
            "wallet_rpc_url": self.shop_url,
            "confirmations": confirmations,
        }

    def stop(self) -> None:
        for process in reversed(self.processes):
            _stop(process)


def peer_workdir(name: str) -> Path:
    """A private temp dir for a peer's data. Not pytest's tmp_path_factory: pytest deletes old
    base dirs of *other* concurrent pytest runs, which would pull a running node's data away."""
    return Path(tempfile.mkdtemp(prefix=f"vpsshop-{name}-"))


def remove_workdir(path: Path) -> None:
    if not os.environ.get("VPSSHOP_KEEP_PEER_LOGS"):
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def running_litecoind(name: str) -> Iterator[Litecoind]:
    """A litecoind -regtest in a private work directory (``peer_workdir(name)``), stopped and the
    directory removed afterwards: the body of every test module's ``litecoind`` fixture."""
    workdir = peer_workdir(name)
    node = Litecoind(workdir)
    try:
        yield node
    finally:
        node.stop()
        remove_workdir(workdir)


@contextmanager
def running_monero(name: str) -> Iterator[MoneroRegtest]:
    """monerod and its two wallet-rpc processes in a private work directory, like
    :func:`running_litecoind`: the body of every test module's ``monero`` fixture."""
    workdir = peer_workdir(name)
    peers = MoneroRegtest(workdir)
    try:
        yield peers
    finally:
        peers.stop()
        remove_workdir(workdir)


def random_tpub() -> str:
    """A fresh testnet account key (tpub) per call, so tests on one shared chain never share an address."""
    key = PrivateKey().public_key.format(compressed=True)
    raw = (
        bytes.fromhex("045f1cf6")
        + bytes([3])
        + b"\0" * 4
        + (0x80000000).to_bytes(4, "big")
        + secrets.token_bytes(32)
        + key
    )
    return b58check_encode(raw)


# ---- helpers of the chain tests -------------------------------------------------------------------


def run_pass(client: TestClient) -> dict[str, int]:
    engine = engine_for(client.app.state.ctx)  # type: ignore[attr-defined]
    return client.portal.call(engine.watcher.run_pass)  # type: ignore[union-attr]


def balance(client: TestClient, headers: dict[str, str]) -> Decimal:
    return Decimal(str(client.get("/v1/account", headers=headers).json()["balance_usd"]))


def get(client: TestClient, headers: dict[str, str], ref: str) -> dict[str, Any]:
    response = client.get(f"/v1/topups/{ref}", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def eventually(
    client: TestClient, headers: dict[str, str], ref: str, seconds: float = 60, **expected: Any
) -> dict[str, Any]:
    """Run watcher passes until the top-up shows ``expected`` (a wallet-rpc syncs with its daemon
    asynchronously, so a block can reach the wallet a moment after monerod accepted it; on a
    loaded machine that takes seconds)."""
    body: dict[str, Any] = {}
    deadline = time.monotonic() + seconds
    while True:
        run_pass(client)
        body = get(client, headers, ref)
        if all(body.get(k) == v for k, v in expected.items()):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"top-up never reached {expected} in {seconds}s: {body}")
        time.sleep(0.25)
