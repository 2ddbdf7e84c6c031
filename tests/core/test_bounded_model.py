"""A bounded queue against a plain model, driven by hypothesis.

The model: each message is unfinished for the default reader and for a named reader
("audit") until that reader acks it; the backlog of a reader is its unfinished
messages (pending or leased) and their payload bytes as given; the queue's backlog is
the larger of the two.  An enqueue (or batch) is refused with ``QueueFullError`` -
having written nothing - exactly when it would take the backlog past ``max_pending``
or ``max_pending_bytes``, and a single payload larger than ``max_pending_bytes`` with
``MessageTooLargeError``.  Nack, release and reopen change nothing of the backlog
(``max_retries=0``: nothing is dead-lettered; the DLQ's room is tested in
test_bounded.py).  The bound is checked after every step, and through reopens,
where the payload ledger is read back from the log.
"""

from __future__ import annotations

from typing import Any, ClassVar

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

import ledgerq
from tests.machines import TempQueueMachine

MAX_PENDING = 6
MAX_PENDING_BYTES = 400
# Sizes spread over the bound (hypothesis's own binary() keeps to small ones): both
# bounds bind, and one payload can be larger than the bytes bound on its own.
payloads = st.integers(min_value=0, max_value=450).map(lambda n: b"%d;" % n + b"." * n)


class BoundedQueueMachine(TempQueueMachine):
    options: ClassVar[dict[str, Any]] = {}
    readers: ClassVar[tuple[str, ...]] = ("default", "audit")
    tmp_prefix = "ledgerq-bounded-model-"

    def __init__(self) -> None:
        super().__init__()
        self.q = self._open()
        self.audit = self.q.reader("audit") if "audit" in self.readers else None
        self.sizes: dict[int, int] = {}  # id -> payload size, of every message enqueued
        self.open_for: dict[str, set[int]] = {name: set() for name in self.readers}
        self.available: dict[str, set[int]] = {name: set() for name in self.readers}
        self.leased: dict[str, set[int]] = {name: set() for name in self.readers}

    def _open(self) -> ledgerq.Queue:
        return ledgerq.open(
            self.path,
            max_pending=MAX_PENDING,
            max_pending_bytes=MAX_PENDING_BYTES,
            max_retries=0,
            segment_size=900,  # rotations (and retention) every few messages
            **self.options,
        )

    # ---------------------------------------------------------------- the model

    def _backlog(self) -> tuple[int, int]:
        count = max(len(ids) for ids in self.open_for.values())
        size = max(sum(self.sizes[i] for i in ids) for ids in self.open_for.values())
        return count, size

    def _fits(self, sizes: list[int]) -> bool:
        count, size = self._backlog()
        return count + len(sizes) <= MAX_PENDING and size + sum(sizes) <= MAX_PENDING_BYTES

    def _added(self, ids: list[int], sizes: list[int]) -> None:
        for message_id, size in zip(ids, sizes, strict=True):
            self.sizes[message_id] = size
            for name in self.open_for:
                self.open_for[name].add(message_id)
                self.available[name].add(message_id)

    def _source(self, name: str) -> ledgerq.Queue | ledgerq.Reader:
        if name == "default" or self.audit is None:
            return self.q
        return self.audit

    # ---------------------------------------------------------------- rules

    @rule(payload=payloads)
    def enqueue(self, payload: bytes) -> None:
        if len(payload) > MAX_PENDING_BYTES:
            with pytest.raises(ledgerq.MessageTooLargeError):
                self.q.enqueue(payload)
        elif self._fits([len(payload)]):
            self._added([self.q.enqueue(payload)], [len(payload)])
        else:
            with pytest.raises(ledgerq.QueueFullError):
                self.q.enqueue(payload)

    @rule(batch=st.lists(payloads, min_size=1, max_size=4))
    def enqueue_batch(self, batch: list[bytes]) -> None:
        sizes = [len(p) for p in batch]
        if self._fits(sizes):
            self._added(self.q.enqueue_batch(batch), sizes)
        else:
            alone_too_large = len(batch) == 1 and sizes[0] > MAX_PENDING_BYTES
            error = ledgerq.MessageTooLargeError if alone_too_large else ledgerq.QueueFullError
            with pytest.raises(error):
                self.q.enqueue_batch(batch)

    @rule(name=st.sampled_from(["default", "audit"]))
    def dequeue(self, name: str) -> None:
        name = name if name in self.readers else "default"
        msg = self._source(name).dequeue()
        if not self.available[name]:
            assert msg is None
            return
        assert msg is not None
        assert msg.id == min(self.available[name])
        assert len(msg.payload) == self.sizes[msg.id]
        self.available[name].discard(msg.id)
        self.leased[name].add(msg.id)

    @precondition(lambda self: any(self.leased.values()))
    @rule(data=st.data(), how=st.sampled_from(["ack", "ack_batch", "nack", "release"]))
    def settle(self, data: st.DataObject, how: str) -> None:
        name = data.draw(st.sampled_from([n for n, ids in self.leased.items() if ids]))
        # Newest first: hypothesis favours the first choice, and an ack above an older
        # lease (out of order) is what the bytes count must subtract by id.
        message_id = data.draw(st.sampled_from(sorted(self.leased[name], reverse=True)))
        source = self._source(name)
        self.leased[name].discard(message_id)
        if how == "ack":
            source.ack(message_id)
        elif how == "ack_batch":
            source.ack_batch([message_id])
        elif how == "nack":
            source.nack(message_id, "model says no")
        else:
            source.release(message_id)
        if how.startswith("ack"):
            self.open_for[name].discard(message_id)
        else:
            self.available[name].add(message_id)

    @rule()
    def reopen(self) -> None:
        self.q.close()
        self.q = self._open()
        self.audit = self.q.reader("audit") if "audit" in self.readers else None
        for name in self.leased:  # leases do not survive a reopen: delivered again
            self.available[name] |= self.leased[name]
            self.leased[name].clear()

    # ---------------------------------------------------------------- invariants

    @invariant()
    def the_bound_holds_and_the_counts_agree(self) -> None:
        count, size = self._backlog()
        assert count <= MAX_PENDING
        assert size <= MAX_PENDING_BYTES
        stats = self.q.stats()
        assert stats.pending + stats.in_flight == len(self.open_for["default"])
        if self.audit is not None:
            audit = stats.readers["audit"]
            assert audit.pending + audit.in_flight == len(self.open_for["audit"])
        self.q._check()


class OneReaderBoundedQueueMachine(BoundedQueueMachine):
    """The default reader alone: its out-of-order acks decide the room (no named
    reader's larger backlog hides them)."""

    readers: ClassVar[tuple[str, ...]] = ("default",)


class CompressedBoundedQueueMachine(BoundedQueueMachine):
    """Payloads compressed on disk: the bytes bound still counts them as given."""

    options: ClassVar[dict[str, Any]] = {"compression": "zstd", "compression_min_size": 1}


_SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestBoundedQueue = BoundedQueueMachine.TestCase
TestBoundedQueue.settings = _SETTINGS
TestOneReaderBoundedQueue = OneReaderBoundedQueueMachine.TestCase
TestOneReaderBoundedQueue.settings = _SETTINGS
TestCompressedBoundedQueue = CompressedBoundedQueueMachine.TestCase
TestCompressedBoundedQueue.settings = _SETTINGS
