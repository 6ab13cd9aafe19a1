"""A TEST DOUBLE of a Solana JSON-RPC endpoint whose transactions run on a real SVM (``solders.litesvm``).

A real validator (``solana-test-validator``) is not in the registries this project installs from, so the
SOL tests talk to this loopback HTTP server. Every transaction it accepts is a real signed Solana
transaction executed by LiteSVM (signatures verified, System Program run, fees charged); the double adds
what LiteSVM lacks, blocks: :meth:`SolanaChainDouble.produce_block` puts the transactions executed since
the previous block into a new block at the next slot (optionally after skipped slots) and rolls the
blockhash. It answers exactly the methods the SOL plugin and its tests call, in the response shapes of
the Solana JSON-RPC documentation:

``getSlot``, ``getBlocks``, ``getBlock`` (``transactionDetails`` ``accounts`` or ``none``; ``-32007`` for
a skipped slot, ``-32004`` for one not produced yet), ``getSignatureStatuses`` (``confirmations`` =
blocks on top, ``null`` with ``finalized`` from 32), ``getBalance``, ``getLatestBlockhash``,
``sendTransaction`` (base64; a transaction that fails in the SVM is refused as preflight does, ``-32002``),
``getHealth``; for x402's exact SVM scheme also ``getAccountInfo`` (base64) and ``simulateTransaction``
(base64; the ``err`` LiteSVM reports, as a string).

:class:`SolanaPubSubDouble` is its WebSocket PubSub endpoint, on the port after the RPC port as a
validator serves it (8899 -> 8900): ``slotSubscribe`` answers a numeric subscription id,
``slotUnsubscribe`` ``true`` (``false`` for an unknown id), and every block :meth:`produce_block` makes is
announced to each subscription as ``{"jsonrpc": "2.0", "method": "slotNotification", "params": {"result":
{"parent", "root", "slot"}, "subscription": <id>}}`` (the documented shape). ``stop``/``start`` take the
endpoint away and bring it back on the same port, the HTTP RPC untouched.

Forks are modelled only as the RPC shows them (:meth:`SolanaChainDouble.abandon_blocks`: the newest
blocks and their signatures disappear, the next block builds on the one before them); LiteSVM's account
state is not rolled back. Not modelled: votes, rewards, commitment differences (every block is
"confirmed" at once, "finalized" 32 blocks later).
"""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from solders.litesvm import LiteSVM
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction
from solders.transaction_metadata import FailedTransactionMetadata
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

FINALIZED_AFTER = 32
LAMPORTS_PER_SIGNATURE = 5000
BLOCK_TIME_0 = 1_760_000_000


class RpcFailure(Exception):
    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


def error_json(err: Any) -> Any:
    """A LiteSVM transaction error as the RPC writes it: ``"AlreadyProcessed"``, ``{"InstructionError": ...}``."""
    if hasattr(err, "to_json"):
        return json.loads(err.to_json())
    return str(err).rsplit(".", 1)[-1]


def simulation(err: Any, logs: list[str], units: int) -> dict[str, Any]:
    """``simulateTransaction``'s value (also the ``data`` of a refused ``sendTransaction``)."""
    return {"err": err, "logs": logs, "accounts": None, "unitsConsumed": units, "returnData": None}


