"""Operator tools over the files of a queue: ``verify``, ``repair`` and a log walk.

:func:`verify` reads every byte a queue keeps - the CRC of every entry in every
segment, every sparse index against its log, every reader's state journal and
``meta.json`` - and reports each problem with its file and byte offset, and checks the
segment files against each other by their contents (``segment.layout``): a misnamed
file, a copy or overlap, and ids missing between segments that the queue did not leave
out on purpose.  It takes no
lock and writes nothing, so it can run beside the process that owns the queue (then a
torn tail at the very end of the newest segment or of a journal may be a write still in
flight; verify a closed queue for an exact answer).  The dead-letter queue in ``dlq/``
is a queue of the same format and is checked the same way.

:func:`repair` is the only function here that writes.  It takes the queue's lock by
opening it with :func:`ledgerq.open` - whose recovery cuts a torn tail of the newest
segment and of reader journals, and rebuilds the index of a sealed segment that fails
its check - then rebuilds, under the lock, any index that is still wrong, renames a
misnamed segment file to its content's name, moves a copy into ``segments/damaged/``,
records ids no file holds any more as known lost, and verifies again.  It never deletes
a valid entry: a corrupt entry in the middle of a log stays (and stays reported);
readers skip it.

:func:`iter_messages` walks the retained log read-only (``ledgerq dump``).

:func:`read_key_file` and :func:`key_from_bytes` read an encryption key the way every
way in takes one from a file (``--key-file``, ``serve --encryption-key-file``, the
Celery transport's ``encryption_key_file``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import string
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from ledgerq._api import open as open_path
from ledgerq._errors import ConfigError, LedgerQError, QueueLockedError
from ledgerq._options import Options
from ledgerq._queue import Queue
from ledgerq._rekey import rekey
from ledgerq._types import Message, PeriodicJob
from ledgerq.core.journal import ReaderJournal  # repair only: it writes
from ledgerq.core.reader_handle import Reader
from ledgerq.features.periodic import read_jobs
from ledgerq.format.entry import Entry, EntryFlags
from ledgerq.format.errors import CorruptRecord, DecodeError
from ledgerq.format.index import IndexEntry
from ledgerq.format.reader_state import Checkpoint, StateRecordType
from ledgerq.segment.encryption import stored_block
from ledgerq.segment.index_file import (
    load_index,
    write_index,  # repair only: it writes
)
from ledgerq.segment.layout import (
    DAMAGED_DIR,
    Layout,
    SegmentFile,
    arrange,
    content_first_id,
    newest_first,
    subtract_ranges,
)
from ledgerq.segment.lock import DirLock  # repair only: it writes
from ledgerq.segment.meta import (  # repair only: it writes
    DELIVER_AT_VERSION,
    ID_BLOCK,
    NEWEST_VERSION,
    DamagedMetaError,
    MetaStore,
    OptionsStore,
    holds_queue_data,
)
from ledgerq.segment.meta_rebuild import rebuild_meta  # repair only: it writes
from ledgerq.segment.naming import (
    DLQ_DIR,
    META_NAME,
    SEGMENTS_DIR,
    idx_path,
    list_segment_ids,
    log_path,
    reader_state_path,
)
from ledgerq.segment.readonly import (
    SegmentDirectory,
    SegmentTail,
    find_queues,
    list_reader_names,
    queue_dir_problem,
    replay_reader,
    segment_ids,
    stored_options,
    view_message,
    view_sealer,
)
from ledgerq.segment.readonly_state import has_valid_header, journal_records
from ledgerq.segment.readonly_tail import log_skipped
from ledgerq.segment.scanner import CorruptRegion, EntryScanner, TailScanner
from ledgerq.segment.setaside import move_to_damaged, rename_segment  # repair only

__all__ = [
    "CORRUPT_ENTRY",
    "CORRUPT_TAIL",
    "DEAD_LETTER_HEADERS",
    "GAP",
    "ID_ORDER",
    "INDEX",
    "KEY_SIZE",
    "META",
    "MISNAMED",
    "OVERLAP",
    "READER_STATE",
    "READER_STATE_TAIL",
    "TORN_TAIL",
    "UNSEALED",
    "DeadLetterFilter",
    "KeyFileError",
    "Problem",
    "RepairReport",
    "VerifyReport",
    "create_reader",
    "has_dlq",
    "iter_messages",
    "key_from_bytes",
    "not_a_queue",
    "paced",
    "parse_header_condition",
    "periodic_jobs",
    "read_key_file",
    "rekey",
    "repair",
    "requeue_dead_letters",
    "verify",
]

logger = logging.getLogger("ledgerq")


def periodic_jobs(path: str | os.PathLike[str]) -> list[PeriodicJob]:
    """The periodic jobs of the queue at ``path`` (name, schedule, next and last run),
    read without its lock: it works beside the processes that have the queue open.

    A snapshot of ``features/periodic.log``; a tick being fired right now may show as
    fired.  On an encrypted queue the payload and headers of each job are not read
    (``b""``, ``{}``): they are sealed with the queue's key.  ``[]`` for a queue
    without periodic jobs.
    """
    return read_jobs(os.fspath(path))


# Problem kinds: stable strings (they appear in ``ledgerq verify --json``).
META = "meta"  # meta.json missing, unreadable, invalid or inconsistent with the log
CORRUPT_ENTRY = "corrupt-entry"  # bytes in a log that are not a valid entry, valid ones after
TORN_TAIL = "torn-tail"  # incomplete bytes at the end of the newest segment
CORRUPT_TAIL = "corrupt-tail"  # invalid bytes at the end of a sealed segment
ID_ORDER = "id-order"  # ids not consecutive inside a segment
MISNAMED = "misnamed"  # a segment file whose name is not its first entry's id
OVERLAP = "overlap"  # a segment file holding ids another one holds (a copy), set aside
GAP = "gap"  # ids missing between segments that the queue did not leave out on purpose
INDEX = "index"  # a sparse index missing, unreadable or not matching its log
READER_STATE = "reader-state"  # a reader journal the queue refuses to open
READER_STATE_TAIL = "reader-state-tail"  # a torn last record, cut when the queue opens
UNSEALED = "unsealed"  # an entry of an encrypted queue that is not sealed (forged, stripped)

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
    """An index that a repair should rebuild from its log (named ``name_id``, its first
    entry ``first_id``)."""

    queue_dir: str
    name_id: int
    first_id: int
    sealed: bool


@dataclass
class _MetaFacts:
    """What verify needs of a usable meta.json."""

    clean: bool
    next_id: int
    reserved_until: int
    gaps: list[list[int]]
    gaps_from: int | None
    known_lost: list[list[int]]
    version: int = 1


@dataclass
class _Tally:
    problems: list[Problem] = field(default_factory=list)
    rebuilds: list[_Rebuild] = field(default_factory=list)
    layouts: dict[str, tuple[Layout, list[tuple[int, int]]]] = field(default_factory=dict)
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
    last_id = _check_segments(queue_dir, tally, meta)
    if meta is not None and last_id:
        clean, next_id = meta.clean, meta.next_id
        if clean and next_id <= last_id:
            tally.add(
                os.path.join(queue_dir, META_NAME),
                None,
                META,
                f"next_id {next_id} is not above the last id in the log ({last_id}) although "
                "the queue was closed cleanly; meta.json is stale or belongs to another queue",
            )
    _check_readers(queue_dir, tally)


def _check_meta(queue_dir: str, tally: _Tally) -> _MetaFacts | None:
    """Check meta.json; return what verify needs of it when it is usable."""
    path = os.path.join(queue_dir, META_NAME)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if holds_queue_data(queue_dir):
            tally.add(path, None, META, f"missing, though the queue holds data; {_REBUILDS}")
        else:
            tally.add(
                path, None, META, "missing: the queue was never opened to its end (open writes it)"
            )
        return None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        tally.add(path, None, META, f"not valid JSON ({exc or 'empty'}); {_REBUILDS}")
        return None
    except RecursionError:
        tally.add(path, None, META, f"not valid JSON (nested too deep); {_REBUILDS}")
        return None
    if not isinstance(value, dict):
        tally.add(path, None, META, f"not a JSON object; {_REBUILDS}")
        return None
    if value.get("format") != "ledgerq":
        tally.add(
            path, None, META, f"format is {value.get('format')!r}, not 'ledgerq'; {_REBUILDS}"
        )
        return None
    version = value.get("version")
    if type(version) is not int or version < 1:
        tally.add(path, None, META, f"version {version!r} is not a positive integer")
        return None
    if version > NEWEST_VERSION:
        tally.add(
            path,
            None,
            META,
            f"format version {version} is newer than this ledgerq reads ({NEWEST_VERSION})",
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
    gaps_from = value.get("gaps_from")
    return _MetaFacts(
        value.get("clean") is True,
        next_id,
        int(value.get("reserved_until", next_id)),
        _int_pairs(value.get("gaps")),
        gaps_from if type(gaps_from) is int else None,
        _int_pairs(value.get("known_lost")),
        version,
    )


_REBUILDS = (
    "--repair rebuilds it from the segments, the reader journals and options.json (and says "
    "what it cannot know)"
)


def _int_pairs(value: object) -> list[list[int]]:
    if not isinstance(value, list):
        return []
    return [
        [r[0], r[1]]
        for r in value
        if isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
    ]


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


def _check_segments(queue_dir: str, tally: _Tally, meta: _MetaFacts | None) -> int:
    """Check every segment log and index, and the order of the segments (by content, as
    every reader takes them); return the last valid id found (0: none)."""
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    if not os.path.isdir(seg_dir):
        tally.add(seg_dir, None, META, "the segments directory is missing")
        return 0
    files = []
    for name_id in list_segment_ids(seg_dir):
        try:
            fd = os.open(log_path(seg_dir, name_id), os.O_RDONLY)
        except FileNotFoundError:
            continue  # deleted by retention while we looked
        try:
            size = os.fstat(fd).st_size
            first_id = content_first_id(fd, size, name_id) if size else name_id
        finally:
            os.close(fd)
        files.append(SegmentFile(name_id, first_id, size))
    newest = max(files, key=newest_first, default=None)
    # Every entry of an encrypted queue is sealed: one that is not is seen without the key.
    encrypted = bool(stored_block(queue_dir))
    for f in files:
        lpath = log_path(seg_dir, f.name_id)
        # Read the index before the log's size: an owner appends to the log before the
        # index, so every point read refers to bytes that exist when the size is taken.
        index = _read_index(idx_path(seg_dir, f.name_id))
        try:
            fd = os.open(lpath, os.O_RDONLY)
        except FileNotFoundError:
            continue  # deleted by retention while we looked
        try:
            # Version 1 says no entry is delayed or grouped: an older ledgerq reads it.
            version_1 = meta is not None and meta.version < DELIVER_AT_VERSION
            f.last_id = _check_log(
                fd,
                lpath,
                f,
                f is newest,
                index,
                tally,
                queue_dir,
                version_1=version_1,
                encrypted=encrypted,
            )
        finally:
            os.close(fd)
        tally.segments += 1
    layout = arrange(files)
    unexplained = _check_layout(seg_dir, layout, meta, tally)
    tally.layouts[queue_dir] = (layout, unexplained)
    return max((f.last_id for f in layout.used), default=0)


def _check_layout(
    seg_dir: str, layout: Layout, meta: _MetaFacts | None, tally: _Tally
) -> list[tuple[int, int]]:
    """Report misnamed files, copies and overlaps, and the gaps no record explains
    (returned: what a repair records as known lost)."""
    damaged = os.path.join(seg_dir, DAMAGED_DIR)
    for f in layout.misnamed:
        tally.add(
            os.path.join(seg_dir, f.file_name),
            None,
            MISNAMED,
            f"holds ids {f.ids()}, not ids from {f.name_id} as its name says (renamed, swapped "
            f"or copied by hand?); readers take it by its content; --repair renames it to "
            f"{f.first_id:020d}.log",
        )
    for f, holder in layout.set_aside:
        tally.add(
            os.path.join(seg_dir, f.file_name),
            None,
            OVERLAP,
            f"holds ids {f.ids()}, which {holder.file_name} holds already (a copy, or another "
            f"history); readers skip it; --repair moves it into {damaged}/",
        )
    for lo, hi, holder in layout.held_aside:
        tally.add(
            os.path.join(seg_dir, holder.file_name),
            None,
            OVERLAP,
            f"ids {lo}-{hi} are only in this set-aside file (it starts inside another "
            "segment's ids): readers skip them; --repair cannot split the file - move the "
            "overlapping segment away by hand once its messages are consumed",
        )
    if meta is None:
        return []  # which gaps were made on purpose is in meta.json (reported above)
    explained = [*meta.gaps, *meta.known_lost, *((a, b) for a, b, _ in layout.held_aside)]
    floor = meta.gaps_from if meta.gaps_from is not None else meta.next_id
    unexplained = []
    for first, last, before, after in layout.gaps:
        for lo, hi in subtract_ranges(max(first, floor), last, explained):
            unexplained.append((lo, hi))
            tally.add(
                os.path.join(seg_dir, after.file_name),
                None,
                GAP,
                f"ids {lo}-{hi} are missing between {before.file_name} and {after.file_name} "
                "(a segment file deleted or moved?); --repair records them as known lost",
            )
    return unexplained


_SCHEDULED_FLAGS = int(EntryFlags.HAS_DELIVER_AT | EntryFlags.HAS_GROUP)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)


def _check_log(
    fd: int,
    lpath: str,
    f: SegmentFile,
    newest: bool,
    index: tuple[list[IndexEntry], bool] | DecodeError | None,
    tally: _Tally,
    queue_dir: str,
    *,
    version_1: bool = False,
    encrypted: bool = False,
) -> int:
    size = os.fstat(fd).st_size
    first_id = f.first_id
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
        if version_1 and entry.flags & _SCHEDULED_FLAGS:
            version_1 = False  # reported once per segment
            tally.add(
                lpath,
                offset,
                META,
                f"message {entry.id} is delayed or grouped but meta.json says version 1: a "
                "ledgerq from before delays and groups would skip it as damaged; set "
                f'"version": {DELIVER_AT_VERSION} in meta.json (this ledgerq wrote it so)',
            )
        if encrypted and not entry.flags & _ENCRYPTED:
            tally.add(lpath, offset, UNSEALED, _unsealed_message(entry.id))
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
                "consecutive from its first entry's)",
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
        idx_path(os.path.dirname(lpath), f.name_id),
        index,
        matched,
        regions,
        count,
        last_offset,
        newest,
        tally,
        _Rebuild(queue_dir, f.name_id, first_id, sealed=not newest),
    )
    return prev_id if count else 0


def _unsealed_message(message_id: int) -> str:
    return (
        f"message {message_id} is not sealed, but the queue is encrypted: it was written "
        "without the key (a forgery) or its seal was stripped; readers skip it as corrupt "
        "and never deliver it (not repaired: nothing valid is deleted)"
    )


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

    if not has_valid_header(data):
        restart = (
            "; --repair restarts this reader at the oldest retained message (what it had "
            "finished is delivered again)"
            if has_valid_header(data) is False
            else ""
        )
        what = "empty" if not data else "no valid file header"
        tally.add(path, 0, READER_STATE, f"{what}: the queue refuses to open{restart}")
        return
    records = journal_records(data, path, on_damage=damaged)
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
    (atomically, durably).  A misnamed segment file is renamed to the id of its first
    entry, a copy (whose ids another file holds) is moved into ``segments/damaged/``,
    and ids missing between segments are recorded in ``meta.json`` as known lost (no
    longer reported; counted in ``stats().lost``).  Corrupt entries inside a log are
    left in place: readers skip them, and the report after the repair still lists them.
    A step that cannot run (a read-only file system, a full disk) is listed in the
    report's ``not_done``, never passed over: the report is then not of a repaired queue.
    """
    root = os.fspath(path)
    before = verify(root, on_progress=on_progress)
    actions: list[str] = []
    not_done: list[str] = []
    for queue_dir in _queue_dirs(root):
        if queue_dir_problem(queue_dir) is None:
            try:
                actions.extend(_repair_metadata(queue_dir))
            except (LedgerQError, OSError) as exc:
                not_done.append(f"could not repair the metadata of {queue_dir}: {exc}")
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
        where = idx_path(os.path.join(rebuild.queue_dir, SEGMENTS_DIR), rebuild.name_id)
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
    for queue_dir, (layout, unexplained) in tally.layouts.items():
        if layout.misnamed or layout.set_aside or unexplained:
            try:
                lock = DirLock(queue_dir)
            except QueueLockedError:
                raise
            except (LedgerQError, OSError) as exc:
                not_done.append(f"could not repair the segment files of {queue_dir}: {exc}")
                continue
            try:
                actions.extend(_repair_layout(queue_dir, layout, unexplained))
            except (LedgerQError, OSError) as exc:
                not_done.append(f"could not repair the segment files of {queue_dir}: {exc}")
            finally:
                lock.release()
    after = verify(root)
    return RepairReport(before, after, tuple(actions), tuple(not_done))


