"""Helpers shared by the account-chain tests: run a watcher pass, read top-ups, balances and the
recorded payments, and read a top-up's QR code back with ``zbarimg`` (Debian zbar-tools)."""

from __future__ import annotations

import base64
import subprocess
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from vpsshop.payments import engine_for


def run_pass(client: TestClient) -> dict[str, int]:
    """One watcher pass of the app's engine (scan, record, recheck, credit)."""
    engine = engine_for(client.app.state.ctx)  # type: ignore[attr-defined]
    return client.portal.call(engine.watcher.run_pass)  # type: ignore[union-attr]


def balance(client: TestClient, headers: dict[str, str]) -> Decimal:
    return Decimal(str(client.get("/v1/account", headers=headers).json()["balance_usd"]))


def get(client: TestClient, headers: dict[str, str], ref: str) -> dict[str, Any]:
    response = client.get(f"/v1/topups/{ref}", headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def payments(client: TestClient) -> list[tuple[str, str, str]]:
    """(coin, identity, status) of every recorded payment, sorted."""
    from sqlmodel import select

    from vpsshop.payments import models

    row_model = getattr(models, "TopupPayment", None) or models.DetectedPayment  # renamed on the top-ups branch
    with client.app.state.ctx.db.session() as session:  # type: ignore[attr-defined]
        return sorted((r.coin, r.identity, r.status) for r in session.exec(select(row_model)).all())


def decode_qr(data_uri: str) -> str:
    """The text of a ``data:image/png;base64,...`` QR code."""
    prefix = "data:image/png;base64,"
    assert data_uri.startswith(prefix)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qr.png"
        path.write_bytes(base64.b64decode(data_uri[len(prefix) :]))
        out = subprocess.run(["zbarimg", "--quiet", "--raw", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()