class SolanaChainDouble:
    """LiteSVM plus blocks. Tests drive it directly (airdrop, produce_block)."""

    def __init__(self, first_slot: int = 1000) -> None:
        self.svm = LiteSVM()
        self.lock = threading.RLock()
        self.blocks: dict[int, dict[str, Any]] = {}
        self.order: list[int] = []
        self.pending: list[dict[str, Any]] = []
        self.tx_slot: dict[str, int] = {}
        self.slot = first_slot - 1
        self.unavailable: set[int] = set()
        """Slots whose getBlock answers -32004 although getBlocks lists them (a lagging backend)."""
        self.listeners: list[Callable[[int, int, int], None]] = []
        """Called with (slot, parent, root) after each new block (the PubSub endpoint's slot notifications)."""
        self.produce_block()

    # ---- test controls -----------------------------------------------------------------------------

    def airdrop(self, address: str, lamports: int) -> None:
        with self.lock:
            self.svm.airdrop(Pubkey.from_string(address), lamports)

    def balance(self, address: str) -> int:
        with self.lock:
            return int(self.svm.get_balance(Pubkey.from_string(address)) or 0)

    def produce_block(self, skipped_slots: int = 0) -> int:
        """A new block after ``skipped_slots`` empty slots, holding the transactions sent since the last."""
        with self.lock:
            parent = self.order[-1] if self.order else None
            self.slot += 1 + skipped_slots
            self.svm.expire_blockhash()
            txs, self.pending = self.pending, []
            self.blocks[self.slot] = {
                "blockHeight": len(self.order),
                "blockTime": BLOCK_TIME_0 + len(self.order),
                "blockhash": str(self.svm.latest_blockhash()),
                "parentSlot": parent if parent is not None else self.slot - 1,
                "previousBlockhash": self.blocks[parent]["blockhash"] if parent is not None else "1" * 32,
                "transactions": txs,
            }
            self.order.append(self.slot)
            for tx in txs:
                self.tx_slot[tx["transaction"]["signatures"][0]] = self.slot
            slot, parent_slot = self.slot, self.blocks[self.slot]["parentSlot"]
            root = self.order[-FINALIZED_AFTER - 1] if len(self.order) > FINALIZED_AFTER else self.order[0]
            listeners = list(self.listeners)
        for listener in listeners:
            listener(slot, parent_slot, root)
        return slot

    def abandon_blocks(self, count: int) -> None:
        """The newest ``count`` blocks leave the chain (a minority fork): their slots read as skipped and
        their transactions are no longer known to ``getSignatureStatuses``."""
        with self.lock:
            for slot in self.order[-count:]:
                for tx in self.blocks.pop(slot)["transactions"]:
                    self.tx_slot.pop(tx["transaction"]["signatures"][0], None)
            del self.order[-count:]

    # ---- execution -------------------------------------------------------------------------------------

    def send(self, raw: bytes) -> str:
        tx = VersionedTransaction.from_bytes(raw)
        message = tx.message
        keys = list(message.account_keys)
        header = message.header
        with self.lock:
            pre = [int(self.svm.get_balance(k) or 0) for k in keys]
            result = self.svm.send_transaction(tx)
            if isinstance(result, FailedTransactionMetadata):
                meta = result.meta()
                raise RpcFailure(
                    -32002,
                    f"Transaction simulation failed: {result.err()}",
                    simulation(error_json(result.err()), list(meta.logs()), int(meta.compute_units_consumed())),
                )
            post = [int(self.svm.get_balance(k) or 0) for k in keys]
            # solders 0.27 metadata has no fee(): the base fee per signature (no priority fee is set)
            fee = int(result.fee()) if hasattr(result, "fee") else LAMPORTS_PER_SIGNATURE * len(tx.signatures)
            signers = header.num_required_signatures
            n = len(keys)

            def writable(i: int) -> bool:
                if i < signers:
                    return i < signers - header.num_readonly_signed_accounts
                return i < n - header.num_readonly_unsigned_accounts

            signature = str(tx.signatures[0])
            self.pending.append(
                {
                    "meta": {
                        "err": None,
                        "fee": fee,
                        "preBalances": pre,
                        "postBalances": post,
                        "status": {"Ok": None},
                        "computeUnitsConsumed": int(result.compute_units_consumed()),
                    },
                    "transaction": {
                        "accountKeys": [
                            {"pubkey": str(k), "signer": i < signers, "source": "transaction", "writable": writable(i)}
                            for i, k in enumerate(keys)
                        ],
                        "signatures": [str(s) for s in tx.signatures],
                    },
                    "version": "legacy",
                }
            )
            return signature

    # ---- JSON-RPC methods ------------------------------------------------------------------------------

    def context(self) -> dict[str, Any]:
        return {"slot": self.slot, "apiVersion": "2.2.0"}

    def call(self, method: str, params: list[Any]) -> Any:
        with self.lock:
            if method == "getHealth":
                return "ok"
            if method == "getSlot":
                return self.slot
            if method == "getBlocks":
                start = int(params[0])
                end = int(params[1]) if len(params) > 1 and not isinstance(params[1], dict) else self.slot
                return [s for s in self.order if start <= s <= min(end, self.slot)]
            if method == "getBlock":
                slot = int(params[0])
                options = params[1] if len(params) > 1 and isinstance(params[1], dict) else {}
                if slot > self.slot or slot in self.unavailable:
                    raise RpcFailure(-32004, f"Block not available for slot {slot}")
                if slot not in self.blocks:
                    raise RpcFailure(
                        -32007, f"Slot {slot} was skipped, or missing due to ledger jump to recent snapshot"
                    )
                block = dict(self.blocks[slot])
                details = options.get("transactionDetails", "full")
                if details == "none":
                    block.pop("transactions")
                elif details != "accounts":
                    raise RpcFailure(-32602, "this double serves transactionDetails accounts or none")
                return block
            if method == "getSignatureStatuses":
                value = []
                for signature in params[0]:
                    slot = self.tx_slot.get(signature)
                    if slot is None:
                        value.append(None)
                        continue
                    on_top = sum(1 for s in self.order if s > slot)
                    final = on_top >= FINALIZED_AFTER
                    value.append(
                        {
                            "slot": slot,
                            "confirmations": None if final else on_top,
                            "err": None,
                            "status": {"Ok": None},
                            "confirmationStatus": "finalized" if final else "confirmed",
                        }
                    )
                return {"context": self.context(), "value": value}
            if method == "getBalance":
                return {"context": self.context(), "value": self.balance(params[0])}
            if method == "getLatestBlockhash":
                return {
                    "context": self.context(),
                    "value": {
                        "blockhash": str(self.svm.latest_blockhash()),
                        "lastValidBlockHeight": len(self.order) + 150,
                    },
                }
            if method == "getAccountInfo":
                account = self.svm.get_account(Pubkey.from_string(params[0]))
                if account is None:
                    return {"context": self.context(), "value": None}
                return {
                    "context": self.context(),
                    "value": {
                        "data": [base64.b64encode(bytes(account.data)).decode(), "base64"],
                        "executable": account.executable,
                        "lamports": account.lamports,
                        "owner": str(account.owner),
                        "rentEpoch": 0,
                        "space": len(bytes(account.data)),
                    },
                }
            if method == "simulateTransaction":
                tx = VersionedTransaction.from_bytes(base64.b64decode(params[0]))
                simulated = self.svm.simulate_transaction(tx)
                err = error_json(simulated.err()) if isinstance(simulated, FailedTransactionMetadata) else None
                meta = simulated.meta()
                return {
                    "context": self.context(),
                    "value": simulation(err, list(meta.logs()), int(meta.compute_units_consumed())),
                }
        if method == "sendTransaction":
            options = params[1] if len(params) > 1 else {}
            if options.get("encoding") != "base64":
                raise RpcFailure(-32602, "this double takes base64 transactions")
            return self.send(base64.b64decode(params[0]))
        raise RpcFailure(-32601, "Method not found")


