"""The shared-mode state page: what the handles of one queue publish to each other.

A queue open in shared mode has one small file, ``shared/state``, that every handle
maps into memory (``segment.shared_page``).  It is coordination, not data: the log,
the reader journals and ``meta.json`` hold the queue; this page saves the handles a
look at the files, holds the *lock words* of their steps, and is rebuilt from the
files by the first handle that opens the queue (after any crash, a power cut included).
Layout (little-endian, version 3: 16 KiB - four pages, so that a first handle on a full
disk finds room for it in the disk reserve)::

    offset  size  field
    0       4     magic b"LQSP"
    4       4     version u32 = 3   (2: the flock design, 4 KiB; 1: format 1's, CRC-32)
    8       64    the published tail (below), written whole under the append lock
    72      8     writing u64         non-zero while a handle appends or rotates
    80      8     reserved_until u64  the id reservation meta.json holds (a cache)
    88      8     duplicates u64      stats().duplicates of the queue
    96      8     corrupt_skipped u64 stats().corrupt_skipped of the queue
    104     8     enqueued_base u64   stats().enqueued counted up to ...
    112     8     enqueued_through u64  ... this id (entries from it on add one each)
    120     8     reserve_spent u64   1 while the queue's disk ``reserve`` is released
    128     8     locking u64         how this session's handles exclude each other:
                                      1 lock words (compare-and-swap), 2 flock files
    136     5 x 8 the feature logs' change words u64 (FEATURE_LOGS' order), bumped
                                      before every write of that file (append lock held)
    176     16    zero
    192     16    the append lock (a lock block, below)
    208     304   zero
    512     124 x 128  reader slots (below), claimed in order
    16384

    lock block (16 bytes: a lock word, and what its waiters sleep on):
    0   u64  owner      0: free; 1 (SUSPECT): free, but the last holder could not cut
                        back a failed write - the next one repairs the file; else the id
                        of the handle that holds it (taken by compare-and-swap)
    8   u32  sequence   bumped by a release that finds waiters (what they sleep on)
    12  u32  waiters    handles asleep waiting for it

    reader slot (128 bytes):
    0   u64  key        non-zero: claimed by the reader named below (xxh64 of its name,
                        lowest bit set)
    8   16   the reader's lock (a lock block)
    24  u64  journal length      bytes of whole records in readers/<name>.state
    32  u64  journal generation  bumped whenever the file is replaced; bit 63: removed
    40  u8   name length, then the name's first bytes (at most 87: with the key, a
             longer name is told apart from another with the same first 87 bytes)

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
order) sees a checksum mismatch and reads again.  The counters are single aligned u64
values changed only under the append lock; a lock block's words change by atomic
operations (``segment.steplock``); a journal's length and generation change under its
reader's lock, and are read under it.

The tail's checksum is the format's (``format.checksum.checksum``: CRC-32C since format
2).  The page is never upgraded in place - the first handle of a session writes a new
one - so an older page is met only by a handle joining a session that an older ledgerq
started: that handle refuses to join (version 3: its handles write the feature logs
without bumping their change words; version 2: its handles lock with ``flock``, which
lock words do not exclude; version 1: format 1), and the first handle of the next
session reads the old page's counters (:func:`page_version`) and writes a version 4
page.  An older ledgerq refuses a version 4 page of a live session in turn.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ledgerq.format.checksum import checksum

__all__ = [
    "APPEND_LOCK",
    "FEATURE_LOGS",
    "LOCKING_FLOCK",
    "LOCKING_WORDS",
    "LOCK_BLOCK_SIZE",
    "LOCK_OWNER",
    "LOCK_SEQUENCE",
    "LOCK_SUSPECT",
    "LOCK_WAITERS",
    "OLD_PAGE_SIZE",
    "PAGE_SIZE",
    "READER_SLOTS",
    "READER_SLOTS_AT",
    "READER_SLOT_SIZE",
    "SHARED_MAGIC",
    "SHARED_VERSION",
    "SLOT_CORRUPT_SKIPPED",
    "SLOT_DUPLICATES",
    "SLOT_ENQUEUED_BASE",
    "SLOT_ENQUEUED_THROUGH",
    "SLOT_FEATURE_LOGS",
    "SLOT_JOURNAL_GENERATION",
    "SLOT_JOURNAL_LENGTH",
    "SLOT_KEY",
    "SLOT_LOCK",
    "SLOT_LOCKING",
    "SLOT_NAME",
    "SLOT_NAME_MAX",
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
SHARED_VERSION = 4  # 3: no feature-log words; 2: the flock design; 1: format 1 (CRC-32)
PAGE_SIZE = 16384
OLD_PAGE_SIZE = 4096  # versions 1 and 2
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
SLOT_LOCKING = 128
_SLOTS_END = 136
# One word a feature log (in FEATURE_LOGS' order): bumped, under the append lock, by
# every handle before it writes that file, so a handle whose last look saw the same
# value knows the file holds nothing new without an fstat of it.
SLOT_FEATURE_LOGS = 136
FEATURE_LOGS = ("dedup", "retries", "periodic", "unique", "forwards")
_FEATURE_LOGS_END = SLOT_FEATURE_LOGS + 8 * len(FEATURE_LOGS)
assert TAIL_OFFSET + TAIL_RECORD.size == SLOT_WRITING

LOCKING_WORDS = 1  # lock words taken by compare-and-swap (the atomicshm package)
LOCKING_FLOCK = 2  # flock on the files in shared/ (where atomics cannot be imported)

# A lock block: the word, and what its waiters sleep on.
LOCK_OWNER = 0
LOCK_SEQUENCE = 8  # u32
LOCK_WAITERS = 12  # u32
LOCK_BLOCK_SIZE = 16
LOCK_SUSPECT = 1  # owner value: free, the guarded file to be repaired (no handle id is 1)
APPEND_LOCK = 192
assert _FEATURE_LOGS_END <= APPEND_LOCK

READER_SLOTS_AT = 512
READER_SLOT_SIZE = 128
READER_SLOTS = (PAGE_SIZE - READER_SLOTS_AT) // READER_SLOT_SIZE
SLOT_KEY = 0
SLOT_LOCK = 8
SLOT_JOURNAL_LENGTH = 24
SLOT_JOURNAL_GENERATION = 32
SLOT_NAME = 40  # u8 length, then the bytes
SLOT_NAME_MAX = 87
assert READER_SLOTS == 124
assert SLOT_LOCK + LOCK_BLOCK_SIZE <= SLOT_JOURNAL_LENGTH
assert SLOT_NAME + 1 + SLOT_NAME_MAX == READER_SLOT_SIZE


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


def encode_page(
    tail: SharedTail,
    *,
    reserved_until: int,
    counters: dict[str, int],
    locking: int = LOCKING_WORDS,
) -> bytes:
    """A whole page: header, ``tail``, ``writing`` 0 and the slots, zero-padded: every
    lock free, no reader slot claimed.

    ``counters`` holds ``duplicates``, ``corrupt_skipped``, ``enqueued_base``,
    ``enqueued_through`` and ``reserve_spent`` (0 when missing); ``locking`` is how the
    session's handles exclude each other (``LOCKING_WORDS`` or ``LOCKING_FLOCK``).
    """
    slots = struct.pack(
        "<8Q",
        0,
        reserved_until,
        counters.get("duplicates", 0),
        counters.get("corrupt_skipped", 0),
        counters.get("enqueued_base", 0),
        counters.get("enqueued_through", 0),
        counters.get("reserve_spent", 0),
        locking,
    )
    page = STATE_HEADER.pack(SHARED_MAGIC, SHARED_VERSION) + encode_tail(tail) + slots
    assert len(page) == _SLOTS_END
    return page + bytes(PAGE_SIZE - len(page))


def page_version(buf: bytes | bytearray | memoryview) -> int | None:
    """The version the header of the page in ``buf`` says (None: no page's magic);
    whether the page is whole and intact is :func:`page_problem`'s to say."""
    if len(buf) < STATE_HEADER.size:
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
    locking = struct.unpack_from("<Q", buf, SLOT_LOCKING)[0]
    if locking not in (LOCKING_WORDS, LOCKING_FLOCK):
        return f"unknown locking {locking}"
    if decode_tail(memoryview(buf)[TAIL_OFFSET : TAIL_OFFSET + TAIL_RECORD.size]) is None:
        return "the published tail's checksum does not match"
    return ""
