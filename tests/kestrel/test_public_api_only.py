"""``ledgerq.kestrel`` is a way in from outside: it uses ledgerq's public API only.

It imports ``ledgerq``, ``ledgerq.tools`` and its own modules - no format, segment,
core or private module - so it knows nothing of the queue's files (readers are created
with ``ledgerq.tools.create_reader``, not by writing their state files).
"""

from __future__ import annotations

import ast
from pathlib import Path

KESTREL = Path(__file__).resolve().parents[2] / "ledgerq" / "kestrel"
ALLOWED = {"ledgerq", "ledgerq.tools"}


def ledgerq_imports(path: Path) -> set[str]:
    """The ledgerq modules ``path`` imports (``from ledgerq import _x`` counts as ``_x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == "ledgerq":
                found.update(f"ledgerq.{a.name}" for a in node.names if a.name.startswith("_"))
    return {name for name in found if name == "ledgerq" or name.startswith("ledgerq.")}


def test_kestrel_imports_only_the_public_api_and_itself() -> None:
    outside = [
        f"{path.name} imports {name}"
        for path in sorted(KESTREL.glob("*.py"))
        for name in sorted(ledgerq_imports(path))
        if name not in ALLOWED and not name.startswith("ledgerq.kestrel")
    ]
    assert outside == []
