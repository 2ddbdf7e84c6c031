"""Fixtures of the torture tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.torture._powerloss import scratch_dir


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory for the power-loss simulation's crash states (``scratch_dir``)."""
    with scratch_dir(tmp_path) as path:
        yield path
