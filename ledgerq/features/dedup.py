"""Dedup window: an enqueue whose ``dedup_id`` was seen within ``dedup_window``
seconds adds nothing and returns the original message's id.

The table maps the xxh3-128 hash of the dedup id (16 bytes: collisions are not
a practical concern) to the original id and the window's end.  The window is the
same for every entry, so insertion order is expiry order: an ``OrderedDict``
gives oldest-expiry eviction (when ``dedup_max_entries`` is reached) and lazy
cleanup of expired entries from its front, on the enqueue path, with no thread.

The table is persisted in ``features/dedup.log`` (framed msgpack records
``[hash, id, expires_ns]``), appended after the message itself is written - a
crash between the two can let one retry through (at-least-once), never lose a
message - and rewritten when it holds twice the live entries.  A record that cannot
be written (a full disk) does not undo the enqueue, which has happened: it is cut back
(never left torn in the middle of the file), later records are appended as usual, and
the table is rewritten whole at the next sync or close.  A damaged record in the middle of
the file is skipped and counted (``stats().corrupt_skipped``); the ones after it count.

In shared mode every handle appends to the same file, under the queue's append lock,
and before admitting anything reads the records the others appended since its last
look (:meth:`DedupFeature.catch_up`): a ``dedup_id`` enqueued by one process is a
duplicate for all.  A rewrite replaces the file (under that lock too); the others
notice it (their descriptor's file has no name left) and read the new one whole.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import xxhash

from ledgerq._options import Options
from ledgerq.core.feature import Draft, Feature
from ledgerq.format.errors import DecodeError
from ledgerq.format.feature_state import (
    FEATURE_FILE_HEADER,
    FEATURE_VERSION,
    FeatureFile,
    decode_feature_file,
    decode_feature_records,
    encode_feature_file_header,
    encode_feature_record,
)
from ledgerq.format.sealing import keyed_digest
from ledgerq.segment.appendlog import AppendLog
from ledgerq.segment.files import StorageError, make_durable_dir
from ledgerq.segment.naming import FEATURES_DIR

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["DedupFeature", "dedup_key"]

logger = logging.getLogger("ledgerq")

_MAGIC = b"LQDD"
_NS = 1_000_000_000
_KEY_SIZE = 16  # an xxh3-128 digest (dedup_key)


def dedup_key(dedup_id: str | bytes) -> bytes:
    """The 16-byte table key of a dedup id (str and bytes ids never collide)."""
    raw = b"s" + dedup_id.encode("utf-8") if isinstance(dedup_id, str) else b"b" + dedup_id
    return xxhash.xxh3_128_digest(raw)


def _table_record(value: Any) -> tuple[bytes, int, int] | None:
    """``(key, id, expires_ns)`` of a decoded ``dedup.log`` record; None if it is not one.

    Exact types only, checked before anything is converted: the file may be damaged
    or hostile, and coercing its values is how a stray int became ``bytes(n)`` (n
    zero bytes) and a float infinity an ``OverflowError``.
    """
    if type(value) is not list or len(value) != 3:
        return None
    key, message_id, expires_ns = value
    if type(key) is not bytes or len(key) != _KEY_SIZE:
        return None
    if type(message_id) is not int or type(expires_ns) is not int:
        return None
    return key, message_id, expires_ns


class DedupFeature(Feature):
    """Remember dedup ids for a window; answer repeats with the original id."""

    name = "dedup"

    def __init__(self, options: Options) -> None:
        assert options.dedup_window is not None
        self._window_ns = int(options.dedup_window * _NS)
        self._max_entries = options.dedup_max_entries
        self._table: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._provisional: list[bytes] = []
        self._log: AppendLog | None = None
        self._records = 0
        self._unsaved = False  # a record could not be written: rewrite the table whole
        self._queue: QueueCore | None = None
        self._shared = False  # other handles append to the file too (shared mode)
        # An encrypted queue keys its table with a keyed hash (HMAC under a key derived
        # from the encryption key): an unkeyed digest in dedup.log would let whoever
        # holds the disk confirm a guessed dedup id.
        key = options.encryption_key
        self._key_of = dedup_key if key is None else keyed_digest(key, _KEY_SIZE)

    def attach(self, queue: QueueCore) -> None:
        directory = os.path.join(queue.path, FEATURES_DIR)
        make_durable_dir(directory)
        path = os.path.join(directory, "dedup.log")
        self._log = AppendLog(path, "dedup state")
        # A record that meets a full disk takes the disk reserve's space (the enqueue
        # that needs it has already written its message); enqueues refuse after that.
        self._log.on_full = lambda: queue.make_room()  # (the proxy: no cycle)
        self._queue = queue
        self._shared = queue.shared
        if self._shared and not queue.is_alone:
            self._join(path, queue)
            return
        values, end = self._load(path, queue)
        for value in values:
            self._take(value, queue)
        try:
            self._rewrite()  # drops expired entries and any damage the file held
        except StorageError as exc:
            # A full disk must not make the queue unopenable.  The file as it is holds the
            # table (and what the rewrite would drop, skipped again at the next load):
            # append to it.  Without a usable file, the table is in memory, and the next
            # sync() or close() tries the rewrite again.
            try:
                if not end:
                    raise exc
                self._log.open(end)
                self._records = len(self._table)
            except StorageError as again:
                self._not_saved(again)

    def _take(self, value: Any, queue: QueueCore) -> None:
        record = _table_record(value)
        if record is None:
            queue.note_corrupt_skipped(1)  # not a record this library writes
            return
        key, message_id, expires_ns = record
        self._table[key] = (message_id, expires_ns)
        self._table.move_to_end(key)

    def _join(self, path: str, queue: QueueCore) -> None:
        """Shared mode, other handles live: read the file as it is, rewrite nothing."""
        assert self._log is not None
        with queue.appends_locked():
            if not os.path.exists(path):
                self._log.replace(encode_feature_file_header(_MAGIC))
            else:
                self._log.open(0, cut=False)
                self._log.size = 0
            self._catch_up_locked()

    def catch_up(self) -> None:
        """Shared mode: apply the records other handles appended (append lock held)."""
        if self._shared:
            self._catch_up_locked()

    def _catch_up_locked(self) -> None:
        log, queue = self._log, self._queue
        assert log is not None
        assert queue is not None
        news = log.news()
        if news is None:
            return
        data, replaced = news
        base = log.size
        if replaced or base == 0:
            self._table.clear()
            try:
                found = decode_feature_file(data, _MAGIC)
            except DecodeError:
                logger.warning("ledgerq: %s is unreadable; the dedup window starts empty", log.path)
                found = FeatureFile([], FEATURE_FILE_HEADER.size, 0)
                log.replace(encode_feature_file_header(_MAGIC))
                return
        else:
            found = decode_feature_records(data, 0)
        if found.damaged:
            queue.note_corrupt_skipped(found.damaged)
        for value in found.values:
            self._take(value, queue)
        self._records += len(found.values)
        log.settle(base + found.end)
        if found.version != FEATURE_VERSION:
            # A version-1 file (CRC-32) that no live handle had loaded - every one that
            # had, upgraded it - is never appended to: rewritten as the newest version
            # now, under the append lock every append to it takes; the other handles see
            # it replaced and read it again (as after the rewrite of an unreadable file).
            self._rewrite()

    @staticmethod
    def _load(path: str, queue: QueueCore) -> tuple[list[Any], int]:
        """The record values of ``dedup.log`` (none if missing), damage counted, and
        where its whole records end (0 when there is no usable file)."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return [], 0
        try:
            found = decode_feature_file(data, _MAGIC)
        except DecodeError:
            logger.warning("ledgerq: %s is unreadable; the dedup window starts empty", path)
            queue.note_corrupt_skipped(1)
            return [], 0
        if found.damaged:
            logger.warning("ledgerq: skipped %d damaged records in %s", found.damaged, path)
            queue.note_corrupt_skipped(found.damaged)
        # A file of an older version (another checksum) is never appended to: rewritten.
        return found.values, found.end if found.version == FEATURE_VERSION else 0

    def _rewrite(self) -> None:
        blob = encode_feature_file_header(_MAGIC) + b"".join(
            encode_feature_record([key, mid, exp]) for key, (mid, exp) in self._table.items()
        )
        assert self._log is not None
        self._log.replace(blob)
        self._records = len(self._table)
        self._unsaved = False

    def _expire(self, now_ns: int) -> None:
        table = self._table
        while table:
            key = next(iter(table))
            if table[key][1] > now_ns and len(table) <= self._max_entries:
                break
            del table[key]

    def admit(self, draft: Draft, now_ns: int, candidate_id: int) -> int | None:
        if draft.dedup_id is None:
            return None
        if self._unsaved:
            # A record could not be written (not even with the disk reserve's space):
            # the table must be in the file before another dedup id is promised, or a
            # crash would forget this one too.  Raises while the disk is still full.
            self._rewrite()
        self._expire(now_ns)
        key = self._key_of(draft.dedup_id)
        hit = self._table.get(key)
        if hit is not None and hit[1] > now_ns:
            return hit[0]
        self._table[key] = (candidate_id, now_ns + self._window_ns)
        self._table.move_to_end(key)
        self._provisional.append(key)
        return None

    def rollback(self) -> None:
        for key in self._provisional:
            self._table.pop(key, None)
        self._provisional.clear()

    def appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        if not self._provisional:
            return
        blob = b"".join(
            encode_feature_record([key, *self._table[key]])
            for key in self._provisional
            if key in self._table
        )
        self._provisional.clear()
        assert self._log is not None
        if not self._log.is_open:
            return  # never opened (a full disk at open): rewritten whole at the next flush
        # The messages are in the log: the enqueue happened and must not raise.  A record
        # that cannot be written stays in the table in memory and the file is rewritten
        # whole at the next sync; later records are still appended meanwhile (the failed
        # one was cut back), so a crash before that sync forgets only the ids it held.
        try:
            self._log.append_record(blob)
        except StorageError as exc:
            self._not_saved(exc)
            return
        self._records += 1
        if len(self._table) > self._max_entries:
            self._expire(now_ns)
        if self._records > 2 * len(self._table) + 1024:
            try:
                self._rewrite()
            except StorageError as exc:
                self._not_saved(exc)

    def _not_saved(self, exc: StorageError) -> None:
        logger.warning("ledgerq: %s; the dedup table will be saved at the next sync", exc)
        self._unsaved = True

    def flush(self) -> None:
        if self._log is None:
            return
        if self._unsaved:
            assert self._queue is not None
            with self._queue.appends_locked():  # shared mode: nobody appends meanwhile
                self.catch_up()
                self._rewrite()  # raises StorageError while the disk is still full
        self._log.sync()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def stats(self, counters: dict[str, Any]) -> None:
        counters["dedup_entries"] = len(self._table)
