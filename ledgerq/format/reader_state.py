"""Reader state journal records: one reader's position, leases and acks.

A reader's state is Kestrel's: a head id (every id below it is done) plus the ids
acked out of order above it, and - ledgerq's addition - how many times each
not-yet-acked message has been delivered.  It lives in an append-only journal
``readers/<name>.state``::

    file header (8 bytes): magic b"LQRS", version u32 = 1
    records, each:
      length  u32  whole record, this field and the CRC included
      type    u8   StateRecordType
      body    length - 9 bytes
      crc32   u32  CRC-32 of every byte of the record before it

    LEASE, ACK, NACK bodies: one or more u64 message ids (a batch is one record)
    CHECKPOINT body: a msgpack array
        [head, done_ids, deliveries, counters]
      head        int            lowest id that may still need delivering
      done_ids    [int, ...]     ids > head already acked
      deliveries  [[id, n], ...] deliveries so far of each id not acked
      counters    {str: int}     acked, nacked, expired, dead_lettered, ...

The journal starts with a CHECKPOINT and is rewritten (temp file, fsync, rename)
with a fresh CHECKPOINT when it grows; replaying it from the start yields the state.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import Any, NamedTuple

import msgpack

from ledgerq.format.checksum import checksum
from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = [
    "STATE_FILE_HEADER",
    "STATE_MAGIC",
    "STATE_RECORD_HEADER",
    "STATE_VERSION",
    "Checkpoint",
    "StateRecordType",
    "decode_checkpoint",
    "decode_state_file_header",
    "decode_state_record",
    "encode_checkpoint",
    "encode_ids_record",
    "encode_state_file_header",
]

STATE_MAGIC = b"LQRS"
STATE_VERSION = 1
STATE_FILE_HEADER = struct.Struct("<4sI")
assert STATE_FILE_HEADER.size == 8
STATE_RECORD_HEADER = struct.Struct("<IB")  # length, type
assert STATE_RECORD_HEADER.size == 5
_CRC = struct.Struct("<I")
_MIN_RECORD = STATE_RECORD_HEADER.size + _CRC.size
_MAX_RECORD = (1 << 31) - 1


class StateRecordType(IntEnum):
    """The ``type`` byte of a reader state record."""

    CHECKPOINT = 1
    LEASE = 2
    ACK = 3
    NACK = 4


_ID_TYPES = frozenset((StateRecordType.LEASE, StateRecordType.ACK, StateRecordType.NACK))


class Checkpoint(NamedTuple):
    """A reader's whole state at one moment."""

    head: int
    done: list[int]
    deliveries: list[tuple[int, int]]
    counters: dict[str, int]


def encode_state_file_header() -> bytes:
    """Return the 8-byte header of a reader state file."""
    return STATE_FILE_HEADER.pack(STATE_MAGIC, STATE_VERSION)


def decode_state_file_header(buf: bytes | bytearray | memoryview) -> int:
    """Validate the file header; return the offset of the first record."""
    if len(buf) < STATE_FILE_HEADER.size:
        raise IncompleteRecord("reader state header cut short", 0, STATE_FILE_HEADER.size)
    magic, version = STATE_FILE_HEADER.unpack_from(buf, 0)
    if magic != STATE_MAGIC:
        raise CorruptRecord(f"bad reader state magic {magic!r}", 0)
    if version != STATE_VERSION:
        raise CorruptRecord(f"unsupported reader state version {version}", 0)
    return STATE_FILE_HEADER.size


def _frame(record_type: int, body: bytes) -> bytes:
    head = STATE_RECORD_HEADER.pack(_MIN_RECORD + len(body), record_type)
    framed = head + body
    return framed + _CRC.pack(checksum(framed))


def encode_ids_record(record_type: StateRecordType, ids: list[int] | tuple[int, ...]) -> bytes:
    """Return a LEASE, ACK or NACK record naming ``ids``."""
    if record_type not in _ID_TYPES:
        raise ValueError(f"{record_type!r} does not carry ids")
    if not ids:
        raise ValueError("an ids record needs at least one id")
    return _frame(record_type, struct.pack(f"<{len(ids)}Q", *ids))


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """Return a CHECKPOINT record."""
    body = msgpack.packb(
        [
            checkpoint.head,
            list(checkpoint.done),
            [list(pair) for pair in checkpoint.deliveries],
            dict(checkpoint.counters),
        ],
        use_bin_type=True,
    )
    return _frame(StateRecordType.CHECKPOINT, body)


def decode_checkpoint(body: bytes, pos: int = 0) -> Checkpoint:
    """Decode a CHECKPOINT body; raise :class:`CorruptRecord` if it is malformed."""
    try:
        value: Any = msgpack.unpackb(body, raw=False, strict_map_key=True)
        head, done, deliveries, counters = value
        checkpoint = Checkpoint(
            int(head),
            [int(i) for i in done],
            [(int(i), int(n)) for i, n in deliveries],
            {str(k): int(v) for k, v in counters.items()},
        )
    except Exception as exc:  # any shape error in a hostile body is corruption
        raise CorruptRecord(f"malformed reader checkpoint ({exc})", pos) from None
    if checkpoint.head < 0 or any(i < 0 for i in checkpoint.done):
        raise CorruptRecord("negative id in reader checkpoint", pos)
    return checkpoint


def decode_state_record(
    buf: bytes | bytearray | memoryview, pos: int
) -> tuple[StateRecordType, bytes | tuple[int, ...], int]:
    """Decode the record at ``pos``; return its type, its body and the next offset.

    The body is the raw bytes for CHECKPOINT (see :func:`decode_checkpoint`) and a
    tuple of ids for the others.
    """
    end = len(buf)
    if end - pos < STATE_RECORD_HEADER.size:
        raise IncompleteRecord("reader state record cut short", pos, STATE_RECORD_HEADER.size)
    length, record_type = STATE_RECORD_HEADER.unpack_from(buf, pos)
    if length < _MIN_RECORD or length > _MAX_RECORD:
        raise CorruptRecord(f"impossible reader state record length {length}", pos)
    stop = pos + length
    if stop > end:
        raise IncompleteRecord("reader state record cut short", pos, length)
    crc_at = stop - 4
    if checksum(memoryview(buf)[pos:crc_at]) != _CRC.unpack_from(buf, crc_at)[0]:
        raise CorruptRecord("reader state record checksum mismatch", pos)
    body = bytes(buf[pos + STATE_RECORD_HEADER.size : crc_at])
    try:
        kind = StateRecordType(record_type)
    except ValueError:
        raise CorruptRecord(f"unknown reader state record type {record_type}", pos) from None
    if kind is StateRecordType.CHECKPOINT:
        return kind, body, stop
    if not body or len(body) % 8:
        raise CorruptRecord("reader state ids record of bad size", pos)
    return kind, struct.unpack(f"<{len(body) // 8}Q", body), stop