def _repair_metadata(queue_dir: str) -> list[str]:
    """Rebuild what the queue refuses to open without (under its lock): a missing or
    damaged ``meta.json`` of a queue that holds data, and reader journals without a
    valid header (restarted at the oldest retained message)."""
    lock = DirLock(queue_dir)
    actions = []
    try:
        store = MetaStore(queue_dir)
        try:
            problem = None if store.exists() else "was missing"
            if problem is None:
                store.load()
        except DamagedMetaError as exc:
            problem = f"was damaged ({exc.reason})"
        if problem is not None and holds_queue_data(queue_dir):
            copy = OptionsStore(queue_dir).load()
            meta, notes = rebuild_meta(queue_dir, copy, margin=ID_BLOCK)
            store.save(meta)
            actions.append(f"rebuilt {store.path}, which {problem}: " + "; ".join(notes))
        for name in list_reader_names(queue_dir):
            path = reader_state_path(queue_dir, name)
            try:
                with open(path, "rb") as f:
                    data = f.read(64)
            except FileNotFoundError:
                continue
            if has_valid_header(data) is False:
                journal = ReaderJournal(path)
                try:
                    journal.rewrite(Checkpoint(1, [], [], {}))  # atomic, durable
                finally:
                    journal.close()
                actions.append(
                    f"restarted reader {name!r} at the oldest retained message: its state file "
                    f"{path} was {'empty' if not data else 'without a valid header'}, so which "
                    "messages it had finished is unknown - they are delivered to it again "
                    "(at-least-once), and its counters (acked, nacked, ...) restart at 0"
                )
    finally:
        lock.release()
    return actions


