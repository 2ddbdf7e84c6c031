"""Reader state journal records: one reader's position, leases and acks.

A reader's state is Kestrel's: a head id (every id below it is done) plus the ids
acked out of order above it, and - ledgerq's addition - how many times each
not-yet-acked message has been delivered.  It lives in an append-only journal
``readers/<name>.state``::

    file header (8 bytes): magic b"LQRS", version u32 (1, 2 or 3)
    records, each:
      length  u32  whole record, this field and the CRC included
      type    u8   StateRecordType
      body    length - 9 bytes
      crc     u32  CRC-32C (version 3) or CRC-32 (1 and 2) of every byte before it

    LEASE, ACK, NACK, DEAD_LETTER, EXPIRE, RELEASE bodies: one or more u64 message ids
      LEASE        delivered once more
      ACK          done
      NACK         delivery failed; delivered again
      DEAD_LETTER  done here: moved to the dead-letter queue
      EXPIRE       done here: its TTL passed before delivery
      RELEASE      given back unused: undoes its LEASE's delivery (not a failure)
    LEASE_BY body: holder u64, deadline_ns u64, then one or more u64 ids
                   (shared mode) a LEASE held by the handle ``holder`` until
                   ``deadline_ns`` (the queue's time; 0: no visibility timeout)
    RECLAIM body:  holder u64, cause u64, then one or more u64 ids
                   (shared mode) the holder's leases of these ids are void: the
                   messages are available again, each lease a failed delivery
                   (cause 1: the holder closed or died; 2: its deadline passed)
    TOUCH body:    holder u64, deadline_ns u64, then one or more u64 ids
                   (version 3, shared mode) the holder's leases of these ids now
                   last until ``deadline_ns`` (``touch``); not a delivery
    NOT_BEFORE body: due_ns u64, then one or more u64 ids
                   (version 3) a failed delivery of these ids is retried no earlier
                   than ``due_ns`` (the queue's time): the retry policy's delay, or
                   ``nack(..., delay=)``; void once the id is leased or finished
    CHECKPOINT body: a msgpack array
        [head, done_ids, deliveries, counters]          (every version)
        [head, done_ids, deliveries, counters, leases]  (version 2 and 3)
        [head, done_ids, deliveries, counters, leases, not_before]  (version 3 only)
      head        int            lowest id that may still need delivering
      done_ids    [int, ...]     ids > head already acked
      deliveries  [[id, n], ...] deliveries so far of each id not acked
      counters    {str: int}     acked, nacked, expired, dead_lettered, ...
      leases      [[id, holder, deadline_ns], ...]  live shared-mode leases
      not_before    [[id, due_ns], ...]  pending retry delays (NOT_BEFORE not yet void)
    Every id and count is an int in 0..2**64-1; anything else is a corrupt checkpoint.

The journal starts with a CHECKPOINT and is rewritten (temp file, fsync, rename)
with a fresh CHECKPOINT when it grows; replaying it from the start yields the state.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NamedTuple

import msgpack

from ledgerq.format.checksum import Checksum, checksum, checksum_v1
from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = [
    "STATE_FILE_HEADER",
    "STATE_MAGIC",
    "STATE_RECORD_HEADER",
    "STATE_VERSION",
    "V1_TYPES_END",
    "ReclaimCause",
    "MIN_STATE_RECORD_SIZE",
    "Checkpoint",
    "StateRecordType",
    "decode_checkpoint",
    "decode_state_file_header",
    "decode_state_record",
    "encode_checkpoint",
    "encode_id_record",
    "encode_ids_record",
    "encode_lease_by_one",
    "encode_lease_by_record",
    "encode_reclaim_record",
    "encode_not_before_record",
    "encode_state_file_header",
    "encode_touch_record",
    "plausible_record_length",
    "state_checksum",
    "state_file_version",
]

STATE_MAGIC = b"LQRS"
STATE_VERSION = 3  # the version written; 1, 2 and 3 are read
# Version 1 files hold only the types below RELEASE; version 2 adds RELEASE, LEASE_BY and
# RECLAIM, and the checkpoint's fifth element (leases; shared mode); both are checksummed
# with CRC-32.  Version 3 (format 2 of the queue) checksums every record with CRC-32C and
# adds NOT_BEFORE, TOUCH and the checkpoint's sixth element (not_before; issue 17).
# Every file this ledgerq writes is version 3, and a journal of an older version is
# rewritten as version 3 when a handle loads it, before anything is appended
# to it (in shared mode under the reader's lock, as a compaction: see core.journal): one
# file never mixes checksums, and an older ledgerq refuses the file by its version
# ("unsupported reader state version 3") instead of misreading it.
V1_TYPES_END = 7
STATE_FILE_HEADER = struct.Struct("<4sI")
assert STATE_FILE_HEADER.size == 8
STATE_RECORD_HEADER = struct.Struct("<IB")  # length, type
assert STATE_RECORD_HEADER.size == 5
_CRC = struct.Struct("<I")
_MIN_RECORD = STATE_RECORD_HEADER.size + _CRC.size
MIN_STATE_RECORD_SIZE = _MIN_RECORD  # length, type, empty body, CRC
_MAX_RECORD = (1 << 31) - 1
_U64_MAX = (1 << 64) - 1


class StateRecordType(IntEnum):
    """The ``type`` byte of a reader state record."""

    CHECKPOINT = 1
    LEASE = 2
    ACK = 3
    NACK = 4
    DEAD_LETTER = 5
    EXPIRE = 6
    RELEASE = 7  # version 2
    LEASE_BY = 8  # version 2: a lease with its holder and deadline (shared mode)
    RECLAIM = 9  # version 2: a holder's leases made void (shared mode)
    NOT_BEFORE = 10  # version 3: a failed delivery retried no earlier than a time
    TOUCH = 11  # version 3: a holder's leases extended (shared mode)


class ReclaimCause(IntEnum):
    """Why a RECLAIM record voids a holder's leases."""

    GONE = 1  # the holder closed, or its process died
    TIMED_OUT = 2  # the lease's deadline (visibility timeout) passed


