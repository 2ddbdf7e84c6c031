"""The last minutes of each queue's figures, kept in memory: rates and chart series.

A queue's files say how things stand, not how fast they change; the console samples
the figures (every ``interval`` seconds, and whenever a page reads fresher ones) and
derives the rates from the differences: messages enqueued per second from the newest
id, acked per second from each reader's ack counter.  Nothing is written anywhere: a
restarted console starts its charts afresh.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ledgerq.ui._figures import QueueFigures

__all__ = ["History", "Rates", "Sample"]

KEEP_S = 600.0  # ten minutes of samples per queue (``ledgerq ui --history``)
RATE_WINDOW_S = 60.0  # a rate is the average over the last minute (or what there is)
MIN_SPAN_S = 0.5  # samples closer than this say nothing about a rate


@dataclass(frozen=True, slots=True)
class Sample:
    """Figures of one queue at ``at`` (``time.time()``), as the charts need them."""

    at: float
    pending: int
    in_flight: int
    dlq: int
    last_id: int
    acked: dict[str, int]  # reader -> its ack counter

    @classmethod
    def of(cls, figures: QueueFigures) -> Sample:
        """The sample ``figures`` make."""
        return cls(
            figures.taken_at,
            figures.pending,
            figures.in_flight,
            figures.dlq,
            figures.last_id,
            {r.name: r.acked for r in figures.readers},
        )


@dataclass(frozen=True, slots=True)
class Rates:
    """Messages per second over the last minute: enqueued, and acked by each reader
    (None while there are not yet two samples far enough apart)."""

    enqueued: float | None
    acked: dict[str, float]

    def acked_by(self, reader: str) -> float | None:
        """The ack rate of ``reader``."""
        return self.acked.get(reader)


def _per_second(
    older: Sample, newer: Sample, value: Callable[[Sample], int | None]
) -> float | None:
    span = newer.at - older.at
    a, b = value(older), value(newer)
    if span < MIN_SPAN_S or a is None or b is None:
        return None
    return max(b - a, 0) / span  # a counter reset (a queue recreated) is not a negative rate


class History:
    """Samples of every queue the console serves, by queue name (thread-safe)."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self._samples: dict[str, deque[Sample]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, figures: QueueFigures) -> None:
        """Record ``figures`` of queue ``name`` (figures with a problem are not samples)."""
        if figures.problem is not None:
            return
        sample = Sample.of(figures)
        with self._lock:
            samples = self._samples.setdefault(name, deque())
            if samples and sample.at <= samples[-1].at:
                return  # taken before the newest one (two threads raced): keep the order
            samples.append(sample)
            while samples and samples[0].at < sample.at - self.keep_s:
                samples.popleft()

    def newest_at(self, name: str) -> float | None:
        """When the newest sample of ``name`` was taken (None: none yet)."""
        with self._lock:
            samples = self._samples.get(name)
            return samples[-1].at if samples else None

    def samples(self, name: str) -> list[Sample]:
        """The samples of ``name``, oldest first."""
        with self._lock:
            return list(self._samples.get(name, ()))

    def forget(self, keep: set[str]) -> None:
        """Drop the samples of queues not in ``keep`` (removed from the tree)."""
        with self._lock:
            for name in set(self._samples) - keep:
                del self._samples[name]

    def rates(self, name: str) -> Rates:
        """The rates of ``name`` over the last :data:`RATE_WINDOW_S` seconds."""
        samples = self.samples(name)
        if len(samples) < 2:
            return Rates(None, {})
        newer = samples[-1]
        older = next(s for s in samples if s.at >= newer.at - RATE_WINDOW_S)
        if older is newer:
            older = samples[-2]
        acked = {}
        for reader in newer.acked:
            rate = _per_second(older, newer, _acked_of(reader))
            if rate is not None:
                acked[reader] = rate
        return Rates(_per_second(older, newer, _last_id), acked)

    def series(self, name: str, field: str, reader: str = "default") -> list[tuple[float, float]]:
        """(time, value) of ``field``: ``pending``, ``in_flight``, ``dlq`` as sampled;
        ``enqueued``, and ``acked`` by ``reader``, as rates between samples."""
        samples = self.samples(name)
        if field in ("pending", "in_flight", "dlq"):
            return [(s.at, float(getattr(s, field))) for s in samples]
        value = _last_id if field == "enqueued" else _acked_of(reader)
        points = []
        for older, newer in itertools.pairwise(samples):
            rate = _per_second(older, newer, value)
            if rate is not None:
                points.append((newer.at, rate))
        return points


def _last_id(sample: Sample) -> int:
    return sample.last_id


def _acked_of(reader: str) -> Callable[[Sample], int | None]:
    def acked(sample: Sample) -> int | None:
        return sample.acked.get(reader)

    return acked
