"""Where the messages are: queue directories under a path, their segments, their readers.

Everything here runs on the Spark driver side (in the Python planner process) and
only looks: it lists directories, reads ``meta.json``, sparse index files and reader
journals, and takes no lock, so it can run beside the process that owns a queue.  The
rules of such reading (what a queue directory is, how an index or a journal is read)
are ``ledgerq.segment.readonly``'s; this module adds what the planner wants of them.
No pyspark or pyarrow here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ledgerq.segment.index_file import read_index_ends
from ledgerq.segment.naming import SEGMENTS_DIR, idx_path
from ledgerq.segment.readonly import SegmentDirectory, is_cleanly_closed, replay_reader

__all__ = [
    "ReaderSnapshot",
    "SegmentInfo",
    "list_segments",
    "read_reader_state",
    "timestamps_non_decreasing",
]


# ---------------------------------------------------------------------- segments


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the planner knows of one segment without reading its log.

    ``first_id`` is its first entry's id; ``name_id`` the id in its file name, which
    differs for a misnamed file (renamed or swapped by hand: read by its content, as
    every reader does - ``segment.layout``).  ``next_first_id`` is the first id of the
    next segment (ids of this one are below it), None for the newest segment.
    ``first_ts``/``last_ts`` are the timestamps of the first and (sealed index) last
    entries, when the index says so.
    """

    first_id: int
    next_first_id: int | None
    size: int
    first_ts: int | None
    last_ts: int | None
    name_id: int | None = None

    @property
    def is_newest(self) -> bool:
        """Whether this is the queue's newest (active) segment."""
        return self.next_first_id is None


def list_segments(queue_path: str) -> list[SegmentInfo]:
    """The segments of a queue, oldest first (an empty list if it has none).

    Reads the header of each log's first entry and two points of each sparse index
    (its first and its last), never the whole file: planning stays fast however large
    the segments are.  Segments are in the order of their contents; a copy of another
    segment's ids is left out (``segment.layout``, the rule every reader applies).
    """
    seg_dir = os.path.join(queue_path, SEGMENTS_DIR)
    try:
        files = SegmentDirectory(seg_dir, last_ids=True).layout().used
    except FileNotFoundError:
        return []
    infos = []
    for position, f in enumerate(files):
        first, last = read_index_ends(idx_path(seg_dir, f.name_id))
        if first is not None and (first.id, first.offset) != (f.first_id, 0):
            first = last = None  # not this log's index
        next_first = files[position + 1].first_id if position + 1 < len(files) else None
        infos.append(
            SegmentInfo(
                f.first_id,
                next_first,
                f.size if f.size >= 0 else os.stat(os.path.join(seg_dir, f.file_name)).st_size,
                first.timestamp if first is not None else None,
                last.timestamp if last is not None else None,
                f.name_id if f.is_misnamed else None,
            )
        )
    return infos


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
    state = replay_reader(queue_path, name)
    head = state.head
    leased = () if is_cleanly_closed(queue_path) else state.leased
    return ReaderSnapshot(
        head,
        frozenset(i for i in state.done if i >= head),
        frozenset(i for i in leased if i >= head),
    )
