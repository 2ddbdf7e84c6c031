"""The shared-mode state page: what the handles of one queue publish to each other.

A queue open in shared mode has one small file, ``shared/state``, that every handle
maps into memory (``segment.shared_page``).  It is coordination, not data: the log,
the reader journals and ``meta.json`` hold the queue; this page only saves the
handles a look at the files, and is rebuilt from them by the first handle that opens
the queue (after any crash, a power cut included).  Layout (little-endian)::

    offset  size  field
    0       4     magic b"LQSP"
    4       4     version u32 = 2   (1: a format-1 ledgerq's page, its tail CRC-32)
    8       64    the published tail (below), written whole under the append lock
    72      8     writing u64         non-zero while a handle appends or rotates
    80      8     reserved_until u64  the id reservation meta.json holds (a cache)
    88      8     duplicates u64      stats().duplicates of the queue
    96      8     corrupt_skipped u64 stats().corrupt_skipped of the queue
    104     8     enqueued_base u64   stats().enqueued counted up to ...
    112     8     enqueued_through u64  ... this id (entries from it on add one each)
    120     8     reserve_spent u64   1 while the queue's disk ``reserve`` is released
    128           zero up to PAGE_SIZE

    published tail (64 bytes at offset 8):
    0   u64  active_first   first id of the segment appends go to (its file name)
    8   u64  active_size    bytes of whole entries in it: readers read no further
    16  u64  last_id        id of its last entry (0: none yet)
    24  i64  last_offset    where that entry starts (-1: none)
    32  i64  last_ts        that entry's timestamp (ns)
    40  i64  last_indexed   offset of its last sparse-index point (-1: none)
    48  u64  generation     bumped whenever a segment is created or deleted
    56  u32  crc            CRC-32C of bytes 0..55 of the tail (version 1: CRC-32)
    60  u32  zero

Handles read the tail without a lock, so it carries its own checksum: a reader that
meets a half-written tail (the writer is between two stores, on any CPU's memory
order) sees a checksum mismatch and reads again.  The other fields are single
aligned u64 values changed only under the append lock.

The tail's checksum is the format's (``format.checksum.checksum``: CRC-32C since format 2),
and the page's version says which: version 2 with format 2.  The page is never upgraded
in place - the first handle of a session writes a new one - so a version-1 page is met
only by a handle joining a session that a format-1 ledgerq started: that handle refuses
to join (its appends would be format 2, which the others take for damage), and the first
handle of the next session reads the old page's counters (:func:`page_version`) and
writes a version 2 page.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ledgerq.format.checksum import checksum

__all__ = [
    "PAGE_SIZE",
    "SHARED_MAGIC",
    "SHARED_VERSION",
    "SLOT_CORRUPT_SKIPPED",
    "SLOT_DUPLICATES",
    "SLOT_ENQUEUED_BASE",
    "SLOT_ENQUEUED_THROUGH",
    "SLOT_RESERVED_UNTIL",
    "SLOT_RESERVE_SPENT",
    "SLOT_WRITING",
    "STATE_HEADER",
    "TAIL_FIELDS",
    "TAIL_OFFSET",
    "TAIL_RECORD",
    "TAIL_TRAILER",
    "SharedTail",
    "decode_tail",
    "encode_page",
    "encode_tail",
    "page_problem",
    "page_version",
]

SHARED_MAGIC = b"LQSP"
SHARED_VERSION = 2  # 1: format 1 (the tail's checksum CRC-32)
PAGE_SIZE = 4096
STATE_HEADER = struct.Struct("<4sI")
assert STATE_HEADER.size == 8
TAIL_OFFSET = 8
TAIL_FIELDS = struct.Struct("<QQQqqqQ")
assert TAIL_FIELDS.size == 56
TAIL_RECORD = struct.Struct("<QQQqqqQII")  # the fields, crc, zero
assert TAIL_RECORD.size == 64
# What follows the fields when an appender publishes: crc, zero, and the ``writing``
# word - the tail and ``writing`` are contiguous, so one copy publishes and clears both.
TAIL_TRAILER = struct.Struct("<IIQ")
assert TAIL_FIELDS.size + TAIL_TRAILER.size == 72
SLOT_WRITING = 72
SLOT_RESERVED_UNTIL = 80
SLOT_DUPLICATES = 88
SLOT_CORRUPT_SKIPPED = 96
SLOT_ENQUEUED_BASE = 104
SLOT_ENQUEUED_THROUGH = 112
SLOT_RESERVE_SPENT = 120
_SLOTS_END = 128
assert TAIL_OFFSET + TAIL_RECORD.size == SLOT_WRITING


class SharedTail(NamedTuple):
    """The active segment as the last appender left it, and the segment generation."""

    active_first: int
    active_size: int
    last_id: int
    last_offset: int
    last_ts: int
    last_indexed: int
    generation: int


def encode_tail(tail: SharedTail, writing: int | None = None) -> bytes:
    """The 64 bytes of ``tail`` (fields and checksum) for offset ``TAIL_OFFSET``; with
    ``writing``, 72 bytes: the ``writing`` word that follows too."""
    fields = TAIL_FIELDS.pack(*tail)
    if writing is None:
        return fields + struct.pack("<II", checksum(fields), 0)
    return fields + TAIL_TRAILER.pack(checksum(fields), 0, writing)


def decode_tail(buf: bytes | bytearray | memoryview) -> SharedTail | None:
    """The tail in the 64 bytes ``buf``, or None when its checksum does not match
    (half-written: read again)."""
    *fields, crc, _ = TAIL_RECORD.unpack(buf)
    if checksum(memoryview(buf)[: TAIL_FIELDS.size]) != crc:
        return None
    return SharedTail(*fields)


def encode_page(tail: SharedTail, *, reserved_until: int, counters: dict[str, int]) -> bytes:
    """A whole page: header, ``tail``, ``writing`` 0 and the slots, zero-padded.

    ``counters`` holds ``duplicates``, ``corrupt_skipped``, ``enqueued_base``,
    ``enqueued_through`` and ``reserve_spent`` (0 when missing).
    """
    slots = struct.pack(
        "<7Q",
        0,
        reserved_until,
        counters.get("duplicates", 0),
        counters.get("corrupt_skipped", 0),
        counters.get("enqueued_base", 0),
        counters.get("enqueued_through", 0),
        counters.get("reserve_spent", 0),
    )
    page = STATE_HEADER.pack(SHARED_MAGIC, SHARED_VERSION) + encode_tail(tail) + slots
    assert len(page) == _SLOTS_END
    return page + bytes(PAGE_SIZE - len(page))


def page_version(buf: bytes | bytearray | memoryview) -> int | None:
    """The version of the page in ``buf`` (None: not a page of a size and magic this
    ledgerq knows); whether its tail is intact is :func:`page_problem`'s to say."""
    if len(buf) < PAGE_SIZE:
        return None
    magic, version = STATE_HEADER.unpack_from(buf, 0)
    return int(version) if magic == SHARED_MAGIC else None


def page_problem(buf: bytes | bytearray | memoryview) -> str:
    """What makes ``buf`` no usable page ("" when it is one)."""
    if len(buf) < PAGE_SIZE:
        return f"{len(buf)} bytes, not {PAGE_SIZE}"
    magic, version = STATE_HEADER.unpack_from(buf, 0)
    if magic != SHARED_MAGIC:
        return f"bad magic {bytes(magic)!r}"
    if version != SHARED_VERSION:
        return f"version {version}, not {SHARED_VERSION}"
    if decode_tail(memoryview(buf)[TAIL_OFFSET : TAIL_OFFSET + TAIL_RECORD.size]) is None:
        return "the published tail's checksum does not match"
    return ""
