"""A segment's sparse-index points in memory: three packed arrays, no object per point.

A 64 MiB segment of 4 KiB messages has a point for every message (one per
``index_interval`` of log): 16,000 points.  Kept as ``IndexEntry`` tuples in a list,
each cost about 150 bytes and, worse, an allocation the cyclic garbage collector
counts - with a point per 4 KiB message, a batch of 100 made the collector run every
few batches, a quarter of a microsecond of each message (profiled: issue 18).  Here a
point is 24 bytes in three ``array`` columns, appended from C; an ``IndexEntry`` is
built only when one is read.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from ledgerq.format.index import IndexEntry, point_from_tuple

__all__ = ["IndexPoints"]


class IndexPoints(Sequence[IndexEntry]):
    """The points of one segment's sparse index, in increasing id and offset order.

    A read-only :class:`Sequence` of :class:`IndexEntry` to its readers (indexing,
    slicing, iteration); the writer appends with :meth:`append` and :meth:`extend_batch`.
    ``ids`` and ``offsets`` are the columns themselves, for ``bisect`` and scans.
    """

    __slots__ = ("ids", "offsets", "timestamps")

    def __init__(self, points: Iterable[IndexEntry] = ()) -> None:
        self.ids = array("Q")  # the typecodes of the index file's u64, i64, u64
        self.timestamps = array("q")
        self.offsets = array("Q")
        for point in points:
            self.append(point)

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> IndexEntry: ...

    @overload
    def __getitem__(self, i: slice) -> IndexPoints: ...

    def __getitem__(self, i: int | slice) -> IndexEntry | IndexPoints:
        if isinstance(i, slice):
            part = IndexPoints()
            part.ids = self.ids[i]
            part.timestamps = self.timestamps[i]
            part.offsets = self.offsets[i]
            return part
        return IndexEntry(self.ids[i], self.timestamps[i], self.offsets[i])

    def __iter__(self) -> Iterator[IndexEntry]:
        return map(point_from_tuple, zip(self.ids, self.timestamps, self.offsets, strict=True))

    def __repr__(self) -> str:
        return f"IndexPoints({list(self)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IndexPoints):
            return (self.ids, self.timestamps, self.offsets) == (
                other.ids,
                other.timestamps,
                other.offsets,
            )
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def append(self, point: IndexEntry) -> None:
        """Add one point after the last."""
        self.ids.append(point.id)
        self.timestamps.append(point.timestamp)
        self.offsets.append(point.offset)

    def extend_columns(self, ids: array[int], timestamps: array[int], offsets: array[int]) -> None:
        """Add the points ``(ids[i], timestamps[i], offsets[i])`` after the last.

        The columns are arrays of this object's typecodes: each is one copy in C.
        """
        self.ids.extend(ids)
        self.timestamps.extend(timestamps)
        self.offsets.extend(offsets)

    def locate(self, message_id: int) -> IndexEntry | None:
        """The last point whose id is <= ``message_id`` (where to scan from for it)."""
        i = bisect.bisect_right(self.ids, message_id) - 1
        return self[i] if i >= 0 else None
