"""Segment log entries: the bytes of one message on disk.

Layout (little-endian; ``docs/format.md`` is the normative description and a test
keeps the two in step)::

    offset  size  field
    0       4     length      u32  whole entry, this field and the CRC included
    4       1     type        u8   format << 4 | RecordType (format 2: 0x21 for DATA; format 1: 1)
    5       1     flags       u8   EntryFlags (optional fields present; BATCH_CONTINUES)
    6       8     id          u64  message id, > 0
    14      8     timestamp   i64  enqueue time, ns since the Unix epoch
    22      8     expires_at  i64  [HAS_TTL] ns since the epoch
    ..      1     priority    u8   [HAS_PRIORITY] 0 LOW, 1 MEDIUM, 2 HIGH (absent = MEDIUM)
    ..      8     deliver_at  i64  [HAS_DELIVER_AT] not before this time, ns since the epoch
    ..      4+n   headers     u32 n, then a msgpack map str -> str  [HAS_HEADERS]
    ..      1+g   group       u8 g (1..255), then g bytes of UTF-8  [HAS_GROUP]
    ..      m     payload     the rest (zstd frame when COMPRESSED; sealed blob when ENCRYPTED)
    end-4   4     crc         u32  CRC-32C (format 2) or CRC-32 (format 1) of every byte before it

The length comes first so a scanner can step from entry to entry without parsing
them; the CRC comes last so that a torn write (a prefix of the entry reached the
file) can never validate.

Every entry says its own format in the high nibble of its type byte (0 in format 1,
whose type bytes were 1 to 3; 2 in format 2), and that picks its checksum.  So a
segment of either format, or one that a newer ledgerq went on appending to (format-2
entries after format-1 ones), reads the same whoever reads it, with no header and no
index to trust: the nibble is covered by the checksum it selects, so a flipped bit
there makes the entry fail the other CRC (but for a 2**-32 chance), like any flip.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from enum import IntEnum, IntFlag
from typing import NamedTuple

import msgpack

from ledgerq.format.checksum import checksum, checksum_v1
from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = [
    "CRC",
    "DELIVER_AT",
    "ENTRY_HEADER",
    "ENTRY_FORMAT",
    "ENTRY_FORMAT_SHIFT",
    "EXPIRES_AT",
    "HEADERS_LENGTH",
    "KNOWN_FLAGS",
    "KNOWN_TYPES",
    "KNOWN_TYPE_BYTES",
    "MAX_ENTRY_SIZE",
    "MAX_GROUP_BYTES",
    "MIN_ENTRY_SIZE",
    "PRIORITY",
    "Entry",
    "EntryFlags",
    "RecordType",
    "decode_entry",
    "decode_headers",
    "encode_entry",
    "encode_headers",
    "encode_plain_batch_parts",
    "encode_delayed_entry",
    "encode_plain_entry",
    "peek_length",
]


class RecordType(IntEnum):
    """The ``type`` byte of an entry.  Only DATA is written today; the others are reserved."""

    DATA = 1
    TOMBSTONE = 2
    CHECKPOINT = 3


class EntryFlags(IntFlag):
    """The ``flags`` byte of an entry: which optional fields are present, and batching.

    ``BATCH_CONTINUES`` is set on every entry of an ``enqueue_batch`` but its last:
    an entry carrying it is followed, in the same segment, by the rest of its batch.
    A log that *ends* with such an entry ends inside a batch whose last bytes never
    reached the file; recovery cuts the batch there, so a batch is all-or-nothing.
    """

    NONE = 0
    HAS_TTL = 1 << 0
    HAS_HEADERS = 1 << 1
    COMPRESSED = 1 << 2
    HAS_PRIORITY = 1 << 3
    BATCH_CONTINUES = 1 << 4
    # Issue 17: the message may not be delivered before ``deliver_at``.  Format 2 only:
    # a format-1 entry carrying it (or HAS_GROUP) is corrupt, since no ledgerq ever
    # wrote one, and an older ledgerq (which takes the bit for damage) already refuses
    # a queue whose meta.json says version 2, written at the first open by this one.
    HAS_DELIVER_AT = 1 << 5
    # Issue 17: the message belongs to a message group (delivered one at a time, in id
    # order).  Format 2 only, as HAS_DELIVER_AT.
    HAS_GROUP = 1 << 6
    # Issue 18: the payload field is a sealed blob (AES-256-GCM, format/sealing.py)
    # holding the headers and the message body.  Format 2 only, and never together
    # with HAS_HEADERS (the headers are inside the blob): both make the entry corrupt.
    ENCRYPTED = 1 << 7


KNOWN_FLAGS = int(
    EntryFlags.HAS_TTL
    | EntryFlags.HAS_HEADERS
    | EntryFlags.COMPRESSED
    | EntryFlags.HAS_PRIORITY
    | EntryFlags.BATCH_CONTINUES
    | EntryFlags.HAS_DELIVER_AT
    | EntryFlags.HAS_GROUP
    | EntryFlags.ENCRYPTED
)
# A format-1 entry has no HAS_DELIVER_AT, HAS_GROUP nor ENCRYPTED (format 2 brought them).
_KNOWN_FLAGS_V1 = KNOWN_FLAGS & ~int(
    EntryFlags.HAS_DELIVER_AT | EntryFlags.HAS_GROUP | EntryFlags.ENCRYPTED
)
KNOWN_TYPES = frozenset(int(t) for t in RecordType)  # every record type a valid entry may have

ENTRY_FORMAT = 2  # the format of the entries this ledgerq writes
ENTRY_FORMAT_SHIFT = 4  # the type byte is ENTRY_FORMAT << 4 | RecordType (format 1: 0 << 4)
_FORMAT_2 = 2 << ENTRY_FORMAT_SHIFT
_TYPE_MASK = (1 << ENTRY_FORMAT_SHIFT) - 1
_DATA_V2 = _FORMAT_2 | RecordType.DATA  # the type byte of every message written today
# Every type byte a valid entry may have, of either format (for scanners that look for an
# entry's start without checksumming every offset).
KNOWN_TYPE_BYTES = KNOWN_TYPES | frozenset(_FORMAT_2 | t for t in KNOWN_TYPES)

ENTRY_HEADER = struct.Struct("<IBBQq")  # length, type, flags, id, timestamp_ns
assert ENTRY_HEADER.size == 22
EXPIRES_AT = struct.Struct("<q")
assert EXPIRES_AT.size == 8
PRIORITY = struct.Struct("<B")
assert PRIORITY.size == 1
DELIVER_AT = struct.Struct("<q")
assert DELIVER_AT.size == 8
HEADERS_LENGTH = struct.Struct("<I")
assert HEADERS_LENGTH.size == 4
CRC = struct.Struct("<I")
assert CRC.size == 4
_LENGTH = struct.Struct("<I")

MIN_ENTRY_SIZE = ENTRY_HEADER.size + CRC.size  # 26: an entry with an empty payload
# An upper bound that keeps a corrupt length field from asking for absurd reads.
# Payloads are limited far below this by Options.max_message_size.
MAX_ENTRY_SIZE = (1 << 31) - 1
_MAX_PRIORITY = 2
_MEDIUM = 1
_U64_MAX = (1 << 64) - 1
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1

_HAS_TTL = int(EntryFlags.HAS_TTL)
_HAS_HEADERS = int(EntryFlags.HAS_HEADERS)
_HAS_PRIORITY = int(EntryFlags.HAS_PRIORITY)
_COMPRESSED = int(EntryFlags.COMPRESSED)
_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)
_HAS_DELIVER_AT = int(EntryFlags.HAS_DELIVER_AT)
_HAS_GROUP = int(EntryFlags.HAS_GROUP)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)
# An ENCRYPTED payload holds at least a nonce, a tag and the sealed content's flags byte
# (format/sealing.py; checked there too, a constant here so the decoder needs no import).
_MIN_SEALED = 12 + 16 + 1
MAX_GROUP_BYTES = 255  # a group name's UTF-8 length fits the u8 before it

# Any flag but BATCH_CONTINUES: an entry with one takes the decoder's general path.
_NOT_PLAIN = 0xFF & ~_BATCH_CONTINUES
_DATA = int(RecordType.DATA)
_HEADER_SIZE = ENTRY_HEADER.size

_CHECK_BY_COPY = 1024
# The checksum, bound once under a name of its own: the C function itself (no call layer),
# chosen in format.checksum.  Tests count the bytes the decoder checksums through it.
_crc32 = checksum
_crc32_v1 = checksum_v1
_pack_header = ENTRY_HEADER.pack
_unpack_header = ENTRY_HEADER.unpack_from
_pack_crc = CRC.pack
_pack_deliver_at = DELIVER_AT.pack
_unpack_crc = CRC.unpack_from


class Entry(NamedTuple):
    """One decoded entry.  ``payload`` is as stored (still compressed if ``flags`` say so)."""

    id: int
    timestamp: int
    expires_at: int | None
    priority: int
    headers: dict[str, str] | None
    payload: bytes
    flags: int
    type: int
    size: int
    deliver_at: int | None = None  # [HAS_DELIVER_AT]: not delivered before (ns)
    group: str | None = None  # [HAS_GROUP]: the message group
    format: int = ENTRY_FORMAT  # 1 or 2: which checksum the entry has


def encode_headers(headers: object) -> bytes:
    """Return the msgpack encoding of a ``Mapping[str, str]``.

    Raises ``TypeError`` naming the first offending key or value.
    """
    try:
        items = headers.items()  # type: ignore[attr-defined]
    except AttributeError:
        raise TypeError(
            f"headers must be a mapping of str to str, got {type(headers).__name__}"
        ) from None
    clean: dict[str, str] = {}
    for key, value in items:
        if type(key) is not str:
            raise TypeError(f"header names must be str, got {type(key).__name__} {key!r}")
        if type(value) is not str:
            raise TypeError(f"header {key!r} must have a str value, got {type(value).__name__}")
        clean[key] = value
    try:
        return msgpack.packb(clean, use_bin_type=True)  # type: ignore[no-any-return]
    except UnicodeEncodeError as exc:
        raise ValueError(f"headers must be valid unicode text: {exc}") from exc


def decode_headers(blob: bytes | memoryview, pos: int = 0) -> dict[str, str]:
    """Decode a msgpack headers map; raise :class:`CorruptRecord` if it is not one."""
    try:
        value = msgpack.unpackb(blob, raw=False, strict_map_key=True, use_list=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise CorruptRecord(f"headers are not valid msgpack ({exc})", pos) from None
    if type(value) is not dict or not all(
        type(k) is str and type(v) is str for k, v in value.items()
    ):
        raise CorruptRecord("headers are not a map of str to str", pos)
    return value


def encode_entry(
    message_id: int,
    timestamp: int,
    payload: bytes | bytearray | memoryview,
    *,
    expires_at: int | None = None,
    priority: int = _MEDIUM,
    headers_blob: bytes | None = None,
    compressed: bool = False,
    batch_continues: bool = False,
    record_type: int = RecordType.DATA,
    deliver_at: int | None = None,
    group: bytes | None = None,
    entry_format: int = ENTRY_FORMAT,
    encrypted: bool = False,
    seal: Callable[[bytes, bytes | bytearray | memoryview], bytes] | None = None,
    sealed_size: int = 0,
) -> bytes:
    """Return the encoded entry.  ``headers_blob`` comes from :func:`encode_headers`.

    ``batch_continues`` sets BATCH_CONTINUES: for every entry of a batch but its last.
    ``entry_format`` 1 writes a format-1 entry (CRC-32; for tests and tools).

    ``encrypted`` sets ENCRYPTED (format 2, no ``headers_blob``: the headers travel
    inside the sealed payload).  With ``seal``, the payload written is
    ``seal(prefix, payload)``, where ``prefix`` is the entry's bytes before its payload
    field and the result must be ``sealed_size`` bytes long (the entry's length is
    fixed before sealing, since the prefix holds it): ``format.sealing`` uses it.

    Raises ``ValueError`` for any value :func:`decode_entry` would reject as corrupt
    (id 0, priority above HIGH, unknown type) or that does not fit its field: bytes
    that cannot be read back must never reach a log as an accepted message.
    """
    if not 0 < message_id <= _U64_MAX:
        raise ValueError(f"entry id must be in 1..2**64-1, got {message_id}")
    if not _I64_MIN <= timestamp <= _I64_MAX:
        raise ValueError(f"entry timestamp {timestamp} does not fit an i64")
    if expires_at is not None and not _I64_MIN <= expires_at <= _I64_MAX:
        raise ValueError(f"entry expires_at {expires_at} does not fit an i64")
    if deliver_at is not None and not _I64_MIN <= deliver_at <= _I64_MAX:
        raise ValueError(f"entry deliver_at {deliver_at} does not fit an i64")
    if group is not None and not 0 < len(group) <= MAX_GROUP_BYTES:
        raise ValueError(f"an entry's group must be 1 to {MAX_GROUP_BYTES} bytes of UTF-8")
    if not 0 <= priority <= _MAX_PRIORITY:
        raise ValueError(f"entry priority must be 0, 1 or 2, got {priority}")
    if record_type not in KNOWN_TYPES:
        raise ValueError(f"unknown entry type {record_type}")
    if entry_format == ENTRY_FORMAT:
        crc = _crc32
        kind = _FORMAT_2 | record_type
    elif entry_format == 1:
        if deliver_at is not None or group is not None:
            raise ValueError("a format-1 entry cannot carry deliver_at or a group")
        crc = _crc32_v1
        kind = record_type
    else:
        raise ValueError(f"entry format must be 1 or 2, got {entry_format}")
    flags = 0
    parts: list[bytes | bytearray | memoryview] = []
    extra = 0
    if expires_at is not None:
        flags |= _HAS_TTL
        parts.append(EXPIRES_AT.pack(expires_at))
        extra += 8
    if priority != _MEDIUM:
        flags |= _HAS_PRIORITY
        parts.append(PRIORITY.pack(priority))
        extra += 1
    if deliver_at is not None:
        flags |= _HAS_DELIVER_AT
        parts.append(DELIVER_AT.pack(deliver_at))
        extra += 8
    if headers_blob is not None:
        flags |= _HAS_HEADERS
        parts.append(HEADERS_LENGTH.pack(len(headers_blob)))
        parts.append(headers_blob)
        extra += 4 + len(headers_blob)
    if group is not None:
        flags |= _HAS_GROUP
        parts.append(bytes((len(group),)))
        parts.append(group)
        extra += 1 + len(group)
    if compressed:
        flags |= _COMPRESSED
    if encrypted:
        if entry_format != ENTRY_FORMAT or headers_blob is not None:
            raise ValueError("an encrypted entry is format 2 and carries its headers sealed")
        flags |= _ENCRYPTED
    if batch_continues:
        flags |= _BATCH_CONTINUES
    length = MIN_ENTRY_SIZE + extra + (len(payload) if seal is None else sealed_size)
    if length > MAX_ENTRY_SIZE:
        raise ValueError(f"entry of {length} bytes exceeds the format limit {MAX_ENTRY_SIZE}")
    head = _pack_header(length, kind, flags, message_id, timestamp)
    if seal is not None:
        # The bytes before the payload are the associated data of the sealed payload:
        # sealing it here authenticates every visible field with it (format/sealing.py).
        prefix = b"".join((head, *parts)) if parts else head
        payload = seal(prefix, payload)
        if len(payload) != sealed_size:
            raise ValueError("a sealed payload differs from its announced size")
        body = prefix + payload
    else:
        body = b"".join((head, *parts, payload)) if parts else head + payload
    return body + _pack_crc(crc(body))


def encode_plain_entry(message_id: int, timestamp: int, payload: bytes) -> bytes:
    """The hot path of :func:`encode_entry`: a DATA entry with no optional field.

    The caller guarantees ``message_id`` >= 1 and ``timestamp`` fitting an i64 (the
    queue's own counter and clock); the bytes are exactly what encode_entry makes.
    """
    body = _pack_header(MIN_ENTRY_SIZE + len(payload), _DATA_V2, 0, message_id, timestamp)
    body += payload
    return body + _pack_crc(_crc32(body))


def encode_delayed_entry(message_id: int, timestamp: int, payload: bytes, deliver_at: int) -> bytes:
    """:func:`encode_plain_entry` with HAS_DELIVER_AT: the hot path of a delayed enqueue.

    The same preconditions, and ``deliver_at`` fitting an i64; the bytes are exactly
    what ``encode_entry(..., deliver_at=deliver_at)`` makes.
    """
    body = _pack_header(
        MIN_ENTRY_SIZE + 8 + len(payload), _DATA_V2, _HAS_DELIVER_AT, message_id, timestamp
    )
    body += _pack_deliver_at(deliver_at)
    body += payload
    return body + _pack_crc(_crc32(body))


# Payloads up to this size are copied behind their header so that one CRC call
# covers both (profiled: 100-byte entries encode 20% faster); larger ones stay
# separate parts, never copied.
_JOIN_PAYLOAD_BELOW = 1024


def encode_plain_batch_parts(
    first_id: int, timestamp: int, payloads: list[bytes], continues: bool = False
) -> tuple[list[bytes], list[int]]:
    """Encode one batch of DATA entries, ids ``first_id``, ``first_id + 1``, ..., for ``writev``.

    Returns the buffers, whose concatenation is the entries, and each entry's size.
    Every entry but the last carries BATCH_CONTINUES - the last too with ``continues``
    (the batch goes on after these entries); otherwise the preconditions and bytes are
    those of :func:`encode_plain_entry`.
    """
    parts: list[bytes] = []
    if not payloads:
        return parts, []
    sizes = [MIN_ENTRY_SIZE + n for n in map(len, payloads)]
    add = parts.append
    pack_header = _pack_header
    pack_crc = _pack_crc
    crc = _crc32
    flag = _BATCH_CONTINUES
    kind = _DATA_V2
    message_id = first_id
    if sizes[0] < _JOIN_PAYLOAD_BELOW:  # batches are usually alike: judge by the first
        for payload, size in zip(payloads, sizes, strict=True):
            body = pack_header(size, kind, flag, message_id, timestamp) + payload
            add(body)
            add(pack_crc(crc(body)))
            message_id += 1
        if continues:
            return parts, sizes
        # The last entry ends the batch: encoded again without BATCH_CONTINUES.
        body = pack_header(sizes[-1], kind, 0, message_id - 1, timestamp) + payloads[-1]
        parts[-2:] = (body, pack_crc(crc(body)))
    else:
        for payload, size in zip(payloads, sizes, strict=True):
            head = pack_header(size, kind, flag, message_id, timestamp)
            add(head)
            add(payload)
            add(pack_crc(crc(payload, crc(head))))
            message_id += 1
        if continues:
            return parts, sizes
        head = pack_header(sizes[-1], kind, 0, message_id - 1, timestamp)
        parts[-3:] = (head, payloads[-1], pack_crc(crc(payloads[-1], crc(head))))
    return parts, sizes


def peek_length(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """Return the declared length of the entry at ``pos`` (validated for sanity only).

    Raises :class:`IncompleteRecord` when fewer than 4 bytes remain and
    :class:`CorruptRecord` when the value cannot be an entry length.
    """
    if len(buf) - pos < 4:
        raise IncompleteRecord("entry length field cut short", pos, 4)
    (length,) = _LENGTH.unpack_from(buf, pos)
    if length < MIN_ENTRY_SIZE or length > MAX_ENTRY_SIZE:
        raise CorruptRecord(f"impossible entry length {length}", pos)
    return int(length)


def decode_entry(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[Entry, int]:
    """Decode the entry starting at ``pos``; return it and the offset just after it.

    Raises :class:`IncompleteRecord` if ``buf`` ends inside the entry and
    :class:`CorruptRecord` if the entry is complete but invalid.
    """
    end = len(buf)
    if end - pos < ENTRY_HEADER.size:
        if end - pos >= 4:
            peek_length(buf, pos)  # a corrupt length is corrupt even when short
        raise IncompleteRecord("entry header cut short", pos, ENTRY_HEADER.size)
    length, kind, flags, message_id, timestamp = _unpack_header(buf, pos)
    if length < MIN_ENTRY_SIZE or length > MAX_ENTRY_SIZE:
        raise CorruptRecord(f"impossible entry length {length}", pos)
    stop = pos + length
    if stop > end:
        raise IncompleteRecord(f"entry of {length} bytes cut short", pos, length)
    if kind == _DATA_V2 and not flags & _NOT_PLAIN:
        # A message with no optional field (batched or not), as most are: the checks
        # below reduce to the checksum and the id (profiled: the consumer's hot path).
        crc_at = stop - 4
        covered = buf[pos:crc_at] if length <= _CHECK_BY_COPY else memoryview(buf)[pos:crc_at]
        if _crc32(covered) != _unpack_crc(buf, crc_at)[0]:
            raise CorruptRecord("entry checksum mismatch", pos)
        if message_id == 0:
            raise CorruptRecord("entry id 0", pos)
        payload = bytes(buf[pos + _HEADER_SIZE : crc_at])
        return Entry(
            message_id,
            timestamp,
            None,
            _MEDIUM,
            None,
            payload,
            flags,
            _DATA,
            length,
            None,
            None,
            ENTRY_FORMAT,
        ), stop
    # The type byte's high nibble is the entry's format, which picks the checksum.
    if kind >> ENTRY_FORMAT_SHIFT == ENTRY_FORMAT:
        crc, entry_format = _crc32, ENTRY_FORMAT
        known_flags = KNOWN_FLAGS
    elif kind >> ENTRY_FORMAT_SHIFT == 0:
        crc, entry_format = _crc32_v1, 1
        known_flags = _KNOWN_FLAGS_V1
    else:
        raise CorruptRecord(f"entry of unknown format (type byte {kind:#04x})", pos)
    crc_at = stop - 4
    (stored,) = _unpack_crc(buf, crc_at)
    # Small entries are cheaper to check as a copied slice than through a memoryview.
    covered = buf[pos:crc_at] if length <= _CHECK_BY_COPY else memoryview(buf)[pos:crc_at]
    if crc(covered) != stored:
        raise CorruptRecord("entry checksum mismatch", pos)
    rtype = kind & _TYPE_MASK
    if rtype not in KNOWN_TYPES:
        raise CorruptRecord(f"unknown entry type {rtype}", pos)
    if flags & ~known_flags:
        raise CorruptRecord(f"unknown entry flags {flags:#04x} for format {entry_format}", pos)
    if message_id == 0:
        raise CorruptRecord("entry id 0", pos)
    at = pos + ENTRY_HEADER.size
    expires_at: int | None = None
    priority = _MEDIUM
    headers: dict[str, str] | None = None
    if flags & _HAS_TTL:
        if at + 8 > crc_at:
            raise CorruptRecord("entry too short for its expiry field", pos)
        (expires_at,) = EXPIRES_AT.unpack_from(buf, at)
        at += 8
    if flags & _HAS_PRIORITY:
        if at + 1 > crc_at:
            raise CorruptRecord("entry too short for its priority field", pos)
        priority = buf[at]
        if priority > _MAX_PRIORITY:
            raise CorruptRecord(f"invalid priority {priority}", pos)
        at += 1
    deliver_at: int | None = None
    if flags & _HAS_DELIVER_AT:
        if at + 8 > crc_at:
            raise CorruptRecord("entry too short for its deliver_at field", pos)
        (deliver_at,) = DELIVER_AT.unpack_from(buf, at)
        at += 8
    if flags & _HAS_HEADERS:
        if at + 4 > crc_at:
            raise CorruptRecord("entry too short for its headers length", pos)
        (hlen,) = HEADERS_LENGTH.unpack_from(buf, at)
        at += 4
        if at + hlen > crc_at:
            raise CorruptRecord("headers run past the end of the entry", pos)
        headers = decode_headers(bytes(buf[at : at + hlen]), pos)
        at += hlen
    group: str | None = None
    if flags & _HAS_GROUP:
        if at + 1 > crc_at:
            raise CorruptRecord("entry too short for its group length", pos)
        glen = buf[at]
        at += 1
        if not glen or at + glen > crc_at:
            raise CorruptRecord("entry group empty or running past the end of the entry", pos)
        try:
            group = bytes(buf[at : at + glen]).decode()
        except UnicodeDecodeError:
            raise CorruptRecord("entry group is not UTF-8", pos) from None
        at += glen
    if flags & _ENCRYPTED:  # one test on the path of a plain entry
        if flags & _HAS_HEADERS:
            raise CorruptRecord("an encrypted entry with headers outside its sealed payload", pos)
        if crc_at - at < _MIN_SEALED:
            raise CorruptRecord("encrypted entry too short for its sealed payload", pos)
    payload = bytes(buf[at:crc_at])
    return Entry(
        message_id,
        timestamp,
        expires_at,
        priority,
        headers,
        payload,
        flags,
        rtype,
        length,
        deliver_at,
        group,
        entry_format,
    ), stop
