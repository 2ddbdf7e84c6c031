"""The public ``ledgerq.Queue``: the core queue with its features and DLQ tooling."""

from __future__ import annotations

import os
from collections.abc import Iterable

from ledgerq._options import Options
from ledgerq.core.queue import QueueCore
from ledgerq.features import build_features
from ledgerq.features.dlq import DeadLetterStore

__all__ = ["Queue", "open_queue"]


class Queue(QueueCore):
    """A durable message queue in one directory.  Use :func:`ledgerq.open` to get one."""

    @property
    def dlq(self) -> Queue:
        """The dead-letter queue: a full queue in ``<path>/dlq/`` (created on first use)."""
        self._ensure_open()
        store = self._dlq_store()
        dlq = store.queue()
        assert isinstance(dlq, Queue)
        return dlq

    def _dlq_store(self) -> DeadLetterStore:
        for feature in self._features:
            if isinstance(feature, DeadLetterStore):
                return feature
        raise AssertionError("every queue has a dead-letter store")  # pragma: no cover

    def requeue_dlq(self, ids: Iterable[int] | None = None) -> int:
        """Move dead-lettered messages back to this queue; return how many moved.

        ``ids`` are ids *in the DLQ* (default: every message there).  Each comes back
        as a new message (new id, attempts starting again) with its original payload,
        priority and headers, the ``dlq.*`` headers removed, and is removed from the
        DLQ - so requeueing the same id twice moves it once.  Ids not in the DLQ are
        skipped.  A crash mid-way can leave a message in both queues, never in neither.
        """
        self._ensure_open()
        dlq = self.dlq
        wanted = None if ids is None else {int(i) for i in ids}
        entries = dlq._pending_entries(wanted)
        moved = 0
        for entry, payload in entries:
            headers = {k: v for k, v in (entry.headers or {}).items() if not k.startswith("dlq.")}
            dedup = (
                f"ledgerq.requeue:{os.path.basename(dlq.path)}:{entry.id}"
                if (self.options.dedup_window is not None)
                else None
            )
            self.enqueue(payload, headers=headers, priority=entry.priority, dedup_id=dedup)
            if dlq._settle(entry.id):
                moved += 1
        return moved

    def purge(self, ids: Iterable[int] | None = None) -> int:
        """Remove pending messages (by id; default all) for good; return how many."""
        self._ensure_open()
        wanted = None if ids is None else {int(i) for i in ids}
        removed = 0
        for entry, _ in self._pending_entries(wanted):
            if self._settle(entry.id):
                removed += 1
        return removed


def open_queue(path: str | os.PathLike[str], options: Options) -> Queue:
    """Open a queue with the features its options turn on."""
    return Queue(path, options, build_features(options, open_queue))
