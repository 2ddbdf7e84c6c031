"""The layers as docs/architecture.md draws them, enforced on the imports (``ast``).

```
format  <-  segment  <-  core  <-  features  <-  API (ledgerq/__init__, _*.py, shard, tools/)
                                                   ^
   ways in and out (cli, server, spark, kestrel, ship, workers, aio, metrics, ui, celery,
   django):
   the public API, ledgerq.segment.readonly, and what their allow-list names
```

Inside the storage stack a module imports its own layer or lower ones; features never
import each other; a way in or out imports only what its allow-list below says - the
public ``ledgerq`` API (the package, its public modules and the value types), the
read-only module's API, its own package, and a few storage modules named with the
reason.  The read-only module's API is pinned (``READ_ONLY_API``), and no other name may
be imported from it, so it cannot become a funnel to the storage engine.
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
# its public modules, the shared value types), segment.readonly's API and its own
# package: storage modules, each with the reason it is needed (a test checks that every
# entry gives one).  Anything else below the API - entry bytes, file names, index
# points, scanners - an outer module reaches only through an entry here.
OUTER: dict[str, dict[str, str]] = {
    "ledgerq.aio": {
        "ledgerq.core.args": "its waits check their arguments as the queue does",
    },
    "ledgerq.celery": {},
    "ledgerq.cli": {
        "ledgerq.segment.naming": "read-only stats find each segment's log and index, and dlq/",
        "ledgerq.segment.index_file": "read-only stats take a segment's last id from its index",
        "ledgerq.segment.scanner": "... or scan its tail from a checked index point",
        "ledgerq.segment.encryption": "verify and dump ask for a key only of an encrypted queue",
    },
    "ledgerq.django": {},
    "ledgerq.kestrel": {},
    "ledgerq.metrics": {},
    "ledgerq.server": {
        "ledgerq.segment.naming": "the registry knows a queue directory by its meta.json",
    },
    "ledgerq.ui": {
        "ledgerq.segment.naming": "the figures read segments/, dlq/ and each reader's journal",
    },
    "ledgerq.spark": {
        # the scan decodes entry bytes itself, for speed: one struct per header, the
        # checksums of a whole chunk in one call, payloads restored and opened in place,
        # from the index points on, falling back to the live-tail scanner at the end
        "ledgerq.format.checksum": "the scan checks a chunk's entries in one call",
        "ledgerq.format.compression": "the scan decompresses payloads itself",
        "ledgerq.format.entry": "the scan decodes entry headers with their struct",
        "ledgerq.format.errors": "the scan tells a torn tail from damage as decode does",
        "ledgerq.format.index": "the scan starts at sparse index points",
        "ledgerq.format.sealing": "the scan opens an encrypted queue's entries",
        "ledgerq.segment.encryption": "the scan and the writer seal with the stored key block",
        "ledgerq.segment.files": "the scan reads chunks; the writer fsyncs its staging dir",
        "ledgerq.segment.index_file": "planning and the scan read sparse index files",
        "ledgerq.segment.naming": "planning and the scan open a segment's log and index",
        "ledgerq.segment.scanner": "the scan of the newest segment's tail stops at appends",
    },
    "ledgerq.ship": {
        # ship writes its destination, itself a queue directory, byte for byte: the
        # durable-file primitives, append-only files (a copy grows by whole entries or
        # not at all), index files, the directory lock and meta.json; and it reads the
        # source's segments entry by entry, by their contents, to copy whole entries.
        "ledgerq.format.entry": "a copied chunk is checked entry by entry",
        "ledgerq.format.errors": "... and a torn tail told from damage",
        "ledgerq.format.index": "the copy's index points are the source's",
        "ledgerq.segment.appendlog": "a copy grows by whole entries or not at all",
        "ledgerq.segment.files": "the durable-file primitives",
        "ledgerq.segment.index_file": "the source's index read, the copy's written",
        "ledgerq.segment.layout": "a segment is known by its first entry, not its name",
        "ledgerq.segment.lock": "the destination's directory lock",
        "ledgerq.segment.meta": "the destination's meta.json",
        "ledgerq.segment.naming": "the files it copies and writes, by their names",
        "ledgerq.segment.scanner": "a sealed segment's index is trusted once it checks out",
        "ledgerq._public": "its public names take its path (reprs, pickles), as ledgerq's do",
    },
    "ledgerq.workers": {
        # The pools' own files in the queue's shared/: they write them, the console and
        # `ledgerq stats` only read them (through segment.readonly).
        "ledgerq.segment.progress": "the progress records of the pool's running tasks",
        "ledgerq.segment.ratelimit": "the start times a rate limit shares across pools",
        "ledgerq._public": "its public names take its path (reprs, pickles), as ledgerq's do",
    },
}
READ_ONLY = "ledgerq.segment.readonly"
# What segment.readonly exports: what a reader of a queue it does not own needs - a
# queue view, entries from an id, reader heads, message views - and nothing more.  A
# name added to its __all__ is added here too, for a reader that needs it (bytes and
# scanners go through an allow-list entry above instead).
READ_ONLY_API = {
    # a queue view
    "QueueDir",
    "check_queue_dir",
    "find_queues",
    "is_cleanly_closed",
    "is_queue_dir",
    "load_meta",
    "queue_dir_problem",
    "stored_options",
    # its segments
    "DirectoryWatcher",
    "SegmentDirectory",
    "WatchMode",
    "segment_ids",
    "watch_segments",
    # entries from an id
    "Entry",
    "EntryFlags",
    "LogTail",
    "RecordType",
    "SegmentTail",
    "last_complete_id",
    # reader heads
    "JournalTail",
    "ReaderState",
    "list_reader_names",
    "reader_heads",
    "replay_reader",
    # message views
    "MAX_VIEW_PAYLOAD",
    "VIEW_ATTEMPTS",
    "view_message",
    "view_sealer",
    "Progress",
    "RateState",
    "read_progress",
    "read_rate_state",
}
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
    if len(parts) == 1 or ".".join(parts[:2]) in PUBLIC_FACES:
        return API_LAYER  # (a public face's private modules too: ledgerq.tools._verify)
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


def runtime_imports_of(path: Path) -> set[str]:
    """The ledgerq modules ``path`` imports when it runs: those of :func:`imports_of`
    but the ones under ``if TYPE_CHECKING:``, which only annotations use."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_storage_stack_has_no_import_cycle() -> None:
    # Inside a layer too, modules import one another in one direction: each can be read
    # (and tested) with only what it imports; a cycle is a knot a newcomer must cut.
    stack = {
        module_name(path): path
        for path in MODULES
        if module_name(path).split(".")[1:2] and module_name(path).split(".")[1] in LAYERS
    }
    graph = {name: runtime_imports_of(path) & stack.keys() - {name} for name, path in stack.items()}
    cycles = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycles.append(" -> ".join([*trail[trail.index(name) :], name]))
            return
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert "ledgerq.core.reader" in graph["ledgerq.core.queue"]  # the check sees imports


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


