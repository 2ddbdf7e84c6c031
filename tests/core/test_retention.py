"""Retention: what is deleted, when, and what never is."""

from __future__ import annotations

import logging
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, rule

import ledgerq
from tests._child import run_python
from tests.machines import TempQueueMachine


def consume_all(reader: ledgerq.Reader | ledgerq.Queue) -> int:
    n = 0
    while (msg := reader.dequeue()) is not None:
        reader.ack(msg.id)
        n += 1
    return n


def test_consumed_segments_are_deleted_after_rotation(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=256) as q:
        for _ in range(20):
            q.enqueue(b"x" * 100)
            consume_all(q)
        # Deleted as they were consumed, without compact().
        assert q.stats().segments <= 2
        assert len(list((tmp_path / "q" / "segments").glob("*.log"))) == q.stats().segments


def test_unopened_reader_on_disk_holds_segments(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=256) as q:
        q.reader("audit")
        q.enqueue_batch([b"x" * 100] * 10)
    with ledgerq.open(path, segment_size=256) as q:  # "audit" is not opened this time
        assert consume_all(q) == 10
        q.compact()
        assert q.stats().segments > 1
    with ledgerq.open(path, segment_size=256) as q:
        assert consume_all(q.reader("audit")) == 10
        q.compact()
        assert q.stats().segments == 1


def test_retention_max_age_keeps_consumed_segments_for_replay(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=256, retention_max_age=3600) as q:
        q.enqueue_batch([f"m{i}".encode() * 20 for i in range(10)])
        consume_all(q)
        q.compact()
        assert q.stats().segments > 1, "young consumed segments are kept"
        q.reader("default").seek(1)
        assert consume_all(q) == 10, "and can be replayed"


def test_retention_max_age_deletes_old_consumed_segments(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=256, retention_max_age=0.0) as q:
        q.enqueue_batch([b"x" * 100] * 10)
        consume_all(q)
        q.compact()
        assert q.stats().segments == 1


def test_unconsumed_data_is_never_deleted_by_age(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=256, retention_max_age=0.0) as q:
        q.enqueue_batch([b"x" * 100] * 10)
        q.compact()
        assert consume_all(q) == 10


def test_retention_max_bytes_drops_and_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=1000, retention_max_bytes=3000) as q:
        with caplog.at_level(logging.WARNING, logger="ledgerq"):
            q.enqueue_batch([b"x" * 100] * 60)  # ~7.5 kB, never consumed
            q.enqueue(b"last")
        stats = q.stats()
        assert stats.disk_bytes <= 3000 + 1000
        assert stats.dropped > 0
        assert "dropped" in caplog.text
        remaining = consume_all(q)
        assert remaining + stats.dropped == 61, "every message is either delivered or counted"


class RetentionMachine(TempQueueMachine):
    """Several readers at their own pace: no reader ever misses a message to retention."""

    tmp_prefix = "ledgerq-retention-"

    def __init__(self) -> None:
        super().__init__()
        self.q = ledgerq.open(self.path, segment_size=300, sync="never", max_retries=0)
        self.names = ["default", "a", "b"]
        self.expected: dict[str, list[int]] = {name: [] for name in self.names}
        for name in self.names:
            self.q.reader(name)

    def reader(self, name: str) -> ledgerq.Reader:
        return self.q.reader(name)

    @rule(n=st.integers(min_value=1, max_value=6))
    def enqueue(self, n: int) -> None:
        ids = self.q.enqueue_batch([b"p" * 40] * n)
        for name in self.names:
            self.expected[name].extend(ids)

    @rule(name=st.sampled_from(["default", "a", "b"]), n=st.integers(min_value=1, max_value=5))
    def consume(self, name: str, n: int) -> None:
        for _ in range(n):
            msg = self.reader(name).dequeue()
            if msg is None:
                assert not self.expected[name]
                return
            assert msg.id == self.expected[name].pop(0), "a reader lost or reordered a message"
            self.reader(name).ack(msg.id)

    @rule(name=st.sampled_from(["default", "a", "b"]))
    def lease_and_nack(self, name: str) -> None:
        msg = self.reader(name).dequeue()
        if msg is None:
            assert not self.expected[name]
            return
        assert msg.id == self.expected[name][0]
        self.reader(name).nack(msg.id)

    @rule()
    def compact(self) -> None:
        self.q.compact()

    @rule()
    def reopen(self) -> None:
        self.q.close()
        self.q = ledgerq.open(self.path, segment_size=300, sync="never", max_retries=0)

    @invariant()
    def pending_matches(self) -> None:
        for name in self.names:
            assert self.reader(name).stats().pending == len(self.expected[name])
        oldest_needed = min((ids[0] for ids in self.expected.values() if ids), default=None)
        segments = sorted((Path(self.path) / "segments").glob("*.log"))
        if oldest_needed is not None:
            assert int(segments[0].stem) <= oldest_needed, "a needed segment was deleted"
        self.q._check()


RetentionMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=40, deadline=None
)
TestRetentionModel = RetentionMachine.TestCase


# ---------------------------------------------------------------- retention_max_bytes counts
# Issue 15 item 15: a leased message whose segment was dropped was counted as dropped and,
# after its ack (which succeeded), as acked too; the counters did not add up.


def _adds_up(stats: ledgerq.Stats) -> None:
    settled = stats.acked + stats.dead_lettered + stats.expired + stats.dropped
    assert stats.enqueued == settled + stats.pending + stats.in_flight, stats