# Names a repair gives a misnamed file on its way to its right name (when that name is
# taken by another misnamed file - a swap): above every id (2^64 - 1 < 10^20 - 1), so
# never a new segment's name.  A crash mid-way leaves the file misnamed there, which
# every reader takes by its content; the next repair finishes the move.
_STAGING_NAME = 10**20 - 1


def _repair_layout(queue_dir: str, layout: Layout, unexplained: list[tuple[int, int]]) -> list[str]:
    """Move copies into ``segments/damaged/``, rename misnamed files to their content's
    name, and record ``unexplained`` gaps as known lost (the queue's lock held)."""
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    actions = []
    held = {f.name_id for _, _, f in layout.held_aside}
    for f, holder in layout.set_aside:
        if f.name_id in held:
            continue  # its later ids are nowhere else: left where it is (reported)
        where = move_to_damaged(seg_dir, f.name_id)
        actions.append(
            f"moved {f.file_name} (ids {f.ids()}, which {holder.file_name} holds) to {where}"
        )
    taken = {f.name_id for f in layout.used} | held
    staged: list[tuple[int, SegmentFile]] = []
    for f in layout.misnamed:
        if f.first_id not in taken:
            rename_segment(seg_dir, f.name_id, f.first_id)
            taken.discard(f.name_id)
            taken.add(f.first_id)
            actions.append(f"renamed {f.file_name} to {f.first_id:020d}.log (ids {f.ids()})")
            continue
        staging = _STAGING_NAME - len(staged)
        while staging in taken or os.path.exists(log_path(seg_dir, staging)):
            staging -= 1
        rename_segment(seg_dir, f.name_id, staging)
        taken.discard(f.name_id)
        taken.add(staging)
        staged.append((staging, f))
    for staging, f in staged:
        rename_segment(seg_dir, staging, f.first_id)
        actions.append(f"renamed {f.file_name} to {f.first_id:020d}.log (ids {f.ids()})")
    if unexplained:
        store = MetaStore(queue_dir)
        meta = store.load()
        for lo, hi in unexplained:
            if [lo, hi] not in meta.lost:
                # Not counted yet (the queue was not opened since): count it now.
                meta.lost.append([lo, hi])
                lost = replay_reader(queue_dir, "default").unfinished_in(lo, hi)
                meta.counters["lost"] = meta.counters.get("lost", 0) + lost
            meta.known_lost.append([lo, hi])
            actions.append(
                f"recorded ids {lo}-{hi} of {queue_dir} as known lost (no segment file holds "
                "them; restore it from a backup to get them back): no longer reported"
            )
        store.save(meta)
    return actions


