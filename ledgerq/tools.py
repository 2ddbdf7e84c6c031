"""Operator tools over the files of a queue: ``verify``, ``repair`` and a log walk.

:func:`verify` reads every byte a queue keeps - the CRC of every entry in every
segment, every sparse index against its log, every reader's state journal and
``meta.json`` - and reports each problem with its file and byte offset.  It takes no
lock and writes nothing, so it can run beside the process that owns the queue (then a
torn tail at the very end of the newest segment or of a journal may be a write still in
flight; verify a closed queue for an exact answer).  The dead-letter queue in ``dlq/``
is a queue of the same format and is checked the same way.

:func:`repair` is the only function here that writes.  It takes the queue's lock by
opening it with :func:`ledgerq.open` - whose recovery cuts a torn tail of the newest
segment and of reader journals, and rebuilds the index of a sealed segment that fails
its check - then rebuilds, under the lock, any index that is still wrong, and verifies
again.  It never deletes a valid entry: a corrupt entry in the middle of a log stays
(and stays reported); readers skip it.

:func:`iter_messages` walks the retained log read-only (``ledgerq dump``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ledgerq._api import open as open_path
from ledgerq._errors import CorruptionError, LedgerQError, QueueLockedError
from ledgerq._options import Options
from ledgerq._queue import Queue
from ledgerq._types import Message
from ledgerq.core.reader import Reader
from ledgerq.segment.index_file import write_index  # repair only: it writes
from ledgerq.segment.lock import DirLock  # repair only: it writes
from ledgerq.segment.readonly import (
    DLQ_DIR,
    FORMAT_VERSION,
    META_NAME,
    SEGMENTS_DIR,
    CorruptRegion,
    DecodeError,
    EntryScanner,
    IndexEntry,
    SegmentTail,
    StateRecordType,
    TailScanner,
    find_queues,
    idx_path,
    journal_records,
    list_reader_names,
    list_segment_ids,
    load_index,
    log_path,
    log_skipped,
    queue_dir_problem,
    reader_state_path,
    segment_ids,
    stored_options,
    view_message,
)

__all__ = [
    "CORRUPT_ENTRY",
    "CORRUPT_TAIL",
    "ID_ORDER",
    "INDEX",
    "META",
    "READER_STATE",
    "READER_STATE_TAIL",
    "TORN_TAIL",
    "Problem",
    "RepairReport",
    "VerifyReport",
    "create_reader",
    "has_dlq",
    "iter_messages",
    "not_a_queue",
    "repair",
    "verify",
]

logger = logging.getLogger("ledgerq")

# Problem kinds: stable strings (they appear in ``ledgerq verify --json``).
META = "meta"  # meta.json missing, unreadable, invalid or inconsistent with the log
CORRUPT_ENTRY = "corrupt-entry"  # bytes in a log that are not a valid entry, valid ones after
TORN_TAIL = "torn-tail"  # incomplete bytes at the end of the newest segment
CORRUPT_TAIL = "corrupt-tail"  # invalid bytes at the end of a sealed segment
ID_ORDER = "id-order"  # ids not consecutive inside a segment, or segments overlapping
INDEX = "index"  # a sparse index missing, unreadable or not matching its log
READER_STATE = "reader-state"  # a reader journal the queue refuses to open
READER_STATE_TAIL = "reader-state-tail"  # a torn last record, cut when the queue opens

ProgressCallback = Callable[[int, int], None]
_PROGRESS_STEP = 1 << 20  # report progress about once per MiB of log


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found in a queue's files: where (file, byte offset) and what."""

    file: str
    offset: int | None
    kind: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.offset is None else f"{self.file}:{self.offset}"
        return f"{where}: {self.kind}: {self.message}"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` checked and found.  ``ok`` when no problem was found."""

    path: str
    problems: tuple[Problem, ...]
    segments: int
    entries: int
    bytes_checked: int
    index_files: int
    reader_files: int
    queues: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Whether every file checked out."""
        return not self.problems


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What :func:`repair` found before, did, could not do, and found after.

    ``not_done`` says what the repair could not do and why (a read-only file system, a
    full disk...): then ``after`` is a report of the files as they are, not of a
    repaired queue, and :attr:`complete` is False.
    """

    before: VerifyReport
    after: VerifyReport
    actions: tuple[str, ...]
    not_done: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Whether every step of the repair ran."""
        return not self.not_done

    @property
    def fixed(self) -> tuple[Problem, ...]:
        """Problems found before the repair and not after it."""
        remaining = set(self.after.problems)
        return tuple(p for p in self.before.problems if p not in remaining)


@dataclass
class _Rebuild:
    """An index that a repair should rebuild from its log."""

    queue_dir: str
    first_id: int
    sealed: bool


@dataclass
class _Tally:
    problems: list[Problem] = field(default_factory=list)
    rebuilds: list[_Rebuild] = field(default_factory=list)
    segments: int = 0
    entries: int = 0
    bytes_checked: int = 0
    index_files: int = 0
    reader_files: int = 0
    queues: list[str] = field(default_factory=list)
    done: int = 0
    total: int = 0
    on_progress: ProgressCallback | None = None

    def add(self, file: str, offset: int | None, kind: str, message: str) -> None:
        self.problems.append(Problem(file, offset, kind, message))

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.on_progress is not None:
            self.on_progress(min(self.done, self.total), self.total)


# ---------------------------------------------------------------------- looking


def not_a_queue(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not an existing queue directory, or None when it is one.

    Looks only; creates nothing (``ledgerq.open`` would create a missing queue).  The
    rule is ``ledgerq.segment.readonly.queue_dir_problem``'s, shared by every reader.
    """
    return queue_dir_problem(path)


def has_dlq(path: str | os.PathLike[str]) -> bool:
    """Whether the queue at ``path`` has a dead-letter queue (``q.dlq`` would create one)."""
    return os.path.isdir(os.path.join(os.fspath(path), DLQ_DIR))


# ---------------------------------------------------------------------- verify


def verify(
    path: str | os.PathLike[str], *, on_progress: ProgressCallback | None = None
) -> VerifyReport:
    """Check every file of the queue at ``path`` (and of its DLQ); write nothing.

    ``on_progress(done_bytes, total_bytes)`` is called as the logs are read.  Raises
    ``FileNotFoundError`` if ``path`` is not a directory; a directory that is not a
    queue is reported as a ``meta`` problem.
    """
    root = os.fspath(path)
    if not os.path.isdir(root):
        raise FileNotFoundError(2, "no queue directory", root)
    tally = _Tally(on_progress=on_progress)
    queues = _queue_dirs(root)
    tally.total = sum(_planned_bytes(q) for q in queues)
    for queue_dir in queues:
        _check_queue(queue_dir, tally)
    if on_progress is not None:
        on_progress(tally.total, tally.total)
    return _report(root, tally)


def _report(root: str, tally: _Tally) -> VerifyReport:
    return VerifyReport(  # the fields in their order: path, problems, then the counts
        root,
        tuple(tally.problems),
        tally.segments,
        tally.entries,
        tally.bytes_checked,
        tally.index_files,
        tally.reader_files,
        tuple(tally.queues),
    )


def _queue_dirs(root: str) -> list[str]:
    """The queues to check: the queue at ``root`` and its dead-letter queue - or, for a
    directory of queues, every queue under it - or ``root`` itself when it holds none
    (reported as not a queue)."""
    return [queue.path for queue in find_queues(root, include_dlq=True)] or [root]


def _planned_bytes(queue_dir: str) -> int:
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    total = 0
    for first_id in segment_ids(queue_dir):
        try:
            total += os.stat(log_path(seg_dir, first_id)).st_size
        except FileNotFoundError:
            pass
    return total


def _check_queue(queue_dir: str, tally: _Tally) -> None:
    tally.queues.append(queue_dir)
    problem = queue_dir_problem(queue_dir)
    if problem is not None:
        tally.add(os.path.join(queue_dir, META_NAME), None, META, problem)
        return
    meta = _check_meta(queue_dir, tally)
    last_id = _check_segments(queue_dir, tally)
    if meta is not None and last_id:
        clean, next_id, reserved_until = meta
        floor = next_id if clean else max(next_id, reserved_until)
        if clean and floor <= last_id:
            tally.add(
                os.path.join(queue_dir, META_NAME),
                None,
                META,
                f"next_id {next_id} is not above the last id in the log ({last_id}) although "
                "the queue was closed cleanly; meta.json is stale or belongs to another queue",
            )
    _check_readers(queue_dir, tally)


def _check_meta(queue_dir: str, tally: _Tally) -> tuple[bool, int, int] | None:
    """Check meta.json; return (clean, next_id, reserved_until) when usable."""
    path = os.path.join(queue_dir, META_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        tally.add(
            path, None, META, "missing: the queue was never opened to its end (open writes it)"
        )
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        tally.add(path, None, META, f"not valid JSON ({exc})")
        return None
    if not isinstance(value, dict):
        tally.add(path, None, META, "not a JSON object")
        return None
    if value.get("format") != "ledgerq":
        tally.add(path, None, META, f"format is {value.get('format')!r}, not 'ledgerq'")
        return None
    version = value.get("version")
    if type(version) is not int or version < 1:
        tally.add(path, None, META, f"version {version!r} is not a positive integer")
        return None
    if version > FORMAT_VERSION:
        tally.add(
            path,
            None,
            META,
            f"format version {version} is newer than this ledgerq reads ({FORMAT_VERSION})",
        )
        return None
    usable = True
    for key in ("created_ns", "next_id", "reserved_until"):
        if key in value and type(value[key]) is not int:
            tally.add(path, None, META, f"{key} is {value[key]!r}, not an integer")
            usable = False
    if "clean" in value and type(value["clean"]) is not bool:
        tally.add(path, None, META, f"clean is {value['clean']!r}, not a boolean")
    counters = value.get("counters", {})
    if not isinstance(counters, dict) or not all(type(v) is int for v in counters.values()):
        tally.add(path, None, META, "counters is not an object of integers")
    regions = value.get("corrupt_regions", [])
    if not isinstance(regions, list) or not all(
        isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in regions
    ):
        tally.add(path, None, META, "corrupt_regions is not an array of [id, offset] pairs")
    if not usable:
        return None
    next_id = int(value.get("next_id", 1))
    return value.get("clean") is True, next_id, int(value.get("reserved_until", next_id))


def _read_index(path: str) -> tuple[list[IndexEntry], bool] | DecodeError | None:
    """The decoded index, the decoding error, or None when the file is missing."""
    try:
        return load_index(path)
    except FileNotFoundError:
        return None
    except DecodeError as exc:
        return exc


def _in_regions(offset: int, regions: list[CorruptRegion]) -> bool:
    return any(r.start <= offset < r.stop for r in regions)


def _check_segments(queue_dir: str, tally: _Tally) -> int:
    """Check every segment log and index; return the last valid id found (0: none)."""
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    if not os.path.isdir(seg_dir):
        tally.add(seg_dir, None, META, "the segments directory is missing")
        return 0
    ids = list_segment_ids(seg_dir)
    prev_last = 0
    for position, first_id in enumerate(ids):
        newest = position == len(ids) - 1
        lpath = log_path(seg_dir, first_id)
        ipath = idx_path(seg_dir, first_id)
        # Read the index before the log's size: an owner appends to the log before the
        # index, so every point read refers to bytes that exist when the size is taken.
        index = _read_index(ipath)
        try:
            fd = os.open(lpath, os.O_RDONLY)
        except FileNotFoundError:
            continue  # deleted by retention while we looked
        try:
            last = _check_log(fd, lpath, first_id, prev_last, newest, index, tally, queue_dir)
        finally:
            os.close(fd)
        tally.segments += 1
        if last:
            prev_last = last
    return prev_last


def _check_log(
    fd: int,
    lpath: str,
    first_id: int,
    prev_last: int,
    newest: bool,
    index: tuple[list[IndexEntry], bool] | DecodeError | None,
    tally: _Tally,
    queue_dir: str,
) -> int:
    size = os.fstat(fd).st_size
    if first_id <= prev_last:
        tally.add(
            lpath,
            None,
            ID_ORDER,
            f"the segment starts at id {first_id} but the previous one ends at id {prev_last}",
        )
    points: list[IndexEntry] = index[0] if isinstance(index, tuple) else []
    wanted = {p.offset for p in points}
    matched: dict[int, tuple[int, int]] = {}
    # The newest segment's end may be an append in flight (verify takes no lock): the
    # scan stops there - and at a batch whose last entry is missing, which the queue's
    # recovery cuts - instead of searching inside it; what is left is the torn tail.
    scanner = TailScanner(
        fd=fd, pos=0, end=size, after_id=first_id - 1, patient=newest, whole_batches=newest
    )
    regions_seen = 0
    prev_id = first_id - 1
    last_offset = -1
    reported_at = 0
    count = 0
    while (entry := scanner.next()) is not None:
        offset = scanner.pos - entry.size
        if len(scanner.corrupt) > regions_seen:
            for region in scanner.corrupt[regions_seen:]:
                lost = entry.id - prev_id - 1
                ids = (
                    f"id {prev_id + 1}"
                    if lost == 1
                    else f"ids {prev_id + 1}-{entry.id - 1}"
                    if lost > 1
                    else "no id"
                )
                tally.add(
                    lpath,
                    region.start,
                    CORRUPT_ENTRY,
                    f"{region.stop - region.start} bytes hold no valid entry ({ids} lost); "
                    "readers skip them",
                )
            regions_seen = len(scanner.corrupt)
        elif entry.id != prev_id + 1:
            tally.add(
                lpath,
                offset,
                ID_ORDER,
                f"expected id {prev_id + 1}, found id {entry.id} (ids inside a segment are "
                "consecutive from the one in its file name)",
            )
        if offset in wanted:
            matched[offset] = (entry.id, entry.timestamp)
        prev_id = entry.id
        last_offset = offset
        count += 1
        if scanner.pos - reported_at >= _PROGRESS_STEP:
            tally.advance(scanner.pos - reported_at)
            reported_at = scanner.pos
    tally.advance(size - reported_at)
    tally.bytes_checked += size
    tally.entries += count
    regions = list(scanner.corrupt)
    if scanner.pos < size:
        regions.append(CorruptRegion(scanner.pos, size))
        if newest:
            what = (
                "an incomplete batch (its last entry is missing; a batch is all-or-nothing)"
                if scanner.held_batch
                else "incomplete or invalid data"
            )
            tally.add(
                lpath,
                scanner.pos,
                TORN_TAIL,
                f"{size - scanner.pos} bytes of {what} end the newest segment (a torn write; "
                "cut when the queue is next opened, or by --repair)",
            )
        else:
            tally.add(
                lpath,
                scanner.pos,
                CORRUPT_TAIL,
                f"{size - scanner.pos} bytes at the end of a sealed segment hold no valid entry; "
                "readers skip them",
            )
    _check_index(
        idx_path(os.path.dirname(lpath), first_id),
        index,
        matched,
        regions,
        count,
        last_offset,
        newest,
        tally,
        _Rebuild(queue_dir, first_id, sealed=not newest),
    )
    return prev_id if count else 0


def _check_index(
    ipath: str,
    index: tuple[list[IndexEntry], bool] | DecodeError | None,
    matched: dict[int, tuple[int, int]],
    regions: list[CorruptRegion],
    count: int,
    last_offset: int,
    newest: bool,
    tally: _Tally,
    rebuild: _Rebuild,
) -> None:
    if index is None:
        tally.add(ipath, None, INDEX, "missing (rebuilt from the log by --repair)")
        tally.rebuilds.append(rebuild)
        return
    tally.index_files += 1
    if isinstance(index, DecodeError):
        tally.add(ipath, index.pos, INDEX, f"unreadable: {index}")
        tally.rebuilds.append(rebuild)
        return
    points, sealed = index
    found: list[Problem] = []

    def bad(offset: int | None, message: str) -> None:
        found.append(Problem(ipath, offset, INDEX, message))

    if not newest and not sealed and count:
        # (an empty older segment, left by a crash mid-rotation, is dropped on open)
        bad(None, "not sealed, although a newer segment exists")
    wrong = []
    for i, point in enumerate(points):
        entry = matched.get(point.offset)
        if entry == (point.id, point.timestamp) or _in_regions(point.offset, regions):
            continue  # a point at a damaged entry: the log is to blame, reported there
        wrong.append((i, point, entry))
    if wrong:
        i, point, entry = wrong[0]
        what = (
            "no entry starts there"
            if entry is None
            else f"the entry there is id {entry[0]} at time {entry[1]}"
        )
        more = f" ({len(wrong) - 1} more points are wrong too)" if len(wrong) > 1 else ""
        bad(
            12 + 24 * i,
            f"point {i} says id {point.id} starts at log offset {point.offset}, but {what}{more}",
        )
    if count and not _in_regions(0, regions) and (not points or points[0].offset != 0):
        bad(None, "does not start with a point for the segment's first entry (offset 0)")
    if sealed and count and points:
        last = points[-1]
        if last.offset != last_offset and not _in_regions(last.offset, regions):
            bad(
                12 + 24 * (len(points) - 1),
                f"a sealed index must end with the segment's last entry (offset {last_offset}), "
                f"but its last point is at offset {last.offset}",
            )
    if found:
        tally.problems.extend(found)
        tally.rebuilds.append(rebuild)


def _check_readers(queue_dir: str, tally: _Tally) -> None:
    for name in list_reader_names(queue_dir):
        path = reader_state_path(queue_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        tally.reader_files += 1
        _check_journal(path, data, tally)


def _check_journal(path: str, data: bytes, tally: _Tally) -> None:
    """Report every problem of one reader journal (the queue's own replay rules)."""
    seen = 0  # records and damaged places met so far

    def damaged(offset: int, resume: int, problem: str) -> bool:
        nonlocal seen
        seen += 1
        after = "with valid records after it" if resume >= 0 else "too damaged to read past"
        tally.add(
            path,
            offset,
            READER_STATE,
            f"{problem}, {after}: the queue refuses to open; restore the file, or delete it "
            "to restart this reader from the oldest message",
        )
        return True

    try:
        records = journal_records(data, path, on_damage=damaged)
    except CorruptionError as exc:
        tally.add(path, 0, READER_STATE, f"bad file header ({exc}); the queue refuses to open")
        return
    for kind, _, _, offset in records:
        if not seen and kind is not StateRecordType.CHECKPOINT:
            tally.add(path, offset, READER_STATE, "the journal does not start with a CHECKPOINT")
        seen += 1
    if records.end < len(data):
        tally.add(
            path,
            records.end,
            READER_STATE_TAIL,
            f"{len(data) - records.end} bytes of a torn last record (cut when the queue is "
            "next opened, or by --repair)",
        )


# ---------------------------------------------------------------------- repair


class _Collect(logging.Handler):
    """Keeps the ``ledgerq`` logger's warnings during a repair (what recovery did)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.messages.append(message.removeprefix("ledgerq: "))


def repair(
    path: str | os.PathLike[str], *, on_progress: ProgressCallback | None = None
) -> RepairReport:
    """Repair what can be repaired without losing a valid entry; verify before and after.

    Takes the queue's lock (raises :class:`QueueLockedError` when it is open
    elsewhere).  Opening the queue runs its recovery: the torn tail of the newest
    segment and of reader journals is cut, the index of a sealed segment that fails
    its check is rebuilt.  Indexes still wrong after that are rebuilt from their logs
    (atomically, durably).  Corrupt entries inside a log are left in place: readers
    skip them, and the report after the repair still lists them.  A step that cannot
    run (a read-only file system, a full disk) is listed in the report's
    ``not_done``, never passed over: the report is then not of a repaired queue.
    """
    root = os.fspath(path)
    before = verify(root, on_progress=on_progress)
    actions: list[str] = []
    not_done: list[str] = []
    collect = _Collect()
    logger.addHandler(collect)
    try:
        queue = open_path(root)  # with its stored options: a repair must not change them
        queue.close()
        actions.append("opened and closed the queue (its recovery ran)")
    except QueueLockedError:
        raise
    except (LedgerQError, OSError) as exc:
        not_done.append(f"could not open the queue, so its recovery did not run: {exc}")
    finally:
        logger.removeHandler(collect)
    actions.extend(f"recovery: {message}" for message in collect.messages)
    tally = _Tally()
    for queue_dir in _queue_dirs(root):
        _check_queue(queue_dir, tally)
    for rebuild in tally.rebuilds:
        where = idx_path(os.path.join(rebuild.queue_dir, SEGMENTS_DIR), rebuild.first_id)
        try:
            lock = DirLock(rebuild.queue_dir)
        except QueueLockedError:
            raise
        except (LedgerQError, OSError) as exc:
            not_done.append(f"could not rebuild {where}: {exc}")
            continue
        try:
            points = _rebuild_index(rebuild)
        except (LedgerQError, OSError) as exc:
            not_done.append(f"could not rebuild {where}: {exc}")
            continue
        finally:
            lock.release()
        actions.append(f"rebuilt {where} from its log ({points} points)")
    after = verify(root)
    return RepairReport(before, after, tuple(actions), tuple(not_done))


def _rebuild_index(rebuild: _Rebuild) -> int:
    """Write the index of one segment from a scan of its log; return its number of points."""
    seg_dir = os.path.join(rebuild.queue_dir, SEGMENTS_DIR)
    stored = stored_options(rebuild.queue_dir).get("index_interval")
    interval = stored if isinstance(stored, int) and stored > 0 else Options().index_interval
    fd = os.open(log_path(seg_dir, rebuild.first_id), os.O_RDONLY)
    try:
        scanner = EntryScanner(fd, 0, os.fstat(fd).st_size, after_id=rebuild.first_id - 1)
        points: list[IndexEntry] = []
        last: IndexEntry | None = None
        while (entry := scanner.next()) is not None:
            last = IndexEntry(entry.id, entry.timestamp, scanner.pos - entry.size)
            if not points or last.offset - points[-1].offset >= interval:
                points.append(last)
    finally:
        os.close(fd)
    if rebuild.sealed and last is not None and points[-1] != last:
        points.append(last)  # a sealed index ends with the segment's last entry
    write_index(idx_path(seg_dir, rebuild.first_id), points, sealed=rebuild.sealed)
    return len(points)


# ---------------------------------------------------------------------- the log walk


def iter_messages(path: str | os.PathLike[str], from_id: int = 1) -> Iterator[Message]:
    """Yield every message retained in the segments of ``path`` with id >= ``from_id``.

    A log view, read without the lock: acked and expired messages that are still in a
    segment are included, and each message is what every view yields
    (``ledgerq.segment.readonly.view_message``: ``attempts`` is 0, as with
    ``ledgerq.follow``).  Corrupt entries are skipped and logged; the walk ends at the
    end of the newest segment (an append in flight is not read).
    """
    seg_dir = os.path.join(os.fspath(path), SEGMENTS_DIR)
    ids = list_segment_ids(seg_dir)
    for position, first_id in enumerate(ids):
        if position + 1 < len(ids) and ids[position + 1] <= from_id:
            continue  # every id of this segment is below from_id
        try:
            seg = SegmentTail(seg_dir, first_id)
        except FileNotFoundError:
            continue  # deleted by retention while we walked
        try:
            start, after = seg.start_for(from_id)
            scanner = EntryScanner(
                seg.fd, start, seg.size, after_id=after, boundaries=seg.boundaries
            )
            while (entry := scanner.next()) is not None:
                if entry.id < from_id:
                    continue
                message = view_message(entry, seg.path)
                if message is not None:
                    yield message
            for region in scanner.corrupt:
                log_skipped(seg.path, region.start, region.stop)
        finally:
            seg.close()


# ---------------------------------------------------------------------- creating a reader


def create_reader(queue: Queue, name: str, *, head: int, done: Iterable[int] = ()) -> Reader:
    """Create the reader ``name`` of the open ``queue`` at a given position and return it.

    Every message below ``head`` counts as done for it, and so does every id in
    ``done``; it delivers the others from ``head`` on.  This is how an importer or a
    migration gives a reader the state it had elsewhere (``ledgerq import-kestrel``
    creates a Kestrel reader's twin with it).  ``head`` runs from 1 to the queue's
    next id (``queue.stats().next_id``: a reader at the tail); each ``done`` id lies
    above ``head`` and below the next id.  A ``head`` below the oldest retained
    message starts there.

    Durable when it returns: the reader's state file is written, fsynced and renamed
    into place, and its directory fsynced.  Raises ``ValueError`` when the reader
    exists already (its state is never replaced), for an invalid name and for an id
    out of bounds; ``TypeError`` for an id that is not an int; ``QueueClosedError``
    on a closed queue.
    """
    return queue._create_reader(name, head, done)