# The type byte's member, by a dict lookup: calling the enum costs ten times more, and
# every record of a journal is decoded when its queue opens.
_TYPES = {int(t): t for t in StateRecordType}

_ID_TYPES = frozenset(
    (
        StateRecordType.LEASE,
        StateRecordType.ACK,
        StateRecordType.NACK,
        StateRecordType.DEAD_LETTER,
        StateRecordType.EXPIRE,
        StateRecordType.RELEASE,
        StateRecordType.LEASE_BY,
        StateRecordType.RECLAIM,
        StateRecordType.NOT_BEFORE,
        StateRecordType.TOUCH,
    )
)
# Types whose body starts with two u64 fields (holder, deadline or cause) before the ids.
_HELD_TYPES = frozenset((StateRecordType.LEASE_BY, StateRecordType.RECLAIM, StateRecordType.TOUCH))
_HELD_TYPE_VALUES = frozenset(int(t) for t in _HELD_TYPES)
_NOT_BEFORE = StateRecordType.NOT_BEFORE


class Checkpoint(NamedTuple):
    """A reader's whole state at one moment.

    ``leases`` (shared mode, version 2 and 3 files) are the live leases as ``(id,
    holder, deadline_ns)``; an exclusive queue's checkpoint has none.  ``not_before``
    (version 3 files only) are the pending retry delays as ``(id, due_ns)``.
    """

    head: int
    done: list[int]
    deliveries: list[tuple[int, int]]
    counters: dict[str, int]
    leases: Sequence[tuple[int, int, int]] = []  # never mutated: NamedTuple fields are set once
    not_before: Sequence[tuple[int, int]] = []


def encode_state_file_header(version: int = STATE_VERSION) -> bytes:
    """Return the 8-byte header of a reader state file of ``version``.

    The records encoded here are CRC-32C: they belong in a file of the newest version
    (an older one is written by tests that make old files).
    """
    if not 1 <= version <= STATE_VERSION:
        raise ValueError(f"reader state version {version} is not one this ledgerq writes")
    return STATE_FILE_HEADER.pack(STATE_MAGIC, version)


