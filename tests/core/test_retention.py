"""Retention: what is deleted, when, and what never is."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import ledgerq


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


class RetentionMachine(RuleBasedStateMachine):
    """Several readers at their own pace: no reader ever misses a message to retention."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="ledgerq-retention-")
        self.path = f"{self.tmp}/q"
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

    def teardown(self) -> None:
        self.q.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


RetentionMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=40, deadline=None
)
TestRetentionModel = RetentionMachine.TestCase
