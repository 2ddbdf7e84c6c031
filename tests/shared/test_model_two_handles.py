"""Two shared-mode handles on one queue, driven by hypothesis against the queue model.

The model of ``tests/core/test_queue_model.py`` with one addition: a leased message
belongs to the handle that leased it.  Every operation goes to one of two handles
(``shared=True``, same process, same directory): enqueues and dequeues through
either see one queue (ids strictly increasing, one delivery order), ack/nack/release
work only through the holding handle (the other gets ``UnknownMessageError``),
reopening a handle returns its leases - and only its leases - as failed deliveries,
and ``stats()`` is the same from both handles after every step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import invariant, precondition, rule

import ledgerq
from ledgerq import Priority
from tests.core.test_queue_model import QueueMachine, model_tests, payloads, priorities, ttls

HANDLES = st.sampled_from([0, 1])


class TwoHandleMachine(QueueMachine):
    """The model, with two shared handles; ``self.q`` is handle 0 for the base invariants.

    The model's operations (its ``_enqueue``, ``_take``... helpers) run through the
    handle a rule draws; ack, nack and release (the base's rules) through the holder.
    """

    options: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.q.close()
        self.handles = [ledgerq.open(self.path, shared=True, **self.options) for _ in range(2)]
        self.q = self.handles[0]
        self.holder: dict[int, int] = {}  # leased id -> the handle holding it

    def _handle(self, h: int) -> ledgerq.Queue:
        return self.handles[h]

    def _holding(self, message_id: int) -> ledgerq.Queue:
        return self.handles[self.holder[message_id]]

    def _take(self, h: int, msg: ledgerq.Message | None) -> None:
        self._check_delivery(msg)
        if msg is not None:
            self.holder[msg.id] = h

    def _leased_by(self, h: int) -> list[int]:
        return sorted(i for i in self._ids("leased") if self.holder.get(i) == h)

    # ---------------------------------------------------------------- rules

    @rule(h=HANDLES, payload=payloads, priority=priorities, ttl=ttls)
    def enqueue(self, h: int, payload: bytes, priority: Priority, ttl: float | None) -> None:  # type: ignore[override]
        self._enqueue(h, payload, priority, ttl)

    @rule(h=HANDLES, data=st.lists(st.tuples(payloads, priorities), min_size=1, max_size=6))
    def enqueue_batch(self, h: int, data: list[tuple[bytes, Priority]]) -> None:  # type: ignore[override]
        self._enqueue_batch(h, data)

    @rule(h=HANDLES)
    def dequeue(self, h: int) -> None:  # type: ignore[override]
        self._take(h, self.handles[h].dequeue())

    @rule(h=HANDLES, n=st.integers(min_value=1, max_value=4))
    def dequeue_batch(self, h: int, n: int) -> None:  # type: ignore[override]
        self._dequeue_batch(h, n)

    @precondition(lambda self: self._ids("leased"))
    @rule(data=st.data())
    def ack_through_the_other_handle(self, data: st.DataObject) -> None:
        """Another handle's lease: its ack and nack are refused, and nothing changes."""
        message_id = data.draw(st.sampled_from(sorted(self._ids("leased"))))
        other = self.handles[1 - self.holder[message_id]]
        for call in (other.ack, other.nack, other.release):
            try:
                call(message_id)
            except ledgerq.UnknownMessageError:
                continue
            raise AssertionError(f"{call.__name__} of another handle's lease must raise")

    @rule(h=HANDLES, offset=st.integers(min_value=0, max_value=50))
    def ack_unknown(self, h: int, offset: int) -> None:  # type: ignore[override]
        self._ack_unknown(h, offset)

    @rule(h=HANDLES)
    def reopen(self, h: int) -> None:  # type: ignore[override]
        """Close one handle and open it again: its leases - only its - come back."""
        self.handles[h].close()
        self.handles[h] = ledgerq.open(self.path, shared=True, **self.options)
        self.q = self.handles[0]
        self._leases_lost(self._leased_by(h))

    @rule()
    def reopen_both(self) -> None:
        """Close both (the last one closes the queue cleanly), open both again."""
        for handle in self.handles:
            handle.close()
        self.handles = [ledgerq.open(self.path, shared=True, **self.options) for _ in range(2)]
        self.q = self.handles[0]
        self._leases_lost(self._ids("leased"))

    @rule(h=HANDLES)
    def compact(self, h: int) -> None:  # type: ignore[override]
        self._compact(h)

    @precondition(lambda self: self.dlq)
    @rule(h=HANDLES)
    def requeue_dlq(self, h: int) -> None:  # type: ignore[override]
        self._requeue_dlq(h)

    @rule(h=HANDLES, n=st.integers(min_value=1, max_value=3))
    def peek(self, h: int, n: int) -> None:  # type: ignore[override]
        self._peek(h, n)

    # ---------------------------------------------------------------- invariants

    @invariant()
    def both_handles_see_one_queue(self) -> None:
        first, second = (h.stats() for h in self.handles)
        for field in ("pending", "in_flight", "enqueued", "acked", "nacked", "dead_lettered"):
            assert getattr(first, field) == getattr(second, field), field
        assert first.expired == second.expired == self.expired
        assert len(self.handles[1]) == first.pending
        self.handles[1]._check()

    def teardown(self) -> None:
        for handle in self.handles:
            handle.close()
        super().teardown()


_SETTINGS = settings(max_examples=30, stateful_step_count=40, deadline=None)

TestFifoTwoHandles, TestRetryTwoHandles, TestPriorityTwoHandles = model_tests(
    TwoHandleMachine, "TwoHandles", _SETTINGS
)
