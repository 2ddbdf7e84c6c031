"""``shared/state`` mapped into memory: the page shared-mode handles publish to each other.

The layout and the reasons for it are in ``ledgerq.format.shared_state``.  The page is
mapped ``MAP_SHARED``, so a store by one process is seen by every other process that
maps the file, at once and without a system call - the published tail is read on
every step of a shared handle, and costs a copy of 64 bytes and a checksum.

The file is never truncated or replaced while a handle maps it (that would make its
pages vanish under the mapping: ``SIGBUS``): the first handle of a session writes it
in place, under the exclusive lock, when no other handle exists.

Where the ``atomicshm`` package can be imported, :attr:`SharedPage.atomics` is an
atomic view of the mapping - what the lock words (``segment.steplock``) are taken
with; the reader slots (:meth:`SharedPage.reader_slot`) hold each reader's lock and the
published length of its journal.
"""

from __future__ import annotations

import importlib
import mmap
import os
import struct
import time
from types import ModuleType

import xxhash

from ledgerq.format.shared_state import (
    FEATURE_LOGS,
    PAGE_SIZE,
    READER_SLOT_SIZE,
    READER_SLOTS,
    READER_SLOTS_AT,
    SLOT_FEATURE_LOGS,
    SLOT_JOURNAL_GENERATION,
    SLOT_JOURNAL_LENGTH,
    SLOT_KEY,
    SLOT_NAME,
    SLOT_NAME_MAX,
    TAIL_OFFSET,
    TAIL_RECORD,
    SharedTail,
    decode_tail,
    encode_tail,
    page_problem,
)
from ledgerq.segment.files import storage_errors, write_all
from ledgerq.segment.naming import (
    DEDUP_NAME,
    FORWARDS_NAME,
    PERIODIC_NAME,
    RETRIES_NAME,
    UNIQUE_NAME,
)

__all__ = ["HAS_ATOMICS", "JournalSlot", "SharedPage", "write_page"]


def _import_atomics() -> ModuleType | None:
    """``atomicshm``, what the lock words are taken with; None where it cannot be
    imported (the session's handles then lock with flock: ``segment.steplock``)."""
    try:
        return importlib.import_module("atomicshm")
    except ImportError:  # pragma: no cover - atomicshm has wheels for every common platform
        return None


_atomicshm = _import_atomics()
HAS_ATOMICS = _atomicshm is not None

_U64 = struct.Struct("<Q")
REMOVED = 1 << 63  # in a journal generation: the reader was removed
# A reader slot's journal length and generation, side by side: read and written together.
_LENGTH_AND_GENERATION = struct.Struct("<QQ")
assert SLOT_JOURNAL_GENERATION == SLOT_JOURNAL_LENGTH + 8
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
    """The mapped page of one queue; one per handle (the mappings share the memory).

    ``size`` is the page's (a version-2 page of an older ledgerq is 4 KiB: mapped only
    to read its version and counters).
    """

    __slots__ = ("_map", "atomics", "path")

    def __init__(self, path: str, size: int = PAGE_SIZE) -> None:
        self.path = path
        with storage_errors("map the shared state", path):
            fd = os.open(path, os.O_RDWR)
            try:
                if os.fstat(fd).st_size < size:
                    size = os.fstat(fd).st_size  # an older (smaller) page: see problem()
                self._map: mmap.mmap | None = mmap.mmap(fd, size)
            finally:
                os.close(fd)  # the mapping keeps the file
        self.atomics: object | None = None
        if _atomicshm is not None and size == PAGE_SIZE:
            self.atomics = _atomicshm.AtomicView(self._map)

    @property
    def address(self) -> int:
        """Where the page is mapped in this process (the futex words' addresses)."""
        view = self.atomics
        assert view is not None, "no atomic view of the page"
        return int(view.address)  # type: ignore[attr-defined]

    def reader_slot(self, name: str) -> int | None:
        """The offset of reader ``name``'s slot, None if it has none (yet)."""
        key, encoded = _slot_key(name)
        memory = self._memory()
        for index in range(READER_SLOTS):
            at = READER_SLOTS_AT + index * READER_SLOT_SIZE
            found = _U64.unpack_from(memory, at + SLOT_KEY)[0]
            if found == 0:
                return None  # slots are claimed in order: none further
            if found == key and _slot_name(memory, at) == encoded:
                return at
        return None

    def claim_reader_slot(self, name: str) -> int | None:
        """The offset of reader ``name``'s slot, claimed now if it has none; None when
        every slot is taken (the reader then locks with its flock file).  Called with
        the append lock held, so that two handles never claim one slot."""
        key, encoded = _slot_key(name)
        memory = self._memory()
        for index in range(READER_SLOTS):
            at = READER_SLOTS_AT + index * READER_SLOT_SIZE
            found = _U64.unpack_from(memory, at + SLOT_KEY)[0]
            if found == key and _slot_name(memory, at) == encoded:
                return at
            if found == 0:
                memory[at + SLOT_NAME] = len(encoded)
                memory[at + SLOT_NAME + 1 : at + SLOT_NAME + 1 + len(encoded)] = encoded
                _U64.pack_into(memory, at + SLOT_KEY, key)  # last: the slot is there now
                return at
        return None

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
        view, self.atomics = self.atomics, None
        if view is not None:
            view.close()  # type: ignore[attr-defined] # (it holds the mapping's buffer)
        memory, self._map = self._map, None
        if memory is not None:
            memory.close()


