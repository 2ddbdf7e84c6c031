"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._child import Children


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    """Start child processes (``children.start([...])``); all are killed and reaped
    at the end of the test, their stderr files kept in ``tmp_path``."""
    running = Children(tmp_path)
    yield running
    running.close()


# The folders of long tests, started first so that none is left to run alone at the
# end; the many short tests of the others fill in around them.
_LONG_FIRST = (
    "tests/spark/",
    "tests/torture/",
    "tests/test_examples.py",
    "tests/shared/",
    "tests/crash/",
    "tests/faults/",
    "tests/format/",
)


def _start_order(item: pytest.Item) -> int:
    for position, prefix in enumerate(_LONG_FIRST):
        if item.nodeid.startswith(prefix):
            return position
    return len(_LONG_FIRST)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (make test), every test of the Spark session runs in one
    worker (each worker would otherwise start its own JVM, ~6 s and 1 GiB, and two JVMs
    on two cores slow each other down more than they gain), which starts with them; the
    tests of tests/spark that need no session (the JVM reader run alone, the Spark-free
    scan, the writers' own checks) go to any worker.  The long folders start first."""
    for item in items:
        if item.nodeid.startswith("tests/spark/") and "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))
    items.sort(key=_start_order)  # (stable: collection order within a folder)
