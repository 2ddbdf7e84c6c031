"""Removal: messages settled other than by their consumer's ack (a part of the reader's
state machine).

* **settle by id** (``settle_any``): tooling that removes one message wherever it is -
  leased, given back, parked, held behind its group, or not read yet (a DLQ requeue, a
  payload that cannot be restored);
* **purge**: every pending message that is not leased, or those of a set of ids, in
  one journal write (a leased message is never purged: its holder's ack must work);
* **a dropped segment** (``drop_segment``): ``retention_max_bytes`` deletes the oldest
  segment, and everything of it the reader had not settled is dropped and counted;
  its leases are revoked, so that their ack or nack says why they are unknown.

Each is counted (acked, or dropped) and told to the features' ``settled`` hook.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from ledgerq.core.delays import DelayIndex
from ledgerq.core.feature import Selector
from ledgerq.core.journal import ReaderJournal
from ledgerq.format.entry import Entry
from ledgerq.format.reader_state import StateRecordType, encode_ids_record
from ledgerq.segment.cursor import LogCursor
from ledgerq.segment.manager import SegmentManager

if TYPE_CHECKING:
    from ledgerq.core.reader import ReaderCore, ReaderHooks

__all__ = ["Removal"]

_ACK = StateRecordType.ACK
_REVOKED_KEPT = 10_000  # the revoked leases remembered, for the error their ack raises


class Removal:
    """The removal of messages from :class:`~ledgerq.core.reader.ReaderCore` (a mixin:
    its methods take the reader's state machine as ``self``)."""

    # The reader's state they read (set by ReaderCore's constructor).
    journal: ReaderJournal
    counters: dict[str, int]
    _hooks: ReaderHooks
    _manager: SegmentManager
    _cursor: LogCursor
    _selector: Selector
    _leased: dict[int, tuple[Entry, int]]  # id -> (entry, delivery number)
    _deliveries: dict[int, int]
    _skip: set[int]  # ids finished ahead of the cursor
    _revoked: dict[int, None]  # leases revoked by a dropped segment (the newest kept)
    _delays: DelayIndex
    _due_ns: int
    _group_of: dict[int, str]
    _group_held: dict[int, Entry]

    if TYPE_CHECKING:  # the reader's own methods, which these call

        @property
        def head(self) -> int: ...
        def _forget(self, message_id: int) -> None: ...
        def _exists_unread(self, message_id: int) -> bool: ...
        def _drop_group_members(self, last_id: int) -> int: ...
        def _forget_ahead(self) -> None: ...

    def settle_any(self, message_id: int) -> bool:
        """Mark ``message_id`` done wherever it is (leased, held, or not read yet).

        Used by tooling that removes messages by id (DLQ requeue and purge).
        Returns False if the id is not pending here.
        """
        leased = message_id in self._leased
        held = not leased and self._selector.holds(message_id)
        parked = not leased and not held and bool(self._delays) and message_id in self._delays
        aside = not leased and message_id in self._group_held
        held = held or parked or aside
        if not leased and not held:  # not read yet, or not pending here at all
            if message_id < self._cursor.next_id or message_id in self._skip:
                return False
            if not self._exists_unread(message_id):
                return False
        self.journal.append(_ACK, [message_id])  # first: if it fails, nothing changed
        if leased:
            del self._leased[message_id]
        elif aside:
            del self._group_held[message_id]
        elif parked:
            self._delays.discard(message_id)
            self._due_ns = self._delays.next_due_ns
        elif held:
            self._selector.discard(message_id)
        else:
            self._skip.add(message_id)
        self._forget(message_id)
        self.counters["acked"] += 1
        return True

    def purge(self, wanted: set[int] | None = None) -> tuple[list[int], int]:
        """Settle for good every pending message that is not leased (or those of
        ``wanted``); return their ids and the journal ticket.

        Pending is everything not finished and not leased: unread, ready, delayed,
        waiting for a retry, held behind its group.  A leased message is never purged:
        its holder's ack must still work.  One journal write for all of them (chunked
        records): if it fails, nothing changed.  Counted as acked (``stats()``).
        """
        parked = self._delays.ids() if self._delays else set()
        if wanted is None:
            candidates: Iterable[int] = self._pending_ids(parked)
        else:
            candidates = sorted(wanted)
        ids = [i for i in candidates if self._may_purge(i, parked)]
        if not ids:
            return [], 0
        records = [encode_ids_record(_ACK, ids[k : k + 8192]) for k in range(0, len(ids), 8192)]
        self.journal.append_record(b"".join(records))  # first: if it fails, nothing changed
        ticket = self.journal.commit.note_write()
        gone = set(ids)
        if parked:
            self._delays.discard_all(gone)
            self._due_ns = self._delays.next_due_ns
        for message_id in ids:  # in id order: a group's head first, then what it frees
            if message_id in self._group_held:
                del self._group_held[message_id]
            elif not self._selector.discard(message_id) and message_id >= self._cursor.next_id:
                self._skip.add(message_id)
            self._forget(message_id)  # (gives its group's next one back: group_freed)
        self.counters["acked"] += len(ids)
        for feature in self._hooks.settled:
            feature.settled(cast("ReaderCore", self), ids)
        return ids, ticket

    def _pending_ids(self, parked: set[int]) -> list[int]:
        """Every id this reader may still deliver (leased ones included), in id order."""
        held = set(self._group_held) | parked
        start = self._cursor.next_id
        behind = [i for i in range(self.head, start) if i in held or self._selector.holds(i)]
        unread: list[int] = []
        for seg in self._manager.segments:
            if seg.is_empty or seg.last_id < start:
                continue
            if not seg.missing:
                unread.extend(range(max(seg.first_id, start), seg.last_id + 1))
                continue
            cursor = LogCursor(self._manager, max(seg.first_id, start))  # a damaged segment
            while (entry := cursor.next()) is not None and entry.id <= seg.last_id:
                unread.append(entry.id)
        skip = self._skip
        return behind + [i for i in unread if i not in skip]

    def _may_purge(self, message_id: int, parked: set[int]) -> bool:
        """Whether ``message_id`` is pending here and not leased."""
        if message_id in self._leased:
            return False
        if message_id in self._group_held or message_id in parked:
            return True
        if self._selector.holds(message_id):
            return True
        if message_id < self._cursor.next_id or message_id in self._skip:
            return False
        return self._exists_unread(message_id)

    def drop_segment(self, first_id: int, last_id: int) -> tuple[int, int]:
        """Retention is deleting the oldest segment, ids ``first_id..last_id``: settle
        everything of it this reader had not settled; return (how many, how many leased).

        Unread messages, messages given back (held by the selector) and leased ones
        alike are dropped and counted in ``counters["dropped"]``.  A lease is revoked:
        its ack or nack raises :class:`UnknownMessageError` saying so (the message
        cannot be delivered again: its bytes are gone).  The reader's head moves past
        ``last_id``, so the caller's checkpoint records the drop durably.
        """
        revoked = [i for i in self._leased if i <= last_id]
        for message_id in revoked:
            del self._leased[message_id]
            self._revoked[message_id] = None
        while len(self._revoked) > _REVOKED_KEPT:
            del self._revoked[next(iter(self._revoked))]
        lost = len(revoked) + len(self._selector.drop_through(last_id))
        if self._delays:
            lost += self._delays.drop_through(last_id)
            self._due_ns = self._delays.next_due_ns
        if self._group_of:
            lost += self._drop_group_members(last_id)
        start = max(self._cursor.next_id, first_id)
        if start <= last_id:
            # Ids are contiguous inside a segment (as pending() counts them).
            lost += last_id - start + 1 - sum(1 for i in self._skip if start <= i <= last_id)
            self._cursor.seek(last_id + 1)
            self._forget_ahead()
        self._skip = {i for i in self._skip if i > last_id}
        failed = [i for i in self._deliveries if i <= last_id]
        for message_id in failed:
            self._forget(message_id)
        for feature in self._hooks.settled:  # e.g. the retry tracker forgets them
            feature.settled(cast("ReaderCore", self), failed)
        self.counters["dropped"] = self.counters.get("dropped", 0) + lost
        return lost, len(revoked)
