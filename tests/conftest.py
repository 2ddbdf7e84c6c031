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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n`` (make test), every Spark test runs in one worker: each worker
    would otherwise start its own JVM (~6 s and 1 GiB) for the session's Spark."""
    for item in items:
        if item.nodeid.startswith("tests/spark/"):
            item.add_marker(pytest.mark.xdist_group("spark"))