def state_checksum(version: int) -> Checksum:
    """The checksum of the records of a reader state file of ``version``."""
    return checksum if version >= 3 else checksum_v1


def decode_state_file_header(buf: bytes | bytearray | memoryview) -> int:
    """Validate the file header; return the offset of the first record."""
    state_file_version(buf)
    return STATE_FILE_HEADER.size


def state_file_version(buf: bytes | bytearray | memoryview) -> int:
    """Validate the file header; return its version (1, 2 or 3)."""
    if len(buf) < STATE_FILE_HEADER.size:
        raise IncompleteRecord("reader state header cut short", 0, STATE_FILE_HEADER.size)
    magic, version = STATE_FILE_HEADER.unpack_from(buf, 0)
    if magic != STATE_MAGIC:
        raise CorruptRecord(f"bad reader state magic {magic!r}", 0)
    if not 1 <= version <= STATE_VERSION:
        raise CorruptRecord(
            f"unsupported reader state version {version} (this ledgerq reads 1 to "
            f"{STATE_VERSION}: upgrade ledgerq to open this queue)",
            0,
        )
    return int(version)


def _frame(record_type: int, body: bytes, crc: Checksum = checksum) -> bytes:
    head = STATE_RECORD_HEADER.pack(_MIN_RECORD + len(body), record_type)
    framed = head + body
    return framed + _CRC.pack(crc(framed))


_ONE_ID = struct.Struct("<IBQ")  # length, type, id: a record naming one id
assert _ONE_ID.size == 13
_ONE_ID_LENGTH = _ONE_ID.size + _CRC.size
_pack_one = _ONE_ID.pack
_pack_crc = _CRC.pack


def encode_id_record(record_type: int, message_id: int) -> bytes:
    """:func:`encode_ids_record` for one id (the hot path; the caller passes a valid type)."""
    framed = _pack_one(_ONE_ID_LENGTH, record_type, message_id)
    return framed + _pack_crc(checksum(framed))


def encode_ids_record(record_type: StateRecordType, ids: list[int] | tuple[int, ...]) -> bytes:
    """Return a LEASE, ACK, NACK, DEAD_LETTER, EXPIRE or RELEASE record naming ``ids``."""
    if record_type in _HELD_TYPES:
        raise ValueError(f"{record_type!r} needs its holder: use its own encoder")
    if record_type is _NOT_BEFORE:
        raise ValueError(f"{record_type!r} needs its due time: use its own encoder")
    if len(ids) == 1 and record_type in _ID_TYPES and 0 <= ids[0] < 1 << 64:
        framed = _ONE_ID.pack(_ONE_ID_LENGTH, record_type, ids[0])
        return framed + _CRC.pack(checksum(framed))
    if record_type not in _ID_TYPES:
        raise ValueError(f"{record_type!r} does not carry ids")
    if not ids:
        raise ValueError("an ids record needs at least one id")
    return _frame(record_type, struct.pack(f"<{len(ids)}Q", *ids))


def _held_record(
    record_type: StateRecordType, holder: int, second: int, ids: list[int] | tuple[int, ...]
) -> bytes:
    if not ids:
        raise ValueError("an ids record needs at least one id")
    return _frame(record_type, struct.pack(f"<{len(ids) + 2}Q", holder, second, *ids))


def encode_lease_by_record(
    holder: int, deadline_ns: int, ids: list[int] | tuple[int, ...]
) -> bytes:
    """Return a LEASE_BY record: ``ids`` leased by ``holder`` until ``deadline_ns`` (0: none)."""
    return _held_record(StateRecordType.LEASE_BY, holder, deadline_ns, ids)


_LEASE_BY_ONE = struct.Struct("<IBQQQ")  # length, type, holder, deadline, one id
assert _LEASE_BY_ONE.size == 29
_LEASE_BY_ONE_LENGTH = _LEASE_BY_ONE.size + _CRC.size
_pack_lease_by_one = _LEASE_BY_ONE.pack


