"""Kestrel 3 (libkestrel) journals: writer files of PUTs and reader bookmark files.

A file is a 4-byte magic, read as a big-endian int (writer ``27 64 26 03``, reader
bookmark ``26 3C 26 03``), then records; everything after the magic is
little-endian.  A record is a command byte ``cmd << 4 | header_words``, then
``header_words`` 32-bit words, then - for ``cmd >= 8`` - a data block whose length
in bytes is the first header word (that word counts in ``header_words``)::

    byte    name       header words                                       data
    0x86/88 PUT        i32 data_len, i32 error_count, i64 id, i64 add_ms,  the item
                       [i64 expire_ms when header_words == 8]
    0x02    READ_HEAD  i64 id: every id <= it has been read (0: none)      -
    0x91    READ_DONE  i32 byte count (8 x n)                              n x i64 ids
                                                                           read out of order

A command byte 0x00 means "no more records": writer files are mmapped at their
maximum size, so a crashed server leaves zero padding, and records are written
first byte last, so a half-written record starts with 0 too.  Unknown commands
are skipped by their declared size.  Data over 16 MiB, a PUT with another header
size than 6 or 8 words, or a PUT with id 0 is corruption.

File names: writer files ``q.<digits>`` (ordered by their first id), bookmarks
``q.read.<reader>`` (``q.read.`` is the default reader, deleted by libkestrel once
a named reader exists); names with ``~`` are temporary.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ledgerq.kestrel._types import JournalDamage, KestrelItem

__all__ = [
    "MAX_DATA",
    "READER_MAGIC",
    "WRITER_MAGIC",
    "Bookmark",
    "Record3",
    "WriterFile",
    "decode_record3",
    "file_magic",
    "read_bookmark",
    "read_writer_file",
]

WRITER_MAGIC = bytes.fromhex("27642603")
READER_MAGIC = bytes.fromhex("263c2603")
MAX_DATA = 16 * 1024 * 1024  # libkestrel's Record.LARGEST_DATA
CMD_READ_HEAD = 0
CMD_PUT = 8
CMD_READ_DONE = 9
PUT_HEADER = struct.Struct("<iiqq")  # data_len, error_count, id, add_ms
assert PUT_HEADER.size == 24
U32 = struct.Struct("<I")
assert U32.size == 4
I64 = struct.Struct("<q")  # a PUT's expire_ms, a READ_HEAD's id
assert I64.size == 8

ProgressCallback = Callable[[int], None]


class TruncatedRecord(Exception):
    """The file ends inside a record."""


class BadRecord(Exception):
    """The record is impossible (a size over the limit, a malformed PUT)."""


@dataclass(frozen=True, slots=True)
class Record3:
    """One record: command, header words (without the command byte) and data."""

    cmd: int
    offset: int
    size: int
    header: bytes
    data: bytes


def file_magic(path: str) -> bytes:
    """The first 4 bytes of a file (fewer if it is shorter)."""
    with open(path, "rb") as f:
        return f.read(4)


def decode_record3(buf: bytes | mmap.mmap, pos: int) -> Record3 | None:
    """Decode the record at ``pos``; None at the end marker (a 0x00 command byte).

    Raises :class:`TruncatedRecord` or :class:`BadRecord`.
    """
    command = buf[pos]
    if command == 0:
        return None
    cmd, words = command >> 4, command & 0x0F
    head_end = pos + 1 + 4 * words
    if head_end > len(buf):
        raise TruncatedRecord
    header = bytes(buf[pos + 1 : head_end])
    data_len = 0
    if cmd >= 8:
        if words < 1:
            raise BadRecord(f"command {cmd} has a data block but no length word")
        (data_len,) = U32.unpack_from(header, 0)
        if data_len > MAX_DATA:
            raise BadRecord(f"data block of {data_len} bytes (libkestrel's limit is 16 MiB)")
    end = head_end + data_len
    if end > len(buf):
        raise TruncatedRecord
    return Record3(cmd, pos, end - pos, header, bytes(buf[head_end:end]))


def _rest_is_zero(buf: bytes | mmap.mmap, pos: int) -> bool:
    step = 1 << 20
    while pos < len(buf):
        chunk = buf[pos : pos + step]
        if chunk.count(0) != len(chunk):
            return False
        pos += step
    return True


@dataclass
class WriterFile:
    """What one writer file holds (items only while :func:`read_writer_file` streams)."""

    name: str
    path: str
    size: int
    first_id: int | None = None
    last_id: int | None = None
    records: int = 0
    damage: list[JournalDamage] = field(default_factory=list)
    quirks: Counter[str] = field(default_factory=Counter)
    quirk_first: dict[str, str] = field(default_factory=dict)

    def quirk(self, kind: str, offset: int) -> None:
        """Count a quirk seen at ``offset``."""
        self.quirks[kind] += 1
        self.quirk_first.setdefault(kind, f"{self.name}:{offset}")


Q_UNKNOWN = "unknown record command skipped (as libkestrel does)"
Q_AFTER_END = "non-zero bytes after the end marker (0x00) ignored (as libkestrel does)"
Q_ID_ORDER = "PUT id not above the previous one: skipped"


def read_writer_file(
    path: str,
    *,
    name: str | None = None,
    first_only: bool = False,
    on_progress: ProgressCallback | None = None,
) -> tuple[WriterFile, Iterator[KestrelItem]]:
    """Open a writer file: its summary, and an iterator of its PUT items in file order.

    The summary's ``last_id``, ``records``, ``damage`` and ``quirks`` are complete once
    the iterator is exhausted.  ``first_only`` stops after the first PUT (to order
    files by first id cheaply).  Damage ends the file: items before it are yielded.
    """
    label = name or os.path.basename(path)
    size = os.path.getsize(path)
    info = WriterFile(label, path, size)
    return info, _iter_writer(info, first_only, on_progress)


def _iter_writer(
    info: WriterFile, first_only: bool, on_progress: ProgressCallback | None
) -> Iterator[KestrelItem]:
    if info.size == 0:
        return
    with open(info.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != WRITER_MAGIC:
            info.damage.append(JournalDamage(info.name, 0, "not a Kestrel 3 writer file (magic)"))
            return
        pos = 4
        reported = 0
        last = 0
        while pos < len(buf):
            try:
                record = decode_record3(buf, pos)
            except TruncatedRecord:
                info.damage.append(
                    JournalDamage(
                        info.name,
                        pos,
                        f"truncated record: {len(buf) - pos} bytes not read",
                        is_torn=True,
                    )
                )
                break
            except BadRecord as exc:
                info.damage.append(JournalDamage(info.name, pos, f"{exc}; rest not read"))
                break
            if record is None:
                if not _rest_is_zero(buf, pos):
                    info.quirk(Q_AFTER_END, pos)
                break
            info.records += 1
            pos += record.size
            if on_progress is not None and pos - reported >= 1 << 20:
                on_progress(pos - reported)
                reported = pos
            if record.cmd != CMD_PUT:
                info.quirk(Q_UNKNOWN, record.offset)
                continue
            words = len(record.header) // 4
            if words not in (6, 8):
                info.damage.append(
                    JournalDamage(
                        info.name,
                        record.offset,
                        f"PUT with {words} header words (6 or 8 expected); rest not read",
                    )
                )
                break
            _, error_count, item_id, add_ms = PUT_HEADER.unpack_from(record.header, 0)
            expire_ms = I64.unpack_from(record.header, 24)[0] if words == 8 else 0
            if item_id == 0:
                info.damage.append(
                    JournalDamage(info.name, record.offset, "PUT with id 0; rest not read")
                )
                break
            if item_id <= last:
                info.quirk(Q_ID_ORDER, record.offset)
                continue
            last = item_id
            if info.first_id is None:
                info.first_id = item_id
            info.last_id = item_id
            yield KestrelItem(
                data=record.data,
                add_time_ms=add_ms,
                expire_time_ms=expire_ms or None,
                file=info.name,
                offset=record.offset,
                item_id=item_id,
                error_count=error_count,
            )
            if first_only:
                return
        if on_progress is not None and len(buf) > reported:
            on_progress(len(buf) - reported)


@dataclass
class Bookmark:
    """A reader's saved state: every id <= ``head`` and every id in ``done`` was read."""

    name: str
    head: int = 0
    done: set[int] = field(default_factory=set)
    damage: list[JournalDamage] = field(default_factory=list)
    quirks: Counter[str] = field(default_factory=Counter)

    def is_read(self, item_id: int) -> bool:
        """Whether this reader has consumed the item ``item_id``."""
        return item_id <= self.head or item_id in self.done


