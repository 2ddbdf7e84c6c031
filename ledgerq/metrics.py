"""Prometheus metrics for queues: ``ledgerq.metrics.QueueCollector``.

>>> from prometheus_client import REGISTRY, start_http_server   # doctest: +SKIP
>>> REGISTRY.register(QueueCollector(q))                          # doctest: +SKIP
>>> start_http_server(9100)                                       # doctest: +SKIP

Needs the ``metrics`` extra (``pip install "ledgerq[metrics]"``); importing
``ledgerq`` alone never imports prometheus-client.  Every scrape calls
``stats()`` on each queue (one short hold of the queue lock, no I/O).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Protocol

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        'ledgerq.metrics needs prometheus-client: pip install "ledgerq[metrics]"'
    ) from exc

from ledgerq._errors import QueueClosedError
from ledgerq._types import Stats

__all__ = ["QueueCollector", "SupportsStats"]


class SupportsStats(Protocol):
    """Anything with a ``stats()`` returning :class:`ledgerq.Stats` (a queue, a sharded queue)."""

    def stats(self) -> Stats: ...


# (metric name, Stats field, help).  Gauges are levels; counters count since the queue
# was created (they survive reopening), so Prometheus rate() works across restarts.
_GAUGES = (
    ("ledgerq_pending", "pending", "Messages waiting for delivery (default reader)."),
    ("ledgerq_in_flight", "in_flight", "Messages leased and not yet acked (default reader)."),
    ("ledgerq_segments", "segments", "Segment files on disk."),
    ("ledgerq_disk_bytes", "disk_bytes", "Bytes of segment files on disk."),
    (
        "ledgerq_oldest_pending_age_seconds",
        "oldest_pending_age",
        "Age of the oldest pending message (default reader); 0 when empty.",
    ),
    ("ledgerq_next_id", "next_id", "The id the next enqueued message will get."),
)
_COUNTERS = (
    ("ledgerq_enqueued", "enqueued", "Messages enqueued."),
    ("ledgerq_acked", "acked", "Messages acked (default reader)."),
    ("ledgerq_nacked", "nacked", "Nacks (default reader)."),
    ("ledgerq_dead_lettered", "dead_lettered", "Messages moved to the DLQ (default reader)."),
    ("ledgerq_expired", "expired", "Messages dropped because their TTL passed (default reader)."),
    ("ledgerq_duplicates", "duplicates", "Enqueues dropped as duplicates by dedup_id."),
    ("ledgerq_dropped", "dropped", "Unconsumed messages dropped by retention_max_bytes."),
    ("ledgerq_corrupt_skipped", "corrupt_skipped", "Corrupt entries skipped while reading."),
    ("ledgerq_lost", "lost", "Unconsumed messages whose segment file was found missing."),
)
_READER_GAUGES = (
    ("ledgerq_reader_pending", "pending", "Messages waiting for delivery to the reader."),
    ("ledgerq_reader_in_flight", "in_flight", "Messages the reader leased and has not acked."),
    (
        "ledgerq_reader_oldest_pending_age_seconds",
        "oldest_pending_age",
        "Age of the reader's oldest pending message; 0 when empty.",
    ),
    ("ledgerq_reader_head", "head", "The lowest id the reader may still need to deliver."),
)
_READER_COUNTERS = (
    ("ledgerq_reader_acked", "acked", "Messages the reader acked."),
    ("ledgerq_reader_nacked", "nacked", "Nacks by the reader."),
    ("ledgerq_reader_expired", "expired", "Messages the reader skipped as expired (TTL)."),
    ("ledgerq_reader_dead_lettered", "dead_lettered", "Messages the reader dead-lettered."),
)
_QUEUE_LABELS = ["queue"]
_READER_LABELS = ["queue", "reader"]


def _default_name(queue: SupportsStats) -> str:
    path = getattr(queue, "path", None) or getattr(queue, "root", None)
    name = os.path.basename(os.path.normpath(os.fspath(path))) if path else ""
    if not name:
        raise ValueError(f"cannot name the queue {queue!r} from its path; pass name=")
    return name


class QueueCollector(Collector):
    """A prometheus-client collector exporting queues' :meth:`~ledgerq.Queue.stats`.

    Register it with a ``CollectorRegistry``.  Every series carries the label
    ``queue`` (``name``, by default the queue directory's base name); the
    per-reader series (``ledgerq_reader_*``) also ``reader``.  To export several
    queues from one registry, :meth:`add` them to one collector: two collectors
    would export the same metric names, which the registry refuses.  A closed
    queue exports nothing (a scrape never fails because of it).
    """

    def __init__(self, queue: SupportsStats, name: str | None = None) -> None:
        self._lock = threading.Lock()
        self._queues: list[tuple[str, SupportsStats]] = []
        self.add(queue, name)

    def add(self, queue: SupportsStats, name: str | None = None) -> None:
        """Export another queue too; ``ValueError`` if its name is already exported."""
        label = _default_name(queue) if name is None else name
        if not isinstance(label, str) or not label:
            raise ValueError(f"name must be a non-empty str, got {label!r}")
        with self._lock:
            if any(existing == label for existing, _ in self._queues):
                raise ValueError(f"a queue named {label!r} is already exported; pass name=")
            self._queues.append((label, queue))

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (the registry checks names with this)."""
        yield from self._families()[0]

    def collect(self) -> Iterator[Metric]:
        """One sample per queue (and per reader) for every family; nothing for closed queues."""
        with self._lock:
            queues = list(self._queues)
        families, queue_rows, reader_rows = self._families()
        collected = False
        for label, queue in queues:
            try:
                stats = queue.stats()
            except QueueClosedError:
                continue
            collected = True
            for family, field in queue_rows:
                family.add_metric([label], float(getattr(stats, field)))
            for reader_name, reader_stats in sorted(stats.readers.items()):
                for family, field in reader_rows:
                    family.add_metric([label, reader_name], float(getattr(reader_stats, field)))
        if collected:
            yield from families

    @staticmethod
    def _families() -> tuple[
        list[Metric],
        list[tuple[GaugeMetricFamily | CounterMetricFamily, str]],
        list[tuple[GaugeMetricFamily | CounterMetricFamily, str]],
    ]:
        queue_rows: list[tuple[GaugeMetricFamily | CounterMetricFamily, str]] = []
        reader_rows: list[tuple[GaugeMetricFamily | CounterMetricFamily, str]] = []
        for name, field, doc in _GAUGES:
            queue_rows.append((GaugeMetricFamily(name, doc, labels=_QUEUE_LABELS), field))
        for name, field, doc in _COUNTERS:
            queue_rows.append((CounterMetricFamily(name, doc, labels=_QUEUE_LABELS), field))
        for name, field, doc in _READER_GAUGES:
            reader_rows.append((GaugeMetricFamily(name, doc, labels=_READER_LABELS), field))
        for name, field, doc in _READER_COUNTERS:
            reader_rows.append((CounterMetricFamily(name, doc, labels=_READER_LABELS), field))
        families: list[Metric] = [family for family, _ in queue_rows + reader_rows]
        return families, queue_rows, reader_rows
