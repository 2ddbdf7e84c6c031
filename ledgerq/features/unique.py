"""Unique jobs: ``enqueue(..., unique_key=)`` adds nothing, and returns the id of the
message that holds the key, while that message is unfinished.

A key is *held* by the last message enqueued with it until every reader of the queue
is done with that message: acked, dead-lettered, expired (past its TTL) or dropped
(retention, purge) - the rule that holds back retention and bounds ``max_pending``.
Pending, delayed, leased and waiting-for-a-retry all hold the key.  Whether a message
is finished is asked of the readers' own state when the key comes again (and by a
sweep that forgets finished keys), so acks, dead-letters and expiries need no hook.

The table maps a 16-byte digest of the key (xxh3-128; on an encrypted queue a keyed
HMAC, as dedup ids: the file must not confirm a guessed key) to the message id.  It
lives in ``features/unique.table``: fixed-size records ``(digest, id, timestamp_ns,
expires_ns)`` in a file mapped into memory (segment/key_table.py; timestamp -1: known
to be written), created at the first unique enqueue, so a queue that never uses the
feature has no file and its enqueues pay nothing.  A record is a store into the
mapping, not a ``write()``: on the path of every new key, that system call cost more
than the rest of the key's work (benchmarks/unique.py).

Why a file of its own and not a field of the entry: the entry's flags byte is full
(every bit has a meaning since format 2), so a key in the entry means a new entry
format, and rebuilding the held keys from the log would read every unfinished message
at each open - recovery reads only state files and the last segment's tail
(docs/architecture.md).

Crash safety.  The record is stored *before* the message is written, under the same
lock: a returned enqueue has both, and a kill -9 at any instant never leaves a written
message whose key is not held (a store into a shared mapping is in the page cache when
it is done; with ``sync="always"`` the record's page is also synced before the
message).  A kill between the two leaves a record whose message was never written; so
a record read back from the file (at open, or another process's) is *unverified* until
the message it names is found in the log with the record's exact timestamp - done
once, the first time the key comes again, by one indexed read.  (Ids are never reused,
and an id another handle took after a dead one carries another timestamp.)  A message
write that fails cuts its records back.

A queue whose keys a version before the table kept in ``features/unique.log`` (framed
msgpack records of the same four values) has that file read at the first unique
enqueue, its records put in the table, and the file removed.

Shared mode: every handle maps the file and stores into it under the append lock,
having first taken the records the others stored since its last look (two reads of
memory when there are none); a key whose message this handle's view shows unfinished
is decided again holding every reader (an ack in another process just before must
count) - a new key needs no reader's lock.  A sweep replaces the file under that lock;
the old file then says so, and the others read the new one whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import xxhash

from ledgerq._errors import StorageError
from ledgerq._options import Options
from ledgerq.core.feature import Draft, FeatureWithTable, ReadersNeeded
from ledgerq.segment.key_table import (
    KEY_RECORD,
    RECORD_ID_AT,
    REPLACED_WORD,
    KeyRecord,
    KeyTable,
)
from ledgerq.segment.naming import UNIQUE_NAME, UNIQUE_TABLE_NAME, feature_log_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["UNIQUE_LOG", "UNIQUE_MAGIC", "UNIQUE_TABLE_MAGIC", "UniqueFeature", "unique_digest"]

logger = logging.getLogger("ledgerq")

UNIQUE_LOG = UNIQUE_NAME  # (the names are spelled in segment/naming.py)
UNIQUE_MAGIC = b"LQUK"  # features/unique.log, read to move its records into the table
UNIQUE_TABLE_MAGIC = b"LQUT"
_DIGEST_SIZE = 16
KEY_RECORD_SIZE = KEY_RECORD.size
_SWEEP_AT = 1024  # held keys before the first sweep for finished ones
# Records of finished keys the file may hold beyond twice the keys held before a sweep
# rewrites it (2.5 MiB): a rewrite fsyncs twice, so one every few thousand keys - when
# a consumer keeps up and few keys are held - cost more than the keys' own work
# (benchmarks/unique.py, the "consumer keeps up" row).
_REWRITE_SLACK = 65536
# The timestamp of a rewritten record whose message this handle knew to be in the log:
# nothing to verify when it is read back.
_VERIFIED = -1
# The digest's domain: a unique key never digests like a dedup id of the same text.
_DOMAIN = "unique:"


_xxh3_128 = xxhash.xxh3_128_digest


def unique_digest(unique_key: str) -> bytes:
    """The 16-byte table key of a unique key on a plain queue."""
    return _xxh3_128((_DOMAIN + unique_key).encode())


def _record(value: Any) -> KeyRecord | None:
    """``(digest, id, timestamp_ns, expires_ns)`` of a record of ``unique.log``, or None.

    Exact types only: the file may be damaged or hostile (see features/dedup.py)."""
    if type(value) is not list or len(value) != 4:
        return None
    digest, message_id, timestamp, expires = value
    if type(digest) is not bytes or len(digest) != _DIGEST_SIZE:
        return None
    if not all(type(x) is int for x in (message_id, timestamp, expires)) or message_id < 1:
        return None
    if not (-(1 << 63) <= timestamp < 1 << 63 and 0 <= expires < 1 << 63):
        return None
    return digest, message_id, timestamp, expires


class UniqueFeature(FeatureWithTable):
    """Hold unique keys while their message is unfinished (always on; see the module)."""

    name = "unique"
    ignores_plain = True  # a plain enqueue has no unique_key: its paths skip this

    def __init__(self, options: Options) -> None:
        # An encrypted queue's digest is keyed (attach): the file must not confirm a
        # guessed key.
        self._digest_of: Callable[[str], bytes] = unique_digest
        self._plain_digest = True  # the digest is unique_digest's
        # digest -> id of the message holding the key (finished ones until a sweep).
        self._held: dict[bytes, int] = {}
        self._expires: dict[bytes, int] = {}  # digest -> expiry (ns) of a TTL's message
        # digest -> timestamp of a record read back, until its message is found: by key,
        # since a dead handle's record may name an id another handle then wrote.
        self._unverified: dict[bytes, int] = {}
        # digest -> (id, timestamp, expires) admitted in the current call, not yet written
        self._provisional: dict[bytes, tuple[int, int, int]] = {}
        # The digest the last add_key stored, and the table's end before it (undo_key).
        self._key_undo: tuple[bytes, int] = (b"", 0)
        self._ahead: int | None = None  # the table's end before a batch's records
        self._queue: QueueCore | None = None
        self._sync_always = False
        self._sweep_at = _SWEEP_AT

    def attach(self, queue: QueueCore) -> None:
        # Nothing is read or created here: at the first unique enqueue (_current).
        keyed = queue.keyed_digest(_DIGEST_SIZE)
        if keyed is not None:  # (under the queue's digest key, which a rotation keeps)
            self._digest_of = lambda k: keyed(_DOMAIN + k)
            self._plain_digest = False
        self._queue = queue
        self._sync_always = queue.options.sync == "always"
        self._table = KeyTable(
            feature_log_path(queue.path, UNIQUE_TABLE_NAME),
            UNIQUE_TABLE_MAGIC,
            "unique keys",
            queue,
            older=(feature_log_path(queue.path, UNIQUE_NAME), UNIQUE_MAGIC, _record),
        )

    # ------------------------------------------------------------------ the file

    def _current(self) -> KeyTable:
        """The table's file, created if missing, with the other handles' records taken
        (lock held; shared mode: the append lock)."""
        table = self._table
        assert table is not None
        if not table.is_loaded:
            # The first use in this handle: the file read whole (the records of a
            # unique.log an older ledgerq wrote moved into it first).
            records = table.open(create=True)
            assert records is not None
            self._clear()
            for record in records:
                self._take(*record)
        else:
            replaced, records = table.news()
            if replaced or records:
                self._take_news(replaced, records)
        return table

    def _take_news(self, replaced: bool, records: list[KeyRecord]) -> None:
        """Take what :meth:`KeyTable.news` found: the others' records (or, ``replaced``,
        the whole file)."""
        if replaced:
            self._clear()
        for record in records:
            self._take(*record)

    def _clear(self) -> None:
        self._held.clear()
        self._expires.clear()
        self._unverified.clear()

    def _take(self, digest: bytes, message_id: int, timestamp: int, expires: int) -> None:
        """A record read back: the key is (again) the message's, until verified."""
        self._held.pop(digest, None)  # to the end: the table stays in id order
        self._held[digest] = message_id
        if expires:
            self._expires[digest] = expires
        else:
            self._expires.pop(digest, None)
        if timestamp != _VERIFIED:
            self._unverified[digest] = timestamp
        else:
            self._unverified.pop(digest, None)

    def _records(self) -> Iterator[KeyRecord]:
        """The records of the keys held now (a rewrite)."""
        unverified, expires = self._unverified, self._expires
        for digest, message_id in self._held.items():
            yield digest, message_id, unverified.get(digest, _VERIFIED), expires.get(digest, 0)

    # ------------------------------------------------------------------ deciding

    def _is_unfinished(self, digest: bytes, message_id: int, now_ns: int) -> bool:
        """Whether some reader still has to finish ``message_id``, the message of
        ``digest``'s last record (which may be unverified)."""
        expires = self._expires.get(digest)
        if expires is not None and now_ns >= expires:
            return False  # expired: never delivered again
        queue = self._queue
        assert queue is not None
        return not all(core.is_finished(message_id) for core in queue.reader_cores())

    def _holds(self, digest: bytes, message_id: int, now_ns: int) -> bool:
        """Whether ``message_id`` holds the key of ``digest`` now.

        Shared mode: a message this handle's view of the readers shows finished is
        finished (the readers' state only moves on: a finished message never comes back);
        one it shows unfinished may have been acked elsewhere just now - asked again with
        every reader held (ReadersNeeded), so the common case, a new key, takes no
        reader's lock."""
        if not self._is_unfinished(digest, message_id, now_ns):
            return False
        queue = self._queue
        assert queue is not None
        if not queue.readers_current():
            raise ReadersNeeded
        timestamp = self._unverified.get(digest)
        if timestamp is not None:
            entry = queue.entry_of(message_id)
            if entry is None or entry.timestamp != timestamp:
                return False  # a record whose message was never written (a crash)
            del self._unverified[digest]
        return True

    def _forget(self, digest: bytes) -> None:
        del self._held[digest]
        self._expires.pop(digest, None)
        self._unverified.pop(digest, None)

    def _forget_all(self, digests: list[bytes]) -> None:
        """:meth:`_forget` of each of ``digests`` (a sweep's)."""
        held, expires, unverified = self._held, self._expires, self._unverified
        for digest in digests:
            del held[digest]
        for side in (expires, unverified):
            if side:  # (mostly empty: no TTL, nothing read back unverified)
                for digest in digests:
                    side.pop(digest, None)

    def admit(self, draft: Draft, now_ns: int, candidate_id: int) -> int | None:
        unique_key = draft.unique_key
        if unique_key is None:
            return None
        expires = 0 if draft.expires_in_ns is None else now_ns + draft.expires_in_ns
        return self._admit_key(unique_key, now_ns, candidate_id, expires)

    def _admit_key(
        self, unique_key: str, now_ns: int, candidate_id: int, expires: int = 0
    ) -> int | None:
        """:meth:`admit` for one key: the id holding ``unique_key``, or None having
        noted ``candidate_id`` for it (stored by before_append)."""
        digest = self._digest_of(unique_key)  # (raises for a key that is not unicode)
        if not self._provisional:  # the first key of this call: the file's news first
            self._current()
        noted = self._provisional.get(digest)
        if noted is not None:
            return noted[0]  # the same key twice in one batch: one message
        held = self._held.get(digest)
        if held is not None:
            if self._holds(digest, held, now_ns):
                return held
            self._forget(digest)
        self._provisional[digest] = (candidate_id, now_ns, expires)
        return None

    def add_key(self, unique_key: str, now_ns: int, candidate_id: int) -> int | None:
        """The core's path for a bytes payload with only a key (lock held): the id holding
        ``unique_key``; or None, having made ``candidate_id`` its holder and stored the
        record - the message is written next; :meth:`undo_key` if that fails."""
        # (raises for a key that is not unicode; unique_digest inlined on a plain queue)
        digest = (
            _xxh3_128((_DOMAIN + unique_key).encode())
            if self._plain_digest
            else self._digest_of(unique_key)
        )
        table = self._table
        assert table is not None
        end = table.end
        if table.stale:
            # Not loaded yet, or shared mode: the others' records first, if a look at
            # two words of the mapping finds any (KeyTable.unchanged, inlined).
            watch = table.watch
            if (
                watch is None
                or end + KEY_RECORD_SIZE > table.size
                or watch[(end + RECORD_ID_AT) >> 3]
                or watch[REPLACED_WORD]
            ):
                self._current()
                end = table.end
        held = self._held
        holder = held.get(digest)
        if holder is not None:
            if self._holds(digest, holder, now_ns):
                return holder
            self._forget(digest)
        elif len(held) >= self._sweep_at:
            self._sweep(now_ns)  # (may rewrite the table)
            end = table.end
        # (table.append, inlined)
        if end + KEY_RECORD_SIZE > table.size:
            table.grow()  # raises having stored nothing
        area = table.area
        assert area is not None
        table.pack(area, end, digest, candidate_id, now_ns, 0)
        table.end = end + KEY_RECORD_SIZE
        held[digest] = candidate_id
        self._key_undo = (digest, end)
        if self._sync_always:
            try:
                table.sync(end)  # the record reaches the disk before its message
            except StorageError:
                self.undo_key()
                raise
        return None

    def undo_key(self) -> None:
        """The message of the last :meth:`add_key` was not written (lock held): its key
        is not held, and its record is cut back."""
        digest, end = self._key_undo
        self._key_undo = (b"", 0)
        if digest:
            self._held.pop(digest, None)
            assert self._table is not None
            self._table.undo(end)

    def unadmit(self, draft: Draft) -> None:
        if draft.unique_key is not None:
            self._provisional.pop(self._digest_of(draft.unique_key), None)

    def before_append(self) -> None:
        if not self._provisional:
            return
        table = self._table
        assert table is not None
        end = table.end
        self._ahead = end
        try:
            for digest, (message_id, timestamp, expires) in self._provisional.items():
                table.append(digest, message_id, timestamp, expires)
        except StorageError:
            table.undo(end)  # raises having stored nothing: rolled back
            self._ahead = None
            raise
        if self._sync_always:
            try:
                table.sync(end)  # the records reach the disk before their messages
            except StorageError:
                self.rollback()
                raise

    def rollback(self) -> None:
        self._provisional.clear()
        end, self._ahead = self._ahead, None
        if end is not None and self._table is not None:
            # The records are stored, their messages not written: cut them back.
            self._table.undo(end)

    def appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        # The messages _admit_key noted are written (their ids are the noted ones).
        provisional = self._provisional
        if not provisional:
            return
        held, expires_of, unverified = self._held, self._expires, self._unverified
        for digest, (message_id, _, expires) in provisional.items():
            # A key held before was found finished: it moves to the end (id order).
            held.pop(digest, None)
            held[digest] = message_id
            if expires:
                expires_of[digest] = expires
            elif expires_of:
                expires_of.pop(digest, None)
            if unverified:
                unverified.pop(digest, None)
        provisional.clear()
        self._ahead = None
        if len(held) > self._sweep_at:
            self._sweep(now_ns)

    def _sweep(self, now_ns: int) -> None:
        """Forget the keys whose message is finished; rewrite the file when mostly dead.

        Amortised: the next sweep waits until the table has doubled.  The table is in id
        order (a key enqueued again moves to the end), so the keys of messages below
        every reader's head - finished, the common case - go from its front; the rest
        is looked at only if some reader finished messages out of order above its head
        or some key's message has a TTL."""
        queue = self._queue
        assert queue is not None
        cores = queue.reader_cores()
        held = self._held
        low = 0
        if cores:
            low = min(core.head for core in cores)
            # One pass from the front (a look for the first key after each removal would
            # step over every slot removed before it: quadratic in the keys dropped).
            below = []
            for digest, message_id in held.items():
                if message_id >= low:
                    break
                below.append(digest)
            self._forget_all(below)
        expires_of = self._expires
        if expires_of or any(core.finished_from(low) for core in cores):
            tests = [core.finished_test() for core in cores]
            finished = [
                digest
                for digest, message_id in held.items()
                if all(test(message_id) for test in tests)
                or (digest in expires_of and now_ns >= expires_of[digest])
            ]
            self._forget_all(finished)
        self._sweep_at = max(_SWEEP_AT, 2 * len(self._held))
        table = self._table
        if table is not None and table.records > 2 * len(self._held) + _REWRITE_SLACK:
            try:
                table.rewrite(self._records())
            except StorageError as exc:  # the old file holds every held key too
                logger.warning("ledgerq: %s; the %s is rewritten later", exc, table.what)
