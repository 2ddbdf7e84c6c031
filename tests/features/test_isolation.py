"""Features never import each other (docs/features.md): each is a seam on the core alone.

A feature is a module ``ledgerq/features/<name>.py`` or a package
``ledgerq/features/<name>/``; the modules of one package may import each other.
``ledgerq/features/__init__.py`` (``build_features``) assembles them and is the only
module allowed to import every feature.
"""

from __future__ import annotations

import ast
from pathlib import Path

FEATURES = Path(__file__).resolve().parents[2] / "ledgerq" / "features"


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(FEATURES.parent.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Modules ``path`` imports, relative imports resolved."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # `from ledgerq.features import dlq` imports the module ledgerq.features.dlq
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _feature_of(module: str) -> str | None:
    """``dlq`` for ``ledgerq.features.dlq.store``; None outside a feature."""
    parts = module.split(".")
    if parts[:2] != ["ledgerq", "features"] or len(parts) < 3:
        return None
    return parts[2]


def feature_cross_imports() -> list[str]:
    """Every import of one feature by another (or of the assembler by a feature)."""
    found = []
    for path in sorted(FEATURES.rglob("*.py")):
        own = _feature_of(_module_of(path))
        if own is None:
            continue  # features/__init__.py: the assembler
        for imported in sorted(_imports(path)):
            if imported == "ledgerq.features":
                found.append(f"{_module_of(path)} imports the assembler ledgerq.features")
                continue
            other = _feature_of(imported)
            if other is not None and other != own:
                found.append(f"{_module_of(path)} imports {imported}")
    return found


def test_no_feature_imports_another() -> None:
    assert feature_cross_imports() == []


def test_the_check_sees_a_feature_package_and_its_modules() -> None:
    # The rule is only as good as the walk: it must see every feature, the DLQ's own
    # modules included, and resolve the DLQ's imports of its own modules.
    features = {_feature_of(_module_of(p)) for p in FEATURES.rglob("*.py")} - {None}
    assert {"dlq", "dedup", "priority", "compression", "ttl"} <= features
    assert "ledgerq.features.dlq.retries" in _imports(FEATURES / "dlq" / "feature.py")
