"""``shared/state`` mapped into memory: the page shared-mode handles publish to each other.

The layout and the reasons for it are in ``ledgerq.format.shared_state``.  The page is
mapped ``MAP_SHARED``, so a store by one process is seen by every other process that
maps the file, at once and without a system call - the published tail is read on
every step of a shared handle, and costs a copy of 64 bytes and a checksum.

The file is never truncated or replaced while a handle maps it (that would make its
pages vanish under the mapping: ``SIGBUS``): the first handle of a session writes it
in place, under the exclusive lock, when no other handle exists.
"""

from __future__ import annotations

import mmap
import os
import struct
import time

from ledgerq.format.shared_state import (
    PAGE_SIZE,
    TAIL_OFFSET,
    TAIL_RECORD,
    SharedTail,
    decode_tail,
    encode_tail,
    page_problem,
)
from ledgerq.segment.files import storage_errors, write_all

__all__ = ["SharedPage", "write_page"]

_U64 = struct.Struct("<Q")
_TAIL_END = TAIL_OFFSET + TAIL_RECORD.size
_WRITING_END = _TAIL_END + 8
# A reader that keeps meeting a half-written tail waits this long in all before it
# reports it (the writer died mid-store, or the file was damaged): see tail().
_TORN_PATIENCE_S = 0.05


def write_page(path: str, page: bytes) -> None:
    """Write a whole page into ``path`` in place (creating it): the first handle's job.

    In place, not by rename: a process that still maps an older file keeps seeing the
    file it maps, so there must be only ever one file.  Not fsynced: the page is
    rebuilt after a power cut, never trusted.
    """
    assert len(page) == PAGE_SIZE
    with storage_errors("write the shared state", path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != PAGE_SIZE:
                os.ftruncate(fd, PAGE_SIZE)
            os.lseek(fd, 0, os.SEEK_SET)
            write_all(fd, page)
        finally:
            os.close(fd)


class SharedPage:
    """The mapped page of one queue; one per handle (the mappings share the memory)."""

    __slots__ = ("_map", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        with storage_errors("map the shared state", path):
            fd = os.open(path, os.O_RDWR)
            try:
                self._map: mmap.mmap | None = mmap.mmap(fd, PAGE_SIZE)
            finally:
                os.close(fd)  # the mapping keeps the file

    @property
    def memory(self) -> mmap.mmap:
        """The mapping itself, for the append path's inline reads and stores."""
        return self._memory()

    def _memory(self) -> mmap.mmap:
        memory = self._map
        if memory is None:
            raise ValueError(f"the shared state page {self.path} is closed")
        return memory

    def problem(self) -> str:
        """What makes the page unusable ("" when it is usable)."""
        return page_problem(self._memory()[:PAGE_SIZE])

    def raw_tail(self) -> bytes:
        """The tail's 64 bytes as they are now (maybe half-written: see :meth:`tail`)."""
        return self._memory()[TAIL_OFFSET:_TAIL_END]

    def raw_tail_and_writing(self) -> bytes:
        """The tail's 64 bytes and the ``writing`` word after them (append lock held)."""
        return self._memory()[TAIL_OFFSET:_WRITING_END]

    def publish_raw(self, blob: bytes) -> None:
        """Write the tail and the ``writing`` word: ``encode_tail(tail, writing)``'s 72
        bytes, in one copy (append lock held)."""
        self._memory()[TAIL_OFFSET:_WRITING_END] = blob

    def tail(self) -> SharedTail | None:
        """The published tail; None when it stays half-written (its writer died between
        two stores, or the page is damaged): then repair it under the append lock."""
        memory = self._memory()
        deadline = 0.0
        while True:
            tail = decode_tail(memory[TAIL_OFFSET:_TAIL_END])
            if tail is not None:
                return tail
            # A writer is between its stores (it holds the append lock for microseconds).
            now = time.monotonic()
            if not deadline:
                deadline = now + _TORN_PATIENCE_S
            elif now >= deadline:
                return None
            time.sleep(0)

    def publish(self, tail: SharedTail) -> None:
        """Write ``tail`` (append lock held): one copy of 64 bytes, checksummed."""
        self._memory()[TAIL_OFFSET:_TAIL_END] = encode_tail(tail)

    def get(self, slot: int) -> int:
        """The u64 at ``slot`` (an offset of ``format.shared_state``)."""
        return int(_U64.unpack_from(self._memory(), slot)[0])

    def set(self, slot: int, value: int) -> None:
        """Store the u64 ``value`` at ``slot`` (append lock held)."""
        _U64.pack_into(self._memory(), slot, value)

    def add(self, slot: int, count: int) -> None:
        """Add ``count`` to the u64 at ``slot`` (append lock held)."""
        memory = self._memory()
        _U64.pack_into(memory, slot, _U64.unpack_from(memory, slot)[0] + count)

    def close(self) -> None:
        """Unmap the page (idempotent)."""
        memory, self._map = self._map, None
        if memory is not None:
            memory.close()
