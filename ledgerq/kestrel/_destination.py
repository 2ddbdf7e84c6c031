"""The ledgerq queue an import writes into: each item enqueued once, then readers placed.

Every item is added with the readers that still have it to read (``members``; ``""``
is the default reader).  Items are enqueued in batches - each batch durable before the
ledger records it - whatever their members; the readers are placed at the end: the
default reader keeps only its own items (the others are purged for it), and each other
reader is created with exactly its items pending, through
:func:`ledgerq.tools.create_reader`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ledgerq
from ledgerq.kestrel._ledger import KEY_HEADER, ImportLedger
from ledgerq.kestrel._report import Progress, Tally
from ledgerq.kestrel._types import KestrelItem
from ledgerq.tools import create_reader

__all__ = ["DEFAULT", "Destination", "ImportJob", "open_destination"]

DEFAULT = ""  # the members name of ledgerq's default reader
_DEFAULT_READER = "default"  # its name in ledgerq
_ONLY_DEFAULT = frozenset({DEFAULT})
_BATCH = 1000


def _headers(queue: str, item: KestrelItem, key: str) -> dict[str, str]:
    headers = {"kestrel.queue": queue, KEY_HEADER: key}
    if item.add_time_ms is not None:
        headers["kestrel.add_time"] = str(item.add_time_ms)
    if item.expire_time_ms is not None:
        headers["kestrel.expire_time"] = str(item.expire_time_ms)
    if item.error_count is not None:
        headers["kestrel.error_count"] = str(item.error_count)
    if item.item_id is not None:
        headers["kestrel.id"] = str(item.item_id)
    if item.xid is not None:
        headers["kestrel.xid"] = str(item.xid)
    return headers


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class ImportJob:
    """One import: the journal directory, the destination and how, and the tally."""

    directory: str
    dest: str
    keep_expired: bool
    options: dict[str, Any]  # for ledgerq.open(dest)
    progress: Progress
    tally: Tally = field(default_factory=Tally)

    def path(self, name: str) -> str:
        """The journal file ``name``."""
        return os.path.join(self.directory, name)


class Destination:
    """Enqueues the items of one Kestrel queue into ``queue`` once, and places readers."""

    def __init__(self, queue: ledgerq.Queue, job: ImportJob, source_queue: str) -> None:
        self.queue = queue
        self.job = job
        self.source_queue = source_queue
        self.ledger = ImportLedger(queue.path)
        self.ledger.load()
        self._started_ms = _now_ms()
        self._batch: list[tuple[KestrelItem, str]] = []
        self._placed: list[tuple[str, frozenset[str]]] = []  # (key, members) of every item

    def add(self, item: KestrelItem, key: str, members: frozenset[str] = _ONLY_DEFAULT) -> None:
        """Import ``item`` under ``key`` unless it was imported before or has expired."""
        tally = self.job.tally
        self._placed.append((key, members))
        if key in self.ledger.keys:
            tally.count("already_imported")
            return
        if item.expire_time_ms is not None and item.expire_time_ms <= self._started_ms:
            if not self.job.keep_expired:
                tally.count("expired_dropped")
                return
            tally.count("expired_kept")
        self._batch.append((item, key))
        if len(self._batch) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        """Enqueue the batch, make it durable, then record it in the ledger."""
        batch, self._batch = self._batch, []
        if not batch:
            return
        now_ms = _now_ms()
        items = []
        for item, key in batch:
            ttl = None
            if item.expire_time_ms is not None and item.expire_time_ms > now_ms:
                ttl = (item.expire_time_ms - now_ms) / 1000.0
            headers = _headers(self.source_queue, item, key)
            items.append(ledgerq.Item(item.data, headers=headers, ttl=ttl))
        ids = self.queue.enqueue_batch(items)
        self.queue.sync()  # the messages are durable before the ledger says they exist
        self.ledger.append([(key, mid) for (_, key), mid in zip(batch, ids, strict=True)])
        self.job.tally.count("imported", len(batch))
        self.job.progress.advance(sum(len(item.data) for item, _ in batch))

    def place_readers(self, readers: Iterable[str]) -> None:
        """Leave each reader exactly its items: purge the others for the default reader,
        create each of ``readers`` that does not exist yet (one that does is left as it
        is: a second run resets nothing)."""
        self.flush()
        tally = self.job.tally
        ledger = self.ledger.keys
        placed = [(ledger[key], members) for key, members in self._placed if key in ledger]
        not_default = [mid for mid, members in placed if DEFAULT not in members]
        if not_default:
            self.queue.purge(not_default)
        stats = self.queue.stats()
        wanted: dict[str, set[int]] = {}
        for name in sorted(set(readers)):
            if name == _DEFAULT_READER:
                tally.readers.append(
                    (name, "'default' is the name of ledgerq's default reader: not created")
                )
            elif name in stats.readers:
                tally.readers.append((name, "reader exists already: left as it is"))
            else:
                wanted[name] = {mid for mid, members in placed if name in members}
        if not wanted:
            return
        heads = {name: min(ids, default=stats.next_id) for name, ids in wanted.items()}
        with ledgerq.follow(self.queue.path, from_id=min(heads.values()), timeout=0) as log:
            logged = [message.id for message in log]
        for name, ids in wanted.items():
            head = heads[name]
            # Everything else from the head on - other readers' items, and messages that
            # were in the queue before - is done for this reader: it sees exactly its own.
            done = [mid for mid in logged if mid > head and mid not in ids]
            try:
                create_reader(self.queue, name, head=head, done=done)
            except ValueError as exc:
                tally.readers.append((name, f"not created: {exc}"))
            else:
                tally.readers.append((name, f"reader created with {len(ids)} pending messages"))


@contextmanager
def open_destination(job: ImportJob, source_queue: str) -> Iterator[Destination]:
    """Open the job's destination queue to import the items of ``source_queue`` into;
    what was added is enqueued when the block ends without an error."""
    with ledgerq.open(job.dest, **job.options) as queue:
        destination = Destination(queue, job, source_queue)
        yield destination
        destination.flush()
