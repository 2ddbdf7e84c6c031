"""Bounded queues: ``max_pending``, ``max_pending_bytes`` and ``enqueue(..., timeout=)``."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import ledgerq
from ledgerq import Item


class _ManualClock:
    """Both clocks at ``now_ns``, which only the test moves."""

    def __init__(self) -> None:
        self.now_ns = 1_750_000_000 * 10**9

    def time_ns(self) -> int:
        return self.now_ns

    def monotonic_ns(self) -> int:
        return self.now_ns


def _open(path: Path, **options: object) -> ledgerq.Queue:
    return ledgerq.open(path, **options)  # type: ignore[arg-type]


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("name", ["max_pending", "max_pending_bytes"])
@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True])
def test_a_bad_bound_is_refused_and_nothing_is_written(
    tmp_path: Path, name: str, value: object
) -> None:
    with pytest.raises(ledgerq.ConfigError, match=name):
        _open(tmp_path / "q", **{name: value})
    assert not (tmp_path / "q").exists()


def test_the_bounds_are_stored_with_the_queue(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=2, max_pending_bytes=100) as q:
        q.enqueue(b"a")
        q.enqueue(b"b")
    with ledgerq.open(tmp_path / "q") as q:
        assert (q.options.max_pending, q.options.max_pending_bytes) == (2, 100)
        with pytest.raises(ledgerq.QueueFullError):
            q.enqueue(b"c")


def test_queue_full_error_is_a_ledgerq_error() -> None:
    assert issubclass(ledgerq.QueueFullError, ledgerq.LedgerQError)


# ---------------------------------------------------------------- the count bound


def test_a_full_queue_refuses_at_once_and_writes_nothing(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=3) as q:
        ids = [q.enqueue(b"x") for _ in range(3)]
        before = q.stats()
        with pytest.raises(ledgerq.QueueFullError, match=r"3 messages pending of max_pending=3"):
            q.enqueue(b"y")
        with pytest.raises(ledgerq.QueueFullError):
            q.enqueue_batch([b"y"])
        after = q.stats()
        assert (after.enqueued, after.next_id) == (before.enqueued, before.next_id)
        # Leased messages still count: they are not finished.
        msg = q.dequeue()
        assert msg is not None
        with pytest.raises(ledgerq.QueueFullError):
            q.enqueue(b"y")
        q.ack(msg.id)
        assert q.enqueue(b"y") == ids[-1] + 1


def test_a_batch_is_all_or_nothing(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=4) as q:
        q.enqueue_batch([b"a", b"b"])
        with pytest.raises(ledgerq.QueueFullError):
            q.enqueue_batch([b"c", b"d", b"e"])
        assert q.stats().enqueued == 2
        assert len(q.enqueue_batch([b"c", b"d"])) == 2


def test_a_batch_larger_than_the_bound_is_refused_without_waiting(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=2) as q:
        with pytest.raises(ledgerq.QueueFullError, match="can never"):
            q.enqueue_batch([b"a", b"b", b"c"], timeout=None)
        assert q.stats().enqueued == 0


def test_dead_letters_expiries_and_drops_make_room(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=2, max_retries=1) as q:
        q.enqueue(b"fails")
        q.enqueue(b"ok")
        msg = q.dequeue()
        assert msg is not None
        q.nack(msg.id, "boom")  # its only retry: to the DLQ
        assert q.stats().dead_lettered == 1
        q.enqueue(b"fits")
    clock = _ManualClock()
    with ledgerq.open(tmp_path / "t", max_pending=1, clock=clock) as q:
        q.enqueue(b"short-lived", ttl=1.0)
        clock.now_ns += 2 * 10**9
        assert q.dequeue() is None  # the dequeue meets it expired
        assert q.stats().expired == 1
        q.enqueue(b"fits")
    with _open(tmp_path / "r", max_pending=2, segment_size=100, retention_max_bytes=250) as q:
        q.enqueue(b"x" * 100)  # a segment each: the oldest is dropped unconsumed
        q.enqueue(b"x" * 100)
        assert q.stats().dropped == 1
        q.enqueue(b"x" * 100)


def test_a_duplicate_on_a_full_queue_returns_the_original_id(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=1, dedup_window=60) as q:
        first = q.enqueue(b"a", dedup_id="k")
        assert q.enqueue(b"a", dedup_id="k") == first
        with pytest.raises(ledgerq.QueueFullError):
            q.enqueue(b"b", dedup_id="other")
        assert q.stats().duplicates == 1
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
        q.enqueue(b"b", dedup_id="other")  # its refused admission was not remembered


def test_the_slowest_reader_bounds_the_queue(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=2) as q:
        slow = q.reader("audit")
        q.enqueue(b"a")
        q.enqueue(b"b")
        for _ in range(2):
            msg = q.dequeue()
            assert msg is not None
            q.ack(msg.id)
        assert q.stats().pending == 0
        with pytest.raises(ledgerq.QueueFullError, match="max_pending=2"):
            q.enqueue(b"c")
        msg = slow.dequeue()
        assert msg is not None
        slow.ack(msg.id)
        q.enqueue(b"c")
        q.remove_reader("audit")
        q.enqueue(b"d")


# ---------------------------------------------------------------- the bytes bound


def test_the_bytes_bound_counts_payloads_as_given(tmp_path: Path) -> None:
    payload = b"z" * 600
    with _open(
        tmp_path / "q", max_pending_bytes=1000, compression="zstd", compression_min_size=1
    ) as q:
        q.enqueue(payload)  # compressed on disk to a few bytes: 600 all the same
        with pytest.raises(ledgerq.QueueFullError, match="600 payload bytes pending"):
            q.enqueue(payload)
        q.enqueue(b"y" * 400)
        with pytest.raises(ledgerq.QueueFullError):
            q.enqueue(b"!")
    with ledgerq.open(tmp_path / "q") as q:  # the ledger is read back from the log
        with pytest.raises(ledgerq.QueueFullError, match="1000 payload bytes"):
            q.enqueue(b"!")
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
        q.enqueue(b"w" * 600)


def test_a_message_larger_than_the_bytes_bound_raises_at_once(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending_bytes=10) as q:
        with pytest.raises(ledgerq.MessageTooLargeError, match="max_pending_bytes=10"):
            q.enqueue(b"x" * 11, timeout=None)
        q.enqueue(b"x" * 10)


def test_out_of_order_acks_free_their_bytes(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending_bytes=30) as q:
        q.enqueue_batch([b"a" * 10, b"b" * 10, b"c" * 10])
        first, second = q.dequeue(), q.dequeue()
        assert first is not None and second is not None
        q.ack(second.id)  # the head stays at the first: the second's bytes are free
        q.enqueue(b"d" * 10)
        with pytest.raises(ledgerq.QueueFullError, match="30 payload bytes"):
            q.enqueue(b"e")


# ---------------------------------------------------------------- waiting for room


def _enqueue_in_thread(
    q: ledgerq.Queue, payload: bytes, timeout: float | None
) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []

    def run() -> None:
        try:
            result.append(q.enqueue(payload, timeout=timeout))
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def _wait_until_waiting(q: ledgerq.Queue) -> None:
    # The enqueue announces its wait under the queue lock: poll that (a state, not a time).
    while True:
        with q._lock:
            if q._waits.room_waiting:
                return
        threading.Event().wait(0.001)


@pytest.mark.parametrize("settle", ["ack", "ack_batch", "dead_letter", "purge"])
def test_a_waiting_enqueue_is_woken_by_what_makes_room(tmp_path: Path, settle: str) -> None:
    with _open(tmp_path / "q", max_pending=1, max_retries=1) as q:
        q.enqueue(b"a")
        msg = q.dequeue()
        assert msg is not None
        thread, result = _enqueue_in_thread(q, b"b", None)
        _wait_until_waiting(q)
        assert not result
        if settle == "ack":
            q.ack(msg.id)
        elif settle == "ack_batch":
            q.ack_batch([msg.id])
        elif settle == "dead_letter":
            q.nack(msg.id, "boom")
        else:
            q.release(msg.id)  # a purge leaves a leased message alone
            assert q.purge([msg.id]) == 1
        thread.join(30)
        assert not thread.is_alive()
        assert result == [msg.id + 1]


def test_a_wait_that_times_out_raises_having_written_nothing(tmp_path: Path) -> None:
    with _open(tmp_path / "q", max_pending=1) as q:
        q.enqueue(b"a")
        with pytest.raises(ledgerq.QueueFullError, match=r"after waiting 0.05 s"):
            q.enqueue(b"b", timeout=0.05)
        with pytest.raises(ledgerq.QueueFullError):
            q.enqueue_batch([Item(b"b")], timeout=0.05)
        assert q.stats().enqueued == 1


def test_close_ends_a_waiting_enqueue(tmp_path: Path) -> None:
    q = _open(tmp_path / "q", max_pending=1)
    q.enqueue(b"a")
    thread, result = _enqueue_in_thread(q, b"b", None)
    _wait_until_waiting(q)
    q.close()
    thread.join(30)
    assert len(result) == 1 and isinstance(result[0], ledgerq.QueueClosedError)


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True])
def test_a_bad_timeout_is_refused(tmp_path: Path, timeout: object) -> None:
    with _open(tmp_path / "q") as q:
        with pytest.raises((TypeError, ValueError)):
            q.enqueue(b"a", timeout=timeout)  # type: ignore[arg-type]
        with pytest.raises((TypeError, ValueError)):
            q.enqueue_batch([b"a"], timeout=timeout)  # type: ignore[arg-type]
        assert q.stats().enqueued == 0


def test_a_reader_that_starts_behind_fills_the_bound_until_it_catches_up(
    tmp_path: Path,
) -> None:
    with _open(tmp_path / "q", max_pending=2) as q:
        for payload in (b"a", b"b"):
            q.enqueue(payload)
            msg = q.dequeue()
            assert msg is not None
            q.ack(msg.id)
        q.enqueue(b"c")  # the default reader's backlog: 1
        late = q.reader("late")  # starts at the oldest retained message: a, b, c
        with pytest.raises(ledgerq.QueueFullError, match="3 messages pending of max_pending=2"):
            q.enqueue(b"d")
        late.seek(3)  # past a and b
        q.enqueue(b"d")
