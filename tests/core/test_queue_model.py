"""The queue against a plain in-memory model, driven by hypothesis.

The model: every message id is either available, leased, or acked.  A FIFO
queue always hands out the smallest available id; nack and reopen make leased
ids available again; attempts count deliveries.
"""

from __future__ import annotations

import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

import ledgerq

payloads = st.binary(min_size=0, max_size=300)


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="ledgerq-model-")
        self.path = f"{self.tmp}/q"
        self.options = {"segment_size": 600, "index_interval": 128, "sync": "never"}
        self.q = ledgerq.open(self.path, **self.options)
        self.payloads: dict[int, bytes] = {}
        self.available: set[int] = set()
        self.leased: set[int] = set()
        self.deliveries: dict[int, int] = {}
        self.last_id = 0

    leased_ids = Bundle("leased_ids")

    def _added(self, ids: list[int], data: list[bytes]) -> None:
        for message_id, payload in zip(ids, data, strict=True):
            assert message_id > self.last_id, "ids must strictly increase"
            self.last_id = message_id
            self.payloads[message_id] = payload
            self.available.add(message_id)

    @rule(payload=payloads)
    def enqueue(self, payload: bytes) -> None:
        self._added([self.q.enqueue(payload)], [payload])

    @rule(data=st.lists(payloads, min_size=1, max_size=8))
    def enqueue_batch(self, data: list[bytes]) -> None:
        self._added(self.q.enqueue_batch(data), data)

    def _delivered(self, msg: ledgerq.Message | None) -> int | None:
        if not self.available:
            assert msg is None
            return None
        assert msg is not None
        expected = min(self.available)
        assert msg.id == expected, f"expected id {expected}, got {msg.id}"
        assert msg.payload == self.payloads[msg.id]
        self.deliveries[msg.id] = self.deliveries.get(msg.id, 0) + 1
        assert msg.attempts == self.deliveries[msg.id]
        self.available.discard(msg.id)
        self.leased.add(msg.id)
        return msg.id

    @rule(target=leased_ids)
    def dequeue(self) -> int | None:
        return self._delivered(self.q.dequeue())

    @rule(n=st.integers(min_value=1, max_value=5))
    def dequeue_batch(self, n: int) -> None:
        messages = self.q.dequeue_batch(n)
        expected = min(n, len(self.available))
        assert len(messages) == expected
        for msg in messages:
            self._delivered(msg)

    @rule(message_id=consumes(leased_ids))
    def ack(self, message_id: int | None) -> None:
        if message_id is None or message_id not in self.leased:
            return
        self.q.ack(message_id)
        self.leased.discard(message_id)
        self.deliveries.pop(message_id, None)

    @rule(message_id=consumes(leased_ids))
    def nack(self, message_id: int | None) -> None:
        if message_id is None or message_id not in self.leased:
            return
        self.q.nack(message_id, "model says no")
        self.leased.discard(message_id)
        self.available.add(message_id)

    @precondition(lambda self: self.leased)
    @rule()
    def ack_all_leased(self) -> None:
        for message_id in sorted(self.leased):
            self.q.ack(message_id)
            self.deliveries.pop(message_id, None)
        self.leased.clear()

    @rule(offset=st.integers(min_value=1, max_value=50))
    def ack_unknown(self, offset: int) -> None:
        unknown = self.last_id + offset
        try:
            self.q.ack(unknown)
        except ledgerq.UnknownMessageError:
            pass
        else:  # pragma: no cover - the assertion below is the point
            raise AssertionError("ack of an unknown id must raise UnknownMessageError")

    @rule()
    def reopen(self) -> None:
        self.q.close()
        self.q = ledgerq.open(self.path, **self.options)
        self.available |= self.leased
        self.leased.clear()

    @rule()
    def compact(self) -> None:
        self.q.compact()
        if not self.available and not self.leased:
            # Everything consumed: only the active segment is left on disk.
            assert self.q.stats().segments == 1

    @rule(n=st.integers(min_value=1, max_value=4))
    def peek(self, n: int) -> None:
        seen = [m.id for m in self.q.peek(n)]
        assert seen == sorted(self.available)[:n]
        for msg in self.q.peek(n):
            assert msg.payload == self.payloads[msg.id]

    @invariant()
    def counts_agree(self) -> None:
        assert len(self.q) == len(self.available)
        stats = self.q.stats()
        assert stats.pending == len(self.available)
        assert stats.in_flight == len(self.leased)
        self.q._check()

    def teardown(self) -> None:
        self.q.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


QueueMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestQueueModel = QueueMachine.TestCase
