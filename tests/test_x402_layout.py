"""x402 lives in one place (``vpsshop/x402/``, and its HTTP headers in ``vpsshop/api/x402.py``) and
payments import one way.

The import graph is read from the source (every ``import`` statement, at module level or inside a
function): nothing under ``vpsshop/payments/`` imports ``vpsshop.x402``, no x402 code is left in
``vpsshop/payments/``, and the x402 package reaches into payments only for its tables, the Top-up
resource and ``engine_for``, never the engine or the watcher modules.
"""

from __future__ import annotations

import ast
import re
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
        "vpsshop.payments.resource",
        "vpsshop.payments.resource.topup_event",
        "vpsshop.payments.resource.x402_payment_event",
    }
    modules = sorted((PACKAGE / "x402").glob("*.py"))
    assert {p.stem for p in modules} >= {"messages", "offers", "settlement", "purchases", "hooks"}
    for path in modules:
        used = {name for name in imports(path) if name.startswith("vpsshop.payments")}
        assert used <= allowed, (path.name, used - allowed)


def test_headers_are_read_in_one_place() -> None:
    """The x402 headers are read and written by vpsshop/api/x402.py only: not by the endpoints, and not by
    the operations, which take and give x402 payments as values (the MCP tools pass them as arguments)."""
    reads = re.compile(r"""\.get\(\s*["'](x-payment|payment-signature)["']""", re.IGNORECASE)
    readers = [path for path in sorted(PACKAGE.rglob("*.py")) if reads.search(path.read_text())]
    assert readers == [PACKAGE / "api" / "x402.py"]