def test_every_allow_list_entry_gives_its_reason() -> None:
    missing = [
        f"{package}: {module}"
        for package, extras in OUTER.items()
        for module, reason in extras.items()
        if not reason.strip()
    ]
    assert not missing, "allow-list entries without a reason:\n" + "\n".join(missing)


def _read_only_all() -> list[str]:
    path = PACKAGE / "segment" / "readonly.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            names = ast.literal_eval(node.value)
            assert isinstance(names, list)
            return [str(name) for name in names]
    raise AssertionError("segment/readonly.py has no __all__")


def test_the_read_only_module_exports_the_reader_api_only() -> None:
    exported = _read_only_all()
    assert len(exported) == len(set(exported)), "a name listed twice in readonly.__all__"
    assert set(exported) == READ_ONLY_API, (
        f"readonly.__all__ added {sorted(set(exported) - READ_ONLY_API)}, "
        f"dropped {sorted(READ_ONLY_API - set(exported))}: a reader's API changes here "
        "on purpose, and lower-level names go through an allow-list entry instead"
    )


def test_only_the_reader_api_is_imported_from_the_read_only_module() -> None:
    """Python lets ``from readonly import X`` take any name readonly itself imported:
    that would make it a funnel to the storage engine again.  Outside ``segment/``
    (which imports the defining modules) only its ``__all__`` may be imported, and only
    by name (``import ledgerq.segment.readonly as r; r.X`` would escape this check)."""
    violations = []
    for path in MODULES:
        module = module_name(path)
        if module.startswith("ledgerq.segment."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                if node.module == READ_ONLY:
                    violations.extend(
                        f"{module} imports {alias.name} from it"
                        for alias in node.names
                        if alias.name not in READ_ONLY_API
                    )
                elif node.module == "ledgerq.segment" and any(
                    alias.name == "readonly" for alias in node.names
                ):
                    violations.append(f"{module} imports the module itself")
            elif isinstance(node, ast.Import) and any(
                alias.name == READ_ONLY for alias in node.names
            ):
                violations.append(f"{module} imports the module itself")
    assert not violations, "past segment.readonly's API:\n" + "\n".join(sorted(violations))


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
