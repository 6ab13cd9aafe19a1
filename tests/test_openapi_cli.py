"""schemathesis's command line with every check and the coverage phase, against a real ``vpsshop
serve``: what an outside tester runs (``st run --checks all``), kept clean in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from served import VPSSHOP, serve, shop_env

SCHEMATHESIS = str(Path(sys.executable).with_name("schemathesis"))

CONFIG = """
[checks.positive_data_acceptance]
# 402 belongs to the contract of valid requests (an order the balance does not cover, x402's
# payment requirements); 409 and 404 to valid requests about state that does not exist.
expected-statuses = ["2xx", "3xx", 401, 402, 403, 404, 409, 429]

[checks.negative_data_rejection]
# An invalid request may also be refused with 413: its body (a long string of escaped characters) is
# larger than the server takes (body_too_large). Never with a 5xx.
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
"""


def test_schemathesis_all_checks_all_phases(tmp_path):
    env = shop_env(
        f"sqlite:///{tmp_path}/shop.db",
        VPSSHOP__SIGNIN__FAILURES_PER_CLIENT="10000",
        VPSSHOP__SERVER__ACCESS_LOG="false",
        # The endpoints' logic under test, not the write limit (300 per minute, used up by the keys
        # minted below): its 429 is tested in tests/test_ratelimit.py.
        VPSSHOP__RATELIMIT__WRITES_PER_ACCOUNT="1000000",
        VPSSHOP__RATELIMIT__MAX_OPEN_TOPUPS_PER_ACCOUNT="100000",
        VPSSHOP__RATELIMIT__MAX_SERVERS_PER_ACCOUNT="100000",
    )
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    with serve(tmp_path, env, "--no-worker") as shop:
        account = httpx.post(f"{shop.base}/account").json()
        subprocess.run(
            [VPSSHOP, "admin", "credit", str(account["user_id"]), "100000", "--reason", "schemathesis"],
            cwd=tmp_path,
            env=env,
            check=True,
            capture_output=True,
        )
        headers = {"Authorization": f"Bearer {account['api_key']}"}
        # Generated DELETE /keys/{id} revoke small ids: authenticate with a key whose id none of them hits.
        key = account["api_key"]
        for _ in range(300):
            key = httpx.post(f"{shop.base}/keys", headers=headers).json()["api_key"]
        base = [
            SCHEMATHESIS,
            "--config-file",
            str(tmp_path / "schemathesis.toml"),
            "run",
            f"{shop.base}/openapi.json",
            "--checks",
            "all",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "10",
            "--generation-deterministic",
            "--workers",
            "1",
            "-H",
            f"Authorization: Bearer {key}",
        ]
        # Some operations run without positive_data_acceptance, because a field's validity is more than
        # a schema can say, so a random "valid string" is rightly refused with a 400: the x402 payment
        # header (a top-up, an order, a renewal, a resize: base64 of a signed JSON payload, invalid_payment;
        # tests/test_x402*.py), an OpenSSH public key (a key, invalid_public_key) and cloud-init user
        # data (a cloud-config YAML mapping or a script, invalid_user_data) on an order, its quote and a
        # reinstall (tests/test_server_access.py), and a firewall rule's source (an address or a prefix,
        # invalid_rule; tests/test_server_firewall.py). Every other check runs on them too.
        paid = [
            "createTopup",
            "orderServer",
            "renewServer",
            "resizeServer",
            "createSshKey",
            "quoteOrder",
            "reinstallServer",
            "setServerFirewall",
        ]
        only_paid = [arg for op in paid for arg in ("--include-operation-id", op)]
        for args in (
            [arg for op in paid for arg in ("--exclude-operation-id", op)],
            [*only_paid, "--exclude-checks", "positive_data_acceptance"],
        ):
            result = subprocess.run(base + args, cwd=tmp_path, capture_output=True, text=True, timeout=900)
            output = result.stdout + result.stderr
            (tmp_path / f"schemathesis-{len(list(tmp_path.glob('schemathesis-*.txt')))}.txt").write_text(output)
            assert result.returncode == 0, output[-8000:]
            assert "Rate limited" not in output, output[-4000:]
            assert "Coverage" in output and " passed" in output, output[-4000:]
        assert "Traceback" not in shop.output() and "internal_error" not in shop.output(), shop.output()[-4000:]
