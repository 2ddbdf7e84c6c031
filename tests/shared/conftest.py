"""Fixtures of the shared-mode tests: a small real disk (tmpfs) to fill up, and the two
ways a session locks."""

from __future__ import annotations

import pytest

from tests.locking import LOCKINGS
from tests.realfs import small_disk

__all__ = ["locking", "small_disk"]


@pytest.fixture(params=LOCKINGS)
def locking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How the sessions this test starts lock: lock words, or flock files (children
    inherit the choice through the environment)."""
    if request.param == "flock":
        monkeypatch.setenv("LEDGERQ_LOCKING", "flock")
    else:
        monkeypatch.delenv("LEDGERQ_LOCKING", raising=False)
    return str(request.param)
