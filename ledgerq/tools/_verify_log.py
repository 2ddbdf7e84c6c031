"""One segment's log and its sparse index checked, entry by entry, for ``verify``."""

from __future__ import annotations

import os

from ledgerq.format.entry import EntryFlags
from ledgerq.format.errors import DecodeError
from ledgerq.format.index import IndexEntry
from ledgerq.segment.layout import SegmentFile
from ledgerq.segment.meta import DELIVER_AT_VERSION
from ledgerq.segment.naming import idx_path
from ledgerq.segment.scanner import CorruptRegion, TailScanner
from ledgerq.tools._verify_report import (
    CORRUPT_ENTRY,
    CORRUPT_TAIL,
    ID_ORDER,
    INDEX,
    META,
    TORN_TAIL,
    UNSEALED,
    IndexRebuild,
    Problem,
    Tally,
)

_PROGRESS_STEP = 1 << 20  # report progress about once per MiB of log
_SCHEDULED_FLAGS = int(EntryFlags.HAS_DELIVER_AT | EntryFlags.HAS_GROUP)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)


def check_log(
    fd: int,
    lpath: str,
    f: SegmentFile,
    newest: bool,
    index: tuple[list[IndexEntry], bool] | DecodeError | None,
    tally: Tally,
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
        IndexRebuild(queue_dir, f.name_id, first_id, sealed=not newest),
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
    tally: Tally,
    rebuild: IndexRebuild,
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


def _in_regions(offset: int, regions: list[CorruptRegion]) -> bool:
    return any(r.start <= offset < r.stop for r in regions)
