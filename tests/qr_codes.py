"""Reads the QR codes of top-ups back with ``zbarimg`` (Debian zbar-tools, scripts/deps/apt-topups.txt)."""

from __future__ import annotations

import base64
import subprocess
import tempfile
from pathlib import Path


def decode_qr(data_uri: str) -> str:
    """The text of a ``data:image/png;base64,...`` QR code."""
    prefix = "data:image/png;base64,"
    assert data_uri.startswith(prefix)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qr.png"
        path.write_bytes(base64.b64decode(data_uri[len(prefix):]))
        out = subprocess.run(["zbarimg", "--quiet", "--raw", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()
