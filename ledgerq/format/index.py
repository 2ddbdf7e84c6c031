"""Sparse index files: where to start scanning for an id or a time.

Layout (little-endian)::

    header (12 bytes)
      magic    4  b"LQIX"
      version  u32  1
      count    u32  number of entries; OPEN_COUNT (0xFFFFFFFF) while the segment is active
    entries (24 bytes each), in increasing id and offset order
      id         u64  id of the entry starting at ``offset``
      timestamp  i64  its enqueue time (ns)
      offset     u64  byte offset of that entry in the segment's .log file

An index always starts with the segment's first entry (offset 0), gains an entry
once at least ``index_interval`` bytes of log have passed since the previous one,
and - once its segment is sealed - ends with an entry for the segment's last
entry, so a sealed segment's id range is known from its index alone.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from collections.abc import Sequence
from functools import partial
from itertools import chain
from typing import NamedTuple

from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = [
    "INDEX_ENTRY",
    "INDEX_HEADER",
    "INDEX_MAGIC",
    "INDEX_VERSION",
    "OPEN_COUNT",
    "IndexEntry",
    "decode_index",
    "encode_index_entry",
    "encode_index_header",
    "encode_index_columns",
    "encode_index_points",
    "point_from_tuple",
    "find_by_id",
    "find_by_timestamp",
]

INDEX_MAGIC = b"LQIX"
INDEX_VERSION = 1
OPEN_COUNT = 0xFFFFFFFF
INDEX_HEADER = struct.Struct("<4sII")  # magic, version, count
assert INDEX_HEADER.size == 12
INDEX_ENTRY = struct.Struct("<QqQ")  # id, timestamp_ns, offset
assert INDEX_ENTRY.size == 24
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"


class IndexEntry(NamedTuple):
    """One sparse-index point."""

    id: int
    timestamp: int
    offset: int


def encode_index_header(count: int = OPEN_COUNT) -> bytes:
    """Return the 12-byte header; ``count`` is OPEN_COUNT for an active segment."""
    return INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, count)


def encode_index_entry(entry_id: int, timestamp: int, offset: int) -> bytes:
    """Return one 24-byte index entry."""
    return INDEX_ENTRY.pack(entry_id, timestamp, offset)


# IndexEntry from a 3-tuple in C (the namedtuple's own __new__ is a Python function).
point_from_tuple = partial(tuple.__new__, IndexEntry)


def encode_index_points(points: Sequence[IndexEntry]) -> bytes:
    """Return the 24-byte entries of ``points``, back to back, in one ``struct`` call."""
    return struct.pack("<" + "QqQ" * len(points), *chain.from_iterable(points))


def encode_index_columns(ids: array[int], timestamps: array[int], offsets: array[int]) -> bytes:
    """Return the entries ``(ids[i], timestamps[i], offsets[i])``, back to back.

    The columns are arrays of typecodes ``Q``, ``q`` and ``Q``: each is copied into
    every third 8-byte slot of the result in C (a strided ``memoryview`` assignment),
    with no Python object per entry - the batch append's points (issue 18: one per
    4 KiB message).  The slots are native-endian: a big-endian host packs each entry.
    """
    if not _LITTLE_ENDIAN_HOST:
        stamped = zip(ids, timestamps, offsets, strict=True)
        return struct.pack("<" + "QqQ" * len(ids), *chain.from_iterable(stamped))
    blob = bytearray(INDEX_ENTRY.size * len(ids))
    with memoryview(blob) as raw, raw.cast("Q") as unsigned, raw.cast("q") as signed:
        unsigned[0::3] = ids
        signed[1::3] = timestamps
        unsigned[2::3] = offsets
    return bytes(blob)


def decode_index(buf: bytes | bytearray | memoryview) -> tuple[list[IndexEntry], bool]:
    """Decode an index file; return its entries and whether it was sealed.

    A sealed index (exact count) that is shorter than its count raises
    :class:`IncompleteRecord`; an open index keeps only its whole entries (a torn
    last entry is dropped).  Entries out of order, a bad magic or an unknown
    version raise :class:`CorruptRecord`.
    """
    if len(buf) < INDEX_HEADER.size:
        raise IncompleteRecord("index header cut short", 0, INDEX_HEADER.size)
    magic, version, count = INDEX_HEADER.unpack_from(buf, 0)
    if magic != INDEX_MAGIC:
        raise CorruptRecord(f"bad index magic {magic!r}", 0)
    if version != INDEX_VERSION:
        raise CorruptRecord(f"unsupported index version {version}", 0)
    available = (len(buf) - INDEX_HEADER.size) // INDEX_ENTRY.size
    sealed = count != OPEN_COUNT
    if sealed:
        if available < count:
            raise IncompleteRecord(
                f"index holds {available} of its {count} entries",
                INDEX_HEADER.size + available * INDEX_ENTRY.size,
            )
        available = count
    entries = [
        IndexEntry(*INDEX_ENTRY.unpack_from(buf, INDEX_HEADER.size + i * INDEX_ENTRY.size))
        for i in range(available)
    ]
    for i in range(1, len(entries)):
        if entries[i].id <= entries[i - 1].id or entries[i].offset <= entries[i - 1].offset:
            raise CorruptRecord(
                "index entries out of order", INDEX_HEADER.size + i * INDEX_ENTRY.size
            )
    return entries, sealed


def find_by_id(entries: list[IndexEntry], ids: list[int], target: int) -> IndexEntry | None:
    """Return the last entry whose id is <= ``target`` (``ids`` mirrors ``entries``)."""
    i = bisect.bisect_right(ids, target) - 1
    return entries[i] if i >= 0 else None


def find_by_timestamp(entries: list[IndexEntry], target_ns: int) -> IndexEntry | None:
    """Return the entry to start a scan from for the first message at or after ``target_ns``.

    Timestamps are not strictly monotonic (clocks step back), so this returns the
    last entry whose timestamp is < ``target_ns`` among entries whose timestamps
    are non-decreasing up to it; a caller then scans forward.
    """
    best: IndexEntry | None = None
    for entry in entries:
        if entry.timestamp < target_ns:
            best = entry
        else:
            break
    return best