def _rebuild_index(rebuild: _Rebuild) -> int:
    """Write the index of one segment from a scan of its log; return its number of points."""
    seg_dir = os.path.join(rebuild.queue_dir, SEGMENTS_DIR)
    stored = stored_options(rebuild.queue_dir).get("index_interval")
    interval = stored if isinstance(stored, int) and stored > 0 else Options().index_interval
    fd = os.open(log_path(seg_dir, rebuild.name_id), os.O_RDONLY)
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
    write_index(idx_path(seg_dir, rebuild.name_id), points, sealed=rebuild.sealed)
    return len(points)


# ---------------------------------------------------------------------- the log walk


def iter_messages(
    path: str | os.PathLike[str], from_id: int = 1, *, encryption_key: bytes | None = None
) -> Iterator[Message]:
    """Yield every message retained in the segments of ``path`` with id >= ``from_id``.

    A log view, read without the lock: acked and expired messages that are still in a
    segment are included, and each message is what every view yields
    (``ledgerq.segment.readonly.view_message``: ``attempts`` is 0, as with
    ``ledgerq.follow``).  Corrupt entries are skipped and logged; the walk ends at the
    end of the newest segment (an append in flight is not read).  An encrypted queue
    needs its ``encryption_key``: :class:`ConfigError` without it or with another.
    """
    sealer = view_sealer(os.fspath(path), encryption_key)
    for entry, segment_path in _iter_entries(path, from_id):
        message = view_message(entry, segment_path, sealer)
        if message is not None:
            yield message


