"""Kestrel 1.x / 2.x queue journals: an opcode log replayed from an empty queue.

Every integer is little-endian; times are i64 milliseconds since the epoch, except
opcode 0 (starling's ADD), whose expiry is i32 seconds.  A journal has no header:
it is a sequence of operations, each an opcode byte and its fields::

    op  name                  fields after the opcode
    0   ADD                   i32 size (= 4 + len), i32 expiry (unix seconds, 0 none), data
    1   REMOVE                -
    2   ADDX                  i32 size (= 16 + len), i64 add_ms, i64 expiry_ms (0 none), data
    3   REMOVE_TENTATIVE      -  (the xid is implied: the next one)
    4   SAVE_XID              i32 xid
    5   UNREMOVE              i32 xid
    6   CONFIRM_REMOVE        i32 xid
    7   ADD_XID               i32 xid, i32 size, i64 add_ms, i64 expiry_ms, data
    8   CONTINUE              i32 xid, i32 size, i64 add_ms, i64 expiry_ms, data
    9   REMOVE_TENTATIVE_XID  i32 xid

Opcode 8 is CONTINUE (confirm ``xid`` and append an item) in every released
version - not the STATE_DUMP of Kestrel's docs/journal_format.md, which never
shipped - and opcode 9, missing from that document, is what 2.1+ writes for every
``/open``.  See ``docs/kestrel.md`` and ``/work/shared/notes/kestrel-darner.md``.

Replay is literal, op by op, in Kestrel's file order, with the *reference* xid
semantics: a REMOVE_TENTATIVE right after an ADD_XID keeps that named xid;
otherwise the next xid is counter + 1, skipping 0 and xids still open; SAVE_XID
sets the counter and REMOVE_TENTATIVE_XID sets it to its xid.  At the end, open
transactions go back to the head in ascending xid order (what a restarted Kestrel
serves: it writes UNREMOVE for every open xid, highest first).

Everything the replay finds odd is reported as a *quirk* (counted, with the place of
the first occurrence); a record that cannot be read ends the replay of its file,
which is reported as *damage*, and the replay goes on with the next file (as
Kestrel does).
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import IntEnum

from ledgerq.kestrel._types import JournalDamage, KestrelItem

__all__ = [
    "OldJournalFiles",
    "OldRecord",
    "Opcode",
    "Replay",
    "TruncatedRecord",
    "BadRecord",
    "decode_record",
    "iter_records",
    "order_journal_files",
]

I32 = struct.Struct("<i")
assert I32.size == 4
ADDX_HEAD = struct.Struct("<qq")  # add_ms, expiry_ms
assert ADDX_HEAD.size == 16
ADD_HEAD = struct.Struct("<i")  # expiry (seconds)
assert ADD_HEAD.size == 4
_I32_MIN = -(1 << 31)


class Opcode(IntEnum):
    """The opcode byte of an old Kestrel journal record."""

    ADD = 0
    REMOVE = 1
    ADDX = 2
    REMOVE_TENTATIVE = 3
    SAVE_XID = 4
    UNREMOVE = 5
    CONFIRM_REMOVE = 6
    ADD_XID = 7
    CONTINUE = 8
    REMOVE_TENTATIVE_XID = 9


_XID_ONLY = frozenset({Opcode.SAVE_XID, Opcode.UNREMOVE, Opcode.CONFIRM_REMOVE})


class TruncatedRecord(Exception):
    """The journal ends inside a record."""


class BadRecord(Exception):
    """The bytes at this position cannot be a record (unknown opcode, impossible size)."""


@dataclass(frozen=True, slots=True)
class OldRecord:
    """One decoded operation.  ``add_ms``/``expiry_ms`` are None when absent or 0."""

    op: Opcode
    offset: int
    size: int  # bytes of the whole record, opcode included
    xid: int | None = None
    data: bytes | None = None
    add_ms: int | None = None
    expiry_ms: int | None = None


def _i32(buf: bytes | mmap.mmap, pos: int) -> int:
    if pos + 4 > len(buf):
        raise TruncatedRecord
    return int(I32.unpack_from(buf, pos)[0])


def _block(buf: bytes | mmap.mmap, pos: int, op: Opcode, minimum: int) -> tuple[int, int, int, int]:
    """Read ``i32 size`` and check it; return (size, data start, data end, header end)."""
    size = _i32(buf, pos)
    if size < minimum:
        raise BadRecord(f"{op.name} with size {size} (at least {minimum})")
    start = pos + 4
    end = start + size
    if end > len(buf):
        raise TruncatedRecord
    return size, start + minimum, end, start


def decode_record(buf: bytes | mmap.mmap, pos: int) -> OldRecord:
    """Decode the record at ``pos``.

    Raises :class:`TruncatedRecord` if the buffer ends inside it and
    :class:`BadRecord` if it is not a record.
    """
    code = buf[pos]
    try:
        op = Opcode(code)
    except ValueError:
        raise BadRecord(f"invalid opcode {code}") from None
    at = pos + 1
    if op in (Opcode.REMOVE, Opcode.REMOVE_TENTATIVE):
        return OldRecord(op, pos, 1)
    if op in _XID_ONLY or op is Opcode.REMOVE_TENTATIVE_XID:
        return OldRecord(op, pos, 5, xid=_i32(buf, at))
    if op is Opcode.ADD:
        _, data_at, end, head = _block(buf, at, op, ADD_HEAD.size)
        (expiry_s,) = ADD_HEAD.unpack_from(buf, head)
        return OldRecord(
            op,
            pos,
            end - pos,
            data=bytes(buf[data_at:end]),
            expiry_ms=expiry_s * 1000 if expiry_s else None,
        )
    xid = None
    if op in (Opcode.ADD_XID, Opcode.CONTINUE):
        xid = _i32(buf, at)
        at += 4
    _, data_at, end, head = _block(buf, at, op, ADDX_HEAD.size)
    add_ms, expiry_ms = ADDX_HEAD.unpack_from(buf, head)
    return OldRecord(
        op,
        pos,
        end - pos,
        xid=xid,
        data=bytes(buf[data_at:end]),
        add_ms=add_ms,
        expiry_ms=expiry_ms or None,
    )


def iter_records(buf: bytes | mmap.mmap) -> Iterator[OldRecord]:
    """Every record of a journal, in order; raises at the first one that cannot be read."""
    pos = 0
    end = len(buf)
    while pos < end:
        record = decode_record(buf, pos)
        yield record
        pos += record.size


# ---------------------------------------------------------------------- file order

_ROTATED = re.compile(r"^(?P<name>[^.]+)\.(?P<ts>[0-9]+)\Z")
_PACK = re.compile(r"^(?P<name>[^.]+)\.(?P<ts>[0-9]+)\.pack\Z")


@dataclass(frozen=True, slots=True)
class OldJournalFiles:
    """The files of one queue in replay order, and the files passed over (with why)."""

    queue: str
    order: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...]


def order_journal_files(queue: str, names: list[str]) -> OldJournalFiles:
    """Kestrel's replay order of ``names`` (file names in one directory) for ``queue``.

    Names with ``~~`` are temporary and ignored.  A ``q.<ts>.pack`` supersedes every
    rotated ``q.<t>`` with ``t <= ts`` (earlier packs included) and takes its place as
    ``q.<ts>``; rotated files are replayed by numeric timestamp, then ``q`` itself.
    """
    rotated: dict[int, str] = {}
    packs: list[tuple[int, str]] = []
    current = None
    ignored: list[tuple[str, str]] = []
    for name in sorted(names):
        if name.split(".", 1)[0] != queue and not (name.startswith(queue + "~~")):
            continue
        if "~~" in name:
            ignored.append((name, "temporary file (~~): ignored, as Kestrel does"))
            continue
        if name == queue:
            current = name
            continue
        match = _ROTATED.match(name)
        if match and match.group("name") == queue:
            ts = int(match.group("ts"))
            if ts in rotated:  # q.007 and q.7: the same timestamp twice
                ignored.append((name, f"another file has timestamp {ts}: {rotated[ts]}"))
                continue
            rotated[ts] = name
            continue
        match = _PACK.match(name)
        if match and match.group("name") == queue:
            packs.append((int(match.group("ts")), name))
            continue
        ignored.append((name, "not a journal file name of this queue"))
    for ts, pack in sorted(packs):
        for t in sorted(rotated):
            if t <= ts:
                ignored.append((rotated.pop(t), f"superseded by pack file {pack}"))
        rotated[ts] = pack
    order = [rotated[t] for t in sorted(rotated)]
    if current is not None:
        order.append(current)
    return OldJournalFiles(queue, tuple(order), tuple(ignored))


# ---------------------------------------------------------------------- replay

ProgressCallback = Callable[[int], None]

# Quirk kinds (stable texts; the report counts each and shows where it was first seen).
Q_REMOVE_EMPTY = "REMOVE on an empty queue (ignored, as Kestrel does)"
Q_TENTATIVE_EMPTY = "tentative remove on an empty queue (ignored, as Kestrel does)"
Q_UNREMOVE_UNKNOWN = "UNREMOVE of an xid that is not open (ignored, as Kestrel does)"
Q_CONFIRM_UNKNOWN = "CONFIRM_REMOVE of an xid that is not open (ignored, as Kestrel does)"
Q_CONTINUE_UNKNOWN = "CONTINUE of an xid that is not open (its item is added anyway)"
Q_XID_REUSED = (
    "tentative remove with an xid that is already open: the earlier open item is lost, "
    "as in Kestrel"
)
Q_NAMED_XID = (
    "REMOVE_TENTATIVE after ADD_XID kept the named xid (reference semantics; Kestrel 1.x, "
    "its QDumper and the 3.0 converter renumber these 1..n)"
)
Q_NAMED_XID_OPEN = "ADD_XID names an xid that is already open: the next free xid is used"
Q_NAMED_OTHER_ITEM = (
    "REMOVE_TENTATIVE after ADD_XID took another item than the ADD_XID's (the queue was "
    "not empty); the named xid is kept"
)
Q_ADD_XID_UNUSED = "ADD_XID not followed by REMOVE_TENTATIVE: its item stays queued"
Q_STARLING_ADD = "starling ADD (opcode 0) items have no add time"
Q_IMPLIED_OPEN = (
    "open transactions from REMOVE_TENTATIVE (opcode 3, implied xid) at the end: numbered "
    "by the reference rule; Kestrel 2.x replays opcode 3 as xid 0 and keeps only one of them"
)
Q_ZERO_XID = "xid 0 in a record (Kestrel never hands it out)"


class Replay:
    """The state of one queue while its journal files are replayed."""

    def __init__(self, queue: str) -> None:
        self.queue_name = queue
        self.items: deque[KestrelItem] = deque()
        self.open: dict[int, KestrelItem] = {}
        self.implied: set[int] = set()  # open xids assigned by opcode 3
        self.counter = 0
        self.records = 0
        self.files: list[str] = []
        self.damage: list[JournalDamage] = []
        self.quirks: Counter[str] = Counter()
        self.quirk_first: dict[str, str] = {}
        self._named: tuple[int, KestrelItem] | None = None  # the ADD_XID just replayed

    # ------------------------------------------------------------------ files

    def replay_file(
        self, path: str, *, on_progress: ProgressCallback | None = None, label: str | None = None
    ) -> None:
        """Apply every readable record of the journal file at ``path``."""
        name = label or os.path.basename(path)
        self.files.append(name)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                self._replay_buffer(buf, name, on_progress)

    def replay_bytes(self, data: bytes, name: str) -> None:
        """Apply every readable record of ``data`` (a whole journal file called ``name``)."""
        self.files.append(name)
        self._replay_buffer(data, name, None)

    def _replay_buffer(
        self, buf: bytes | mmap.mmap, name: str, on_progress: ProgressCallback | None
    ) -> None:
        pos = 0
        end = len(buf)
        reported = 0
        while pos < end:
            try:
                record = decode_record(buf, pos)
            except TruncatedRecord:
                self.damage.append(
                    JournalDamage(
                        name,
                        pos,
                        f"truncated record (opcode {buf[pos]}): the file ends inside it; "
                        f"{end - pos} bytes not replayed",
                        is_torn=True,
                    )
                )
                break
            except BadRecord as exc:
                self.damage.append(
                    JournalDamage(
                        name,
                        pos,
                        f"{exc}; the remaining {end - pos} bytes of this file are not replayed",
                    )
                )
                break
            self.apply(record, name)
            pos += record.size
            if on_progress is not None and pos - reported >= 1 << 20:
                on_progress(pos - reported)
                reported = pos
        if on_progress is not None and end > reported:
            on_progress(end - reported)

    # ------------------------------------------------------------------ operations

    def _quirk(self, kind: str, name: str, offset: int) -> None:
        self.quirks[kind] += 1
        self.quirk_first.setdefault(kind, f"{name}:{offset}")

    def _next_xid(self) -> int:
        while True:
            self.counter = (self.counter + 1 - _I32_MIN) % (1 << 32) + _I32_MIN
            if self.counter != 0 and self.counter not in self.open:
                return self.counter

    def _item(self, record: OldRecord, name: str) -> KestrelItem:
        assert record.data is not None
        return KestrelItem(
            data=record.data,
            add_time_ms=record.add_ms,
            expire_time_ms=record.expiry_ms,
            file=name,
            offset=record.offset,
        )

    def _open_xid(self, xid: int, item: KestrelItem, name: str, offset: int) -> None:
        if xid in self.open:
            self._quirk(Q_XID_REUSED, name, offset)
        if xid == 0:
            self._quirk(Q_ZERO_XID, name, offset)
        self.open[xid] = item

    def _named_unused(self, name: str, offset: int) -> None:
        if self._named is not None:
            self._quirk(Q_ADD_XID_UNUSED, name, offset)
            self._named = None

    def apply(self, record: OldRecord, name: str) -> None:
        """Apply one operation to the queue state."""
        self.records += 1
        op = record.op
        named, self._named = self._named, None
        if named is not None and op is not Opcode.REMOVE_TENTATIVE:
            self._quirk(Q_ADD_XID_UNUSED, name, record.offset)
        if op is Opcode.ADD or op is Opcode.ADDX:
            if op is Opcode.ADD:
                self._quirk(Q_STARLING_ADD, name, record.offset)
            self.items.append(self._item(record, name))
        elif op is Opcode.REMOVE:
            if self.items:
                self.items.popleft()
            else:
                self._quirk(Q_REMOVE_EMPTY, name, record.offset)
        elif op is Opcode.REMOVE_TENTATIVE:
            if not self.items:
                self._quirk(Q_TENTATIVE_EMPTY, name, record.offset)
                return
            item = self.items.popleft()
            if named is not None:
                xid, named_item = named
                if named_item is not item:
                    self._quirk(Q_NAMED_OTHER_ITEM, name, record.offset)
                if xid in self.open:
                    self._quirk(Q_NAMED_XID_OPEN, name, record.offset)
                    xid = self._next_xid()
                    self.implied.add(xid)
                else:
                    self._quirk(Q_NAMED_XID, name, record.offset)
                    self.implied.discard(xid)
            else:
                xid = self._next_xid()
                self.implied.add(xid)
            self._open_xid(xid, item, name, record.offset)
        elif op is Opcode.SAVE_XID:
            assert record.xid is not None
            self.counter = record.xid
        elif op is Opcode.UNREMOVE:
            assert record.xid is not None
            found = self.open.pop(record.xid, None)
            self.implied.discard(record.xid)
            if found is None:
                self._quirk(Q_UNREMOVE_UNKNOWN, name, record.offset)
            else:
                self.items.appendleft(found)
        elif op is Opcode.CONFIRM_REMOVE:
            assert record.xid is not None
            self.implied.discard(record.xid)
            if self.open.pop(record.xid, None) is None:
                self._quirk(Q_CONFIRM_UNKNOWN, name, record.offset)
        elif op is Opcode.ADD_XID:
            assert record.xid is not None
            item = self._item(record, name)
            self.items.append(item)
            self._named = (record.xid, item)
        elif op is Opcode.CONTINUE:
            assert record.xid is not None
            self.implied.discard(record.xid)
            if self.open.pop(record.xid, None) is None:
                self._quirk(Q_CONTINUE_UNKNOWN, name, record.offset)
            self.items.append(self._item(record, name))
        else:  # REMOVE_TENTATIVE_XID
            assert record.xid is not None
            self.counter = record.xid
            self.implied.discard(record.xid)
            if not self.items:
                self._quirk(Q_TENTATIVE_EMPTY, name, record.offset)
                return
            self._open_xid(record.xid, self.items.popleft(), name, record.offset)

    # ------------------------------------------------------------------ result

    def pending(self) -> list[KestrelItem]:
        """What a restarted Kestrel serves: open transactions by ascending xid, then the queue."""
        self._named_unused(self.files[-1] if self.files else self.queue_name, -1)
        if len(self.implied & set(self.open)) >= 2:
            self.quirks[Q_IMPLIED_OPEN] = len(self.implied & set(self.open))
            self.quirk_first.setdefault(Q_IMPLIED_OPEN, self.queue_name)
        restored = [replace(item, xid=xid) for xid, item in sorted(self.open.items())]
        return restored + list(self.items)

    def quirk_lines(self) -> list[str]:
        """One line per quirk kind: what, how many times, where first."""
        return [
            f"{kind}: {count}x (first at {self.quirk_first.get(kind, '?')})"
            for kind, count in sorted(self.quirks.items())
        ]
