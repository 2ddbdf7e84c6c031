"""Delivery in time: message groups and delays (a part of the reader's state machine).

:class:`~ledgerq.core.reader.ReaderCore` decides what a reader delivers; these are the
rules that hold a message back, written apart:

* **groups** - a grouped message is delivered only when it is its group's smallest
  unfinished id (one at a time, in id order, across nacks, delays and priorities);
  one taken out of turn waits, held aside, until the one before it is finished;
* **delays** - an entry with a ``deliver_at`` or an id with a retry time (NOT_BEFORE,
  from the reader's journal) is *parked* in the delay index until it is due, then
  given back to the selector, read back from the log;
* what ``stats().delayed`` counts: the parked ids, and the unread ones that will wait.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections.abc import MutableSequence

from ledgerq.core.delays import NEVER_NS, DelayIndex
from ledgerq.core.feature import Selector
from ledgerq.core.journal import ReaderJournal
from ledgerq.format.entry import Entry, EntryFlags
from ledgerq.format.reader_state import encode_not_before_record
from ledgerq.segment.cursor import LogCursor
from ledgerq.segment.manager import SegmentManager

__all__ = ["DeliveryInTime"]

_DELIVER_AT = int(EntryFlags.HAS_DELIVER_AT)
_HAS_GROUP = int(EntryFlags.HAS_GROUP)


class DeliveryInTime:
    """The groups and delays of :class:`~ledgerq.core.reader.ReaderCore` (a mixin: its
    methods take the reader's state machine as ``self``)."""

    # The reader's state they read (set by ReaderCore's constructor).
    journal: ReaderJournal
    _manager: SegmentManager
    _cursor: LogCursor
    _selector: Selector
    _leased: dict[int, tuple[Entry, int]]
    _done: set[int]
    _skip: set[int]
    _not_before: dict[int, int]  # id -> its retry time (NOT_BEFORE), the queue's ns
    _delays: DelayIndex  # the parked ids, by due time
    _due_ns: int  # the delay index's earliest due time (NEVER_NS: none)
    # The delayed entries found ahead of the cursor, for stats (_unread_delayed).
    _ahead_ids: MutableSequence[int]  # (arrays: 8 bytes an id)
    _ahead_dues: MutableSequence[int]
    _ahead_from: int
    # The groups (_reset_groups).
    _group_of: dict[int, str]
    _group_heaps: dict[str, list[int]]
    _group_held: dict[int, Entry]
    group_freed: bool

    # ------------------------------------------------------------------ groups

    def _reset_groups(self) -> None:
        # Every unfinished message of a group this reader has read: id -> group, and per
        # group a heap of ids (lazily pruned).  A grouped message may be delivered only
        # when it is its group's smallest unfinished id - so one at a time, in id order,
        # across nacks, delays and priorities.  Those taken out of turn wait in
        # _group_held until the one before them is finished.
        self._group_of: dict[int, str] = {}
        self._group_heaps: dict[str, list[int]] = {}
        self._group_held: dict[int, Entry] = {}
        # Set when settling a message gave its group's next one back: the caller must
        # wake the dequeues that wait (an ack is otherwise no news to them).
        self.group_freed = False

    def _note_member(self, entry: Entry) -> None:
        """``entry`` (grouped) was read: it is an unfinished member of its group."""
        message_id = entry.id
        group = entry.group
        if group is None or message_id in self._group_of:
            return
        self._group_of[message_id] = group
        heap = self._group_heaps.get(group)
        if heap is None:
            self._group_heaps[group] = [message_id]
        else:
            heapq.heappush(heap, message_id)

    def _group_first(self, group: str) -> int | None:
        """The smallest unfinished id of ``group`` read so far, if any."""
        heap = self._group_heaps.get(group)
        if heap is None:
            return None
        group_of = self._group_of
        while heap and group_of.get(heap[0]) != group:
            heapq.heappop(heap)
        if not heap:
            del self._group_heaps[group]
            return None
        return heap[0]

    def _group_turn(self, entry: Entry) -> bool:
        """Whether grouped ``entry`` may be delivered now; if not, hold it aside."""
        if entry.id not in self._group_of:
            self._note_member(entry)
        group = entry.group
        if group is None or self._group_first(group) == entry.id:
            return True
        self._group_held[entry.id] = entry
        return False

    def _group_advance(self, group: str) -> None:
        """A member of ``group`` finished: hand its next one, if held aside, back."""
        first = self._group_first(group)
        if first is not None:
            entry = self._group_held.pop(first, None)
            if entry is not None:
                self._selector.give_back(entry)
                self.group_freed = True

    def _drop_group_members(self, last_id: int) -> int:
        """Forget grouped ids <= ``last_id`` (retention deleted them); return how many
        were held aside (pending, now lost)."""
        for message_id in [i for i in self._group_of if i <= last_id]:
            del self._group_of[message_id]
        held = [i for i in self._group_held if i <= last_id]
        for message_id in held:
            del self._group_held[message_id]
        for group in list(self._group_heaps):
            self._group_advance(group)
        return len(held)

    # ------------------------------------------------------------------ delays

    def _is_due(self, entry: Entry, now_ns: int) -> bool:
        """Whether a delayed ``entry`` may be delivered at ``now_ns``; if not, park it."""
        due = entry.deliver_at
        if due is None or due <= now_ns:
            return True
        self._delays.add(due, entry.id)
        if due < self._due_ns:
            self._due_ns = due
        return False

    def _release_due(self, now_ns: int) -> None:
        """Give the parked entries whose time has come back to the selector.

        Each is read back from the log (the index keeps ids only).  An id settled or
        leased meanwhile (shared mode: by another handle) is not given back, nor one
        that must wait longer now: in shared mode another handle may lease a parked id
        when it falls due and nack it with a retry delay, which parks it here again -
        the entry of the first wait is left behind (finding it to drop it at the lease
        is O(parked)), and ends here.
        """
        selector = self._selector
        not_before = self._not_before
        for message_id in self._delays.pop_due(now_ns):
            if not self._may_release(message_id):
                continue
            if not_before and not_before.get(message_id, 0) > now_ns:
                continue  # parked again, for its later time
            entry = self._manager.read_entry(message_id)
            if entry is not None:
                selector.give_back(entry)
        self._due_ns = self._delays.next_due_ns

    def _may_deliver(self, entry: Entry, now_ns: int) -> bool:
        """Whether ``entry`` is due and its group's turn; if not, park or hold it aside."""
        if entry.flags & _DELIVER_AT and not self._is_due(entry, now_ns):
            return False  # parked until its time
        if self._not_before and not self._may_retry(entry.id, now_ns):
            return False  # parked until its retry time
        return not (entry.flags & _HAS_GROUP and not self._group_turn(entry))

    def _may_retry(self, message_id: int, now_ns: int) -> bool:
        """Whether ``message_id`` is past its retry time (if any); if not, park it."""
        due = self._not_before.get(message_id)
        if due is None or due <= now_ns:
            return True
        self._park(due, message_id)
        return False

    def _park(self, due_ns: int, message_id: int) -> None:
        self._delays.add(due_ns, message_id)
        if due_ns < self._due_ns:
            self._due_ns = due_ns

    def _retry_later(self, message_id: int, due_ns: int, now_ns: int) -> bool:
        """Record that ``message_id`` comes back no earlier than ``due_ns``, and park it.

        Writes a NOT_BEFORE record first, so a reopen does not shorten the wait.
        Returns False (writing nothing) when ``due_ns`` is not in the future.
        """
        if due_ns <= now_ns:
            return False
        self._append_with_not_before(b"", {message_id: due_ns})
        self._not_before[message_id] = due_ns
        self._park(due_ns, message_id)
        return True

    def _append_with_not_before(self, record: bytes, dues: dict[int, int]) -> int:
        """Append ``record`` and a NOT_BEFORE record per id of ``dues``, as one write (a
        kill keeps all or none of them); return the durability ticket."""
        # The journal is version 3 from its open on (ReaderJournal.load), which holds
        # NOT_BEFORE: an older ledgerq refuses the file by its version.
        records = [record]
        records.extend(encode_not_before_record(due, [i]) for i, due in dues.items())
        self.journal.append_record(b"".join(records))
        return self.journal.commit.note_write()

    def _may_release(self, message_id: int) -> bool:
        """Whether a parked id is still this reader's to deliver."""
        return message_id not in self._leased and message_id not in self._done

    def next_due_ns(self) -> int | None:
        """When the earliest parked message falls due (the queue's ns), if any."""
        return None if self._due_ns == NEVER_NS else self._due_ns

    def delayed(self, now_ns: int) -> int:
        """Pending messages waiting for their delay (parked, or unread and not due)."""
        if now_ns >= self._due_ns:
            self._release_due(now_ns)
        return len(self._delays) + self._unread_delayed(now_ns)

    def _unread_delayed(self, now_ns: int) -> int:
        """Messages the cursor has not read yet that wait at ``now_ns``: delayed entries
        (``deliver_at``) and ids with a retry time from the journal (``not_before``).

        For stats only.  The unread log is scanned once, the delayed entries found ahead
        of the cursor are remembered (16 bytes each), and later calls scan only what was
        appended since.  Entries a selector read ahead and holds unexamined (the priority
        order's columns) count as unread: none of them is parked yet.
        """
        cursor_next = self._cursor.next_id
        selector = self._selector
        read_ahead = selector.unexamined_from()
        start = cursor_next if read_ahead is None else min(cursor_next, read_ahead)
        skip = self._skip

        def unread(message_id: int) -> bool:
            return message_id >= cursor_next or selector.holds_unexamined(message_id)

        waiting: set[int] = set()
        ahead_ids, ahead_dues = self._ahead_ids, self._ahead_dues
        cursor = LogCursor(self._manager, max(start, self._ahead_from))
        while True:
            entry = cursor.next()
            if entry is None:
                break
            if entry.flags & _DELIVER_AT and entry.deliver_at is not None:
                ahead_ids.append(entry.id)
                ahead_dues.append(entry.deliver_at)
        self._ahead_from = cursor.next_id
        passed = bisect_left(ahead_ids, start)  # read by the cursor since: parked or gone
        if passed:
            del ahead_ids[:passed]
            del ahead_dues[:passed]
        waiting.update(
            message_id
            for message_id, due in zip(ahead_ids, ahead_dues, strict=True)
            if due > now_ns and message_id not in skip and unread(message_id)
        )
        if self._not_before:
            waiting.update(
                message_id
                for message_id, due in self._not_before.items()
                if due > now_ns
                and message_id >= start
                and message_id not in skip
                and unread(message_id)
            )
        return len(waiting)

    def _forget_ahead(self) -> None:
        """The cursor moved other than forward by reading: scan the unread log again."""
        self._ahead_ids = array("Q")
        self._ahead_dues = array("q")
        self._ahead_from = 0
