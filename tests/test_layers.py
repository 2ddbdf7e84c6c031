"""The layers as docs/architecture.md draws them, enforced on the imports (``ast``).

```
format  <-  segment  <-  core  <-  features  <-  API (ledgerq/__init__, _*.py, shard, tools)
                                                   ^
   ways in and out (cli, server, spark, kestrel, ship, workers, aio, metrics, ui, celery,
   django):
   the public API, ledgerq.segment.readonly, and what their allow-list names
```

Inside the storage stack a module imports its own layer or lower ones; features never
import each other; a way in or out imports only what its allow-list below says - the
public ``ledgerq`` API (the package, its public modules and the value types), the
read-only module, its own package, and a few storage modules named with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ledgerq"

# Lower number = lower layer.  A module may import its own layer or lower ones.
LAYERS = {"format": 0, "segment": 1, "core": 2, "features": 3}
API_LAYER = 4  # ledgerq/__init__.py, ledgerq/_*.py and the public faces below
PUBLIC_FACES = {"ledgerq.shard", "ledgerq.tools"}  # public modules of the API layer
# Value types every layer may use (exceptions, Message/Stats/..., Options).
SHARED = {"ledgerq._errors", "ledgerq._types", "ledgerq._options"}

# The ways in and out, and what each may import besides the public API (the package,
# its public modules, the shared value types), segment.readonly and its own package.
OUTER = {
    "ledgerq.aio": {
        "ledgerq.core.args",  # its waits check their arguments as the queue does
    },
    "ledgerq.celery": set(),
    "ledgerq.cli": set(),
    "ledgerq.django": set(),
    "ledgerq.kestrel": set(),
    "ledgerq.metrics": set(),
    "ledgerq.server": set(),
    "ledgerq.ui": set(),
    "ledgerq.spark": {
        "ledgerq.segment.files",  # the writer fsyncs its staging directory
    },
    "ledgerq.ship": {
        # ship writes its destination, itself a queue directory, byte for byte: the
        # durable-file primitives, append-only files (a copy grows by whole entries or
        # not at all), index files, the directory lock and meta.json.
        "ledgerq.segment.appendlog",
        "ledgerq.segment.files",
        "ledgerq.segment.index_file",
        "ledgerq.segment.lock",
        "ledgerq.segment.meta",
    },
    "ledgerq.workers": {
        # The pools' own files in the queue's shared/: the start times a rate limit
        # shares across pools, and the progress records of their running tasks.
        "ledgerq.segment.progress",
        "ledgerq.segment.ratelimit",
    },
}
READ_ONLY = "ledgerq.segment.readonly"
# Private API modules an outer module may use as if they were public (the public
# names they define are re-exported by ``ledgerq``): none but the shared value types.
PUBLIC_API = {"ledgerq", *PUBLIC_FACES, *SHARED}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def outer_package(module: str) -> str | None:
    """The way in or out ``module`` belongs to, if any."""
    for name in OUTER:
        if module == name or module.startswith(name + "."):
            return name
    return None


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
    return API_LAYER + 1


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "ledgerq":  # `from ledgerq import tools` imports a module
                found.update(
                    f"ledgerq.{alias.name}"
                    for alias in node.names
                    if (PACKAGE / alias.name).is_dir() or (PACKAGE / f"{alias.name}.py").exists()
                )
    return {name for name in found if name == "ledgerq" or name.startswith("ledgerq.")}


MODULES = sorted(PACKAGE.rglob("*.py"))


def allowed_for_outer(package: str, imported: str) -> bool:
    """Whether the way in or out ``package`` may import ``imported``."""
    if imported in PUBLIC_API or imported == READ_ONLY or imported in OUTER[package]:
        return True
    if imported == package or imported.startswith(package + "."):
        return True
    own = outer_package(imported)
    if own is not None:  # another way in or out: only through its public face
        return not any(part.startswith("_") for part in imported.split(".")[1:])
    return False


def test_the_storage_stack_imports_only_downwards() -> None:
    violations = []
    for path in MODULES:
        module = module_name(path)
        if outer_package(module) is not None:
            continue  # checked by its allow-list below
        own = layer_of(module)
        for imported in imports_of(path):
            if own == -1 and layer_of(imported) > -1:
                violations.append(f"shared value module {module} imports {imported}")
            elif layer_of(imported) > own and outer_package(imported) is None:
                violations.append(f"{module} imports {imported}")
            elif outer_package(imported) is not None and own < API_LAYER:
                violations.append(f"{module} imports the way in or out {imported}")
    assert not violations, "layer violations:\n" + "\n".join(sorted(violations))


def test_features_never_import_each_other() -> None:
    violations = []
    for path in (PACKAGE / "features").rglob("*.py"):
        module = module_name(path)
        parts = module.split(".")
        if len(parts) < 3:
            continue  # ledgerq.features itself assembles them
        own = ".".join(parts[:3])
        for imported in imports_of(path):
            other = imported.split(".")
            if len(other) >= 3 and other[1] == "features" and ".".join(other[:3]) != own:
                violations.append(f"{module} imports {imported}")
    assert not violations, "features import each other:\n" + "\n".join(sorted(violations))


@pytest.mark.parametrize("package", sorted(OUTER))
def test_a_way_in_or_out_imports_only_its_allow_list(package: str) -> None:
    relative = package.split(".")[1:]
    root = PACKAGE.joinpath(*relative)
    paths = sorted(root.rglob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    violations = [
        f"{module_name(path)} imports {imported}"
        for path in paths
        for imported in sorted(imports_of(path))
        if not allowed_for_outer(package, imported)
    ]
    assert not violations, f"{package} reaches past its allow-list:\n" + "\n".join(violations)


def test_the_allow_lists_name_only_modules_that_exist() -> None:
    for extra in set().union(*OUTER.values()) | {READ_ONLY}:
        relative = Path(*extra.split(".")[1:])
        assert (PACKAGE / relative).with_suffix(".py").exists(), extra


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