def unauthentic_ids(path: str | os.PathLike[str], encryption_key: bytes) -> list[int]:
    """The ids of the sealed messages of ``path`` that fail authentication under the key.

    Read without the lock, as :func:`iter_messages`.  Raises :class:`ConfigError` when
    the key is not the queue's (or the queue is not encrypted).  Entries that are not
    sealed at all need no key to be found: :func:`verify` reports them (``unsealed``).
    """
    sealer = view_sealer(os.fspath(path), encryption_key)
    assert sealer is not None
    failed = []
    for entry, _ in _iter_entries(path, 1):
        if entry.flags & _ENCRYPTED:
            try:
                sealer.open(entry)
            except CorruptRecord:
                failed.append(entry.id)
    return failed


def _iter_entries(path: str | os.PathLike[str], from_id: int) -> Iterator[tuple[Entry, str]]:
    """The valid entries of ``path`` with id >= ``from_id``, with their segment's path."""
    seg_dir = os.path.join(os.fspath(path), SEGMENTS_DIR)
    files = SegmentDirectory(seg_dir).layout().used  # by content: as every reader orders them
    for position, f in enumerate(files):
        if position + 1 < len(files) and files[position + 1].first_id <= from_id:
            continue  # every id of this segment is below from_id
        try:
            seg = SegmentTail(seg_dir, f.first_id, f.name_id)
        except FileNotFoundError:
            continue  # deleted by retention while we walked
        try:
            start, after = seg.start_for(from_id)
            scanner = EntryScanner(
                seg.fd, start, seg.size, after_id=after, boundaries=seg.boundaries
            )
            while (entry := scanner.next()) is not None:
                if entry.id >= from_id:
                    yield entry, seg.path
            for region in scanner.corrupt:
                log_skipped(seg.path, region.start, region.stop)
        finally:
            seg.close()


