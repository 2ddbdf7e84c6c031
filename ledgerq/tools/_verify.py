"""``verify``: every file of a queue checked, read without its lock, nothing written.

It reads every byte a queue keeps - the CRC of every entry in every segment, every
sparse index against its log (``_verify_log.py``), every reader's state journal and
``meta.json`` - and reports each problem with its file and byte offset, and checks the
segment files against each other by their contents (``segment.layout``): a misnamed
file, a copy or overlap, and ids missing between segments that the queue did not leave
out on purpose.  It takes no lock and writes nothing, so it can run beside the process
that owns the queue (then a torn tail at the very end of the newest segment or of a
journal may be a write still in flight; verify a closed queue for an exact answer).
The dead-letter queue in ``dlq/`` is a queue of the same format and is checked the
same way.
"""

from __future__ import annotations

import json
import os

from ledgerq.format.errors import DecodeError
from ledgerq.format.index import IndexEntry
from ledgerq.format.reader_state import StateRecordType
from ledgerq.segment.encryption import stored_block
from ledgerq.segment.index_file import load_index
from ledgerq.segment.layout import (
    DAMAGED_DIR,
    Layout,
    SegmentFile,
    arrange,
    content_first_id,
    newest_first,
    subtract_ranges,
)
from ledgerq.segment.meta import (
    DELIVER_AT_VERSION,
    NEWEST_VERSION,
    holds_queue_data,
)
from ledgerq.segment.naming import (
    META_NAME,
    SEGMENTS_DIR,
    idx_path,
    list_segment_ids,
    log_path,
    reader_state_path,
)
from ledgerq.segment.readonly import (
    find_queues,
    list_reader_names,
    queue_dir_problem,
    segment_ids,
)
from ledgerq.segment.readonly_state import has_valid_header, journal_records
from ledgerq.tools._verify_log import check_log
from ledgerq.tools._verify_report import (
    GAP,
    META,
    MISNAMED,
    OVERLAP,
    READER_STATE,
    READER_STATE_TAIL,
    MetaFacts,
    ProgressCallback,
    Tally,
    VerifyReport,
)


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
    tally = Tally(on_progress=on_progress)
    queues = queue_dirs(root)
    tally.total = sum(_planned_bytes(q) for q in queues)
    for queue_dir in queues:
        check_queue(queue_dir, tally)
    if on_progress is not None:
        on_progress(tally.total, tally.total)
    return _report(root, tally)


def _report(root: str, tally: Tally) -> VerifyReport:
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


def queue_dirs(root: str) -> list[str]:
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


def check_queue(queue_dir: str, tally: Tally) -> None:
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


def _check_meta(queue_dir: str, tally: Tally) -> MetaFacts | None:
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
    return MetaFacts(
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


def _check_segments(queue_dir: str, tally: Tally, meta: MetaFacts | None) -> int:
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
            f.last_id = check_log(
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
    seg_dir: str, layout: Layout, meta: MetaFacts | None, tally: Tally
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


def _check_readers(queue_dir: str, tally: Tally) -> None:
    for name in list_reader_names(queue_dir):
        path = reader_state_path(queue_dir, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        tally.reader_files += 1
        _check_journal(path, data, tally)


def _check_journal(path: str, data: bytes, tally: Tally) -> None:
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