def test_a_leased_message_whose_segment_is_dropped_is_dropped_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with ledgerq.open(
        tmp_path / "q", sync="never", segment_size=1000, retention_max_bytes=3000
    ) as q:
        q.enqueue_batch([b"x" * 100] * 5)
        leased = q.dequeue_batch(2)
        with caplog.at_level(logging.WARNING, logger="ledgerq"):
            q.enqueue_batch([b"y" * 100] * 60)
        stats = q.stats()
        assert stats.in_flight == 0, "the leases went with their segment"
        assert stats.dropped >= 5
        _adds_up(stats)
        for message in leased:
            with pytest.raises(ledgerq.UnknownMessageError, match="retention_max_bytes"):
                q.ack(message.id)
            with pytest.raises(ledgerq.UnknownMessageError, match="dropped"):
                q.nack(message.id)
        assert q.stats() == stats, "a refused ack changes no counter"
        assert "2 of them leased" in caplog.text
        assert "unconsumed" not in caplog.text
        consume_all(q)
        _adds_up(q.stats())
    with ledgerq.open(tmp_path / "q") as q:
        assert q.stats().dropped == stats.dropped
        _adds_up(q.stats())


def test_a_nacked_message_waiting_in_a_dropped_segment_is_not_delivered(tmp_path: Path) -> None:
    with ledgerq.open(
        tmp_path / "q", sync="never", segment_size=1000, retention_max_bytes=3000, max_retries=0
    ) as q:
        first = q.enqueue(b"first")
        message = q.dequeue()
        assert message is not None and message.id == first
        q.nack(message.id)  # held, given back: delivered again next
        q.enqueue_batch([b"y" * 100] * 60)
        assert all(m.id != first for m in q.dequeue_batch(100))
        _adds_up(q.stats())


_CHILD_DROPS = """
import os, sys
import ledgerq
q = ledgerq.open(sys.argv[1], sync="always", segment_size=1000, retention_max_bytes=3000)
q.enqueue_batch([b"x" * 100] * 5)
for m in q.dequeue_batch(3):
    q.ack(m.id)
q.dequeue_batch(1)
q.enqueue_batch([b"y" * 100] * 60)
print(q.stats().dropped, flush=True)
os._exit(0)  # a crash: no close, no meta.json save
"""


def test_the_counts_add_up_after_a_crash_that_followed_a_drop(tmp_path: Path) -> None:
    path = tmp_path / "q"
    proc = run_python("-c", _CHILD_DROPS, str(path))
    assert proc.returncode == 0, proc.stderr
    dropped_before_crash = int(proc.stdout)
    with ledgerq.open(path) as q:
        stats = q.stats()
        assert stats.dropped == dropped_before_crash
        _adds_up(stats)


class CountersMachine(TempQueueMachine):
    """Random workloads under retention_max_bytes: the default reader's counters add up."""

    priorities = False
    tmp_prefix = "ledgerq-counters-"

    def __init__(self) -> None:
        super().__init__()
        self.clock = _StepClock()
        self.leased: list[int] = []
        self.q = self._open()
        self.q.reader("audit")  # a reader that never reads: retention ignores it by bytes

    def _open(self) -> ledgerq.Queue:
        return ledgerq.open(
            self.path,
            sync="never",
            segment_size=600,
            retention_max_bytes=1800,
            max_retries=2,
            priorities=self.priorities,
            clock=self.clock,
        )

    @rule(
        n=st.integers(min_value=1, max_value=8),
        ttl=st.sampled_from([None, None, 5]),
        priority=st.sampled_from(list(ledgerq.Priority)),
    )
    def enqueue(self, n: int, ttl: float | None, priority: ledgerq.Priority) -> None:
        self.q.enqueue_batch([ledgerq.Item(b"p" * 60, ttl=ttl, priority=priority)] * n)

    @rule(n=st.integers(min_value=1, max_value=4))
    def lease(self, n: int) -> None:
        self.leased.extend(m.id for m in self.q.dequeue_batch(n))

    @rule(data=st.data(), nack=st.booleans())
    def settle(self, data: st.DataObject, nack: bool) -> None:
        if not self.leased:
            return
        message_id = self.leased.pop(data.draw(st.integers(0, len(self.leased) - 1)))
        refused = None
        try:
            if nack:
                self.q.nack(message_id, "failed")
            else:
                self.q.ack(message_id)
        except ledgerq.UnknownMessageError as exc:
            refused = str(exc)
        # Only a lease that retention revoked may be refused.
        assert refused is None or "retention_max_bytes" in refused, refused

    @rule()
    def time_passes(self) -> None:
        self.clock.mono_ns += 3 * 10**9

    @rule()
    def requeue_dead_letters(self) -> None:
        self.q.requeue_dlq()

    @rule()
    def reopen(self) -> None:
        self.q.close()
        self.leased.clear()  # leases are lost: delivered again
        self.q = self._open()

    @invariant()
    def counters_add_up(self) -> None:
        _adds_up(self.q.stats())
        self.q._check()


class _StepClock:
    """A clock whose time passes only when the machine says (TTL expiries)."""

    def __init__(self) -> None:
        self.mono_ns = 0

    def time_ns(self) -> int:
        return 1_750_000_000 * 10**9 + self.mono_ns

    def monotonic_ns(self) -> int:
        return self.mono_ns


class PriorityCountersMachine(CountersMachine):
    priorities = True


_COUNTER_SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None)
CountersMachine.TestCase.settings = _COUNTER_SETTINGS
PriorityCountersMachine.TestCase.settings = _COUNTER_SETTINGS
TestCountersAddUp = CountersMachine.TestCase
TestCountersAddUpWithPriorities = PriorityCountersMachine.TestCase
