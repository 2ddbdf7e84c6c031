"""The queue against a plain in-memory model, driven by hypothesis.

The model: every message is available, leased, acked, expired or dead-lettered.
The queue always hands out the first available message in delivery order (id
order; with priorities, highest priority first, then id); nack, release and
reopen make leased messages available again; every delivery counts but a
released one; a message whose failed deliveries reach ``max_retries`` goes to
the dead-letter queue; an expired message is skipped.  Starvation promotion is
off here (it depends on the clock and has its own tests).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

import ledgerq
from ledgerq import Item, Priority
from tests.locking import locking
from tests.machines import TempQueueMachine, delivered_as_expected

payloads = st.binary(min_size=0, max_size=300)
priorities = st.sampled_from(list(Priority))
# 1 ns of life is over by the time anyone dequeues; an hour is not.
ttls = st.sampled_from([None, None, None, 1e-9, 3600.0])
NACK_REASON = "model says no"
# What the DLQ records for a delivery whose lease a reopen took back (the rest of the
# text explains the causes; the prefix is what an operator filters on).
LOST_LEASE_PREFIX = "lease lost"


@dataclass
class Model:
    payload: bytes
    priority: int
    expired: bool
    headers: dict[str, str]
    deliveries: int = 0
    state: str = "available"
    last_failure: str = ""  # the reason of the last failed delivery, as the DLQ records it


class QueueMachine(TempQueueMachine):
    options: ClassVar[dict[str, Any]] = {}
    shared: ClassVar[bool] = False  # open every handle in shared mode
    locking: ClassVar[str | None] = None  # ... locking so ("words", "flock": tests/locking.py)
    seed: ClassVar[Path | None] = None  # a queue directory copied as the starting queue
    tmp_prefix = "ledgerq-model-"

    def __init__(self) -> None:
        super().__init__()
        if self.seed is not None:
            shutil.copytree(self.seed, self.path)
        with locking(self.locking):
            self.q = ledgerq.open(self.path, shared=self.shared, **self.options)
        self.max_retries = self.q.options.max_retries
        self.by_priority = self.q.options.priorities
        self.messages: dict[int, Model] = {}
        self.dlq: list[int] = []  # original ids now in the DLQ, in the order they went there
        # The queue's counters, counted since the queue was created (Stats says so).
        self.enqueued = 0
        self.acked = 0
        self.nacked = 0
        self.dead_lettered = 0
        self.expired = 0
        self.last_id = 0

    # ---------------------------------------------------------------- model helpers

    def _ids(self, state: str) -> list[int]:
        return [i for i, m in self.messages.items() if m.state == state]

    def _order(self, message_id: int) -> tuple[int, int]:
        priority = self.messages[message_id].priority if self.by_priority else 0
        return (-priority, message_id)

    def _next_deliverable(self) -> int | None:
        """Settle what the queue would skip; return the id it delivers next."""
        while True:
            available = sorted(self._ids("available"), key=self._order)
            if not available:
                return None
            model = self.messages[available[0]]
            if model.expired:
                model.state = "expired"
                self.expired += 1
            elif self.max_retries and model.deliveries >= self.max_retries:
                # Only a lease lost to a reopen leaves a message available with all its
                # deliveries failed (a nack at the limit dead-letters at once); the queue
                # counts that failure when it next comes to the message.
                model.last_failure = LOST_LEASE_PREFIX
                self._dead_letter(available[0])
            else:
                return available[0]

    def _dead_letter(self, message_id: int) -> None:
        self.messages[message_id].state = "dlq"
        self.dlq.append(message_id)
        self.dead_lettered += 1

    def _added(self, ids: list[int], models: list[Model]) -> None:
        for message_id, model in zip(ids, models, strict=True):
            assert message_id > self.last_id, "ids must strictly increase"
            self.last_id = message_id
            self.messages[message_id] = model
        self.enqueued += len(ids)

    def _check_delivery(self, got: ledgerq.Message | None) -> None:
        if (msg := delivered_as_expected(got, self._next_deliverable())) is None:
            return
        model = self.messages[msg.id]
        assert msg.payload == model.payload
        assert msg.headers == model.headers
        assert msg.priority == model.priority
        model.deliveries += 1
        assert msg.attempts == model.deliveries
        model.state = "leased"

    # ------------------------------------------------- operations, through a handle

    # The model has one handle; the two-handle model (tests/shared/
    # test_model_two_handles.py) overrides the first three, and so runs the same
    # operations through the handle a rule draws and each lease through its holder.

    def _handle(self, h: int) -> ledgerq.Queue:
        """Handle number ``h`` (this model has one: ``self.q``)."""
        return self.q

    def _holding(self, message_id: int) -> ledgerq.Queue:
        """The handle that holds the lease of ``message_id``."""
        return self.q

    def _take(self, h: int, msg: ledgerq.Message | None) -> None:
        """Check a delivery through handle ``h`` against the model."""
        self._check_delivery(msg)

    def _enqueue(self, h: int, payload: bytes, priority: Priority, ttl: float | None) -> None:
        message_id = self._handle(h).enqueue(payload, priority=priority, ttl=ttl)
        self._added([message_id], [Model(payload, priority, ttl == 1e-9, {})])

    def _enqueue_batch(self, h: int, data: list[tuple[bytes, Priority]]) -> None:
        items = [Item(p, headers={"n": str(i)}, priority=pr) for i, (p, pr) in enumerate(data)]
        ids = self._handle(h).enqueue_batch(items)
        self._added(ids, [Model(p, pr, False, {"n": str(i)}) for i, (p, pr) in enumerate(data)])

    def _dequeue_batch(self, h: int, n: int) -> None:
        got = self._handle(h).dequeue_batch(n)
        for msg in got:
            self._take(h, msg)
        if len(got) < n:
            # A short batch means the queue looked at (and skipped) everything left.
            assert self._next_deliverable() is None

    def _ack_unknown(self, h: int, offset: int) -> None:
        unknown = self.last_id + 1 + offset
        try:
            self._handle(h).ack(unknown)
        except ledgerq.UnknownMessageError:
            pass
        else:  # pragma: no cover - the assertion below is the point
            raise AssertionError("ack of an unknown id must raise UnknownMessageError")

    def _leases_lost(self, ids: list[int]) -> None:
        """A reopen took these leases back: available again, the delivery failed."""
        for message_id in ids:
            self.messages[message_id].state = "available"
            self.messages[message_id].last_failure = LOST_LEASE_PREFIX

    def _compact(self, h: int) -> None:
        self._handle(h).compact()
        if not self._ids("available") and not self._ids("leased"):
            assert self._handle(h).stats().segments == 1, "consumed segments must be deleted"

    def _requeue_dlq(self, h: int) -> None:
        moved = self._handle(h).requeue_dlq()
        assert moved == len(self.dlq)
        originals = [self.messages[i] for i in self.dlq]
        for original in originals:
            original.state = "requeued"
        new_ids = list(range(self.last_id + 1, self.last_id + 1 + moved))
        self._added(
            new_ids,
            [Model(m.payload, m.priority, False, m.headers) for m in originals],
        )
        self.dlq.clear()

    def _peek(self, h: int, n: int) -> None:
        # peek must not change anything: check it against the model without settling.
        for msg in self._handle(h).peek(n):
            assert msg.payload == self.messages[msg.id].payload
            assert self.messages[msg.id].state == "available"

    # ---------------------------------------------------------------- rules

    @rule(payload=payloads, priority=priorities, ttl=ttls)
    def enqueue(self, payload: bytes, priority: Priority, ttl: float | None) -> None:
        self._enqueue(0, payload, priority, ttl)

    @rule(data=st.lists(st.tuples(payloads, priorities), min_size=1, max_size=6))
    def enqueue_batch(self, data: list[tuple[bytes, Priority]]) -> None:
        self._enqueue_batch(0, data)

    @rule()
    def dequeue(self) -> None:
        self._take(0, self.q.dequeue())

    @rule(n=st.integers(min_value=1, max_value=4))
    def dequeue_batch(self, n: int) -> None:
        self._dequeue_batch(0, n)

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        message_id = data.draw(st.sampled_from(sorted(self._ids("leased"))))
        self._holding(message_id).ack(message_id)
        self.messages[message_id].state = "acked"
        self.acked += 1

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        message_id = data.draw(st.sampled_from(sorted(self._ids("leased"))))
        self._holding(message_id).nack(message_id, NACK_REASON)
        self.nacked += 1
        model = self.messages[message_id]
        model.last_failure = NACK_REASON
        if self.max_retries and model.deliveries >= self.max_retries:
            self._dead_letter(message_id)
        else:
            model.state = "available"

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        message_id = data.draw(st.sampled_from(sorted(self._ids("leased"))))
        self._holding(message_id).release(message_id)
        model = self.messages[message_id]
        model.deliveries -= 1  # not a failed delivery: the next one has the same attempts
        model.state = "available"

    @rule(offset=st.integers(min_value=0, max_value=50))
    def ack_unknown(self, offset: int) -> None:
        self._ack_unknown(0, offset)

    @rule()
    def reopen(self) -> None:
        self.q.close()
        with locking(self.locking):
            self.q = ledgerq.open(self.path, shared=self.shared, **self.options)
        self._leases_lost(self._ids("leased"))

    @rule()
    def compact(self) -> None:
        self._compact(0)

    @precondition(lambda self: self.dlq)
    @rule()
    def requeue_dlq(self) -> None:
        self._requeue_dlq(0)

    @rule(n=st.integers(min_value=1, max_value=3))
    def peek(self, n: int) -> None:
        self._peek(0, n)

    # ---------------------------------------------------------------- invariants

    @invariant()
    def counts_agree(self) -> None:
        stats = self.q.stats()
        assert stats.in_flight == len(self._ids("leased"))
        # Pending counts messages the queue has not looked at yet, expired or not.
        assert stats.pending == len(self._ids("available")) == len(self.q)
        assert stats.enqueued == self.enqueued
        assert stats.acked == self.acked
        assert stats.nacked == self.nacked
        assert stats.dead_lettered == self.dead_lettered
        assert stats.expired == self.expired
        self.q._check()

    @invariant()
    def dlq_holds_what_was_dead_lettered(self) -> None:
        assert len(self.q.dlq) == len(self.dlq)
        got = self.q.dlq.peek(len(self.dlq) + 1)
        assert [int(m.headers["dlq.original_id"]) for m in got] == self.dlq
        for msg, original_id in zip(got, self.dlq, strict=True):
            model = self.messages[original_id]
            assert msg.payload == model.payload
            assert msg.priority == model.priority
            dlq_headers = {k: v for k, v in msg.headers.items() if k.startswith("dlq.")}
            assert {k: v for k, v in msg.headers.items() if k not in dlq_headers} == model.headers
            assert set(dlq_headers) == {
                "dlq.original_id",
                "dlq.retry_count",
                "dlq.failure_reason",
                "dlq.last_failure",
            }
            assert int(dlq_headers["dlq.retry_count"]) == model.deliveries == self.max_retries
            assert dlq_headers["dlq.failure_reason"].startswith(model.last_failure)
            assert int(dlq_headers["dlq.last_failure"]) > 0


_SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None)

# The configurations the model runs in (the two-handle model runs in them too).
CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "Fifo": {"segment_size": 600, "index_interval": 128, "sync": "never", "max_retries": 0},
    "Retry": {"segment_size": 600, "index_interval": 128, "sync": "never", "max_retries": 2},
    "Priority": {
        "segment_size": 800,
        "index_interval": 128,
        "sync": "never",
        "max_retries": 3,
        "priorities": True,
        "starvation_after": None,
    },
}


def model_tests(machine: type[QueueMachine], suffix: str, budget: settings) -> list[Any]:
    """``machine``'s TestCase in each configuration (Fifo, Retry, Priority), in that order.

    Each runs a subclass named after its configuration (``Fifo`` + ``suffix``) with
    ``budget``.
    """
    tests = []
    for name, options in CONFIGURATIONS.items():
        namespace = {"options": options, "__module__": machine.__module__}
        test = type(name + suffix, (machine,), namespace).TestCase
        test.settings = budget
        tests.append(test)
    return tests


TestFifoModel, TestRetryModel, TestPriorityModel = model_tests(QueueMachine, "Machine", _SETTINGS)
