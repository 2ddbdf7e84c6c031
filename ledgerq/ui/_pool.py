"""What worker pools leave in a queue's ``shared/``, for the console.

The rate limit the pools share (``workers.run(rate_limit=)``: the limit and the starts
of the last period) and the progress the handlers of in-flight messages reported
(``ledgerq.workers.progress``) - both read without a lock, like every figure here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ledgerq.segment.readonly import Progress, read_progress, read_rate_state

__all__ = ["RateLimit", "progress_json", "progress_of", "rate_limit"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The limit as ``workers.run`` takes it (``"20/s"``), its unit's name, and the
    starts in the last period."""

    limit: str
    unit: str
    current: float
    starts: int

    def json(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "current_rate": round(self.current, 3),
            "starts": self.starts,
        }


def rate_limit(path: str) -> RateLimit | None:
    """The queue's start-rate limit (None: no pool ran with one)."""
    state = read_rate_state(path, time.monotonic_ns())
    if state is None:
        return None
    unit = {"s": "second", "m": "minute", "h": "hour"}.get(state.limit[-1], "period")
    return RateLimit(state.limit, unit, state.rate, state.starts)


def progress_of(
    path: str, reader: str, leased: Iterable[tuple[int, int | None]]
) -> dict[int, Progress]:
    """The report of each ``(id, attempts)`` leased now whose handler reported on this
    delivery (a record of an earlier delivery, left by a killed pool, is not shown)."""
    records = {p.id: p for p in read_progress(path, reader)}
    return {
        message_id: records[message_id]
        for message_id, attempts in leased
        if message_id in records and records[message_id].attempts == attempts
    }


def progress_json(record: Progress) -> dict[str, Any]:
    return {"fraction": record.fraction, "note": record.note, "updated": record.updated_ns / 1e9}
