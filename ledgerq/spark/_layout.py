"""Where the messages are: queue directories under a path, their segments, their readers.

Everything here runs on the Spark driver side (in the Python planner process) and
only looks: it lists directories, reads ``meta.json``, sparse index files and reader
journals, and takes no lock, so it can run beside the process that owns a queue.
No pyspark or pyarrow here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from ledgerq._errors import CorruptionError, NotAQueueError
from ledgerq.format.entry import (
    ENTRY_HEADER,
    MAX_ENTRY_SIZE,
    MIN_ENTRY_SIZE,
    EntryFlags,
    decode_entry,
)
from ledgerq.format.errors import CorruptRecord, DecodeError, IncompleteRecord
from ledgerq.format.index import (
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_MAGIC,
    INDEX_VERSION,
    OPEN_COUNT,
    IndexEntry,
    decode_index,
)
from ledgerq.format.reader_state import (
    StateRecordType,
    decode_checkpoint,
    decode_state_file_header,
    decode_state_record,
)
from ledgerq.segment.naming import SEGMENTS_DIR, idx_path, list_segment_ids, log_path
from ledgerq.segment.scanner import EntryScanner

__all__ = [
    "DLQ_DIR",
    "QueueDir",
    "ReaderSnapshot",
    "SegmentInfo",
    "TailScanner",
    "find_queues",
    "last_complete_id",
    "list_segments",
    "read_index_points",
    "read_reader_state",
    "timestamps_non_decreasing",
]

DLQ_DIR = "dlq"  # the dead-letter queue of a queue: a queue directory of its own
_META = "meta.json"
_READERS_DIR = "readers"
_LENGTH_SIZE = 4
_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)


@dataclass(frozen=True, slots=True)
class QueueDir:
    """One queue directory: ``name`` is what the ``queue`` column shows."""

    name: str
    path: str


def is_queue_dir(path: str) -> bool:
    """Whether ``path`` looks like a ledgerq queue directory (it has ``segments/``)."""
    return os.path.isdir(os.path.join(path, SEGMENTS_DIR))


def find_queues(path: str, *, include_dlq: bool) -> list[QueueDir]:
    """The queue directories at or under ``path``, sorted by name.

    ``path`` itself may be a queue (its own name is then the queue name) or a tree of
    queues (names are paths relative to ``path``, with ``/``).  The walk does not go
    into a queue directory (except its ``dlq/`` when ``include_dlq``), skips names
    starting with ``.`` or ``_`` (hidden, and the writer's staging area) and follows
    each directory once.  Raises :class:`NotAQueueError` if ``path`` does not exist
    or is not a directory; an existing directory with no queue yields ``[]``.
    """
    root = os.path.abspath(path)
    if not os.path.exists(root):
        raise NotAQueueError(f"no ledgerq queue at {path!r}: the path does not exist")
    if not os.path.isdir(root):
        raise NotAQueueError(f"{path!r} is not a directory, so not a ledgerq queue")
    found: list[QueueDir] = []
    if is_queue_dir(root):
        _add_queue(found, os.path.basename(root.rstrip(os.sep)) or root, root, include_dlq)
    else:
        seen: set[str] = set()
        _walk(root, "", found, seen, include_dlq)
    found.sort(key=lambda q: q.name)
    return found


def _add_queue(found: list[QueueDir], name: str, path: str, include_dlq: bool) -> None:
    found.append(QueueDir(name, path))
    if include_dlq:
        dlq = os.path.join(path, DLQ_DIR)
        if is_queue_dir(dlq):
            _add_queue(found, f"{name}/{DLQ_DIR}", dlq, include_dlq)


def _walk(directory: str, prefix: str, found: list[QueueDir], seen: set[str], dlq: bool) -> None:
    real = os.path.realpath(directory)
    if real in seen:
        return  # a symlink loop, or the same tree reached twice
    seen.add(real)
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for entry in entries:
        if entry.name.startswith((".", "_")):
            continue
        try:
            if not entry.is_dir():
                continue
        except OSError:
            continue
        name = f"{prefix}{entry.name}"
        if is_queue_dir(entry.path):
            _add_queue(found, name, entry.path, dlq)
        else:
            _walk(entry.path, f"{name}/", found, seen, dlq)


def is_cleanly_closed(queue_path: str) -> bool:
    """Whether ``meta.json`` says the queue was closed cleanly (no process has it open)."""
    try:
        with open(os.path.join(queue_path, _META), "rb") as f:
            raw = json.loads(f.read())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("clean") is True


# ---------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the planner knows of one segment without reading its log.

    ``next_first_id`` is the first id of the next segment (ids of this one are below
    it), None for the newest segment.  ``first_ts``/``last_ts`` are the timestamps of
    the first and (sealed index) last entries, when the index says so.
    """

    first_id: int
    next_first_id: int | None
    size: int
    first_ts: int | None
    last_ts: int | None

    @property
    def is_newest(self) -> bool:
        """Whether this is the queue's newest (active) segment."""
        return self.next_first_id is None


def read_index_points(queue_path: str, first_id: int) -> tuple[list[IndexEntry], bool]:
    """The points of a segment's sparse index and whether it is sealed; ``([], False)``
    when the index is missing or unreadable (it is a hint only)."""
    try:
        with open(idx_path(os.path.join(queue_path, SEGMENTS_DIR), first_id), "rb") as f:
            data = f.read()
        return decode_index(data)
    except (OSError, DecodeError):
        return [], False


def list_segments(queue_path: str) -> list[SegmentInfo]:
    """The segments of a queue, oldest first (an empty list if it has none).

    Reads two points of each sparse index (its first and its last), never the whole
    file: planning stays fast however large the segments are.
    """
    seg_dir = os.path.join(queue_path, SEGMENTS_DIR)
    try:
        ids = list_segment_ids(seg_dir)
    except FileNotFoundError:
        return []
    infos = []
    for position, first_id in enumerate(ids):
        try:
            size = os.stat(log_path(seg_dir, first_id)).st_size
        except FileNotFoundError:
            continue  # deleted by retention while we listed
        first, last = _index_ends(idx_path(seg_dir, first_id))
        next_first = ids[position + 1] if position + 1 < len(ids) else None
        infos.append(
            SegmentInfo(
                first_id,
                next_first,
                size,
                first.timestamp if first is not None and first.offset == 0 else None,
                last.timestamp if last is not None else None,
            )
        )
    return infos


def _index_ends(path: str) -> tuple[IndexEntry | None, IndexEntry | None]:
    """The first point of an index and, when it is sealed, its last point (the segment's
    last entry); None where the file is missing, damaged or says nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, None
    try:
        head = os.pread(fd, INDEX_HEADER.size + INDEX_ENTRY.size, 0)
        if len(head) < INDEX_HEADER.size + INDEX_ENTRY.size:
            return None, None
        magic, version, count = INDEX_HEADER.unpack_from(head, 0)
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            return None, None
        first = IndexEntry(*INDEX_ENTRY.unpack_from(head, INDEX_HEADER.size))
        if count == OPEN_COUNT or count == 0:
            return first, None
        at = INDEX_HEADER.size + (count - 1) * INDEX_ENTRY.size
        tail = os.pread(fd, INDEX_ENTRY.size, at)
        if len(tail) < INDEX_ENTRY.size:
            return first, None
        last = IndexEntry(*INDEX_ENTRY.unpack_from(tail, 0))
        if last.id < first.id or last.offset < first.offset:
            return first, None
        return first, last
    finally:
        os.close(fd)


def timestamps_non_decreasing(segments: list[SegmentInfo]) -> bool:
    """Whether the first and last timestamps of the segments never decrease, in id order.

    Timestamp pruning assumes the enqueue clock did not step back; when these samples
    show that it did, the planner does not prune that queue by time.
    """
    previous = None
    for seg in segments:
        for ts in (seg.first_ts, seg.last_ts):
            if ts is None:
                continue
            if previous is not None and ts < previous:
                return False
            previous = ts
    return True


class TailScanner(EntryScanner):
    """An :class:`EntryScanner` for the live end of a queue's newest segment.

    The plain scanner searches every later byte offset for a valid entry when one
    runs past the end of the data; at the live end that is an append in flight (or a
    torn tail), and its payload could even hold bytes that look like an entry.  An
    entry whose header is plausible and whose declared length runs past ``end`` stops
    this scanner instead (``incomplete`` is then True).
    """

    def _resync(self, bad: int) -> bool:
        available = self.end - bad
        head = os.pread(self.fd, min(ENTRY_HEADER.size, available), bad)
        if len(head) < _LENGTH_SIZE:
            return False
        length = int.from_bytes(head[:_LENGTH_SIZE], "little")
        if MIN_ENTRY_SIZE <= length <= MAX_ENTRY_SIZE and length > available:
            return False  # a write still in flight, or torn: not data to search past
        return super()._resync(bad)


def _entry_id_at(fd: int, offset: int, size: int) -> int:
    """Id of the valid entry starting at ``offset``, or -1."""
    head = os.pread(fd, ENTRY_HEADER.size, offset)
    if len(head) < ENTRY_HEADER.size:
        return -1
    length = int.from_bytes(head[:_LENGTH_SIZE], "little")
    if not MIN_ENTRY_SIZE <= length <= MAX_ENTRY_SIZE or offset + length > size:
        return -1
    try:
        entry, _ = decode_entry(os.pread(fd, length, offset), 0)
    except DecodeError:
        return -1
    return entry.id


def checked_start(
    fd: int, points: list[IndexEntry], size: int, accept: int
) -> tuple[int, int] | None:
    """The last index point with ``points[i].id <= accept`` whose entry checks out.

    Returns ``(offset, id)`` of that point, or None (scan from the start).
    """
    for point in reversed(points):
        if point.id > accept or point.offset >= size:
            continue
        if point.offset == 0:
            return None
        if _entry_id_at(fd, point.offset, size) == point.id:
            return point.offset, point.id
    return None


def _tail_points(path: str, want: int = 8) -> list[IndexEntry]:
    """The last ``want`` whole points of a sparse index (fewer if it has fewer; none if
    it is missing or damaged), without reading the rest of the file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        head = os.pread(fd, INDEX_HEADER.size, 0)
        if len(head) < INDEX_HEADER.size:
            return []
        magic, version, count = INDEX_HEADER.unpack_from(head, 0)
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            return []
        whole = (os.fstat(fd).st_size - INDEX_HEADER.size) // INDEX_ENTRY.size
        if count != OPEN_COUNT:
            whole = min(whole, count)
        first = max(0, whole - want)
        data = os.pread(
            fd, (whole - first) * INDEX_ENTRY.size, INDEX_HEADER.size + first * INDEX_ENTRY.size
        )
    finally:
        os.close(fd)
    return [
        IndexEntry(*INDEX_ENTRY.unpack_from(data, i * INDEX_ENTRY.size))
        for i in range(len(data) // INDEX_ENTRY.size)
    ]


def last_complete_id(queue_path: str, segments: list[SegmentInfo] | None = None) -> int:
    """The id of the last complete, valid entry of a queue (0 if it has none).

    Reads the newest segment from the last of its final index points that checks out
    (never the whole index); an append in flight at the end is not counted, nor the
    entries of a batch whose last entry is not written yet (the owner's recovery would
    cut them).  An empty newest segment (just rotated) defers to the one before it.
    """
    seg_dir = os.path.join(queue_path, SEGMENTS_DIR)
    segments = list_segments(queue_path) if segments is None else segments
    for seg in reversed(segments):
        try:
            fd = os.open(log_path(seg_dir, seg.first_id), os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            points = _tail_points(idx_path(seg_dir, seg.first_id))
            start = checked_start(fd, points, size, 1 << 64)
            pos, after = (start[0], start[1] - 1) if start else (0, seg.first_id - 1)
            boundaries = [p.offset for p in points if p.offset > pos]
            scanner = TailScanner(fd, pos, size, after_id=after, boundaries=boundaries)
            last = 0
            while (entry := scanner.next()) is not None:
                if not entry.flags & _BATCH_CONTINUES:
                    last = entry.id
        finally:
            os.close(fd)
        if last:
            return last
    return 0


# ---------------------------------------------------------------------- readers


@dataclass(frozen=True, slots=True)
class ReaderSnapshot:
    """One reader's state as its journal says: ids below ``head`` and in ``done`` are
    finished (acked, dead-lettered or expired), ids in ``leased`` are out for delivery."""

    head: int
    done: frozenset[int]
    leased: frozenset[int]

    def restricted(self, lo: int, hi: int | None) -> ReaderSnapshot:
        """The same state with the id sets cut to ``[lo, hi)`` (for one segment)."""

        def inside(i: int) -> bool:
            return i >= lo and (hi is None or i < hi)

        return ReaderSnapshot(
            self.head,
            frozenset(i for i in self.done if inside(i)),
            frozenset(i for i in self.leased if inside(i)),
        )


def read_reader_state(queue_path: str, name: str) -> ReaderSnapshot:
    """Replay ``readers/<name>.state`` read-only; a reader that does not exist yet is at
    the oldest message with nothing leased.

    Leases are those taken since the journal's last checkpoint and not settled since;
    a queue closed cleanly has none (leases do not survive a close).  Raises
    :class:`CorruptionError` when the journal is damaged in the middle (the queue
    itself refuses to open then); a torn last record is ignored.
    """
    if not name or "/" in name or os.sep in name or name.startswith("."):
        raise ValueError(f"invalid reader name {name!r}")
    path = os.path.join(queue_path, _READERS_DIR, f"{name}.state")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return ReaderSnapshot(1, frozenset(), frozenset())
    try:
        pos = decode_state_file_header(data)
    except DecodeError as exc:
        raise CorruptionError(f"reader state file is damaged ({exc})", path, 0) from None
    head = 1
    done: set[int] = set()
    leased: set[int] = set()
    for kind, body, at in _records(data, pos, path):
        if kind is StateRecordType.CHECKPOINT:
            assert isinstance(body, bytes)
            try:
                checkpoint = decode_checkpoint(body, at)
            except CorruptRecord as exc:
                raise CorruptionError(f"reader checkpoint is damaged ({exc})", path, at) from None
            head = checkpoint.head
            done = set(checkpoint.done)
            leased = set()  # a checkpoint's deliveries are counts, not live leases
            continue
        assert isinstance(body, tuple)
        if kind is StateRecordType.LEASE:
            leased.update(body)
        elif kind is StateRecordType.NACK:
            leased.difference_update(body)
        else:  # ACK, DEAD_LETTER, EXPIRE: finished for this reader
            done.update(body)
            leased.difference_update(body)
    if is_cleanly_closed(queue_path):
        leased = set()
    return ReaderSnapshot(
        head, frozenset(i for i in done if i >= head), frozenset(i for i in leased if i >= head)
    )


def _records(
    data: bytes, pos: int, path: str
) -> Iterator[tuple[StateRecordType, bytes | tuple[int, ...], int]]:
    while pos < len(data):
        try:
            kind, body, nxt = decode_state_record(data, pos)
        except IncompleteRecord:
            return  # a torn last record (or an append in flight)
        except CorruptRecord as exc:
            if _only_garbage_after(data, pos):
                return
            raise CorruptionError(f"reader state record is damaged ({exc})", path, pos) from None
        yield kind, body, pos
        pos = nxt


def _only_garbage_after(data: bytes, pos: int) -> bool:
    for at in range(pos + 1, len(data)):
        try:
            decode_state_record(data, at)
        except (CorruptRecord, IncompleteRecord):
            continue
        return False
    return True
