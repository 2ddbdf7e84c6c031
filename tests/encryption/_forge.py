"""What an attacker who can write a queue directory, and has no key, does to its logs.

Each function changes the real bytes of a real (closed) queue directory the way such an
attacker can: every entry it leaves has a valid CRC-32C, which needs no key, so only the
seal (AES-GCM over the entry's id, visible fields and queue identity) can tell a forged,
moved, stripped or replayed entry from a genuine one.  The functions return what they
wrote, for the tests to look for in what the readers deliver.
"""

from __future__ import annotations

import struct
from pathlib import Path

from ledgerq.format.checksum import checksum
from ledgerq.format.entry import (
    ENTRY_HEADER,
    MIN_ENTRY_SIZE,
    Entry,
    EntryFlags,
    decode_entry,
    encode_entry,
    encode_headers,
)

__all__ = [
    "FORGED",
    "entries",
    "forge_in_place",
    "forge_tail",
    "last_log",
    "move_to_next_id",
    "replay",
    "retime",
    "strip_seal",
    "transplant",
]

FORGED = b"FORGED: rm -rf / (written without the key)"
_ENCRYPTED = int(EntryFlags.ENCRYPTED)
_FLAGS_AT = 5  # the flags byte: after the length (u32) and the type byte
_ID = struct.Struct("<Q")
_ID_AT = 6
_TIMESTAMP = struct.Struct("<q")
_TIMESTAMP_AT = 14
_CRC = struct.Struct("<I")


def last_log(queue: Path) -> Path:
    """The newest segment log of the queue at ``queue`` (where appends go)."""
    return max((queue / "segments").glob("*.log"))


def entries(log: Path) -> list[tuple[int, Entry]]:
    """(offset, entry) of every entry of ``log`` (the whole file must be valid)."""
    raw = log.read_bytes()
    found = []
    pos = 0
    while pos < len(raw):
        entry, end = decode_entry(raw, pos)
        found.append((pos, entry))
        pos = end
    return found


def _find(log: Path, message_id: int) -> tuple[int, Entry]:
    for offset, entry in entries(log):
        if entry.id == message_id:
            return offset, entry
    raise LookupError(f"no message {message_id} in {log}")


def _fix_crc(raw: bytearray, offset: int, size: int) -> None:
    """Give the entry at ``offset`` the CRC its bytes need (no key needed for that)."""
    crc_at = offset + size - _CRC.size
    raw[crc_at : offset + size] = _CRC.pack(checksum(bytes(raw[offset:crc_at])))


def forge_tail(
    queue: Path, payload: bytes = FORGED, *, headers: dict[str, str] | None = None, count: int = 1
) -> list[int]:
    """Append ``count`` plain format-2 entries (flags 0, or HAS_HEADERS with ``headers``)
    with the next ids to the newest segment; return their ids."""
    log = last_log(queue)
    last = entries(log)[-1][1]
    blob = encode_headers(headers) if headers is not None else None
    ids = [last.id + 1 + i for i in range(count)]
    forged = b"".join(encode_entry(i, last.timestamp + 1, payload, headers_blob=blob) for i in ids)
    with log.open("ab") as f:
        f.write(forged)
    return ids


def forge_in_place(queue: Path, message_id: int) -> bytes:
    """Replace message ``message_id`` by a plain entry of the same id and size (so the
    sparse index stays right); return the forged payload."""
    log = last_log(queue)
    offset, genuine = _find(log, message_id)
    payload = (FORGED * (genuine.size // len(FORGED) + 1))[: genuine.size - MIN_ENTRY_SIZE]
    forged = encode_entry(message_id, genuine.timestamp, payload)
    assert len(forged) == genuine.size
    raw = bytearray(log.read_bytes())
    raw[offset : offset + genuine.size] = forged
    log.write_bytes(bytes(raw))
    return payload


def strip_seal(queue: Path, message_id: int) -> bytes:
    """Clear the ENCRYPTED flag of message ``message_id`` and fix its CRC; return what
    a reader that believed the flag would deliver (nonce, ciphertext and tag)."""
    log = last_log(queue)
    offset, genuine = _find(log, message_id)
    assert genuine.flags == _ENCRYPTED, "a message with no visible optional field"
    raw = bytearray(log.read_bytes())
    raw[offset + _FLAGS_AT] = 0
    _fix_crc(raw, offset, genuine.size)
    log.write_bytes(bytes(raw))
    return genuine.payload


def move_to_next_id(queue: Path, message_id: int) -> int:
    """Append a copy of genuine message ``message_id`` under the next id (its sealed
    blob untouched, the id field and CRC rewritten); return that id."""
    log = last_log(queue)
    offset, genuine = _find(log, message_id)
    new_id = entries(log)[-1][1].id + 1
    raw = bytearray(log.read_bytes()[offset : offset + genuine.size])
    raw[_ID_AT : _ID_AT + _ID.size] = _ID.pack(new_id)
    _fix_crc(raw, 0, genuine.size)
    with log.open("ab") as f:
        f.write(raw)
    return new_id


def retime(queue: Path, message_id: int) -> None:
    """Move the visible timestamp of message ``message_id`` an hour back (CRC fixed)."""
    log = last_log(queue)
    offset, genuine = _find(log, message_id)
    raw = bytearray(log.read_bytes())
    at = offset + _TIMESTAMP_AT
    raw[at : at + _TIMESTAMP.size] = _TIMESTAMP.pack(genuine.timestamp - 3600 * 10**9)
    _fix_crc(raw, offset, genuine.size)
    log.write_bytes(bytes(raw))


def replay(queue: Path, message_id: int) -> None:
    """Append the genuine bytes of message ``message_id`` again, unchanged, to the end
    of the newest segment (an old entry copied in again)."""
    log = last_log(queue)
    offset, genuine = _find(log, message_id)
    copy = log.read_bytes()[offset : offset + genuine.size]
    with log.open("ab") as f:
        f.write(copy)


def transplant(source: Path, dest: Path, message_id: int) -> None:
    """Put the genuine entry ``message_id`` of queue ``source`` where ``dest``'s entry of
    that id is (the same id, a valid CRC; the two must be of the same size)."""
    src_log, dest_log = last_log(source), last_log(dest)
    src_offset, theirs = _find(src_log, message_id)
    dest_offset, ours = _find(dest_log, message_id)
    assert theirs.size == ours.size and ENTRY_HEADER.size < ours.size
    raw = bytearray(dest_log.read_bytes())
    raw[dest_offset : dest_offset + ours.size] = src_log.read_bytes()[
        src_offset : src_offset + theirs.size
    ]
    dest_log.write_bytes(bytes(raw))
