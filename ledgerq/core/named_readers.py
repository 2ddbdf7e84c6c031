"""The named readers of a queue: each an independent consumer with its own state file
(a mixin of the queue core).

``reader(name)`` returns the reader, creating it if new: its first checkpoint is
written durably (``readers/<name>.state``, segment/naming.py) before the reader exists,
and a new reader whose first checkpoint failed half-way leaves no file behind.
``remove_reader(name)`` deletes the state file first, then forgets the reader, so a
failure changes nothing.  Opening reads the readers on disk (core/opening.py); the
reader's state machine is core/reader.py, its public face core/reader_handle.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from ledgerq._types import ReaderStart
from ledgerq.core.args import check_reader_name, check_reader_start
from ledgerq.core.journal import ReaderJournal
from ledgerq.core.opening import DEFAULT_READER
from ledgerq.core.queue_state import QueueState
from ledgerq.core.reader import ReaderCore, initial_checkpoint
from ledgerq.core.reader_handle import Reader
from ledgerq.core.retry import RetryPolicy
from ledgerq.segment.files import storage_errors
from ledgerq.segment.naming import reader_state_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["NamedReaders"]


class NamedReaders(QueueState):
    """The readers part of :class:`~ledgerq.core.queue.QueueCore` (a mixin: its methods
    take the queue as ``self``; shared mode's core overrides how a reader's state is
    made and when the readers are current)."""

    def _open_reader(self, name: str, *, start_latest: bool) -> Reader:
        journal = self._new_journal(name)
        journal.on_full = self._make_room
        journal.set_low_space(not self._disk_reserve.is_held)
        is_new = not os.path.exists(journal.path)
        try:
            with storage_errors("open reader state", journal.path):
                core = self._new_reader_core(name, journal, start_latest=start_latest)
        except BaseException:
            journal.close()
            if is_new:
                # A new reader whose first checkpoint failed half-way must not exist: its
                # file would make the next reader(name) start elsewhere than asked.
                with contextlib.suppress(OSError):
                    os.unlink(journal.path)
            raise
        reader = Reader(cast("QueueCore", self), core)  # (this part of one)
        self._readers[name] = reader
        self._cores[name] = core
        return reader

    def _new_journal(self, name: str) -> ReaderJournal:
        return ReaderJournal(self._reader_path(name))

    def _new_reader_core(
        self, name: str, journal: ReaderJournal, *, start_latest: bool
    ) -> ReaderCore:
        return ReaderCore(
            name,
            journal,
            self._manager,
            self._reader_hooks,
            visibility_timeout=self.options.visibility_timeout,
            start_latest=start_latest,
            retry_policy=RetryPolicy.from_options(self.options),
        )

    def reader_cores(self) -> list[ReaderCore]:
        """Every reader of the queue, for a feature that asks whether all of them are done
        with a message (unique keys; lock held).  An exclusive queue has opened every
        reader on disk; a shared handle's append that needs them holds them all."""
        return list(self._cores.values())

    def readers_current(self) -> bool:
        """Whether :meth:`reader_cores` show every other handle's acks too (lock held).
        Always for an exclusive queue; in shared mode, while an append holds them all
        (a feature that needs them raises :class:`ReadersNeeded` from ``admit``)."""
        return True

    def reader(self, name: str, start: ReaderStart | int = "earliest") -> Reader:
        """Return the named reader (an independent consumer), creating it if new.

        A new reader starts at the oldest retained message, with ``start="latest"``
        at the tail, or with an id at the first message whose id is at least
        ``start`` (from 1 to the queue's next id; below the oldest retained message
        it starts there).  An existing reader is returned as it is.  Names are
        1-100 characters of ``[A-Za-z0-9_.-]`` not starting with a dot.  A new
        reader's state is durable when this returns.  Raises ``ValueError`` for a bad
        name or ``start``, ``TypeError`` for a ``start`` that is no str or int.
        """
        name = check_reader_name(name)
        start = check_reader_start(start)
        with self._lock:
            self._ensure_open()
            existing = self._readers.get(name)
            if existing is not None:
                return existing
            if isinstance(start, int):
                return self._open_new_reader(name, start, ())
            return self._open_reader(name, start_latest=start == "latest")

    def _create_reader(self, name: str, head: int, done: Iterable[int]) -> Reader:
        """Create the reader ``name`` with every id below ``head`` and in ``done`` done.

        For :func:`ledgerq.tools.create_reader`.  Refuses (``ValueError``) to touch a
        reader that exists; see :func:`~ledgerq.core.reader.initial_checkpoint` for
        the bounds of ``head`` and ``done``.
        """
        name = check_reader_name(name)
        with self._lock:
            self._ensure_open()
            path = self._reader_path(name)
            if name in self._readers or os.path.exists(path):
                raise ValueError(
                    f"reader {name!r} exists already ({path}); a reader's state is never "
                    "replaced: use queue.reader(name) to use it, or remove_reader(name) first"
                )
            return self._open_new_reader(name, head, done)

    def _open_new_reader(self, name: str, head: int, done: Iterable[int]) -> Reader:
        """Write a new reader's first checkpoint durably, then open it (lock held)."""
        checkpoint = initial_checkpoint(head, done, self._next_id)
        journal = ReaderJournal(self._reader_path(name))
        try:
            # temp file, fsync, rename, fsync of readers/: durable before the reader exists
            journal.rewrite(checkpoint)
        finally:
            journal.close()
        return self._open_reader(name, start_latest=False)

    def _reader_path(self, name: str) -> str:
        return reader_state_path(self.path, name)

    def remove_reader(self, name: str) -> bool:
        """Forget the named reader and its state, so it no longer holds back retention.

        Returns False if there is no such reader.  The default reader cannot be removed.
        """
        if check_reader_name(name) == DEFAULT_READER:
            raise ValueError("the default reader cannot be removed")
        with self._lock:
            self._ensure_open()
            reader = self._readers.get(name)
            if reader is None:
                return False
            with storage_errors("delete reader state", reader._core.journal.path):
                os.unlink(reader._core.journal.path)  # first: if it fails, nothing changed
            del self._readers[name]
            del self._cores[name]  # nothing of it is saved again, at close or by retention
            reader._removed = True
            reader._core.journal.close()
            self._retire_consumed()
            self._waits.wake()  # its waiters must see that it is gone
            return True
