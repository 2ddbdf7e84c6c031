"""A byte-level writer of Kestrel journals, written from the format descriptions only.

Independent of ``ledgerq.kestrel`` (nothing is imported from it), so the tests check
the readers against the specification rather than against themselves.  Layouts
(``/work/shared/notes/kestrel-darner.md`` section 3; all little-endian):

Old journals (Kestrel 1.x/2.x), no header, one opcode byte per record::

    0 ADD        i32 size (4 + len), i32 expiry (unix s, 0 none), data
    1 REMOVE
    2 ADDX       i32 size (16 + len), i64 add_ms, i64 expiry_ms, data
    3 REMOVE_TENTATIVE
    4 SAVE_XID   i32 xid
    5 UNREMOVE   i32 xid
    6 CONFIRM_REMOVE i32 xid
    7 ADD_XID    i32 xid, i32 size, i64 add_ms, i64 expiry_ms, data
    8 CONTINUE   i32 xid, i32 size, i64 add_ms, i64 expiry_ms, data
    9 REMOVE_TENTATIVE_XID i32 xid

Kestrel 3: magic (writer 27 64 26 03, reader 26 3C 26 03), then records of a command
byte ``cmd << 4 | header words``; for cmd >= 8 the first header word is the data size.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path


class OldJournal:
    """Builds the bytes of one Kestrel 1.x/2.x journal file, op by op."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.offsets: list[int] = []  # where each record starts

    def _op(self, blob: bytes) -> OldJournal:
        self.offsets.append(len(self.data))
        self.data += blob
        return self

    def add(self, payload: bytes, expiry_s: int = 0) -> OldJournal:
        """Opcode 0: starling's ADD (expiry in seconds, no add time)."""
        return self._op(struct.pack("<Bii", 0, 4 + len(payload), expiry_s) + payload)

    def remove(self) -> OldJournal:
        """Opcode 1."""
        return self._op(b"\x01")

    def addx(self, payload: bytes, add_ms: int, expiry_ms: int = 0) -> OldJournal:
        """Opcode 2."""
        return self._op(struct.pack("<Biqq", 2, 16 + len(payload), add_ms, expiry_ms) + payload)

    def remove_tentative(self) -> OldJournal:
        """Opcode 3 (xid implied)."""
        return self._op(b"\x03")

    def save_xid(self, xid: int) -> OldJournal:
        """Opcode 4."""
        return self._op(struct.pack("<Bi", 4, xid))

    def unremove(self, xid: int) -> OldJournal:
        """Opcode 5."""
        return self._op(struct.pack("<Bi", 5, xid))

    def confirm_remove(self, xid: int) -> OldJournal:
        """Opcode 6."""
        return self._op(struct.pack("<Bi", 6, xid))

    def add_xid(self, xid: int, payload: bytes, add_ms: int, expiry_ms: int = 0) -> OldJournal:
        """Opcode 7: the xid comes before the size."""
        return self._op(
            struct.pack("<Biiqq", 7, xid, 16 + len(payload), add_ms, expiry_ms) + payload
        )

    def roll_1x(self, opened: Sequence[tuple[int, bytes, int]], saved_xid: int) -> OldJournal:
        """What Kestrel 1.x writes first when it rolls a journal: each open transaction
        ``(xid, payload, add_ms)`` as ADD_XID + REMOVE_TENTATIVE, then SAVE_XID."""
        for xid, payload, add_ms in opened:
            self.add_xid(xid, payload, add_ms).remove_tentative()
        return self.save_xid(saved_xid)

    def continue_(self, xid: int, payload: bytes, add_ms: int, expiry_ms: int = 0) -> OldJournal:
        """Opcode 8 CONTINUE: confirm ``xid`` and add an item."""
        return self._op(
            struct.pack("<Biiqq", 8, xid, 16 + len(payload), add_ms, expiry_ms) + payload
        )

    def remove_tentative_xid(self, xid: int) -> OldJournal:
        """Opcode 9."""
        return self._op(struct.pack("<Bi", 9, xid))

    def raw(self, blob: bytes) -> OldJournal:
        """Arbitrary bytes (damage)."""
        return self._op(blob)

    def bytes(self) -> bytes:
        """The journal's bytes."""
        return bytes(self.data)

    def write(self, path: Path) -> Path:
        """Write the journal to ``path``."""
        path.write_bytes(self.bytes())
        return path


WRITER_MAGIC = b"\x27\x64\x26\x03"
READER_MAGIC = b"\x26\x3c\x26\x03"


def put_record(
    item_id: int,
    payload: bytes,
    add_ms: int,
    expire_ms: int | None = None,
    error_count: int = 0,
) -> bytes:
    """A Kestrel 3 PUT: 0x86 (6 header words) or 0x88 (8, with the expiry)."""
    words = 6 if expire_ms is None else 8
    header = struct.pack("<IiQq", len(payload), error_count, item_id, add_ms)
    if expire_ms is not None:
        header += struct.pack("<q", expire_ms)
    return bytes([0x80 | words]) + header + payload


def read_head_record(head: int) -> bytes:
    """READ_HEAD: command 0 with 2 header words (0x02), an i64 id."""
    return b"\x02" + struct.pack("<q", head)


def read_done_record(ids: list[int]) -> bytes:
    """READ_DONE: command 9 with 1 header word (0x91): the byte count, then i64 ids."""
    return b"\x91" + struct.pack("<I", 8 * len(ids)) + struct.pack(f"<{len(ids)}q", *ids)


def writer_file(records: list[bytes], *, padding: int = 0) -> bytes:
    """A writer file: magic, records, then ``padding`` zero bytes (mmapped files)."""
    return WRITER_MAGIC + b"".join(records) + b"\x00" * padding


def bookmark_file(head: int, done: list[int] | None = None, *, extra: bytes = b"") -> bytes:
    """A reader bookmark as libkestrel writes it: magic, READ_HEAD, READ_DONE."""
    return READER_MAGIC + read_head_record(head) + read_done_record(done or []) + extra
