"""One segment: a ``.log`` file of entries and its sparse ``.idx`` file."""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Sequence

from ledgerq.format.index import IndexEntry
from ledgerq.segment.naming import idx_path, log_path
from ledgerq.segment.points import IndexPoints

__all__ = ["Segment"]


class Segment:
    """What the manager knows of one segment without reading its entries.

    ``first_id`` is the id of its first entry and ``name_id`` the id its file name
    says: the two differ only for a misnamed file (renamed, swapped or copied by hand;
    see ``segment.layout``), which is read by its content.  ``last_id`` is 0 while the
    segment holds no entry.  Ids inside a segment are consecutive, so ``count`` is
    ``last_id - first_id + 1`` unless corruption removed some (then ``missing`` says
    how many).
    """

    __slots__ = (
        "_read_fd",
        "deleted",
        "first_id",
        "idx_path",
        "index",
        "last_id",
        "last_offset",
        "last_timestamp",
        "log_path",
        "missing",
        "name_id",
        "sealed",
        "size",
    )

    def __init__(self, segments_dir: str, first_id: int, name_id: int | None = None) -> None:
        self.first_id = first_id
        self.name_id = first_id if name_id is None else name_id
        self.log_path = log_path(segments_dir, self.name_id)
        self.idx_path = idx_path(segments_dir, self.name_id)
        self.size = 0
        self.last_id = 0
        self.last_offset = -1
        self.last_timestamp = 0
        self.index = IndexPoints()
        self.missing = 0
        self.sealed = False
        self.deleted = False
        self._read_fd: int | None = None

    @property
    def count(self) -> int:
        """Number of entries in the segment."""
        if self.last_id == 0:
            return 0
        return self.last_id - self.first_id + 1 - self.missing

    @property
    def is_misnamed(self) -> bool:
        """Whether the file's name is not the id of its first entry."""
        return self.name_id != self.first_id

    @property
    def is_empty(self) -> bool:
        """Whether the segment holds no entry."""
        return self.last_id == 0

    def rename(self, segments_dir: str, name_id: int) -> None:
        """Take the file names of ``name_id`` (the files were renamed on disk)."""
        self.name_id = name_id
        self.log_path = log_path(segments_dir, name_id)
        self.idx_path = idx_path(segments_dir, name_id)

    def add_index_entry(self, entry: IndexEntry) -> None:
        """Record a sparse-index point in memory (the caller persists it)."""
        self.index.append(entry)

    def add_index_columns(
        self, ids: array[int], timestamps: array[int], offsets: array[int]
    ) -> None:
        """Record points in memory, given as columns (the caller persists them)."""
        self.index.extend_columns(ids, timestamps, offsets)

    def set_index(self, entries: Iterable[IndexEntry]) -> None:
        """Replace the in-memory index."""
        self.index = entries[:] if isinstance(entries, IndexPoints) else IndexPoints(entries)

    def boundaries(self) -> Sequence[int]:
        """Offsets known to start an entry (from the sparse index), increasing."""
        return self.index.offsets

    def locate(self, message_id: int) -> IndexEntry | None:
        """The index point to scan from to find ``message_id``."""
        return self.index.locate(message_id)

    def read_fd(self) -> int:
        """A read-only descriptor of the log, opened once and kept."""
        if self._read_fd is None:
            self._read_fd = os.open(self.log_path, os.O_RDONLY)
        return self._read_fd

    def close_read_fd(self) -> None:
        """Close the cached read descriptor, if any."""
        fd, self._read_fd = self._read_fd, None
        if fd is not None:
            os.close(fd)

    def __repr__(self) -> str:
        named = f", name_id={self.name_id}" if self.is_misnamed else ""
        return (
            f"Segment(first_id={self.first_id}{named}, last_id={self.last_id}, "
            f"size={self.size}, sealed={self.sealed})"
        )
