"""The one protocol of a feature's log: a table kept in memory, its records on disk.

A feature (dedup ids, retry reasons, periodic jobs) keeps a table in memory and says
each change of it as a record appended to its file under ``features/`` (framed as
format/feature_state.py frames them), which now and then is rewritten whole as the
records of the table.  (The unique keys and the hand-offs, whose records are written
on the path of every such enqueue, keep theirs in a mapped table instead:
segment/key_table.py.)  The steps are the same for every
feature, and are here once; the feature gives only its table, a :class:`FeatureTable`
of three methods:

- ``apply_record(value)``: take one decoded record; False if it is not one the
  feature writes (then counted as damage, like a record whose checksum fails);
- ``clear_table()``: forget the table (the file is about to be read whole again);
- ``table_records()``: the encoded records that hold the table now (a rewrite).

Loading.  The file is read whole: a torn last record is cut, a damaged one in the
middle skipped and counted (``stats().corrupt_skipped``), an unreadable file (a bad
header) replaced by an empty one, counted once.  A file of an older version (format
1, CRC-32) is never appended to: it is rewritten as the newest, every record the
feature took kept.

Full disk.  An append that fails is cut back (:class:`AppendLog`) and, on ENOSPC,
tried once more in the disk reserve's room (the host's ``make_room``).  A feature
that writes its record *before* what it describes (periodic fires) uses
:meth:`FeatureLog.append` or :meth:`append_ahead`, which raise having written
nothing: its caller undoes the operation (:meth:`undo_ahead` cuts back what
was written ahead of an operation that then failed).  A feature that writes it
*after* (a dedup id once its message is in the log, a retry reason once the nack is
counted) uses :meth:`append_or_defer`: the record stays in the table, later records
are appended as usual, and the table is written whole by :meth:`save_deferred`
(dedup: before another id is promised) or at the next :meth:`flush` (sync, close).
The open of a handle alone with the queue never fails for a write either: the file
as it is holds the table, or, when it cannot be appended to, the table waits in
memory the same way.  (This is the fix of
docs/reliability.md's bugs 21 and 32: a dedup record lost after a full disk, then a
crash.)

Shared mode.  Every handle appends to the same file under the queue's append lock
(the host's ``appends_locked``), having first applied what the others appended
since its last look (:meth:`catch_up`: the bytes past where it stopped reading; a
torn record there, a dead handle's, is cut).  A rewrite replaces the file under that
lock too; the others notice that their descriptor's file has no name left and read
the new one whole.  So every handle's table is the file's, and any of them may
rewrite it.  Each write bumps the file's change word in the state page first
(``FeatureLogWord``): a look that finds the word as this handle left it costs one read
of memory, not an ``fstat``.  A handle that joins a session reads the file as it is (under the lock)
and rewrites nothing at open: only one alone with the queue compacts then.  In
exclusive mode there is no lock to take and nothing to catch up: the calls for it
cost nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from typing import Any, Protocol

from ledgerq.format.errors import DecodeError
from ledgerq.format.feature_state import (
    FEATURE_VERSION,
    decode_feature_file,
    decode_feature_records,
    encode_feature_file_header,
    encode_feature_record,
)
from ledgerq.segment.appendlog import AppendLog
from ledgerq.segment.files import StorageError, make_durable_dir
from ledgerq.segment.shared_page import FeatureLogWord

__all__ = ["FeatureHost", "FeatureLog", "FeatureTable", "read_feature_values"]

logger = logging.getLogger("ledgerq")


class FeatureHost(Protocol):
    """What a feature log needs of its queue (``QueueCore`` is one)."""

    shared: bool

    @property
    def is_alone(self) -> bool:
        """Whether no other handle can have the queue open (exclusive, or opening first)."""
        ...

    def appends_locked(self) -> contextlib.AbstractContextManager[None]:
        """The block no other handle appends in (shared mode's append lock)."""
        ...

    def make_room(self) -> bool:
        """Release the disk reserve for a write that met a full disk (True: try again)."""
        ...

    def note_corrupt_skipped(self, count: int) -> None:
        """Count damaged records skipped (``stats().corrupt_skipped``)."""
        ...

    def feature_log_word(self, path: str) -> FeatureLogWord | None:
        """Shared mode: the change word of the feature log ``path`` in the state page
        (None: exclusive mode, or no word for that file)."""
        ...


class FeatureTable(Protocol):
    """A feature's table, as its log sees it (see the module docstring)."""

    def apply_record(self, value: Any) -> bool:
        """Take one decoded record; False if it is not one of this table's."""
        ...

    def clear_table(self) -> None:
        """Forget everything: the file is read whole again."""
        ...

    def table_records(self) -> Iterable[bytes]:
        """The encoded records that hold the table now."""
        ...


class FeatureLog:
    """A feature's file ``path`` (magic ``magic``; ``what`` names it in errors) and the
    protocol that keeps it equal to the feature's ``table`` (see the module docstring).

    ``host`` is the queue (None: a file read and written alone, by a tool or a test).
    Nothing is read or written until :meth:`open` or :meth:`load`.
    """

    def __init__(
        self,
        path: str,
        magic: bytes,
        what: str,
        host: FeatureHost | None,
        table: FeatureTable,
    ) -> None:
        self.path = path
        self.what = what
        self._magic = magic
        self._host = host
        self._shared = host is not None and host.shared
        self._apply = table.apply_record
        self._clear = table.clear_table
        self._snapshot = table.table_records
        self._log = AppendLog(path, what)
        if host is not None:
            # (A lambda: the host is the queue's weak proxy; its bound method would not be.)
            self._log.on_full = lambda: host.make_room()
        self.records = 0  # records in the file (live or not): when to compact
        self.unsaved = False  # the table holds what the file does not: write it whole
        self._damage_seen = False  # records skipped as damaged since the open
        self._loaded = False
        # Whether current() has anything to do: not loaded yet, or shared mode (the
        # others may have appended).  A plain attribute, for a hot path (a forward) to
        # skip the call: ``if log.stale: log.current(...)``.
        self.stale = True
        self._defer = False  # opening alone: a failed rewrite defers, never raises
        self._inode = 0  # the file this handle appends to (has_news)
        self._ahead: int | None = None  # the size before records written ahead (undo_ahead)
        self._ahead_records = 0  # and the records then
        # Shared mode: the file's change word in the state page (found at the first
        # look), and its value when this handle's table last equalled the file (-1:
        # unknown, read the file): see FeatureLogWord.
        self._word: FeatureLogWord | None = None
        self._word_found = False
        self._seen = -1

    # ------------------------------------------------------------------ loading

    @property
    def is_loaded(self) -> bool:
        """Whether the file was read (by :meth:`open` or :meth:`load`)."""
        return self._loaded

    def open(self, *, compact: bool) -> None:
        """Read the file (creating it if missing) at the queue's open, and, ``compact``,
        rewrite it as the table when this handle is alone with the queue.

        Alone, only a read that fails raises (:class:`StorageError`): a write that fails
        (a full disk) leaves the table in memory (:attr:`unsaved`).  Beside other
        handles, it reads under the append lock, and any failure raises.
        """
        host = self._host
        if host is not None and self._shared and not host.is_alone:
            with host.appends_locked():
                self.load(create=True)
            return
        self._defer = True
        try:
            self.load(create=True)
        finally:
            self._defer = False
        if compact and self._log.is_open:
            # Drops what the table dropped (expired, damaged, superseded) - if anything:
            # a file of the table's records only is left as it is (an fsync and a rename
            # fewer at every open).
            records = list(self._snapshot())
            if self._damage_seen or len(records) != self.records:
                self._compact_as(records)

    def load(self, *, create: bool) -> bool:
        """Read the file whole into the table (append lock held, in shared mode);
        create it if missing and ``create``.  False if there is no file (not created).

        Raises :class:`StorageError` if the file cannot be read or written.
        """
        path = self.path
        try:
            if not os.path.exists(path):
                if not create:
                    return False
                make_durable_dir(os.path.dirname(path))
                self._replace([])
            else:
                self._log.open(0, cut=False)  # read whole by catch_up, a torn tail cut
                self._catch_up_locked()
        except BaseException:
            # Nothing is appended to a file not read whole (or of an older version): the
            # next call loads it again.
            self._log.close()
            raise
        self._loaded = True
        self.stale = self._shared
        return True

    def current(self, *, create: bool = False) -> bool:
        """Bring the table up to date with the file (append lock held, in shared mode):
        :meth:`load` it the first time, then :meth:`catch_up`.  False if there is none."""
        if not self._loaded:
            return self.load(create=create)
        if self._shared:
            self._catch_up_locked()
        return True

    def catch_up(self) -> None:
        """Shared mode (append lock held): apply the records the other handles appended
        since the last look, or the whole file if one of them replaced it.  Nothing to do
        in exclusive mode."""
        if self._shared and self._loaded:
            self._catch_up_locked()

    def _change_word(self) -> FeatureLogWord | None:
        if not self._word_found:
            host = self._host
            # (Exclusive mode has none: no other handle writes the file.)
            self._word = (
                host.feature_log_word(self.path) if self._shared and host is not None else None
            )
            # Shared mode without a word yet (asked before the session's page was there):
            # ask again next time rather than never bump it, which the others would miss.
            self._word_found = self._word is not None or not self._shared
        return self._word

    def _writing(self) -> None:
        """Shared mode, before any write of the file (append lock held): bump its change
        word, so that the others read the file at their next look.  A handle whose table
        equalled the file stays current: it writes what its table holds."""
        word = self._word if self._word_found else self._change_word()
        if word is not None and word.bump() == self._seen:
            self._seen += 1

    def _catch_up_locked(self) -> None:
        # Nothing written since this handle's last look (the word says so): no fstat.
        word = self._word if self._word_found else self._change_word()
        if word is None:
            self._read_news()
            return
        if word.value() == self._seen:
            return
        self._read_news()
        # The table is the file now, whatever this look wrote (an upgrade's rewrite):
        # under the append lock, nobody else has bumped the word meanwhile.
        self._seen = word.value()

    def _read_news(self) -> None:
        log = self._log
        merge = False
        if not log.is_open:
            # Never opened (a full disk while this handle was alone): the others' file
            # is read whole *on top of* the table, whose unsaved entries it lacks.
            if not self._shared or not os.path.exists(self.path):
                return
            log.open(0, cut=False)
            merge = True
        news = log.news()
        if news is None:
            return
        data, replaced = news
        base = log.size
        if replaced or base == 0:
            if not merge:
                self._clear()
            self.records = 0
            try:
                found = decode_feature_file(data, self._magic)
            except DecodeError:
                logger.warning(
                    "ledgerq: %s is unreadable; the %s starts empty", self.path, self.what
                )
                self._note_skipped(1)
                self._replace([])
                return
        else:
            found = decode_feature_records(data, 0)
        kept = [value for value in found.values if self._apply(value)]
        skipped = found.damaged + len(found.values) - len(kept)
        if skipped:
            logger.warning("ledgerq: skipped %d damaged records in %s", skipped, self.path)
            self._note_skipped(skipped)
        self.records += len(found.values)
        log.settle(base + found.end)
        if found.version != FEATURE_VERSION:
            # A file of an older version (another checksum) is never appended to: every
            # record the table took, rewritten as the newest version now.  In shared
            # mode this handle is the first to load it (each that did upgraded it), and
            # holds the append lock each append to it takes: no record can be lost.
            self._replace([encode_feature_record(value) for value in kept])
        elif replaced or base == 0:
            self._note_inode()

    def _note_skipped(self, count: int) -> None:
        self._damage_seen = True
        if self._host is not None:
            self._host.note_corrupt_skipped(count)

    def has_news(self) -> bool:
        """Whether the file changed since this handle last looked (no lock: a stat), or
        exists and was never read.  For a feature that polls for the others' changes."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        return not self._loaded or (st.st_ino, st.st_size) != (self._inode, self._log.size)

    def _note_inode(self) -> None:
        try:
            self._inode = os.stat(self.path).st_ino
        except OSError:
            self._inode = 0

    # ------------------------------------------------------------------ writing

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The host's append lock (shared mode), for appends outside an enqueue; then
        :meth:`current` before appending.  Nothing to take in exclusive mode."""
        host = self._host
        return contextlib.nullcontext() if host is None else host.appends_locked()

    def append(self, blob: bytes, count: int = 1) -> None:
        """Append ``count`` encoded records, or raise :class:`StorageError` having written
        nothing (lock held).  They have reached the OS when this returns."""
        if self._shared:
            self._writing()
        self._log.append_record(blob)
        self.records += count

    def append_or_defer(self, blob: bytes, count: int = 1) -> bool:
        """Append ``count`` records that describe what already happened (lock held):
        True if written; False if the disk refused them - they are in the table, which
        is written whole later (:meth:`save_deferred`, :meth:`flush`)."""
        if not self._log.is_open:
            return False  # never opened (a full disk at open): unsaved already
        # After a record that could not be written, later ones are still appended: the
        # failed one was cut back, so none lands after a fragment.
        if self._shared:
            self._writing()
        try:
            self._log.append_record(blob)
        except StorageError as exc:
            self._not_saved(exc)
            return False
        self.records += count
        return True

    def append_ahead(self, blob: bytes, count: int = 1) -> None:
        """Append records written *before* what they describe (lock held), or raise
        having written nothing: then :meth:`keep_ahead` once the operation is done, or
        :meth:`undo_ahead` if it failed."""
        log = self._log
        size = log.size
        if self._shared:
            self._writing()
        log.append_record(blob)  # (append, inlined: this is every forward's path)
        if self._ahead is None:
            self._ahead = size
            self._ahead_records = self.records
        self.records += count

    def keep_ahead(self) -> None:
        """The operation the records written ahead describe is done: they stay."""
        self._ahead = None

    def undo_ahead(self) -> None:
        """The operation failed: cut back the records written ahead of it.  If the cut
        fails too (logged) they stay - the feature must, and does, take them for what
        they are when read back: records whose operation may not have happened."""
        size, self._ahead = self._ahead, None
        if size is None:
            return
        if self._shared:
            self._writing()
        try:
            self._log.settle(size)
        except StorageError as exc:
            logger.warning("ledgerq: %s; records of a failed write stay in the %s", exc, self.what)
        else:
            self.records = self._ahead_records  # (they are not in the file: not counted)

    def _not_saved(self, exc: StorageError) -> None:
        logger.warning("ledgerq: %s; the %s will be saved whole at the next sync", exc, self.what)
        self.unsaved = True

    def save_deferred(self) -> None:
        """Write the table whole if a record could not be written (lock held, caught up):
        before promising anything a crash would otherwise forget.  Raises
        :class:`StorageError` while the disk is still full."""
        if self.unsaved:
            self.rewrite()

    def should_compact(self, live: int, *, factor: int, slack: int) -> bool:
        """Whether the file holds more than ``factor`` records per ``live`` one, plus
        ``slack``: then :meth:`compact`."""
        return self.records > factor * live + slack

    def compact(self) -> None:
        """Rewrite the file as the table (lock held, caught up).  A failure is logged:
        the file as it is holds the table too, and is appended to meanwhile."""
        self._compact_as(list(self._snapshot()))

    def _compact_as(self, records: list[bytes]) -> None:
        try:
            self.rewrite(records)
        except StorageError as exc:
            logger.warning("ledgerq: %s; the %s is rewritten later", exc, self.what)

    def rewrite(self, records: list[bytes] | None = None) -> None:
        """Replace the file with the records of the table (lock held, caught up), or
        ``records`` when the caller has them already.

        Raises :class:`StorageError` if it cannot; the log then appends to whichever
        file holds the name (both hold the table)."""
        self._replace(list(self._snapshot()) if records is None else records)
        self.unsaved = False

    def _replace(self, records: list[bytes]) -> None:
        """Replace the file with a header and ``records`` (temp file, rename)."""
        if self._shared:
            self._writing()
        try:
            self._log.replace(encode_feature_file_header(self._magic) + b"".join(records))
        except StorageError as exc:
            if not self._defer:
                raise
            # Opening alone: the queue must open on a full disk.  The file cannot be
            # appended to (missing, unreadable or of an older version): the table waits.
            self._log.close()
            self._not_saved(exc)
            return
        self.records = len(records)
        self._note_inode()

    def sync(self) -> None:
        """fdatasync the file (any thread)."""
        self._log.sync()

    def flush(self) -> None:
        """Write the table whole if a record could not be written, then fdatasync.

        Raises :class:`StorageError` if the disk refuses."""
        if self.unsaved:
            with self.locked():  # shared mode: nobody appends meanwhile
                self.catch_up()
                self.rewrite()
        self._log.sync()

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._log.close()


def read_feature_values(path: str, magic: bytes) -> list[Any]:
    """The record values of the feature file ``path``, read without any lock (a
    snapshot, for tools): ``[]`` if it is missing or unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return decode_feature_file(data, magic).values
    except (OSError, DecodeError):
        return []
