"""Which segment file holds which ids: the naming rule, and the order of the segments.

A segment log is named after the id of its first entry (``naming.log_path``), and every
reader finds ids by bisecting those names.  A name is only a promise, though: a file
renamed, swapped with another or copied by hand keeps its entries - whose ids are
covered by their checksums - under a name that lies.  Read under its name, such a
file's entries look like "valid bytes in the wrong place" and are skipped, or, at the
end of the newest segment, cut as a torn tail.  So every reader applies one rule:

* **A segment's ids are its entries'.**  Its *content first id* is the id of its first
  entry (:func:`content_first_id`); a file whose content first id is not its name is
  *misnamed*, and is read by its content - in the order of content first ids, never
  under the id its name says.  (A damaged first entry does not make a file misnamed:
  when the first valid entry has an id above the name, the name is right and the
  entries before it were lost to corruption.)
* **One id, one file.**  Two files whose contents start at the same id, or one whose
  ids all lie inside another's, hold copies: the larger file is used (a copy taken
  earlier is a prefix of the file it copied), then the correctly named one, and the
  other is *set aside*: read by nobody until ``ledgerq verify --repair`` moves it into
  ``segments/damaged/``.  A file whose ids run past another's but start inside them
  (two histories mixed) is set aside too, and its later ids are reported as held
  only there.
* **Gaps** between the used files (content order) are either purposeful - recorded by
  the queue in ``meta.json`` before it made them (``Meta.gaps``) - or ids lost with a
  deleted file; :func:`arrange` lists them and the queue or ``verify`` decides which.

The owner (``SegmentManager.open``), ``ledgerq.follow``, ``ship``, the Spark source
and ``verify`` all order segments through :func:`arrange`, so they agree on which file
holds which id.  Lock-free readers list segments with :class:`SegmentDirectory`, which
remembers each file's content first id by inode (a log's first entry never changes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ledgerq.format.entry import ENTRY_HEADER
from ledgerq.segment.index_file import read_index_ends
from ledgerq.segment.naming import LOG_SUFFIX, idx_path, parse_log_name
from ledgerq.segment.scanner import EntryScanner, entry_id_at

__all__ = [
    "DAMAGED_DIR",
    "Layout",
    "SegmentDirectory",
    "SegmentFile",
    "arrange",
    "content_first_id",
    "newest_first",
    "subtract_ranges",
]

DAMAGED_DIR = "damaged"  # segments/damaged/: where a repair sets aside a duplicate
_ID_AT = 6  # offset of the id field in an entry (format.entry.ENTRY_HEADER)


def content_first_id(fd: int, size: int, name_id: int) -> int:
    """The id of the first entry of the segment log ``fd`` (``size`` bytes), named ``name_id``.

    One read of the 22-byte header at offset 0 when it carries the name's id (the
    common case: its checksum is checked when the entry is read).  Otherwise the entry
    at offset 0 is decoded whole: valid, its id is the answer.  When it is damaged, the
    first valid entry after it decides: an id below the name means a misnamed file
    (ids below its name never belong in it), anything else a named file that lost its
    first entries.  An empty file, or one without any valid entry, is what its name says.
    """
    head = os.pread(fd, ENTRY_HEADER.size, 0)
    if len(head) == ENTRY_HEADER.size and int.from_bytes(head[_ID_AT : _ID_AT + 8], "little") == (
        name_id
    ):
        return name_id
    if len(head) < 4:
        return name_id  # empty, or a first append still in flight
    found = entry_id_at(fd, 0, size)
    if found > 0:
        return found
    entry = EntryScanner(fd, 0, size, after_id=0).next()
    if entry is not None and entry.id < name_id:
        return entry.id
    return name_id


@dataclass(slots=True)
class SegmentFile:
    """One segment log: the id its name says, the ids it holds, and its size.

    ``last_id`` is 0 when unknown (a lock-free reader of a segment without a sealed
    index) or when the file holds no entry.
    """

    name_id: int
    first_id: int
    size: int
    last_id: int = 0

    @property
    def is_misnamed(self) -> bool:
        """Whether the file's name is not its first entry's id."""
        return self.name_id != self.first_id

    @property
    def file_name(self) -> str:
        """The log's file name (in ``segments/``)."""
        return f"{self.name_id:020d}{LOG_SUFFIX}"

    def ids(self) -> str:
        """The ids it holds, for messages: ``"13-24"``, or ``"from 13"`` when the end is unknown."""
        if self.last_id >= self.first_id:
            return f"{self.first_id}-{self.last_id}"
        return f"from {self.first_id}"


@dataclass(slots=True)
class Layout:
    """The segment files of a queue in content order (see the module).

    ``used``: the files to read, in id order, their id ranges disjoint.  ``set_aside``:
    (file, the used file that holds its ids) for copies and overlaps, read by nobody.
    ``gaps``: ``(first, last, before, after)`` - ids ``first..last`` held by no used
    file, between the used files ``before`` and ``after``.  ``held_aside``: the parts
    of those gaps that a set-aside file holds, ``(first, last, file)``.
    """

    used: list[SegmentFile] = field(default_factory=list)
    set_aside: list[tuple[SegmentFile, SegmentFile]] = field(default_factory=list)
    gaps: list[tuple[int, int, SegmentFile, SegmentFile]] = field(default_factory=list)
    held_aside: list[tuple[int, int, SegmentFile]] = field(default_factory=list)

    @property
    def misnamed(self) -> list[SegmentFile]:
        """The used files whose name is not their content's."""
        return [f for f in self.used if f.is_misnamed]


