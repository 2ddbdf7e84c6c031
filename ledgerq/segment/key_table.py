"""A table of fixed-size keyed records in a file mapped into memory (``features/*.table``).

The unique keys' table (features/unique.py) and the hand-offs' (features/forward.py) are
written on the path of every ``enqueue(..., unique_key=)`` and every ``forward``,
*before* what they describe: a record that a ``write()`` put in the kernel cost a system
call per call - more than the rest of the key's work together (benchmarks/unique.py and
forward_bench.py, the "floor" rows).  Here a record is a store into a shared mapping of
the file: it is in the page cache - so it survives the process (kill -9), and every
other process mapping the file sees it - the moment the store is done, with no system
call.

Layout (``docs/format.md``, "Unique keys"; little-endian)::

    0     4   magic       the feature's: b"LQUT" (unique keys), b"LQFT" (hand-offs)
    4     4   version     u32, 1
    8     8   replaced    u64: nonzero once a rewrite replaces this file (read the name again)
    16    48  reserved    zeros
    64    40  record      key 16 bytes, id u64 (>= 1), then two i64 the feature's own
    ...                   records back to back; the first whose id is 0 ends them

The file is longer than its records (zeros, allocated ahead: a page of a mapping that
the disk cannot back would kill the process with SIGBUS when first stored into, so the
room is taken with ``posix_fallocate`` - where a full disk is an error - before any
store lands in it).  The end is where the first zero id is: a store writes the digest
first and the id within it, so a process killed inside a store leaves either no record
or one whose timestamp may be torn - which the feature checks against the log anyway
(the records are written ahead of what they describe, so each is verified before it
is trusted).  A record that turned out to describe nothing (the message write failed)
is cut back by zeroing its id.

Shared mode: every handle maps the same file, and stores and reads only under the
queue's append lock; a look for the others' records is a read of memory (the id where
this handle's records end, and the ``replaced`` word).  A rewrite (temp file, fsync,
rename) sets ``replaced`` in the old file just before the rename: a handle that sees it
maps the name again and reads the new file whole (a mark left on the file that still
holds the name - the rewriter stopped before its rename - is cleared by the next open).
So the file is never truncated while it is mapped - a cut under a mapping makes its
pages vanish (``SIGBUS`` at the next touch), as for ``shared/state``
(segment/shared_page.py): only a person doing it by hand, with the queue open, can.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterable
from typing import Any

from ledgerq.segment.feature_log import FeatureHost, read_feature_values
from ledgerq.segment.files import StorageError, fsync_dir, make_durable_dir, replace_and_open

__all__ = [
    "KEY_RECORD",
    "KEY_TABLE_HEADER_SIZE",
    "KEY_TABLE_VERSION",
    "RECORD_ID_AT",
    "REPLACED_WORD",
    "KeyRecord",
    "KeyTable",
    "OlderLog",
]

logger = logging.getLogger("ledgerq")

KEY_TABLE_VERSION = 1
KEY_TABLE_HEADER_SIZE = 64
KEY_RECORD = struct.Struct("<16sQqq")  # key, id, two ints (the feature's): 40 bytes
KeyRecord = tuple[bytes, int, int, int]
_HEADER = struct.Struct("<4sIQ")  # magic, version, replaced
_REPLACED_AT = 8
REPLACED_WORD = _REPLACED_AT >> 3  # the replaced word's index among the file's u64 words
RECORD_ID_AT = 16  # the id's offset inside a record
_WORD = struct.Struct("<Q")
_MIN_SIZE = 64 * 1024  # 1636 records: the room a new file is created with
_MAX_GROWTH = 16 * 1024 * 1024  # a growth doubles the file, by this much at most


# Where an older ledgerq kept the same table: (path, magic, record parser) of a framed
# feature log (segment/feature_log), read once into the table and removed.
OlderLog = tuple[str, bytes, Callable[[Any], "KeyRecord | None"]]


class KeyTable:
    """The mapped file ``path`` (magic ``magic``; ``what`` names it in errors).

    ``host`` is the queue (None: a file read and written alone, by a tool or a test):
    whether other handles share the file, the disk reserve to release when the file
    cannot grow on a full disk, the counter of damage.  ``older`` names the file an
    older ledgerq kept the records in.  Nothing is read or created until :meth:`open`.
    """

    def __init__(
        self,
        path: str,
        magic: bytes,
        what: str,
        host: FeatureHost | None = None,
        older: OlderLog | None = None,
    ) -> None:
        self.path = path
        self.what = what
        self._magic = magic
        self._host = host
        self._shared = host is not None and host.shared
        self._older = older
        self.is_loaded = False  # read whole by open() (the first use)
        # Whether current state needs a look: not loaded yet, or shared mode (the others
        # may have stored records).  A plain attribute, for a hot path to skip the call:
        # ``if table.stale: ...news()``.
        self.stale = True
        self._fd: int | None = None
        self.area: mmap.mmap | None = None  # the mapping (a hot path stores into it)
        self._words: memoryview | None = None  # the same, as u64 words
        # The same words while loaded in shared mode, else None: what a hot path reads
        # for the look :meth:`unchanged` makes - the id after this handle's last record
        # (``watch[(end + RECORD_ID_AT) >> 3]``) and ``watch[REPLACED_WORD]``, both 0.
        self.watch: memoryview | None = None
        self.size = 0  # bytes mapped
        self.end = KEY_TABLE_HEADER_SIZE  # where the next record goes
        self.pack = KEY_RECORD.pack_into  # pack(area, end, record...): a store

    @property
    def records(self) -> int:
        """Records in the file, live or not (when to rewrite)."""
        return (self.end - KEY_TABLE_HEADER_SIZE) // KEY_RECORD.size

    # ------------------------------------------------------------------ reading

    def open(self, *, create: bool) -> list[KeyRecord] | None:
        """Map the file and return its records (None if there is none and not
        ``create``).  An unreadable file (a bad header) is replaced by an empty one
        and counted (the host's ``note_corrupt_skipped``).  The records of the framed
        log an older ledgerq kept (``older``) come first, and are moved into the table:
        it is rewritten with them (the last record of a key kept), then the old file
        removed.  Raises :class:`StorageError`."""
        records = self._open_mapped(create=create)
        if records is None:
            return None
        older = self._older
        if older is not None and os.path.exists(older[0]):
            records = self._move_in(older, records)
        # Loaded only now: a failure above leaves the next call to open it again.
        self.is_loaded = True
        self.stale = self._shared
        self.watch = self._words if self._shared else None
        return records

    def _move_in(self, older: OlderLog, records: list[KeyRecord]) -> list[KeyRecord]:
        """Rewrite the table with the records of the older log first, then remove it."""
        path, magic, parse = older
        by_key: dict[bytes, KeyRecord] = {}
        for record in [*filter(None, map(parse, read_feature_values(path, magic))), *records]:
            by_key.pop(record[0], None)  # to the end: the records stay in write order
            by_key[record[0]] = record
        moved = list(by_key.values())
        self.rewrite(moved)
        try:
            os.unlink(path)
            fsync_dir(os.path.dirname(path))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError("remove", path, exc) from exc
        return moved

    def _open_mapped(self, *, create: bool) -> list[KeyRecord] | None:
        self.close()
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            if not create:
                return None
            self.rewrite([])
            return []
        except OSError as exc:
            raise StorageError("open", self.path, exc) from exc
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, _HEADER.size, 0)
        except OSError as exc:
            os.close(fd)
            raise StorageError("read", self.path, exc) from exc
        ok = len(head) == _HEADER.size and size >= KEY_TABLE_HEADER_SIZE + KEY_RECORD.size
        if ok:
            magic, version, _ = _HEADER.unpack(head)
            ok = magic == self._magic and version == KEY_TABLE_VERSION
        if not ok:
            os.close(fd)
            logger.warning("ledgerq: %s is unreadable; the %s starts empty", self.path, self.what)
            if self._host is not None:
                self._host.note_corrupt_skipped(1)
            self.rewrite([])
            return []
        self._adopt(fd, size)
        area = self.area
        assert area is not None
        if _WORD.unpack_from(area, _REPLACED_AT)[0]:
            # The file holds the name, so it is current: the mark of a rewrite that
            # stopped before its rename (see rewrite) - cleared, or every look would
            # map the name again.
            _WORD.pack_into(area, _REPLACED_AT, 0)
        return self._read_records()

    def _adopt(self, fd: int, size: int, end: int = KEY_TABLE_HEADER_SIZE) -> None:
        """Map ``size`` bytes of ``fd`` in place of the current mapping (closed; its
        descriptor too, unless it is ``fd``), the records ending at ``end``.  If the
        map fails, the table is left closed - the next use opens it again."""
        old_area, old_fd = self.area, self._fd
        try:
            area = mmap.mmap(fd, size)
        except OSError as exc:
            if fd != old_fd:
                os.close(fd)
            self.close()
            raise StorageError("map", self.path, exc) from exc
        old_words = self._words
        self._fd, self.area, self.size, self.end = fd, area, size, end
        # The mapping as 64-bit words: a record's id and the replaced word are read by
        # index on the hot path (unchanged), without a struct call.
        self._words = memoryview(area)[: size - size % 8].cast("Q")
        if self.watch is not None:
            self.watch = self._words
        if old_words is not None:
            old_words.release()  # (a mapping with a view on it cannot be closed)
        if old_area is not None:
            old_area.close()
        if old_fd is not None and old_fd != fd:
            os.close(old_fd)

    def _read_records(self) -> list[KeyRecord]:
        """The records from :attr:`end` to the first zero id (moving :attr:`end`)."""
        area = self.area
        assert area is not None
        found: list[KeyRecord] = []
        unpack = KEY_RECORD.unpack_from
        end, size, step = self.end, self.size, KEY_RECORD.size
        while True:
            if end + step > size:
                if not self._remap_if_grown():
                    break
                area, size = self.area, self.size
                assert area is not None
                continue
            record = unpack(area, end)
            if not record[1]:
                break
            found.append(record)
            end += step
        self.end = end
        return found

    def _remap_if_grown(self) -> bool:
        """Another handle grew the file past this mapping: map it whole (True)."""
        fd = self._fd
        assert fd is not None
        try:
            size = os.fstat(fd).st_size
        except OSError as exc:
            raise StorageError("read", self.path, exc) from exc
        if size <= self.size:
            return False
        self._adopt(fd, size, self.end)
        return True

    def unchanged(self) -> bool:
        """Whether a look would find nothing: loaded, and in exclusive mode or with no
        record stored by the others and no rewrite since this handle's last look (two
        reads of memory; append lock held).  For a hot path: ``if not unchanged():``
        take :meth:`news`."""
        if not self.is_loaded:
            return False
        words = self.watch
        if words is None:
            return True  # exclusive mode
        end = self.end
        return (
            end + KEY_RECORD.size <= self.size
            and not words[(end + RECORD_ID_AT) >> 3]  # (records and ids are 8-aligned)
            and not words[REPLACED_WORD]
        )

    def news(self) -> tuple[bool, list[KeyRecord]]:
        """``(replaced, records)``: in shared mode (append lock held) the records the
        others stored since this handle's last look, or, ``replaced`` True, every
        record of the file that now holds the name (the table is to be rebuilt);
        nothing in exclusive mode, where no other handle stores into the file."""
        if not self._shared:
            return False, []
        area = self.area
        assert area is not None
        if _WORD.unpack_from(area, _REPLACED_AT)[0]:
            records = self.open(create=True)
            assert records is not None
            return True, records
        end = self.end
        fresh = end + KEY_RECORD.size <= self.size
        if fresh and not _WORD.unpack_from(area, end + RECORD_ID_AT)[0]:
            return False, []  # the common case: nothing new, two reads of memory
        return False, self._read_records()

    # ------------------------------------------------------------------ writing

    def append(self, digest: bytes, message_id: int, timestamp: int, expires: int) -> None:
        """Store one record at the end (lock held), or raise :class:`StorageError`
        having stored nothing (the file could not grow)."""
        end = self.end
        if end + KEY_RECORD.size > self.size:
            self.grow()
        area = self.area
        assert area is not None
        self.pack(area, end, digest, message_id, timestamp, expires)
        self.end = end + KEY_RECORD.size

    def undo(self, since: int) -> None:
        """Cut back the records stored from offset ``since`` (an earlier :attr:`end`):
        what they describe was not written."""
        area = self.area
        if area is None:
            return
        at = self.end - KEY_RECORD.size
        while at >= since:  # last first: a reader never sees a hole before a record
            _WORD.pack_into(area, at + RECORD_ID_AT, 0)
            at -= KEY_RECORD.size
        self.end = min(self.end, since)

    def grow(self) -> None:
        """Make room for more records (lock held): the file doubles (by 16 MiB at most),
        its new bytes allocated; raises :class:`StorageError` having changed nothing."""
        fd, size = self._fd, self.size
        if fd is None:
            raise StorageError(f"append to {self.what}", self.path, OSError(errno.EBADF, "closed"))
        new_size = size + max(_MIN_SIZE, min(size, _MAX_GROWTH))
        try:
            _allocate(fd, size, new_size - size)
        except OSError as exc:
            host = self._host
            if exc.errno != errno.ENOSPC or host is None or not host.make_room():
                raise StorageError(f"grow {self.what}", self.path, exc) from exc
            try:
                _allocate(fd, size, new_size - size)
            except OSError as again:
                raise StorageError(f"grow {self.what}", self.path, again) from again
        self._adopt(fd, new_size, self.end)

    def rewrite(self, records: Iterable[KeyRecord]) -> None:
        """Replace the file with ``records`` (``files.replace_and_open``: temp file,
        fsync, rename, fsync of the directory) and map the new one; the old file says
        it was replaced.  Raises
        :class:`StorageError` (the old file, still mapped, holds the table too).

        The old file is marked *before* the rename: a process killed between the rename
        and a mark after it would leave the others storing into an unlinked file, their
        keys and this one's apart for good.  Marked first, a kill (or a failure) before
        the rename leaves a mark on the file that still holds the name, which the next
        handle to open it clears (:meth:`open`) - the others only map the name again.
        Nobody looks between the two: stores and looks take the append lock, held here."""
        records = list(records)
        body = b"".join(KEY_RECORD.pack(*r) for r in records)
        used = KEY_TABLE_HEADER_SIZE + len(body)
        size = max(_MIN_SIZE, 2 * used)
        size += -size % mmap.PAGESIZE
        data = (
            _HEADER.pack(self._magic, KEY_TABLE_VERSION, 0).ljust(KEY_TABLE_HEADER_SIZE, b"\0")
            + body
            + bytes(size - used)  # zeros written: the room is allocated, and ends the records
        )
        make_durable_dir(os.path.dirname(self.path))
        old = self.area
        if old is not None:
            _WORD.pack_into(old, _REPLACED_AT, 1)  # the others map the name again
        # The new file holds the name from the rename on.
        replace_and_open(self.path, data, lambda fd: self._adopt(fd, size, used))

    def sync(self, since: int | None = None) -> None:
        """Write the mapped pages to disk (all of them; or from offset ``since`` on)."""
        area = self.area
        if area is None:
            return
        try:
            if since is None:
                area.flush()
            else:
                start = since - since % mmap.ALLOCATIONGRANULARITY
                area.flush(start, self.end - start)
        except OSError as exc:
            raise StorageError("sync", self.path, exc) from exc

    def close(self) -> None:
        """Unmap and close (idempotent)."""
        area, self.area = self.area, None
        fd, self._fd = self._fd, None
        words, self._words = self._words, None
        self.watch = None
        if words is not None:
            words.release()
        if area is not None:
            area.close()
        if fd is not None:
            os.close(fd)
        self.size = 0
        self.end = KEY_TABLE_HEADER_SIZE
        self.is_loaded = False
        self.stale = True


def _allocate(fd: int, offset: int, length: int) -> None:
    """Take ``length`` bytes of disk at ``offset`` (extending the file): ENOSPC now,
    rather than SIGBUS at the first store into a page the disk cannot back."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, offset, length)
    else:  # pragma: no cover - macOS: zeros written are blocks taken
        os.pwrite(fd, bytes(length), offset)
