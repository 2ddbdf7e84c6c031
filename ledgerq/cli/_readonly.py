"""``stats`` and ``peek`` of a queue that cannot be locked: read without the lock.

On a read-only file system ``ledgerq.open`` fails on ``LOCK`` (it cannot be opened
for writing), so the commands that show a queue would fail where a user most needs to
look at it: a disk remounted read-only after errors, a mounted backup.  There they
fall back to reading the files through :mod:`ledgerq.segment.readonly`, as ``dump``
and ``verify`` always do, and say so.  What they show is the state a reopen would
start from: each reader's journal replayed, and messages leased when the files were
last written counted as pending (a lease does not outlive its process: a reopen
delivers such a message again); the log in id order (with priorities on, the order
of delivery may differ).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time

from ledgerq import Message, ReaderStats, Stats, StorageError
from ledgerq.segment.index_file import read_index_ends, read_index_tail
from ledgerq.segment.naming import DLQ_DIR, SEGMENTS_DIR, idx_path, log_path
from ledgerq.segment.readonly import (
    LogTail,
    ReaderState,
    RecordType,
    is_queue_dir,
    list_reader_names,
    load_meta,
    replay_reader,
    segment_ids,
    view_message,
    view_sealer,
)
from ledgerq.segment.scanner import TailScanner, checked_start

__all__ = ["NOTE", "dlq_pending", "is_read_only_error", "peek", "stats"]

NOTE = (
    "read without its lock: the file system is read-only (the queue as its files say: "
    "messages leased when they were written count as pending)"
)
_DEFAULT = "default"
_ANY_ID = (1 << 64) - 1


def is_read_only_error(exc: BaseException) -> bool:
    """Whether ``exc`` (from ``ledgerq.open``) means the queue's file system is read-only."""
    return isinstance(exc, StorageError) and exc.errno == errno.EROFS


@dataclasses.dataclass(frozen=True, slots=True)
class _Segment:
    first_id: int
    last_id: int  # first_id - 1 when it holds no entry
    size: int


_DATA = int(RecordType.DATA)


def _segments(queue_dir: str) -> list[_Segment]:
    """Each segment's id range, from its sealed index or a scan of its tail."""
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    found = []
    for first_id in segment_ids(queue_dir):
        path = log_path(seg_dir, first_id)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue
        _, last_point = read_index_ends(idx_path(seg_dir, first_id))
        last = last_point.id if last_point is not None else _scan_last_id(seg_dir, first_id)
        found.append(_Segment(first_id, max(last, first_id - 1), size))
    return found