# The feature logs' file names, each to its word (FEATURE_LOGS spells the words' order).
_FEATURE_LOG_WORDS = {
    name: SLOT_FEATURE_LOGS + 8 * FEATURE_LOGS.index(name.removesuffix(".log"))
    for name in (DEDUP_NAME, RETRIES_NAME, PERIODIC_NAME, UNIQUE_NAME, FORWARDS_NAME)
}


class FeatureLogWord:
    """The change word of one feature log in the page: every handle bumps it before it
    writes the file (an append, a cut, a replacement), under the append lock, as every
    write of a feature log is; so a handle that saw this value at its last look knows,
    with one read of memory, that the file holds nothing new (``segment/feature_log``).
    A writer that dies mid-write has bumped it already: the next look reads the file,
    and cuts what it left torn."""

    __slots__ = ("_at", "_memory")

    def __init__(self, page: SharedPage, at: int) -> None:
        self._memory = page.memory
        self._at = at

    @classmethod
    def of(cls, page: SharedPage, file_name: str) -> FeatureLogWord | None:
        """The word of the feature log named ``file_name`` (None: not a feature log)."""
        at = _FEATURE_LOG_WORDS.get(file_name)
        return None if at is None else cls(page, at)

    def value(self) -> int:
        return int(_U64.unpack_from(self._memory, self._at)[0])

    def bump(self) -> int:
        """Add one (append lock held); returns the value before."""
        before = int(_U64.unpack_from(self._memory, self._at)[0])
        _U64.pack_into(self._memory, self._at, before + 1)
        return before


class JournalSlot:
    """The published length and generation of one reader's journal, in its page slot.

    Read and written under the reader's lock only: the holder publishes what it
    appended (the length) or that it replaced the file (the generation), so the next
    holder learns whether there is news with two reads of memory instead of an
    ``fstat`` of the file.
    """

    __slots__ = ("_at", "_memory")

    def __init__(self, page: SharedPage, offset: int) -> None:
        self._memory = page.memory
        self._at = offset

    @property
    def length(self) -> int:
        return int(_U64.unpack_from(self._memory, self._at + SLOT_JOURNAL_LENGTH)[0])

    def read(self) -> tuple[int, int]:
        """``(length, generation)`` in one read (the two words are side by side)."""
        return _LENGTH_AND_GENERATION.unpack_from(self._memory, self._at + SLOT_JOURNAL_LENGTH)

    @property
    def generation(self) -> int:
        return int(_U64.unpack_from(self._memory, self._at + SLOT_JOURNAL_GENERATION)[0])

    def publish(self, length: int, generation: int) -> None:
        """Say the journal holds ``length`` bytes of whole records, and is the file of
        ``generation`` (lock held).  A removal published before stays published."""
        memory, at = self._memory, self._at + SLOT_JOURNAL_LENGTH
        removed = _LENGTH_AND_GENERATION.unpack_from(memory, at)[1] & REMOVED
        _LENGTH_AND_GENERATION.pack_into(memory, at, length, generation | removed)

    def mark_removed(self) -> None:
        """The journal was deleted (``remove_reader``): every other handle's next step
        sees another generation, looks for the file and learns that it is gone.  Not
        under the reader's lock - no later publish of a step undoes it."""
        _U64.pack_into(self._memory, self._at + SLOT_JOURNAL_GENERATION, self.generation | REMOVED)

    def adopt(self, length: int, *, new_generation: bool = False) -> int:
        """A handle that just loaded the journal (lock held) publishes ``length``, and
        clears a removal mark with a new generation (a reader created again); returns
        the generation.  ``new_generation``: the file may have been replaced unknown to
        the others (see ``SharedReaderJournal.attach_slot``)."""
        generation = self.generation
        if generation & REMOVED:
            generation = (generation & ~REMOVED) + 1
        elif new_generation:
            generation += 1
        _U64.pack_into(self._memory, self._at + SLOT_JOURNAL_LENGTH, length)
        _U64.pack_into(self._memory, self._at + SLOT_JOURNAL_GENERATION, generation)
        return generation


def _slot_key(name: str) -> tuple[int, bytes]:
    """A reader slot's key (non-zero: the name's hash) and the name's bytes a slot keeps
    (its first ``SLOT_NAME_MAX``)."""
    encoded = name.encode()
    return xxhash.xxh64_intdigest(encoded) | 1, encoded[:SLOT_NAME_MAX]


def _slot_name(memory: mmap.mmap, at: int) -> bytes:
    length = memory[at + SLOT_NAME]
    return memory[at + SLOT_NAME + 1 : at + SLOT_NAME + 1 + length]
