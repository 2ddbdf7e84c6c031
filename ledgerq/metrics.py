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


# Every series: (Stats / ReaderStats field, type, help, whose).  The queue's series is
# ledgerq_<field>, a reader's ledgerq_reader_<field>, with "_seconds" after an age (see
# _metric_name); "whose" says which of them exist.  In the help, {reader} is the default
# reader for the queue's series (its figures are the default reader's, as in stats()).
# Gauges are levels; counters count since the queue was created (they survive
# reopening), so Prometheus rate() works across restarts.
_QUEUE, _READER, _BOTH = ("queue",), ("reader",), ("queue", "reader")
_SERIES = (
    ("pending", "gauge", "Messages waiting for delivery to {reader}.", _BOTH),
    ("in_flight", "gauge", "Messages {reader} leased and has not acked.", _BOTH),
    ("delayed", "gauge", "Pending messages waiting for their delay or retry time.", _BOTH),
    ("segments", "gauge", "Segment files on disk.", _QUEUE),
    ("disk_bytes", "gauge", "Bytes of segment files on disk.", _QUEUE),
    ("oldest_pending_age", "gauge", "Age of {reader}'s oldest pending message; 0: none.", _BOTH),
    ("next_id", "gauge", "The id the next enqueued message will get.", _QUEUE),
    ("head", "gauge", "The lowest id {reader} may still need to deliver.", _READER),
    ("enqueued", "counter", "Messages enqueued.", _QUEUE),
    ("acked", "counter", "Messages {reader} acked.", _BOTH),
    ("nacked", "counter", "Nacks by {reader}.", _BOTH),
    ("dead_lettered", "counter", "Messages {reader} moved to the DLQ.", _BOTH),
    ("expired", "counter", "Messages {reader} skipped because their TTL passed.", _BOTH),
    (
        "duplicates",
        "counter",
        "Enqueues that added nothing: a dedup_id seen, or a unique_key held.",
        _QUEUE,
    ),
    ("dropped", "counter", "Unconsumed messages dropped by retention_max_bytes.", _QUEUE),
    ("corrupt_skipped", "counter", "Corrupt entries skipped while reading.", _QUEUE),
    ("lost", "counter", "Unconsumed messages whose segment file was found missing.", _QUEUE),
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

    Register one per queue with a ``CollectorRegistry`` - any number of them in one
    registry - or :meth:`add` several queues to one collector.  Every series carries
    the label ``queue`` (``name``, by default the queue directory's base name); the
    per-reader series (``ledgerq_reader_*``) also ``reader``.  A closed queue exports
    nothing (a scrape never fails because of it).
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
        """Claim no metric names, so that any number of collectors share a registry.

        A registry calls ``describe`` when a collector is registered and refuses one
        that describes a name another collector already described (prometheus-client's
        ``DuplicateTimeseries``).  Every QueueCollector exports the same names, told
        apart by the ``queue`` label, so claiming them would allow one per registry; the
        prometheus-client documentation's answer for such collectors is an empty
        ``describe``.  It also keeps registration from calling ``stats()`` (a registry
        with ``auto_describe`` would call :meth:`collect` instead of a missing describe).
        """
        return iter(())

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
    def _families() -> tuple[list[Metric], list[_Row], list[_Row]]:
        queue_rows = _rows("ledgerq_", "queue", "the default reader", _QUEUE_LABELS)
        reader_rows = _rows("ledgerq_reader_", "reader", "the reader", _READER_LABELS)
        families: list[Metric] = [family for family, _ in queue_rows + reader_rows]
        return families, queue_rows, reader_rows


_Row = tuple[GaugeMetricFamily | CounterMetricFamily, str]  # a family and its Stats field


def _metric_name(prefix: str, field: str) -> str:
    return f"{prefix}{field}_seconds" if field.endswith("_age") else f"{prefix}{field}"


def _rows(prefix: str, scope: str, reader: str, labels: list[str]) -> list[_Row]:
    """A fresh family (no samples yet) for each series of ``scope``, with its field."""
    rows: list[_Row] = []
    for field, kind, doc, whose in _SERIES:
        if scope in whose:
            family_type = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            name = _metric_name(prefix, field)
            rows.append((family_type(name, doc.format(reader=reader), labels=labels), field))
    return rows
