"""``forward`` against a model, driven by hypothesis.

The model: each source message hands off at most one batch of items, ever.  A forward
of a message whose items never landed appends them to the target and acks the message;
a forward of a message whose items landed before (a delivery that lost its ack: here an
ack that raises, the message staying leased, then nacks and reopens that deliver it
again) appends nothing, acks it and returns the ids of the first batch.  The target's
content is always the concatenation of the landed batches, in forward order.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, ClassVar

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import ledgerq
from ledgerq.core.reader_handle import Reader


class AckLost(Exception):
    """The instant after the items landed, before the ack."""


def _losing_ack(self: Reader, message_id: int) -> None:
    raise AckLost(message_id)


class ForwardMachine(RuleBasedStateMachine):
    options: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ledgerq-forward-model-")
        self._open()
        self.pending: set[int] = set()  # source messages not acked (leased or not)
        self.leased: set[int] = set()
        self.landed: dict[int, list[int]] = {}  # source id -> target ids of its batch
        self.expected: list[bytes] = []  # the target's payloads
        self.batches = 0

    def _open(self) -> None:
        # max_retries=0: a nacked message is delivered again, never dead-lettered.
        self.a = ledgerq.open(f"{self.dir}/a", max_retries=0, **self.options)
        self.b = ledgerq.open(f"{self.dir}/b", **self.options)

    def teardown(self) -> None:
        self.a.close()
        self.b.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(count=st.integers(1, 3))
    def enqueue(self, count: int) -> None:
        ids = self.a.enqueue_batch([b"job"] * count)
        self.pending.update(ids)

    @rule()
    def dequeue(self) -> None:
        msg = self.a.dequeue()
        if msg is None:
            assert self.pending <= self.leased
            return
        assert msg.id in self.pending
        assert msg.id not in self.leased
        self.leased.add(msg.id)

    def _items(self, count: int, as_items: bool) -> list[Any]:
        self.batches += 1
        payloads = [b"%d.%d" % (self.batches, k) for k in range(count)]
        return [ledgerq.Item(p) for p in payloads] if as_items else payloads

    def _forward(self, data: st.DataObject, *, ack_lost: bool) -> None:
        message_id = data.draw(st.sampled_from(sorted(self.leased)))
        count = data.draw(st.integers(0, 3))
        items = self._items(count, data.draw(st.booleans()))
        before = self.landed.get(message_id)
        if ack_lost:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(Reader, "ack", _losing_ack)
                with pytest.raises(AckLost):
                    self.a.forward(message_id, self.b, items)
            if before is None and items:  # (no items: nothing to land, only the ack)
                self._land(message_id, items)
            return
        ids = self.a.forward(message_id, self.b, items)
        if before is not None:
            assert ids == before
        elif items:
            first = len(self.expected) + 1
            assert ids == list(range(first, first + len(items)))
            self._land(message_id, items)
        else:
            assert ids == []
        self.leased.discard(message_id)
        self.pending.discard(message_id)

    def _land(self, message_id: int, items: list[Any]) -> None:
        first = len(self.expected) + 1
        self.landed[message_id] = list(range(first, first + len(items)))
        self.expected += [i.payload if isinstance(i, ledgerq.Item) else i for i in items]

    @precondition(lambda self: self.leased)
    @rule(data=st.data())
    def forward(self, data: st.DataObject) -> None:
        self._forward(data, ack_lost=False)

    @precondition(lambda self: self.leased)
    @rule(data=st.data())
    def forward_losing_the_ack(self, data: st.DataObject) -> None:
        self._forward(data, ack_lost=True)

    @precondition(lambda self: self.leased)
    @rule(data=st.data())
    def nack(self, data: st.DataObject) -> None:
        message_id = data.draw(st.sampled_from(sorted(self.leased)))
        self.a.nack(message_id, "again")
        self.leased.discard(message_id)

    @rule(source=st.booleans(), target_too=st.booleans())
    def reopen(self, source: bool, target_too: bool) -> None:
        if source:
            self.a.close()
            self.a = ledgerq.open(f"{self.dir}/a", max_retries=0, **self.options)
            self.leased.clear()  # the leases return at a reopen
        if target_too:
            self.b.close()
            self.b = ledgerq.open(f"{self.dir}/b", **self.options)

    @invariant()
    def target_holds_each_batch_once(self) -> None:
        assert [m.payload for m in self.b.peek(10_000)] == self.expected
        assert len(self.a) == len(self.pending - self.leased)
        assert self.a.stats().in_flight == len(self.leased)
        self.a._check()
        self.b._check()


_SETTINGS = settings(max_examples=10, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize(
    "options",
    [{}, {"shared": True}, {"encryption_key": bytes(range(32))}],
    ids=["exclusive", "shared", "encrypted"],
)
def test_forward_follows_the_model(
    options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ForwardMachine, "options", options)
    ForwardMachine.TestCase.settings = _SETTINGS
    ForwardMachine.TestCase().runTest()
