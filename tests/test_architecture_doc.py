"""docs/architecture.md names every module and package of ``ledgerq/``, and nothing gone.

A module is named by its path relative to ``ledgerq/`` (``core/backlog.py``,
``_rekey.py``), a package by its directory with a slash (``ui/``,
``django/management/``); ``__init__.py`` files are the packages themselves.  In the
other direction, every module path the page writes in backticks (``segment/layout.py``)
must exist, so the page cannot keep describing a module that was removed or renamed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ledgerq"
DOC = ROOT / "docs" / "architecture.md"

# Backticked paths the page may name that are not modules of ledgerq/.
OUTSIDE_PACKAGE = ("tests/", "benchmarks/", "examples/", "docs/", "scripts/")


def expected_names() -> list[str]:
    """Every module (but ``__init__.py``) and package directory, relative to ledgerq/."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if path.name != "__init__.py":
            names.append(relative)
    for directory in sorted(PACKAGE.rglob("*/")):
        if directory.is_dir() and (directory / "__init__.py").exists():
            names.append(directory.relative_to(PACKAGE).as_posix() + "/")
    return names


def is_named(name: str, text: str) -> bool:
    # A whole path: `_queue.py` is not named by `core/shared_queue.py`, nor `meta.py` by
    # `segment/meta.py`; a leading `ledgerq/` is allowed, and a package is also named by
    # the path of a module inside it (`django/management/` by its command's path).
    pattern = r"(?<![\w/.])(?:ledgerq/)?" + re.escape(name)
    if not name.endswith("/"):
        pattern += r"(?!\w)"
    return re.search(pattern, text) is not None


def backticked_module_paths(text: str) -> set[str]:
    """The ``dir/name.py`` or ``name.py`` spans in backticks, outside fenced blocks."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return {
        span
        for span in re.findall(r"`([^`\n]+)`", prose)
        if re.fullmatch(r"(?:[A-Za-z_][\w]*/)*[A-Za-z_]\w*\.py", span)
    }


def test_every_module_and_package_is_named() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [name for name in expected_names() if not is_named(name, text)]
    assert not missing, (
        f"{len(missing)} module(s) or package(s) of ledgerq/ not named in "
        "docs/architecture.md - name it in docs/architecture.md (its path relative to "
        "ledgerq/, e.g. `core/backlog.py`, one line in its layer's section):\n" + "\n".join(missing)
    )


def test_every_module_path_the_doc_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    gone = sorted(
        span
        for span in backticked_module_paths(text)
        if not span.startswith(OUTSIDE_PACKAGE)
        and not (PACKAGE / span.removeprefix("ledgerq/")).is_file()
    )
    assert not gone, (
        "docs/architecture.md names module paths that do not exist under ledgerq/ "
        "(removed or renamed? fix or remove them in docs/architecture.md; a path outside "
        "the package goes in OUTSIDE_PACKAGE):\n" + "\n".join(gone)
    )


def test_the_checks_see_what_they_should() -> None:
    # The matching itself: a path inside a longer one does not count as named.
    assert is_named("_queue.py", "the class in `_queue.py`")
    assert not is_named("_queue.py", "`core/shared_queue.py`")
    assert not is_named("meta.py", "`segment/meta.py`")
    assert is_named("ui/", "packages cli/ ui/ celery/")
    assert is_named("django/management/", "`django/management/commands/ledgerq_worker.py`")
    assert backticked_module_paths("`a/b.py` `c.py` `ledgerq.open` `x/` `y.py z`") == {
        "a/b.py",
        "c.py",
    }
