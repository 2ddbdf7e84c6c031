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
message - and rewritten when it holds twice the live entries.  The file's protocol
(loading, damage, the version upgrade, shared mode, full disks) is
:class:`~ledgerq.segment.feature_log.FeatureLog`'s.  A record that cannot be written (a
full disk) does not undo the enqueue, which has happened: the table is written whole
before the next dedup id is admitted, or at the next sync or close.  In shared mode
every handle reads the records the others appended before admitting anything
(:meth:`DedupFeature.catch_up`): a ``dedup_id`` enqueued by one process is a duplicate
for all.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import xxhash

from ledgerq._options import Options
from ledgerq.core.feature import Draft, FeatureWithLog
from ledgerq.format.feature_state import encode_feature_record
from ledgerq.segment.feature_log import FeatureLog
from ledgerq.segment.naming import DEDUP_NAME, feature_log_path

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["DedupFeature", "dedup_key"]

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


class DedupFeature(FeatureWithLog):
    """Remember dedup ids for a window; answer repeats with the original id."""

    name = "dedup"

    def __init__(self, options: Options) -> None:
        assert options.dedup_window is not None
        self._window_ns = int(options.dedup_window * _NS)
        self._max_entries = options.dedup_max_entries
        self._table: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._provisional: list[bytes] = []
        self._key_of: Callable[[str | bytes], bytes] = dedup_key

    def attach(self, queue: QueueCore) -> None:
        # An encrypted queue keys its table with a keyed hash (HMAC under the queue's
        # digest key, which a key rotation keeps): an unkeyed digest in dedup.log would
        # let whoever holds the disk confirm a guessed dedup id.
        keyed = queue.keyed_digest(_KEY_SIZE)
        if keyed is not None:
            self._key_of = keyed
        self._log = FeatureLog(
            feature_log_path(queue.path, DEDUP_NAME), _MAGIC, "dedup table", queue, self
        )
        self._log.open(compact=True)  # drops expired entries and any damage the file held

    # ------------------------------------------------------------------ the table (FeatureTable)

    def apply_record(self, value: Any) -> bool:
        record = _table_record(value)
        if record is None:
            return False  # not a record this library writes
        key, message_id, expires_ns = record
        self._table[key] = (message_id, expires_ns)
        self._table.move_to_end(key)
        return True

    def clear_table(self) -> None:
        self._table.clear()

    def table_records(self) -> Iterator[bytes]:
        for key, (message_id, expires_ns) in self._table.items():
            yield encode_feature_record([key, message_id, expires_ns])

    def catch_up(self) -> None:
        """Shared mode: apply the records other handles appended (append lock held)."""
        assert self._log is not None
        self._log.catch_up()

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
        # A record that could not be written (not even in the disk reserve's room) must
        # be in the file before another dedup id is promised, or a crash would forget
        # this one too: the table is written whole (raises while the disk is still full).
        assert self._log is not None
        self._log.save_deferred()
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
        records = [
            encode_feature_record([key, *self._table[key]])
            for key in self._provisional
            if key in self._table
        ]
        self._provisional.clear()
        log = self._log
        assert log is not None
        # The messages are in the log: the enqueue happened and must not raise.  A record
        # that cannot be written stays in the table, written whole before the next dedup
        # id is admitted (or at the next sync); later records are still appended.
        if not log.append_or_defer(b"".join(records), len(records)):
            return
        if len(self._table) > self._max_entries:
            self._expire(now_ns)
        if log.should_compact(len(self._table), factor=2, slack=1024):
            log.compact()

    def stats(self, counters: dict[str, Any]) -> None:
        counters["dedup_entries"] = len(self._table)
