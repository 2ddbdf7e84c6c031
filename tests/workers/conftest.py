"""Fixtures of the worker-pool tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers import _handlers


@pytest.fixture
def done_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the handlers in ``_handlers`` note what they ran in (``DONE_LOG``)."""
    log = tmp_path / "done.log"
    monkeypatch.setenv(_handlers.DONE_LOG, str(log))
    return log
