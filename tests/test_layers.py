"""Layers only import downwards (STYLE.md): format <- segment <- core <- features <- API."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ledgerq"

# Lower number = lower layer.  A module may import its own layer or lower ones.
LAYERS = {
    "format": 0,
    "segment": 1,
    "core": 2,
    "features": 3,
}
API_LAYER = 4  # ledgerq/_*.py and ledgerq/__init__.py
OUTER_LAYER = 5  # cli, server, workers, spark, shard, kestrel, ...
SHARED = {"ledgerq._errors", "ledgerq._types", "ledgerq._options"}  # value types used by all
PUBLIC_FACES = {"ledgerq.shard", "ledgerq.tools"}  # public modules of the API layer


def layer_of(module: str) -> int:
    parts = module.split(".")
    if module in SHARED:
        return -1
    if len(parts) == 1 or module in PUBLIC_FACES:
        return API_LAYER
    if parts[1] in LAYERS:
        return LAYERS[parts[1]]
    if parts[1].startswith("_"):
        return API_LAYER
    return OUTER_LAYER


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {name for name in found if name == "ledgerq" or name.startswith("ledgerq.")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_no_layer_imports_upwards() -> None:
    violations = []
    for path in PACKAGE.rglob("*.py"):
        module = module_name(path)
        own = layer_of(module)
        for imported in imports_of(path):
            if layer_of(imported) > own and own != -1:
                violations.append(f"{module} imports {imported}")
            if own == -1 and layer_of(imported) > -1:
                violations.append(f"shared value module {module} imports {imported}")
    assert not violations, "layer violations:\n" + "\n".join(sorted(violations))


def test_format_layer_does_no_io() -> None:
    forbidden = {"os", "io", "socket", "threading", "time"}
    for path in (PACKAGE / "format").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module.split(".")[0]}
            else:
                continue
            assert not names & forbidden, f"{path.name} imports {names & forbidden}"