class _Identified(Protocol):
    @property
    def first_id(self) -> int: ...
    @property
    def name_id(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def is_misnamed(self) -> bool: ...


def newest_first(f: _Identified) -> tuple[int, int, bool, int]:
    """Sort key whose maximum is the newest segment by content (the one appended to):
    the highest first id; among files starting there the larger, then the correctly
    named one (the choice :func:`arrange` makes among them)."""
    return (f.first_id, f.size, not f.is_misnamed, -f.name_id)


def _preference(f: SegmentFile) -> tuple[int, int, int, bool, int]:
    # Among files starting at one id: the one holding the most (last id, then size),
    # then the correctly named one, then the lowest name - the same choice everywhere.
    return (f.first_id, -f.last_id, -f.size, f.is_misnamed, f.name_id)


def arrange(files: Iterable[SegmentFile]) -> Layout:
    """Order segment files by content; set copies and overlaps aside; list the gaps.

    Files that hold no entry (``last_id`` 0 and no ``size``) take part by their name.
    A file whose ``last_id`` is unknown is used unless another starts at its first id.
    """
    layout = Layout()
    covered = 0  # the highest id a used file holds (as far as known)
    for f in sorted(files, key=_preference):
        previous = layout.used[-1] if layout.used else None
        if previous is not None and (
            f.first_id == previous.first_id or (f.first_id <= covered and f.last_id >= f.first_id)
        ):
            layout.set_aside.append((f, previous))
            if f.last_id > covered:
                layout.held_aside.append((covered + 1, f.last_id, f))
            continue
        if previous is not None and previous.last_id and f.first_id > previous.last_id + 1:
            layout.gaps.append((previous.last_id + 1, f.first_id - 1, previous, f))
        layout.used.append(f)
        covered = max(covered, f.last_id, f.first_id - 1)
    return layout


def subtract_ranges(
    first: int, last: int, ranges: Iterable[Sequence[int]]
) -> list[tuple[int, int]]:
    """The parts of ids ``first..last`` (inclusive) outside every ``[a, b]`` of ``ranges``."""
    parts = [(first, last)] if first <= last else []
    for a, b in sorted((int(r[0]), int(r[1])) for r in ranges):
        kept = []
        for lo, hi in parts:
            if b < lo or a > hi:
                kept.append((lo, hi))
                continue
            if lo < a:
                kept.append((lo, a - 1))
            if b < hi:
                kept.append((b + 1, hi))
        parts = kept
    return parts


class SegmentDirectory:
    """The segment files of one ``segments/`` directory, as a lock-free reader sees them.

    :meth:`layout` lists the directory and arranges its files by content.  Each file's
    content first id is read once (a header read) and remembered by inode: a log's
    first entry never changes once written (a file whose first entry is not there yet
    is looked at again next time).  With ``last_ids``, the last id of each file with a
    sealed index is read from it (for overlap checks; the newest file's stays 0).
    """

    def __init__(self, segments_dir: str, *, last_ids: bool = False) -> None:
        self.path = segments_dir
        self._last_ids = last_ids
        self._known: dict[str, tuple[int, int, int]] = {}  # name -> (inode, first id, last id)

    def layout(self) -> Layout:
        """Arrange the files there now (``FileNotFoundError`` if the directory is gone)."""
        files: list[SegmentFile] = []
        known: dict[str, tuple[int, int, int]] = {}
        with os.scandir(self.path) as entries:
            for entry in entries:
                name_id = parse_log_name(entry.name)
                if name_id is None:
                    continue
                try:
                    inode = entry.inode()
                    remembered = self._known.get(entry.name)
                    if remembered is not None and remembered[0] == inode:
                        _, first_id, last_id = remembered
                        size = -1  # not needed unless another file starts at first_id
                    else:
                        first_id, last_id, size = self._look(entry.path, name_id)
                except FileNotFoundError:
                    continue  # deleted (retention) while we looked
                if size != 0 and (last_id or not self._last_ids):
                    known[entry.name] = (inode, first_id, last_id)
                files.append(SegmentFile(name_id, first_id, size, last_id))
        self._known = known
        firsts = [f.first_id for f in files]
        if len(set(firsts)) != len(firsts):  # copies: the larger file is preferred
            for f in files:
                if f.size < 0:
                    try:
                        f.size = os.stat(os.path.join(self.path, f.file_name)).st_size
                    except FileNotFoundError:
                        f.size = 0
        return arrange(files)

    def _look(self, path: str, name_id: int) -> tuple[int, int, int]:
        """(content first id, last id from a sealed index or 0, size) of one log."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            first_id = content_first_id(fd, size, name_id) if size else name_id
        finally:
            os.close(fd)
        last_id = 0
        if self._last_ids and size:
            first, last = read_index_ends(idx_path(self.path, name_id))
            # Only an index of this log: its first point is this log's first entry.
            if first is not None and last is not None and (first.id, first.offset) == (first_id, 0):
                last_id = last.id
        return first_id, last_id, size
