"""Fixtures of the crash tests: child processes that are always reaped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._harness import ChildProcess, Spawn


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start ``_child.py MODE PATH SYNC SEED TOKEN_BASE SEGMENT_SIZE``; reaped at teardown."""
    children: list[ChildProcess] = []

    def start(
        mode: str,
        path: Path,
        *,
        sync: str = "never",
        seed: int = 0,
        token_base: int = 0,
        segment_size: int = 4096,
    ) -> ChildProcess:
        args = [mode, str(path), sync, str(seed), str(token_base), str(segment_size)]
        child = ChildProcess(args, tmp_path / f"child-{len(children)}.stderr")
        children.append(child)
        return child

    yield start
    for child in children:
        child.close()
