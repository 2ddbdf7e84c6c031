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
