"""A segment's sparse index file (``<first-id>.idx``): read whole or in part, or replace.

The index is a hint for finding an id or a time in a log, and - once its segment is
sealed - the record of the segment's id range.  Readers never trust a point without
checking the log (``ledgerq.segment.scanner.checked_start``), so a missing or damaged
index costs a scan, never a wrong answer; :func:`read_index` reads it that way.  The
owner appends points to an open index as it appends entries, and replaces it whole
(atomically) when it seals the segment or rebuilds the index.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ledgerq.format.errors import DecodeError
from ledgerq.format.index import (
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_MAGIC,
    INDEX_VERSION,
    OPEN_COUNT,
    IndexEntry,
    decode_index,
    encode_index_columns,
    encode_index_header,
    encode_index_points,
)
from ledgerq.segment.files import atomic_write
from ledgerq.segment.points import IndexPoints

__all__ = [
    "load_index",
    "read_index",
    "read_index_ends",
    "read_index_tail",
    "write_index",
]


def load_index(path: str) -> tuple[list[IndexEntry], bool]:
    """The points of the index at ``path`` and whether it is sealed.

    Raises ``FileNotFoundError`` (and other ``OSError``) when it cannot be read, and
    :class:`DecodeError` when it is damaged (see ``format.index.decode_index``).
    """
    with open(path, "rb") as f:
        return decode_index(f.read())


def read_index(path: str) -> tuple[list[IndexEntry], bool]:
    """:func:`load_index`, or ``([], False)`` when the index is missing or unreadable."""
    try:
        return load_index(path)
    except (OSError, DecodeError):
        return [], False


def _open_header(path: str) -> tuple[int, int] | None:
    """An open descriptor of the index and its header's count; None when there is no
    usable header (missing file, cut short, another magic or version)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    head = os.pread(fd, INDEX_HEADER.size, 0)
    if len(head) == INDEX_HEADER.size:
        magic, version, count = INDEX_HEADER.unpack(head)
        if magic == INDEX_MAGIC and version == INDEX_VERSION:
            return fd, count
    os.close(fd)
    return None


def read_index_tail(path: str, want: int = 8) -> list[IndexEntry]:
    """The last ``want`` whole points of an index (fewer if it has fewer; none if it is
    missing or damaged), without reading the rest of the file."""
    opened = _open_header(path)
    if opened is None:
        return []
    fd, count = opened
    try:
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


def read_index_ends(path: str) -> tuple[IndexEntry | None, IndexEntry | None]:
    """The first point of an index and, when it is sealed, its last point (the segment's
    last entry); None where the file is missing, damaged or says nothing.  Two small
    reads, whatever the size of the index."""
    opened = _open_header(path)
    if opened is None:
        return None, None
    fd, count = opened
    try:
        head = os.pread(fd, INDEX_ENTRY.size, INDEX_HEADER.size)
        if len(head) < INDEX_ENTRY.size:
            return None, None
        first = IndexEntry(*INDEX_ENTRY.unpack(head))
        if count == OPEN_COUNT or count == 0:
            return first, None
        tail = os.pread(fd, INDEX_ENTRY.size, INDEX_HEADER.size + (count - 1) * INDEX_ENTRY.size)
    finally:
        os.close(fd)
    if len(tail) < INDEX_ENTRY.size:
        return first, None
    last = IndexEntry(*INDEX_ENTRY.unpack(tail))
    if last.id < first.id or last.offset < first.offset:
        return first, None
    return first, last


def write_index(
    path: str, points: Sequence[IndexEntry], *, sealed: bool, durable: bool = True
) -> None:
    """Replace the index at ``path`` with ``points`` (temp file and rename).

    A sealed index carries its exact count and must end with the segment's last entry
    (the caller's business); an open one carries OPEN_COUNT and grows by appends.
    ``durable``: fsync the file and the directory before returning - a sealed index is
    trusted by recovery, so it must be on disk before the next segment exists.
    """
    header = encode_index_header(len(points) if sealed else OPEN_COUNT)
    if isinstance(points, IndexPoints):  # a segment's own: its columns, copied in C
        body = encode_index_columns(points.ids, points.timestamps, points.offsets)
    else:
        body = encode_index_points(points)
    blob = header + body
    atomic_write(path, blob, durable=durable)