def encode_lease_by_one(holder: int, deadline_ns: int, message_id: int) -> bytes:
    """:func:`encode_lease_by_record` for one id (the shared-mode dequeue's hot path)."""
    framed = _pack_lease_by_one(
        _LEASE_BY_ONE_LENGTH, StateRecordType.LEASE_BY, holder, deadline_ns, message_id
    )
    return framed + _pack_crc(checksum(framed))


def encode_not_before_record(due_ns: int, ids: list[int] | tuple[int, ...]) -> bytes:
    """Return a NOT_BEFORE record: ``ids`` are retried no earlier than ``due_ns``."""
    if not ids:
        raise ValueError("an ids record needs at least one id")
    return _frame(StateRecordType.NOT_BEFORE, struct.pack(f"<{len(ids) + 1}Q", due_ns, *ids))


def encode_touch_record(holder: int, deadline_ns: int, ids: list[int] | tuple[int, ...]) -> bytes:
    """Return a TOUCH record: ``holder``'s leases of ``ids`` now last until ``deadline_ns``."""
    return _held_record(StateRecordType.TOUCH, holder, deadline_ns, ids)


def encode_reclaim_record(
    holder: int, cause: ReclaimCause | int, ids: list[int] | tuple[int, ...]
) -> bytes:
    """Return a RECLAIM record: ``holder``'s leases of ``ids`` are void, for ``cause``."""
    return _held_record(StateRecordType.RECLAIM, holder, int(cause), ids)


def _is_u64(value: object) -> bool:
    return type(value) is int and 0 <= value <= _U64_MAX


def _checkpoint_problem(
    head: object,
    done: object,
    deliveries: object,
    counters: object,
    leases: object = (),
    not_before: object = (),
) -> str:
    """Return what makes these fields an invalid checkpoint; "" when they are valid.

    Exact types only: a float, a bool or a digit string where an id belongs is a
    damaged (or foreign) checkpoint, not something to coerce.
    """
    if not _is_u64(head):
        return f"head {head!r} is not a u64 id"
    if not isinstance(done, list | tuple) or not all(_is_u64(i) for i in done):
        return "done ids are not an array of u64 ids"
    if not isinstance(deliveries, list | tuple) or not all(
        isinstance(pair, list | tuple) and len(pair) == 2 and _is_u64(pair[0]) and _is_u64(pair[1])
        for pair in deliveries
    ):
        return "deliveries are not an array of [id, count] pairs of u64"
    if not isinstance(counters, dict) or not all(
        type(name) is str and _is_u64(value) for name, value in counters.items()
    ):
        return "counters are not a map of str to u64"
    if not isinstance(leases, list | tuple) or not all(
        isinstance(lease, list | tuple) and len(lease) == 3 and all(_is_u64(v) for v in lease)
        for lease in leases
    ):
        return "leases are not an array of [id, holder, deadline_ns] triples of u64"
    if not isinstance(not_before, list | tuple) or not all(
        isinstance(pair, list | tuple) and len(pair) == 2 and _is_u64(pair[0]) and _is_u64(pair[1])
        for pair in not_before
    ):
        return "not_before is not an array of [id, due_ns] pairs of u64"
    return ""


def encode_checkpoint(
    checkpoint: Checkpoint, crc: Checksum = checksum, *, shared: bool = False
) -> bytes:
    """Return a CHECKPOINT record (``crc``: that of the file's version, the newest's).

    ``shared`` writes the five-element form with the live leases (version 2 and 3 files
    only); otherwise the four-element form, which every version reads, and
    ``checkpoint.leases`` must be empty.  Pending retry delays add a sixth element
    (version 3 files only).

    Raises ``ValueError`` for a checkpoint :func:`decode_checkpoint` would reject
    (negative or non-int ids and counts, non-str counter names): such a record would
    make the reader's journal unreadable on the next open.
    """
    head, done, deliveries, counters, leases, not_before = checkpoint
    counters = dict(counters)
    problem = _checkpoint_problem(head, done, deliveries, counters, leases, not_before)
    if problem:
        raise ValueError(f"invalid reader checkpoint: {problem}")
    fields: list[Any] = [head, list(done), [list(pair) for pair in deliveries], counters]
    if shared or not_before:
        fields.append([list(lease) for lease in leases])
    if leases and not shared:
        raise ValueError("invalid reader checkpoint: leases belong in a shared-mode checkpoint")
    if not_before:
        fields.append([list(pair) for pair in not_before])
    body = msgpack.packb(fields, use_bin_type=True)
    return _frame(StateRecordType.CHECKPOINT, body, crc)


