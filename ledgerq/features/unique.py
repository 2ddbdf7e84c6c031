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
lives in ``features/unique.log`` (framed msgpack records ``[digest, id, timestamp_ns,
expires_ns]``, format/feature_state.py; timestamp -1: known to be written), created at
the first unique enqueue, so a queue that never uses the feature has no file and its
enqueues pay nothing.

Why a feature file and not a field of the entry: the entry's flags byte is full (every
bit has a meaning since format 2), so a key in the entry means a new entry format, and
rebuilding the held keys from the log would read every unfinished message at each open
- recovery reads only state files and the last segment's tail (docs/architecture.md).

Crash safety.  The record is written *before* the message, under the same lock: a
returned enqueue has both, and a kill -9 at any instant never leaves a written message
whose key is not held.  A kill between the two leaves a record whose message was never
written; so a record read back from the file (at open, or another process's) is
*unverified* until the message it names is found in the log with the record's exact
timestamp - done once, the first time the key comes again, by one indexed read.  (Ids
are never reused, and an id another handle took after a dead one carries another
timestamp.)  A message write that fails cuts its records back.

The file's protocol (loading, damage, the version upgrade, shared mode, full disks) is
:class:`~ledgerq.segment.feature_log.FeatureLog`'s.  Shared mode: every handle appends
to the file under the append lock and reads what the others appended before admitting a
key; a key whose message this handle's view shows
unfinished is decided again holding every reader (an ack in another process just
before must count) - a new key needs no reader's lock; a sweep replaces the file under that lock
and the others, seeing their file unlinked, read the new one whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import xxhash

from ledgerq._options import Options
from ledgerq.core.feature import Draft, FeatureWithLog, ReadersNeeded
from ledgerq.format.feature_state import keyed_record_encoder
from ledgerq.format.sealing import keyed_digest
from ledgerq.segment.feature_log import FeatureLog
from ledgerq.segment.naming import UNIQUE_NAME, feature_log_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["UNIQUE_LOG", "UNIQUE_MAGIC", "UniqueFeature", "unique_digest"]


UNIQUE_LOG = UNIQUE_NAME  # (the name is spelled in segment/naming.py)
UNIQUE_MAGIC = b"LQUK"
_DIGEST_SIZE = 16
_SWEEP_AT = 1024  # held keys before the first sweep for finished ones
# The timestamp of a rewritten record whose message this handle knew to be in the log:
# nothing to verify when it is read back.
_VERIFIED = -1
# The digest's domain: a unique key never digests like a dedup id of the same text.
_DOMAIN = "unique:"


def unique_digest(unique_key: str) -> bytes:
    """The 16-byte table key of a unique key on a plain queue."""
    return xxhash.xxh3_128_digest((_DOMAIN + unique_key).encode())


# One record, ``[digest, message_id, timestamp, expires]``: one struct.pack and one CRC.
_encode_record = keyed_record_encoder("Qqq")


def _record(value: Any) -> tuple[bytes, int, int, int] | None:
    """``(digest, id, timestamp_ns, expires_ns)`` of a decoded record, or None.

    Exact types only: the file may be damaged or hostile (see features/dedup.py)."""
    if type(value) is not list or len(value) != 4:
        return None
    digest, message_id, timestamp, expires = value
    if type(digest) is not bytes or len(digest) != _DIGEST_SIZE:
        return None
    if not all(type(x) is int for x in (message_id, timestamp, expires)) or message_id < 1:
        return None
    return digest, message_id, timestamp, expires


class UniqueFeature(FeatureWithLog):
    """Hold unique keys while their message is unfinished (always on; see the module)."""

    name = "unique"
    ignores_plain = True  # a plain enqueue has no unique_key: its paths skip this

    def __init__(self, options: Options) -> None:
        key = options.encryption_key
        self._digest_of: Callable[[str], bytes] = unique_digest
        if key is not None:
            keyed = keyed_digest(key, _DIGEST_SIZE)
            self._digest_of = lambda k: keyed(_DOMAIN + k)
        # digest -> id of the message holding the key (finished ones until a sweep).
        self._held: dict[bytes, int] = {}
        self._expires: dict[bytes, int] = {}  # digest -> expiry (ns) of a TTL's message
        # digest -> timestamp of a record read back, until its message is found: by key,
        # since a dead handle's record may name an id another handle then wrote.
        self._unverified: dict[bytes, int] = {}
        # digest -> (id, timestamp, expires) admitted in the current call, not yet written
        self._provisional: dict[bytes, tuple[int, int, int]] = {}
        self._added = b""  # the digest add_key wrote the record of
        self._queue: QueueCore | None = None
        self._sweep_at = _SWEEP_AT

    def attach(self, queue: QueueCore) -> None:
        # Nothing is read or created here: at the first unique enqueue (_current).
        self._queue = queue
        self._log = FeatureLog(
            feature_log_path(queue.path, UNIQUE_NAME), UNIQUE_MAGIC, "unique keys", queue, self
        )

    # ------------------------------------------------------------------ the file

    def _current(self) -> FeatureLog:
        """The file, created if missing, with the other handles' records applied (lock
        held)."""
        log = self._log
        assert log is not None
        log.current(create=True)
        return log

    def apply_record(self, value: Any) -> bool:
        record = _record(value)
        if record is None:
            return False
        self._take(*record)
        return True

    def clear_table(self) -> None:
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

    def table_records(self) -> Iterator[bytes]:
        """The records of the keys held now (a rewrite)."""
        unverified, expires = self._unverified, self._expires
        for digest, message_id in self._held.items():
            yield _encode_record(
                digest, message_id, unverified.get(digest, _VERIFIED), expires.get(digest, 0)
            )

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
        noted ``candidate_id`` for it (written by before_append)."""
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
        ``unique_key``; or None, having written the record of ``candidate_id`` - the
        message is written next, then :meth:`key_added` (or :meth:`rollback`)."""
        digest = self._digest_of(unique_key)  # (raises for a key that is not unicode)
        log = self._current()
        held = self._held.get(digest)
        if held is not None:
            if self._holds(digest, held, now_ns):
                return held
            self._forget(digest)
        log.append_ahead(_encode_record(digest, candidate_id, now_ns, 0))
        self._added = digest
        return None

    def key_added(self, message_id: int, now_ns: int) -> None:
        """The message of :meth:`add_key` is written (lock held)."""
        digest, self._added = self._added, b""
        assert self._log is not None
        self._log.keep_ahead()
        held = self._held
        held[digest] = message_id  # (not there: add_key forgot a finished holder)
        if len(held) > self._sweep_at:
            self._sweep(now_ns)

    def unadmit(self, draft: Draft) -> None:
        if draft.unique_key is not None:
            self._provisional.pop(self._digest_of(draft.unique_key), None)

    def before_append(self) -> None:
        if not self._provisional:
            return
        log = self._log
        assert log is not None
        provisional = self._provisional
        if len(provisional) == 1:
            ((digest, noted),) = provisional.items()
            blob = _encode_record(digest, *noted)
        else:
            blob = b"".join(_encode_record(digest, *noted) for digest, noted in provisional.items())
        log.append_ahead(blob, len(provisional))  # raises having written nothing: rolled back

    def rollback(self) -> None:
        self._provisional.clear()
        self._added = b""
        if self._log is not None:
            # The records are written, their messages not: cut them back.  If that fails
            # too they stay, unverifiable - no message has their id and timestamp.
            self._log.undo_ahead()

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
        assert self._log is not None
        self._log.keep_ahead()
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
        if cores:
            low = min(core.head for core in cores)
            while held:
                digest = next(iter(held))
                if held[digest] >= low:
                    break
                self._forget(digest)
        expires_of = self._expires
        if expires_of or any(core.finished_from(low) for core in cores):
            tests = [core.finished_test() for core in cores]
            finished = [
                digest
                for digest, message_id in held.items()
                if all(test(message_id) for test in tests)
                or (digest in expires_of and now_ns >= expires_of[digest])
            ]
            for digest in finished:
                self._forget(digest)
        self._sweep_at = max(_SWEEP_AT, 2 * len(self._held))
        log = self._log
        if log is not None and log.should_compact(len(self._held), factor=2, slack=_SWEEP_AT):
            log.compact()  # (if it fails, the old file holds every held key too)

    # ------------------------------------------------------------------ lifecycle