# ---------------------------------------------------------------------- dead letters

# The headers the dead-letter feature writes on every message it moves (docs/dlq.md).
DEAD_LETTER_HEADERS = (
    "dlq.original_id",
    "dlq.retry_count",
    "dlq.failure_reason",
    "dlq.last_failure",
)


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead-lettered messages an operation picks: every condition given must hold.

    ``ledgerq dlq list|requeue|purge`` and the web console (``ledgerq ui``) choose
    with this one class, so a filter means the same in both.  Conditions:

    * ``reason``: the last failure reason (header ``dlq.failure_reason``) contains a
      match of this regular expression, ignoring case - or, with ``regex=False``,
      contains this text, ignoring case;
    * ``older_than``: the message was dead-lettered more than this many seconds ago
      (its timestamp in the dead-letter queue is when it arrived there);
    * ``headers``: the message has each of these headers with exactly this value;
    * ``attempts_at_least``: it failed at least this many deliveries (header
      ``dlq.retry_count``).

    An empty filter matches every message.  Raises ``ValueError`` for a reason that is
    not a valid regular expression, a negative or non-finite age and attempts below 0.
    """

    reason: str | None = None
    regex: bool = True
    older_than: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    attempts_at_least: int | None = None
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.reason is not None and self.reason != "":
            source = self.reason if self.regex else re.escape(self.reason)
            try:
                pattern = re.compile(source, re.IGNORECASE)
            except re.error as exc:
                raise ValueError(
                    f"the reason {self.reason!r} is not a valid regular expression: {exc}"
                ) from None
            object.__setattr__(self, "_pattern", pattern)
        if self.older_than is not None and not (
            math.isfinite(self.older_than) and self.older_than >= 0
        ):
            raise ValueError(f"older_than must be a number of seconds >= 0, got {self.older_than}")
        if self.attempts_at_least is not None and self.attempts_at_least < 0:
            raise ValueError(f"attempts_at_least must be >= 0, got {self.attempts_at_least}")
        object.__setattr__(self, "headers", tuple((str(k), str(v)) for k, v in self.headers))

    @property
    def is_empty(self) -> bool:
        """Whether it has no condition (it matches every message)."""
        return (
            self._pattern is None
            and self.older_than is None
            and not self.headers
            and self.attempts_at_least is None
        )

    def matches(self, message: Message, now_ns: int | None = None) -> bool:
        """Whether the dead-lettered ``message`` meets every condition.

        ``now_ns`` (ns since the epoch, default now) is the time ages are measured
        from: pass one value for a whole listing, so that it does not drift.
        """
        headers = message.headers
        if self._pattern is not None and not self._pattern.search(
            headers.get("dlq.failure_reason", "")
        ):
            return False
        for key, value in self.headers:
            if headers.get(key) != value:
                return False
        if self.attempts_at_least is not None:
            count = headers.get("dlq.retry_count", "")
            if not (count.isdigit() and int(count) >= self.attempts_at_least):
                return False
        if self.older_than is not None:
            now = time.time_ns() if now_ns is None else now_ns
            if now - message.timestamp <= self.older_than * 1e9:
                return False
        return True

    def describe(self) -> str:
        """The conditions in words (``"reason matching /timeout/, older than 600s"``)."""
        parts = []
        if self._pattern is not None:
            shown = f"/{self.reason}/" if self.regex else repr(self.reason)
            parts.append(f"reason {'matching' if self.regex else 'containing'} {shown}")
        if self.older_than is not None:
            parts.append(f"dead-lettered more than {self.older_than:g}s ago")
        parts.extend(f"header {key}={value}" for key, value in self.headers)
        if self.attempts_at_least is not None:
            parts.append(f"at least {self.attempts_at_least} failed deliveries")
        return ", ".join(parts) if parts else "every message"


def parse_header_condition(text: str) -> tuple[str, str]:
    """``"K=V"`` as the header condition ``(K, V)``; ``ValueError`` without a ``=`` or a key."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not a header condition; write KEY=VALUE")
    return key, value