def read_bookmark(path: str, *, name: str | None = None) -> Bookmark:
    """Read a reader bookmark file: the last READ_HEAD wins, READ_DONE ids accumulate.

    Damage (a truncated or impossible record) is recorded and ends the reading; what
    was read before it is kept.
    """
    label = name or os.path.basename(path)
    mark = Bookmark(label)
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 4 or buf[:4] != READER_MAGIC:
        mark.damage.append(JournalDamage(label, 0, "not a Kestrel 3 reader file (magic)"))
        return mark
    pos = 4
    while pos < len(buf):
        try:
            record = decode_record3(buf, pos)
        except TruncatedRecord:
            mark.damage.append(JournalDamage(label, pos, "truncated record"))
            break
        except BadRecord as exc:
            mark.damage.append(JournalDamage(label, pos, str(exc)))
            break
        if record is None:
            break
        pos += record.size
        if record.cmd == CMD_READ_HEAD:
            if len(record.header) != 8:
                mark.damage.append(
                    JournalDamage(label, record.offset, "READ_HEAD without its 2 header words")
                )
                break
            (mark.head,) = I64.unpack_from(record.header, 0)
        elif record.cmd == CMD_READ_DONE:
            if len(record.data) % 8:
                mark.damage.append(
                    JournalDamage(label, record.offset, "READ_DONE of a size not a multiple of 8")
                )
                break
            mark.done.update(struct.unpack(f"<{len(record.data) // 8}q", record.data))
        else:
            mark.quirks[Q_UNKNOWN] += 1
    mark.done = {i for i in mark.done if i > mark.head}
    return mark