def free_port_pair() -> int:
    """A loopback port ``p`` with ``p + 1`` free too (RPC and PubSub, as a validator lays them out)."""
    for _ in range(100):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free loopback ports")


class SolanaPubSubDouble:
    """The WebSocket PubSub endpoint of :class:`SolanaChainDouble` (``slotSubscribe`` only)."""

    def __init__(self, chain: SolanaChainDouble, port: int) -> None:
        self.chain = chain
        self.port = port
        self.url = f"ws://127.0.0.1:{port}"
        self.lock = threading.Lock()
        self.subscriptions: dict[int, ServerConnection] = {}
        self.connections: set[ServerConnection] = set()
        self.next_id = 0
        self.server: Server | None = None
        self.thread: threading.Thread | None = None
        chain.listeners.append(self.notify)
        self.start()

    def start(self) -> None:
        self.server = serve(self.handle, "127.0.0.1", self.port, compression=None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """The endpoint goes away: the listening socket and every connection are closed."""
        if self.server is None:
            return
        self.server.shutdown()
        with self.lock:
            connections = list(self.connections)
            self.subscriptions.clear()
        for connection in connections:
            connection.close()
        if self.thread is not None:
            self.thread.join(5)
        self.server = None

    def handle(self, connection: ServerConnection) -> None:
        with self.lock:
            self.connections.add(connection)
        try:
            for message in connection:
                answer = self.answer(connection, message)
                with self.lock:
                    connection.send(json.dumps(answer))
        except ConnectionClosed:
            pass
        finally:
            with self.lock:
                self.connections.discard(connection)
                for sub in [s for s, c in self.subscriptions.items() if c is connection]:
                    del self.subscriptions[sub]

    def answer(self, connection: ServerConnection, message: str | bytes) -> dict[str, Any]:
        try:
            request = json.loads(message)
            method, params = request["method"], request.get("params") or []
        except (ValueError, KeyError, TypeError):
            return {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}}
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request.get("id")}
        if method == "slotSubscribe":
            with self.lock:
                self.next_id += 1
                self.subscriptions[self.next_id] = connection
                reply["result"] = self.next_id
        elif method == "slotUnsubscribe" and params and isinstance(params[0], int):
            with self.lock:
                reply["result"] = self.subscriptions.pop(params[0], None) is connection
        elif method == "slotUnsubscribe":
            reply["error"] = {"code": -32602, "message": "Invalid params: expected a subscription id"}
        else:
            reply["error"] = {"code": -32601, "message": "Method not found"}
        return reply

    def notify(self, slot: int, parent: int, root: int) -> None:
        with self.lock:
            for sub, connection in list(self.subscriptions.items()):
                notification = {
                    "jsonrpc": "2.0",
                    "method": "slotNotification",
                    "params": {"result": {"parent": parent, "root": root, "slot": slot}, "subscription": sub},
                }
                try:
                    connection.send(json.dumps(notification))
                except ConnectionClosed:
                    self.subscriptions.pop(sub, None)


class SolanaRpcDouble:
    """The JSON-RPC HTTP server of :class:`SolanaChainDouble` on a loopback port, and its PubSub
    endpoint (:attr:`pubsub`) on the next port."""

    def __init__(self, chain: SolanaChainDouble) -> None:
        self.chain = chain
        port = free_port_pair()
        self.pubsub = SolanaPubSubDouble(chain, port + 1)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    request = json.loads(raw)
                    answer: dict[str, Any] = {"jsonrpc": "2.0", "id": request.get("id")}
                    answer["result"] = chain.call(request["method"], request.get("params") or [])
                except RpcFailure as exc:
                    answer["error"] = {"code": exc.code, "message": exc.message}
                    if exc.data is not None:
                        answer["error"]["data"] = exc.data
                except (ValueError, KeyError, TypeError, IndexError) as exc:
                    answer = {
                        "jsonrpc": "2.0",
                        "id": None,
                        "error": {"code": -32602, "message": f"Invalid params: {exc}"},
                    }
                payload = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.pubsub.stop()
        self.server.shutdown()
        self.server.server_close()