def _scan_last_id(seg_dir: str, first_id: int) -> int:
    """The last whole entry's id of a segment without a sealed index (0: none)."""
    fd = os.open(log_path(seg_dir, first_id), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        points = read_index_tail(idx_path(seg_dir, first_id))
        pos, after = checked_start(fd, points, size, _ANY_ID, first_id)
        scanner = TailScanner(
            fd=fd,
            pos=pos,
            end=size,
            after_id=after,
            boundaries=[p.offset for p in points if p.offset > pos],
            patient=False,  # nothing is in flight on a read-only file system
            whole_batches=True,
        )
        last = 0
        while (entry := scanner.next()) is not None:
            last = entry.id
        return last
    finally:
        os.close(fd)


def _start(state: ReaderState, segments: list[_Segment]) -> int:
    """The first id a reopened reader would deliver from (its head, in the log)."""
    head = state.durable_head()
    return max(head, segments[0].first_id) if segments else head


def _first_pending(queue_dir: str, start: int, state: ReaderState) -> int | None:
    """The timestamp of the first message from ``start`` this reader has not settled.

    Read from the entry's visible fields: no payload is opened (an encrypted queue's
    figures need no key).
    """
    tail = LogTail(queue_dir, start)
    try:
        while (entry := tail.next_entry()) is not None:
            if entry.id in state.done or entry.type != _DATA:
                continue
            return entry.timestamp
        return None
    finally:
        tail.close()


def _reader_stats(queue_dir: str, name: str, segments: list[_Segment], now_ns: int) -> ReaderStats:
    state = replay_reader(queue_dir, name)
    start = _start(state, segments)
    pending = sum(max(0, seg.last_id - max(seg.first_id, start) + 1) for seg in segments)
    pending -= sum(
        1 for i in state.done if i >= start and any(s.first_id <= i <= s.last_id for s in segments)
    )
    first = _first_pending(queue_dir, start, state) if pending else None
    counters = state.counters
    return ReaderStats(
        name=name,
        pending=max(pending, 0),
        in_flight=0,
        acked=counters.get("acked", 0),
        nacked=counters.get("nacked", 0),
        expired=counters.get("expired", 0),
        dead_lettered=counters.get("dead_lettered", 0),
        head=start,
        oldest_pending_age=max(0.0, (now_ns - first) / 1e9) if first is not None else 0.0,
    )


def stats(queue_dir: str) -> Stats:
    """The figures of the queue at ``queue_dir`` as its files say (see the module)."""
    meta = load_meta(queue_dir)
    segments = _segments(queue_dir)
    now_ns = time.time_ns()
    names = sorted({_DEFAULT, *list_reader_names(queue_dir)})
    readers = {name: _reader_stats(queue_dir, name, segments, now_ns) for name in names}
    default = readers[_DEFAULT]
    counters = meta.counters
    newest = next((seg for seg in reversed(segments) if seg.last_id >= seg.first_id), None)
    log_next = newest.last_id + 1 if newest is not None else 1
    if segments and segments[-1].last_id < segments[-1].first_id:
        log_next = max(log_next, segments[-1].first_id)  # an empty active segment
    floor = meta.next_id if meta.clean else max(meta.next_id, meta.reserved_until)
    enqueued = counters.get("enqueued", 0) + max(
        0, log_next - counters.get("enqueued_through", meta.next_id)
    )
    return Stats(
        pending=default.pending,
        in_flight=0,
        enqueued=enqueued,
        acked=default.acked,
        nacked=default.nacked,
        dead_lettered=default.dead_lettered,
        expired=default.expired,
        duplicates=counters.get("duplicates", 0),
        dropped=counters.get("dropped", 0),
        corrupt_skipped=counters.get("corrupt_skipped", 0),
        segments=len(segments),
        disk_bytes=sum(seg.size for seg in segments),
        oldest_pending_age=default.oldest_pending_age,
        next_id=max(log_next, floor),
        readers=readers,
    )


def dlq_pending(queue_dir: str) -> int:
    """Messages waiting in the queue's dead-letter queue, as its files say (0: none)."""
    dlq = os.path.join(queue_dir, DLQ_DIR)
    if not is_queue_dir(dlq):
        return 0
    return _reader_stats(dlq, _DEFAULT, _segments(dlq), time.time_ns()).pending


def peek(queue_dir: str, count: int, encryption_key: bytes | None = None) -> list[Message]:
    """The next ``count`` messages the default reader would get, as the files say.

    In id order; ``attempts`` is the delivery a reopen would make (deliveries so far + 1).
    An encrypted queue needs its ``encryption_key`` (:class:`ConfigError`).
    """
    sealer = view_sealer(queue_dir, encryption_key)
    state = replay_reader(queue_dir, _DEFAULT)
    segments = _segments(queue_dir)
    found: list[Message] = []
    tail = LogTail(queue_dir, _start(state, segments))
    try:
        while len(found) < count and (entry := tail.next_entry()) is not None:
            if entry.id in state.done:
                continue
            message = view_message(entry, queue_dir, sealer)
            if message is not None:
                attempts = state.deliveries.get(entry.id, 0) + 1
                found.append(dataclasses.replace(message, attempts=attempts))
    finally:
        tail.close()
    return found
