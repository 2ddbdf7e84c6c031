"""The console's figures, read without the lock, against ``Queue.stats()`` of the owner.

Every figure the overview shows must be what the queue itself says: checked on closed
queues in many states, and on a queue another process holds open with leases out.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ledgerq
from ledgerq.ui._figures import QueueFigures, QueueFiles
from tests._child import Children


def _same_as_stats(figures: QueueFigures, stats: ledgerq.Stats, dlq: int) -> None:
    assert figures.problem is None
    assert (figures.pending, figures.in_flight) == (stats.pending, stats.in_flight)
    assert (figures.acked, figures.nacked, figures.dead_lettered, figures.expired) == (
        stats.acked,
        stats.nacked,
        stats.dead_lettered,
        stats.expired,
    )
    assert (figures.segments, figures.disk_bytes) == (stats.segments, stats.disk_bytes)
    assert figures.last_id == stats.next_id - 1
    assert figures.dlq == dlq
    assert figures.delayed == getattr(stats, "delayed", 0)
    assert {r.name: (r.pending, r.in_flight, r.head, r.acked) for r in figures.readers} == {
        name: (r.pending, r.in_flight, r.head, r.acked) for name, r in stats.readers.items()
    }


def test_figures_of_a_closed_queue_are_its_stats(tmp_path: Path) -> None:
    path = tmp_path / "q"
    files = QueueFiles(str(path))
    # Small segments: several, and retention deletes the consumed ones on the way.
    with ledgerq.open(path, max_retries=1, segment_size=400) as q:
        q.enqueue_batch([b"m%d" % i for i in range(60)])
        for _ in range(25):
            m = q.dequeue()
            assert m is not None
            q.ack(m.id)
        out_of_order = q.dequeue_batch(5)
        for m in out_of_order[1:]:
            q.ack(m.id)  # acked above a lease: the head stays
        for _ in range(4):
            m = q.dequeue()
            assert m is not None
            q.nack(m.id, "boom")  # max_retries=1: to the DLQ
        other = q.reader("audit")
        for _ in range(7):
            m = other.dequeue()
            assert m is not None
            other.ack(m.id)
        # Open: the leases of the default reader are out (its first of the batch).
        live = files.figures()
        assert live.is_open and live.in_flight == 1
        _same_as_stats(live, q.stats(), dlq=4)
    with ledgerq.open(path) as q:
        stats, dlq = q.stats(), len(q.dlq)
    closed = files.figures()  # the same QueueFiles, following the files since
    assert not closed.is_open and closed.in_flight == 0
    # Reopened then closed: the lease came back as a failed delivery (attempts kept).
    _same_as_stats(closed, stats, dlq=dlq)


def _fields(figures: QueueFigures) -> dict[str, object]:
    return {name: getattr(figures, name) for name in figures.__slots__}


def test_a_fresh_reader_of_the_files_agrees_with_one_that_followed_them(tmp_path: Path) -> None:
    path = tmp_path / "q"
    followed = QueueFiles(str(path))
    with ledgerq.open(path, max_retries=2) as q:
        for round_ in range(30):
            q.enqueue(b"x" * round_)
            m = q.dequeue()
            assert m is not None
            if round_ % 3:
                q.ack(m.id)
            else:
                q.nack(m.id, "again")
            before = _fields(followed.figures())
            fresh = _fields(QueueFiles(str(path)).figures())
            for key in ("taken_at", "oldest_pending_age"):
                before.pop(key)
                fresh.pop(key)
            assert before == fresh


def test_oldest_pending_age_is_the_oldest_waiting_message(tmp_path: Path) -> None:
    path = tmp_path / "q"

    class Past:
        def time_ns(self) -> int:
            return time.time_ns() - 3600 * 10**9

        def monotonic_ns(self) -> int:
            return time.monotonic_ns()

    with ledgerq.open(path, clock=Past()) as q:
        q.enqueue(b"old")
    with ledgerq.open(path) as q:
        q.enqueue(b"new")
    assert QueueFiles(str(path)).figures().oldest_pending_age == pytest.approx(3600, abs=30)
    with ledgerq.open(path) as q:
        m = q.dequeue()
        assert m is not None
        q.ack(m.id)
    assert QueueFiles(str(path)).figures().oldest_pending_age < 30
    with ledgerq.open(path) as q:
        m = q.dequeue()
        assert m is not None
        q.ack(m.id)
    empty = QueueFiles(str(path)).figures()
    assert (empty.pending, empty.oldest_pending_age) == (0, 0.0)


_HOLDER = """
import sys, ledgerq
q = ledgerq.open(sys.argv[1], max_retries=1)
q.enqueue_batch([b"%d" % i for i in range(20)])
leased = q.dequeue_batch(6)
q.ack(leased[0].id)
q.nack(leased[1].id, "held-open failure")
print("ready", flush=True)
sys.stdin.readline()
print(repr((q.stats().pending, q.stats().in_flight, q.stats().acked, len(q.dlq))), flush=True)
sys.stdin.readline()
"""


def test_figures_of_a_queue_another_process_holds(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    holder = children.start(["-c", _HOLDER, str(path)])
    holder.wait_for("ready")
    figures = QueueFiles(str(path)).figures()
    holder.send("stats")
    pending, in_flight, acked, dlq = eval(holder.line())  # the owner's own view, now
    assert figures.is_open
    assert (
        (figures.pending, figures.in_flight, figures.acked, figures.dlq)
        == (
            pending,
            in_flight,
            acked,
            dlq,
        )
        == (14, 4, 1, 1)
    )
    holder.kill()  # a crash: the leases are not returned, the files say the queue is open
    holder.wait()
    after = QueueFiles(str(path)).figures()
    assert (after.pending, after.in_flight, after.is_open) == (14, 4, True)
    with ledgerq.open(path) as q:  # the recovery returns them
        assert (q.stats().pending, q.stats().in_flight) == (18, 0)
    reread = QueueFiles(str(path)).figures()
    assert (reread.pending, reread.in_flight) == (18, 0)


def test_a_damaged_journal_is_a_problem_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
        for _ in range(3):
            m = q.dequeue()
            assert m is not None
            q.ack(m.id)
    (path / "readers" / "default.state").write_bytes(b"not a reader journal\n" * 8)
    figures = QueueFiles(str(path)).figures()
    assert figures.problem is not None and "journal" in figures.problem
    assert figures.pending == 0


@pytest.mark.parametrize("shared", [False, True])
def test_delayed_messages_are_counted_as_the_queue_counts_them(
    tmp_path: Path, shared: bool
) -> None:
    path = tmp_path / "q"
    files = QueueFiles(str(path))
    with ledgerq.open(path, retry_delay=3600.0, shared=shared) as q:
        q.enqueue_batch([b"now-%d" % i for i in range(4)])
        for i in range(3):
            q.enqueue(b"later-%d" % i, delay=3600.0)  # held back for an hour
        first = files.figures()  # a first refresh: the entries so far
        retried = q.dequeue()
        assert retried is not None
        q.nack(retried.id, "downstream is down")  # waits the retry policy's hour
        released = q.dequeue()
        assert released is not None
        q.release(released.id, delay=3600.0)
        q.enqueue(b"later-3", delay=3600.0)  # appended after the first refresh
        stats = q.stats()
        assert stats.delayed == 6
        live = files.figures()
        fresh = QueueFiles(str(path)).figures()
    assert first.delayed == 3
    assert live.delayed == fresh.delayed == 6
    with ledgerq.open(path, retry_delay=3600.0, shared=shared) as q:
        reopened = q.stats().delayed
    assert files.figures().delayed == reopened == 6


def test_a_backlog_is_read_over_several_refreshes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerq.ui import _schedule

    monkeypatch.setattr(_schedule, "ENTRIES_PER_REFRESH", 10)
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch([ledgerq.Item(b"%d" % i, delay=3600.0) for i in range(25)])
    files = QueueFiles(str(path))
    seen = [files.figures().delayed for _ in range(4)]
    assert seen == [10, 20, 25, 25]  # caught up, then nothing more to read
