"""What worker pools leave for ``ledgerq stats``: the rate limit and task progress.

Both are read from the queue's ``shared/`` without a lock (``segment.readonly``): the
start-rate limit the pools share (its figures, and the starts of the last period), and
the progress records of in-flight messages whose handlers reported
(``ledgerq.workers.progress``).
"""

from __future__ import annotations

import time
from typing import Any

from ledgerq.segment.readonly import Progress, RateState, read_progress, read_rate_state

__all__ = ["pool_json", "progress_rows", "rate_limit_text"]


def _rate_state(path: str) -> RateState | None:
    return read_rate_state(path, time.monotonic_ns())


def _progress_json(record: Progress) -> dict[str, Any]:
    return {
        "reader": record.reader,
        "id": record.id,
        "attempts": record.attempts,
        "fraction": record.fraction,
        "note": record.note,
        "updated": record.updated_ns / 1e9,
    }


def pool_json(path: str) -> dict[str, Any]:
    """``rate_limit`` (None: no pool ran with one) and ``progress`` (a list) for --json."""
    state = _rate_state(path)
    rate = None
    if state is not None:
        rate = {
            "limit": state.limit,
            "count": state.count,
            "period": state.period_ns / 1e9,
            "starts": state.starts,
            "current_rate": round(state.rate, 3),
        }
    return {"rate_limit": rate, "progress": [_progress_json(p) for p in read_progress(path)]}


def rate_limit_text(path: str) -> str | None:
    """``20/s (now 19 in the last second)``, or None without a limit."""
    state = _rate_state(path)
    if state is None:
        return None
    unit = {"s": "second", "m": "minute", "h": "hour"}.get(state.limit[-1], "period")
    return f"{state.limit} (now {state.rate:.4g} in the last {unit})"


def progress_rows(path: str) -> list[tuple[str, str, str, str]]:
    """(reader, id, percent done, note) of each in-flight message that reported."""
    return [(p.reader, str(p.id), f"{p.fraction * 100:.1f}%", p.note) for p in read_progress(path)]
