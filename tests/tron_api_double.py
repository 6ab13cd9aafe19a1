"""A TEST DOUBLE of a TRON full node's HTTP API (java-tron ``/wallet/...``, as TronGrid also serves it).

No TRON node is packaged in any registry this project installs from, so the TRON tests talk to this
server instead. It speaks the documented java-tron HTTP wire format for exactly the endpoints the TRON
plugin and the tests use, with hex (``41...``) addresses (``visible`` false):

* ``POST /wallet/getnowblock``: the newest block;
* ``POST /wallet/getblockbynum {"num": n}``: a block ``{"blockID", "block_header": {"raw_data": {"number",
  "txTrieRoot", "witness_address", "parentHash", "version", "timestamp"}, "witness_signature"},
  "transactions": [{"ret": [{"contractRet"}], "signature", "txID", "raw_data", "raw_data_hex"}]}``, or
  ``{}`` when there is no such block;
* ``POST /wallet/gettransactioninfobyblocknum {"num": n}``: ``[{"id", "fee", "blockNumber",
  "blockTimeStamp", "contractResult", "contract_address", "receipt": {"result", "energy_usage_total",
  "net_usage"}, "log": [{"address", "topics", "data"}]}]`` (addresses in logs without the 41 prefix);
* ``POST /wallet/broadcasttransaction``: a signed transaction as tronpy's ``Transaction.to_json()`` gives
  it; answers ``{"result": true, "txid"}`` or ``{"code": "SIGERROR" | "CONTRACT_VALIDATE_ERROR" | ...,
  "message": <hex>}``.

It is driven by real keys and signatures: every transaction is built and signed with ``tronpy`` (its
offline builder computes the protobuf ``txID``); the double recomputes the ``txID`` from ``raw_data``
with tronpy's protobuf definitions, recovers the secp256k1 signer from the signature and refuses a
transaction whose signer is not its ``owner_address``. It executes ``TransferContract`` (TRX balances)
and ``TriggerSmartContract`` calls of ``transfer(address,uint256)`` and ``batchTransfer(address[],uint256[])``
(one ``Transfer`` log per recipient, as batch-payout tokens do) on the TRC-20 contracts it hosts (a call
without the balance reverts: ``contractRet`` ``REVERT`` and no log), and lets tests mine blocks
and reorganise the chain. Block ids follow java-tron's layout (8 bytes of block number, then 24 bytes of
a SHA-256 of the header); consensus, bandwidth and energy are not modelled.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from Crypto.Hash import keccak
from eth_abi import decode as abi_decode
from tronpy.keys import PrivateKey, Signature
from tronpy.proto import calculate_txid_from_raw_data

TRANSFER_TOPIC = "ddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
TRANSFER_SELECTOR = "a9059cbb"
BATCH_TRANSFER_SELECTOR = keccak.new(digest_bits=256, data=b"batchTransfer(address[],uint256[])").hexdigest()[:8]
GENESIS_TIME_MS = 1_700_000_000_000


def _sha(data: Any) -> bytes:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).digest()


@dataclass
class TronChainDouble:
    """The chain state behind the HTTP double. Tests drive it directly (mine, reorg, mint)."""

    token_contracts: list[str]
    """Hex (41...) addresses of the TRC-20 contracts hosted (6 decimals)."""
    blocks: list[dict[str, Any]] = field(default_factory=list)
    infos: list[list[dict[str, Any]]] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)
    trx: dict[str, int] = field(default_factory=dict)
    tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    forks: int = 0
    funding_trx: dict[str, int] = field(default_factory=dict)
    funding_tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    witness: PrivateKey = field(default_factory=lambda: PrivateKey(hashlib.sha256(b"tron double witness").digest()))

    def __post_init__(self) -> None:
        self._append_block([])

    # ---- state for tests ---------------------------------------------------------------------------

    def fund(self, address_hex: str, sun: int) -> None:
        with self.lock:
            self.trx[address_hex] = self.trx.get(address_hex, 0) + sun
            self.funding_trx[address_hex] = self.funding_trx.get(address_hex, 0) + sun

    def mint(self, contract_hex: str, address_hex: str, units: int) -> None:
        with self.lock:
            key = (contract_hex, address_hex)
            self.tokens[key] = self.tokens.get(key, 0) + units
            self.funding_tokens[key] = self.funding_tokens.get(key, 0) + units

    @property
    def height(self) -> int:
        return len(self.blocks) - 1

    def mine(self, count: int = 1) -> None:
        with self.lock:
            for _ in range(count):
                txs, self.pending = self.pending, []
                self._append_block(txs)

    def reorg(self, depth: int, new_blocks: int, keep_transactions: bool = False) -> None:
        """Replace the newest ``depth`` blocks by ``new_blocks`` others; their transactions are dropped
        (or, ``keep_transactions``, mined again in the first new block). Balances are replayed."""
        with self.lock:
            removed = self.blocks[-depth:]
            del self.blocks[-depth:]
            del self.infos[-depth:]
            self.forks += 1
            self._replay()
            again = [tx for block in removed for tx in block.get("transactions", ())] if keep_transactions else []
            for tx in again:
                tx.pop("ret", None)
            self.pending = again + self.pending
            self.mine(new_blocks)

    # ---- blocks ------------------------------------------------------------------------------------

    def _append_block(self, txs: list[dict[str, Any]]) -> None:
        number = len(self.blocks)
        executed, infos = [], []
        for tx in txs:
            tx_out, info = self._execute(tx, number)
            executed.append(tx_out)
            infos.append(info)
        parent = self.blocks[-1]["blockID"] if self.blocks else "00" * 32
        raw = {
            "number": number,
            "txTrieRoot": _sha([t["txID"] for t in executed]).hex(),
            "witness_address": self.witness.public_key.to_hex_address(),
            "parentHash": parent,
            "version": 30,
            "timestamp": GENESIS_TIME_MS + 3000 * number + self.forks,
        }
        header_hash = _sha(raw)
        block_id = number.to_bytes(8, "big").hex() + header_hash[8:].hex()
        block: dict[str, Any] = {
            "blockID": block_id,
            "block_header": {"raw_data": raw, "witness_signature": self.witness.sign_msg_hash(header_hash).hex()},
        }
        if executed:
            block["transactions"] = executed
        for info in infos:
            info["blockTimeStamp"] = raw["timestamp"]
        self.blocks.append(block)
        self.infos.append(infos)

    def _replay(self) -> None:
        """Recompute balances from the blocks left (after a reorg)."""
        self.trx = dict(self.funding_trx)
        self.tokens = dict(self.funding_tokens)
        for block in self.blocks:
            for tx in block.get("transactions", ()):
                tx.pop("ret", None)
                self._execute(tx, block_number=int(block["block_header"]["raw_data"]["number"]))

    def _execute(self, tx: dict[str, Any], block_number: int) -> tuple[dict[str, Any], dict[str, Any]]:
        contract = tx["raw_data"]["contract"][0]
        value = contract["parameter"]["value"]
        info: dict[str, Any] = {"id": tx["txID"], "fee": 0, "blockNumber": block_number, "receipt": {}}
        result = "SUCCESS"
        if contract["type"] == "TransferContract":
            owner, to, amount = value["owner_address"], value["to_address"], int(value["amount"])
            if self.trx.get(owner, 0) >= amount:
                self.trx[owner] -= amount
                self.trx[to] = self.trx.get(to, 0) + amount
            else:
                result = "FAILED"
            info["receipt"] = {"net_usage": 268}
        elif contract["type"] == "TriggerSmartContract":
            token, data, owner = value["contract_address"], value.get("data", ""), value["owner_address"]
            info["contract_address"] = token
            logs = []
            moves = self._token_moves(data) if token in self.token_contracts else None
            if moves is None or self.tokens.get((token, owner), 0) < sum(amount for _, amount in moves):
                result = "REVERT"
            else:
                for to, amount in moves:
                    self.tokens[(token, owner)] -= amount
                    self.tokens[(token, to)] = self.tokens.get((token, to), 0) + amount
                    logs.append(
                        {
                            "address": token[2:],
                            "topics": [TRANSFER_TOPIC, "0" * 24 + owner[2:], "0" * 24 + to[2:]],
                            "data": f"{amount:064x}",
                        }
                    )
            info["contractResult"] = ["0" * 63 + "1" if result == "SUCCESS" else ""]
            info["receipt"] = {
                "energy_usage_total": 13_000 if result == "SUCCESS" else 0,
                "net_usage": 345,
                "result": result,
            }
            if logs:
                info["log"] = logs
            if result != "SUCCESS":
                info["result"] = "FAILED"
        tx["ret"] = [{"contractRet": result}]
        return tx, info

    @staticmethod
    def _token_moves(data: str) -> list[tuple[str, int]] | None:
        """(recipient hex, amount) pairs of a TRC-20 call's data, None for an unknown call."""
        if data.startswith(TRANSFER_SELECTOR) and len(data) == 136:
            return [("41" + data[8 + 24 : 8 + 64], int(data[8 + 64 :], 16))]
        if data.startswith(BATCH_TRANSFER_SELECTOR):
            recipients, amounts = abi_decode(["address[]", "uint256[]"], bytes.fromhex(data[8:]))
            if len(recipients) != len(amounts):
                return None
            return [("41" + r.lower().removeprefix("0x"), int(a)) for r, a in zip(recipients, amounts, strict=False)]
        return None

    # ---- wire ----------------------------------------------------------------------------------------

    def broadcast(self, tx: dict[str, Any]) -> dict[str, Any]:
        def error(code: str, message: str) -> dict[str, Any]:
            return {"code": code, "txid": tx.get("txID", ""), "message": message.encode().hex()}

        raw = tx.get("raw_data") or {}
        try:
            txid = calculate_txid_from_raw_data(raw)
        except Exception as exc:  # noqa: BLE001 - a malformed raw_data is the client's error
            return error("OTHER_ERROR", f"cannot encode raw_data: {exc}")
        if txid != tx.get("txID"):
            return error("SIGERROR", "txID does not match raw_data")
        contract = raw["contract"][0]
        owner = contract["parameter"]["value"]["owner_address"]
        signatures = tx.get("signature") or []
        if not signatures:
            return error("SIGERROR", "no signature")
        signer = Signature.fromhex(signatures[0]).recover_public_key_from_msg_hash(bytes.fromhex(txid))
        if signer.to_hex_address() != owner:
            return error("SIGERROR", "the signature is not the owner's")
        with self.lock:
            known = {t["txID"] for t in self.pending} | {
                t["txID"] for b in self.blocks for t in b.get("transactions", ())
            }
            if txid in known:
                return error("DUP_TRANSACTION_ERROR", "dup transaction")
            if contract["type"] == "TransferContract":
                if self.trx.get(owner, 0) < int(contract["parameter"]["value"]["amount"]):
                    return error(
                        "CONTRACT_VALIDATE_ERROR", "Validate TransferContract error, balance is not sufficient."
                    )
            elif contract["type"] != "TriggerSmartContract":
                return error("CONTRACT_VALIDATE_ERROR", f"{contract['type']} is not served by this double")
            self.pending.append({"signature": signatures, "txID": txid, "raw_data": raw})
        return {"result": True, "txid": txid}

    def answer(self, path: str, body: dict[str, Any]) -> Any:
        with self.lock:
            if path == "/wallet/getnowblock":
                return self.blocks[-1]
            if path == "/wallet/getblockbynum":
                num = int(body.get("num", -1))
                return self.blocks[num] if 0 <= num < len(self.blocks) else {}
            if path == "/wallet/gettransactioninfobyblocknum":
                num = int(body.get("num", -1))
                return self.infos[num] if 0 <= num < len(self.infos) else []
        if path == "/wallet/broadcasttransaction":
            return self.broadcast(body)
        raise KeyError(path)


class TronApiDouble:
    """The HTTP server of :class:`TronChainDouble` on a loopback port."""

    def __init__(self, chain: TronChainDouble) -> None:
        self.chain = chain
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        double = chain

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw.strip() else {}
                    answer = double.answer(self.path.split("?")[0], body)
                    status, payload = 200, json.dumps(answer).encode()
                except KeyError:
                    status, payload = 404, b'{"Error": "no such endpoint"}'
                except (ValueError, TypeError) as exc:
                    status, payload = (
                        200,
                        json.dumps({"Error": f"class java.lang.IllegalArgumentException : {exc}"}).encode(),
                    )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