def decode_checkpoint(body: bytes, pos: int = 0) -> Checkpoint:
    """Decode a CHECKPOINT body; raise :class:`CorruptRecord` if it is malformed.

    ``pos`` is the offset of the record, used in the error only.
    """
    try:
        value: Any = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptRecord(f"malformed reader checkpoint ({exc})", pos) from None
    if type(value) is not list or len(value) not in (4, 5, 6):
        raise CorruptRecord("malformed reader checkpoint (not an array of 4 to 6 fields)", pos)
    head, done, deliveries, counters = value[:4]
    leases = value[4] if len(value) >= 5 else []
    not_before = value[5] if len(value) == 6 else []
    problem = _checkpoint_problem(head, done, deliveries, counters, leases, not_before)
    if problem:
        raise CorruptRecord(f"malformed reader checkpoint ({problem})", pos)
    return Checkpoint(
        head,
        done,
        [(i, n) for i, n in deliveries],
        counters,
        [(i, h, d) for i, h, d in leases],
        [(i, d) for i, d in not_before],
    )


def plausible_record_length(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """The length of the record whose header is at ``pos``, or 0 if it cannot be valid.

    The checks :func:`decode_state_record` makes besides the CRC (length, type, size
    of an ids body), for recovery to find candidate records without checksumming
    every offset.  ``buf`` must hold the header (``MIN_STATE_RECORD_SIZE`` bytes).
    """
    length, record_type = STATE_RECORD_HEADER.unpack_from(buf, pos)
    if length < _MIN_RECORD or pos + length > len(buf):
        return 0
    if record_type == StateRecordType.CHECKPOINT:
        return int(length)
    body = length - _MIN_RECORD
    if record_type not in _ID_TYPES or not body or body % 8:
        return 0
    if record_type in _HELD_TYPE_VALUES and body < 24:
        return 0
    if record_type == _NOT_BEFORE and body < 16:
        return 0
    return int(length)


def decode_state_record(
    buf: bytes | bytearray | memoryview, pos: int, crc: Checksum = checksum
) -> tuple[StateRecordType, bytes | tuple[int, ...], int]:
    """Decode the record at ``pos``; return its type, its body and the next offset.

    The body is the raw bytes for CHECKPOINT (see :func:`decode_checkpoint`) and a
    tuple of u64 for the others: the ids, after the holder and the deadline (LEASE_BY),
    the holder and the cause (RECLAIM), the holder and the deadline (TOUCH), or the due
    time (NOT_BEFORE).  ``crc`` is the file's checksum (:func:`state_checksum` of its
    version).
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
    if crc(memoryview(buf)[pos:crc_at]) != _CRC.unpack_from(buf, crc_at)[0]:
        raise CorruptRecord("reader state record checksum mismatch", pos)
    body = bytes(buf[pos + STATE_RECORD_HEADER.size : crc_at])
    kind = _TYPES.get(record_type)
    if kind is None:
        raise CorruptRecord(f"unknown reader state record type {record_type}", pos)
    if kind is StateRecordType.CHECKPOINT:
        return kind, body, stop
    if (
        not body
        or len(body) % 8
        or (kind in _HELD_TYPES and len(body) < 24)
        or (kind is _NOT_BEFORE and len(body) < 16)
    ):
        raise CorruptRecord("reader state ids record of bad size", pos)
    return kind, struct.unpack(f"<{len(body) // 8}Q", body), stop