def requeue_dead_letters(queue: Queue, ids: Iterable[int] | None, *, delay: float | None) -> int:
    """``queue.requeue_dlq(ids)``, the messages first delivered no earlier than ``delay``
    seconds from now when ``delay`` is given; return how many moved."""
    return queue.requeue_dlq(ids, delay=delay)


def paced(
    ids: Sequence[int],
    rate: float | None,
    apply: Callable[[list[int]], int],
    *,
    should_stop: Callable[[], bool] | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Call ``apply`` on consecutive slices of ``ids`` at most ``rate`` ids per second.

    Returns the sum of what ``apply`` returned.  Without a rate, one call takes them
    all.  With one, each slice holds at most a tenth of a second's worth (at least one
    id) and starts no earlier than its share of the time since the first one - the
    schedule is kept against the clock, so a slow ``apply`` does not add up to a
    lower rate, and a burst never exceeds one slice.  ``should_stop`` is asked before
    each slice after the first; True ends the run early (``ledgerq ui``'s cancel).
    """
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a number of messages per second > 0, got {rate}")
    chosen = list(ids)
    if not chosen:
        return 0
    if rate is None:
        return apply(chosen)
    step = max(1, min(len(chosen), int(rate / 10)))
    start = monotonic()
    done = 0
    for offset in range(0, len(chosen), step):
        if offset:
            if should_stop is not None and should_stop():
                break
            wait = start + offset / rate - monotonic()
            if wait > 0:
                sleep(wait)
        done += apply(chosen[offset : offset + step])
    return done


# ---------------------------------------------------------------------- key files

KEY_SIZE = 32  # bytes of an encryption key (AES-256)
_HEX_DIGITS = frozenset(string.hexdigits.encode())


class KeyFileError(ConfigError):
    """A key file that cannot be read or holds no key; the message names the file,
    never its content."""


def key_from_bytes(data: bytes) -> bytes | None:
    """The key ``data`` holds - 32 raw bytes, or 64 hexadecimal digits (surrounding
    whitespace and a trailing newline allowed) - or None when it holds neither."""
    if len(data) == KEY_SIZE:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_SIZE and set(text) <= _HEX_DIGITS:
        return bytes.fromhex(text.decode("ascii"))
    return None


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """Return the key held by the file at ``path`` (32 raw bytes or 64 hex digits).

    Raises :class:`KeyFileError` naming the file (never its content) when it cannot be
    read or holds anything else.
    """
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise KeyFileError(f"key file {os.fspath(path)} is not a regular file")
            data = f.read(4096)
    except OSError as exc:
        raise KeyFileError(
            f"cannot read key file {os.fspath(path)}: {exc.strerror or exc}"
        ) from None
    key = key_from_bytes(data)
    if key is None:
        raise KeyFileError(
            f"key file {os.fspath(path)} must hold a 32-byte key: 32 raw bytes, or 64 "
            f"hexadecimal digits (it holds {len(data)} bytes)"
        )
    return key


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
