"""``vpsshop admin ...`` (vpsshop/admin.py) against a running shop: lookups, ledger changes and server
and job actions through the queue, each with its audit entry."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
from served import VPSSHOP, serve, shop_env, worker

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def admin(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([VPSSHOP, "admin", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def _status(api, sid: int, headers: dict[str, str]) -> str:
    return httpx.get(f"{api.base}/servers/{sid}", headers=headers).json()["status"]


def _until(read, want: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while read() != want:
        assert time.monotonic() < deadline, f"never {want}"
        time.sleep(0.3)


def test_admin_tools_act_through_ledger_and_queue_with_audit(vpsshop_database_url, tmp_path: Path):
    env = shop_env(
        vpsshop_database_url,
        VPSSHOP__SERVERS__JOBS_INTERVAL_SECONDS="0.2",
        VPSSHOP__HYPERVISOR__SIMULATOR__BOOT_SECONDS="0.5",
    )
    with serve(tmp_path, env, "--no-worker") as api:
        created = httpx.post(f"{api.base}/account").json()
        uid = str(created["user_id"])
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        assert admin(env, tmp_path, "credit", uid, "40", "--reason", "goodwill").returncode == 0
        topup = httpx.post(f"{api.base}/topups", headers=headers, json={"amount": 25, "coin": "BTC"}).json()
        sid = httpx.post(f"{api.base}/servers", headers=headers, json=ORDER).json()["server"]["id"]

        # Lookups by every handle a customer may quote.
        address = topup["deposit_address"] if "deposit_address" in topup else topup["payment"]["address"]
        for query in (uid, created["api_key"][:12], topup["ref"], address):
            found = admin(env, tmp_path, "lookup", query)
            assert found.returncode == 0, (query, found.stderr)
            assert json.loads(found.stdout)["account"]["id"] == int(uid)
        assert admin(env, tmp_path, "lookup", "nothing-like-this").returncode == 1

        # The create job waits (no worker yet): it is listed as stuck, and cancelling it terminates the
        # server and refunds the order; a retry then has nothing to provision.
        time.sleep(1.2)
        stuck = json.loads(admin(env, tmp_path, "stuck", "--minutes", "0.01").stdout)
        job_id = str(next(j["id"] for j in stuck["jobs"] if j["server_id"] == sid))
        cancelled = admin(env, tmp_path, "cancel-job", job_id, "--reason", "test")
        assert cancelled.returncode == 0 and "order refunded (3.990000 USD)" in cancelled.stdout, cancelled.stderr
        assert _status(api, sid, headers) == "terminated"
        retried = admin(env, tmp_path, "retry-job", job_id, "--reason", "test")
        assert retried.returncode == 1 and "nothing to provision" in retried.stderr
        sid = httpx.post(f"{api.base}/servers", headers=headers, json=ORDER).json()["server"]["id"]
        with worker(tmp_path, env):
            _until(lambda: _status(api, sid, headers), "active")
            # Debit through the ledger; a debit past the balance is refused.
            balance = float(httpx.get(f"{api.base}/account", headers=headers).json()["balance_usd"])
            assert admin(env, tmp_path, "debit", uid, "1.50", "--reason", "chargeback").returncode == 0
            after = float(httpx.get(f"{api.base}/account", headers=headers).json()["balance_usd"])
            assert round(balance - after, 2) == 1.5
            assert admin(env, tmp_path, "debit", uid, "100000", "--reason", "too much").returncode == 1
            # Suspend, unsuspend, terminate: each moves the server and queues its job.
            assert admin(env, tmp_path, "suspend", str(sid), "--reason", "abuse report").returncode == 0
            assert _status(api, sid, headers) == "suspended"
            assert admin(env, tmp_path, "suspend", str(sid), "--reason", "again").returncode == 1
            assert admin(env, tmp_path, "unsuspend", str(sid), "--reason", "resolved").returncode == 0
            assert _status(api, sid, headers) == "active"
            # Terminate with a refund of the unused time: nearly the whole price of a period just bought.
            assert admin(env, tmp_path, "refund", str(sid), "--reason", "customer asked").returncode == 0
            assert _status(api, sid, headers) == "terminated"
            ledger = json.loads(admin(env, tmp_path, "lookup", uid).stdout)["recent_ledger"]
            order = next(e for e in ledger if e["reason"] == "order" and e["ref"] == f"server:{sid}")
            refund = next(e for e in ledger if e["reason"] == "refund" and e["ref"] == f"server:{sid}")
            assert 0.99 * -order["amount_micros"] < refund["amount_micros"] <= -order["amount_micros"]
            assert admin(env, tmp_path, "terminate", str(sid), "--reason", "again").returncode == 1
        entries = json.loads(admin(env, tmp_path, "audit").stdout)
        assert [e["action"] for e in entries][::-1] == [
            "admin_credit",
            "cancel_job",
            "admin_debit",
            "suspend",
            "unsuspend",
            "refund",
        ]
        assert all(e["actor"] and e["reason"] for e in entries)
        assert "--reason" in admin(env, tmp_path, "suspend", str(sid)).stderr  # a reason is required
