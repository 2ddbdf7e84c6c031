"""A kill -9 at a chosen instant of a segment write, for the crash tests' child scripts.

A child script imports this (``from tests.crash._kill_at import kill_in_segment_writes``)
after it has set up what must be on disk before the kill.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from ledgerq.segment.manager import SegmentManager


def kill_in_segment_writes(instant: str) -> None:
    """Make every later segment append kill this process with SIGKILL: just before its
    bytes are written (``instant == "before"``), or else just after them, before the
    call returns."""

    def killing(write: Callable[..., Any]) -> Callable[..., Any]:
        def append(self: SegmentManager, *args: Any, **kwargs: Any) -> Any:
            if instant == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            write(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        return append

    SegmentManager.append = killing(SegmentManager.append)  # type: ignore[method-assign]
    SegmentManager.append_one = killing(SegmentManager.append_one)  # type: ignore[method-assign]
