"""Fixtures of the crash tests: child processes that are always reaped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._child import Child, Children

from ._harness import CHILD_SCRIPT, WATCHDOG_SECONDS, Spawn


@pytest.fixture
def spawn(children: Children) -> Spawn:
    """Start ``_child.py MODE PATH SYNC SEED TOKEN_BASE SEGMENT_SIZE``; reaped at teardown."""

    def start(
        mode: str,
        path: Path,
        *,
        sync: str = "never",
        seed: int = 0,
        token_base: int = 0,
        segment_size: int = 4096,
    ) -> Child:
        args = [mode, str(path), sync, str(seed), str(token_base), str(segment_size)]
        return children.start([CHILD_SCRIPT, *args], watchdog_seconds=WATCHDOG_SECONDS)

    return start
