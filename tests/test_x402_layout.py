"""x402 lives in one place (``vpsshop/x402/``) and payments import one way.

The import graph is read from the source (every ``import`` statement, at module level or inside a
function): nothing under ``vpsshop/payments/`` imports ``vpsshop.x402``, no x402 code is left in
``vpsshop/payments/``, and the x402 package reaches into payments only for its tables and
``engine_for``, never the engine or the watcher modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "vpsshop"


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_payments_never_import_x402() -> None:
    for path in sorted((PACKAGE / "payments").glob("*.py")):
        assert not {name for name in imports(path) if name.startswith("vpsshop.x402")}, path.name
        assert "x402" not in path.stem, f"x402 code belongs in vpsshop/x402/, not {path}"


def test_x402_uses_only_the_tables_of_payments() -> None:
    allowed = {
        "vpsshop.payments",
        "vpsshop.payments.models",
        "vpsshop.payments.engine_for",
        "vpsshop.payments.models.Topup",
        "vpsshop.payments.models.X402Record",
        "vpsshop.payments.models.new_ref",
    }
    modules = sorted((PACKAGE / "x402").glob("*.py"))
    assert {p.stem for p in modules} >= {"headers", "settlement", "orders", "discovery", "hooks"}
    for path in modules:
        used = {name for name in imports(path) if name.startswith("vpsshop.payments")}
        assert used <= allowed, (path.name, used - allowed)


def test_headers_are_read_outside_the_endpoints() -> None:
    for endpoint in (PACKAGE / "api" / "topups.py", PACKAGE / "servers" / "api.py"):
        text = endpoint.read_text()
        assert '"x-payment"' not in text.replace('"x-payment-mode"', "") and '"payment-signature"' not in text, endpoint
