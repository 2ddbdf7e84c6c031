"""One reader's state shared by the handles of many processes (shared mode).

Each shared handle keeps its own :class:`SharedReaderCore` per reader: the in-memory
state of :class:`~ledgerq.core.reader.ReaderCore` (a cursor over the log, the
selector, the leases, delivery counts), kept equal to what the reader's journal says
by *catching up* before every decision.  A step of the reader - a dequeue, an ack, a
nack, ``len``, ``stats`` - is a *section*, entered and left by the handle's
:class:`~ledgerq.core.reader_session.ReaderSession` (``with self.session``, or a method
marked ``@in_step``):

1. take the reader's lock (``segment.steplock``: a lock word in its slot of the state
   page, or ``flock`` of ``shared/<name>.reader``), waiting at most the handle's budget;
2. bring the log's view up to date (the state page: one read) and read the records
   the other handles appended to the journal since this handle's offset - the page
   says how far the journal's whole records go - folding them into the in-memory state
   (:meth:`_apply`: ``segment.journal_fold``'s fold, the one ``ReaderState`` replays
   with, this core its sink);
3. decide and write this handle's own record (nobody else writes meanwhile, so it
   lands at the offset this handle knows, which then moves past it);
4. publish the journal's new length, and release the lock.

A lease belongs to a *handle* (its 64-bit id, the holder of LEASE_BY records).  The
other handles' leases are ``_foreign``: the cursor passes over them, and they come
back only through a record - NACK, RELEASE, RECLAIM (the holder closed or died, or its
visibility timeout passed: whoever notices first writes it), or end with ACK,
DEAD_LETTER, EXPIRE.  So at any moment one message is leased by at most one live
handle: every lease is decided under the reader's lock, after catching up with every
earlier lease.

A compaction by another handle replaces the journal by one CHECKPOINT of the whole
state, live leases included: the state is then rebuilt from it (:meth:`_rebuild`),
keeping this handle's own leases that it still lists.
"""

from __future__ import annotations

import heapq
import logging
import os
import struct

from ledgerq._errors import LedgerQError, QueueClosedError, UnknownMessageError
from ledgerq._types import ReaderStats
from ledgerq.core.clock import QueueClock
from ledgerq.core.failures import _TIMED_OUT
from ledgerq.core.journal import SharedReaderJournal
from ledgerq.core.reader import ReaderHooks
from ledgerq.core.reader_catch_up import CatchingUp
from ledgerq.core.reader_session import ReaderSession, in_step
from ledgerq.core.retry import RetryPolicy
from ledgerq.format.entry import Entry, EntryFlags, RecordType
from ledgerq.format.reader_state import (
    ReclaimCause,
    StateRecordType,
)
from ledgerq.segment.files import StorageError
from ledgerq.segment.lock import LockFile
from ledgerq.segment.shared_manager import SharedSegmentManager
from ledgerq.segment.shared_page import JournalSlot
from ledgerq.segment.steplock import StepLock

__all__ = ["SharedReaderCore", "read_published_head"]

logger = logging.getLogger("ledgerq")

_HAS_GROUP = int(EntryFlags.HAS_GROUP)
_ACK = StateRecordType.ACK
_DATA = int(RecordType.DATA)
_GONE = ReclaimCause.GONE
_EXPIRED = ReclaimCause.TIMED_OUT
_HEAD = struct.Struct("<Q")  # the published head, at offset 0 of the reader's lock file
_HOLDER_GONE = "the handle that held it closed or its process died"


def read_published_head(lock: LockFile) -> int | None:
    """The head a handle of the reader last published in its lock file (None: none yet)."""
    data = os.pread(lock.fd, _HEAD.size, 0)
    return int(_HEAD.unpack(data)[0]) if len(data) == _HEAD.size else None


class SharedReaderCore(CatchingUp):
    """A :class:`ReaderCore` that catches up with the other handles' journal records
    (:class:`~ledgerq.core.reader_catch_up.CatchingUp` folds them) before every step.

    ``lock`` is this handle's descriptor of the reader's lock file (its first bytes
    hold the published head), ``step`` the reader's step lock, ``slot`` where the
    journal's length is published (None: the page has no slot left; the file is looked
    at instead), ``clock`` the queue's clock (lease deadlines are its time, in LEASE_BY
    records).  With ``first`` (the first handle of a session, after a crash or with no
    other handle) every lease the journal holds is lost: their holders are gone.
    """

    session: ReaderSession

    def __init__(
        self,
        name: str,
        journal: SharedReaderJournal,
        manager: SharedSegmentManager,
        hooks: ReaderHooks,
        *,
        visibility_timeout: float | None,
        start_latest: bool = False,
        lock: LockFile,
        step: StepLock,
        slot: JournalSlot | None,
        clock: QueueClock,
        first: bool = False,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        self._lock_file = lock
        self._shared_journal = journal
        self._shared_manager = manager
        self.session = ReaderSession(name, step, journal, manager, self._apply)
        self._clock = clock
        self.holder = journal.holder
        self._visibility_ns = (
            int(visibility_timeout * 1_000_000_000) if visibility_timeout is not None else 0
        )
        self._foreign_deadlines: list[tuple[int, int, int]] = []  # (deadline_ns, id, holder)
        self._own_deadline_ns: dict[int, int] = {}  # our leases' deadlines, for checkpoints
        self._lost: dict[int, str] = {}  # our leases that ended elsewhere: why (for the error)
        self._back: set[int] = set()  # (of a catch-up: see the fold's sink below)
        # Set by a catch-up that applied another handle's lease while ids were parked
        # here: one of them may be the id leased (see _apply).
        self._leased_while_parked = False
        # Our leases a checkpoint of the catch-up did not list: revoked at its end unless
        # a LEASE_BY of ours after the checkpoint holds them (a file read whole again).
        self._unconfirmed: set[int] = set()
        repaired = self.session.enter_to_load()
        try:
            manager.refresh()
            super().__init__(
                name,
                journal,
                manager,
                hooks,
                visibility_timeout=visibility_timeout,
                start_latest=start_latest,
                retry_policy=retry_policy,
            )
            state = journal.loaded
            if state is not None and not first:
                head = self.head
                for message_id, (holder, deadline) in state.holders.items():
                    if message_id >= head and message_id not in self._skip:
                        self._note_foreign(message_id, holder, deadline)
            if first:
                # A clean start (the dead holders' leases lost).  (The file is version 3
                # by now: load() upgraded an older one, under this lock.)
                try:
                    self.checkpoint()
                except StorageError as exc:
                    # (A full disk must not lock the user out.)  The dead holders' leases
                    # stay in the file: later handles reclaim them as any dead handle's.
                    logger.warning("ledgerq: %s; the reader state is kept as it is", exc)
            if slot is not None:
                journal.attach_slot(slot, replaced=repaired or first)
        finally:
            self.session.leave()

    # ------------------------------------------------------------------ sections

    def view_is_current(self) -> bool:
        """Whether this handle's view of the reader holds every step ended elsewhere:
        the page says its journal is the file and length this handle has applied (two
        reads of the page, no lock).  A step under way elsewhere is not in it: its ack
        has not returned, so the view is that of a moment before it."""
        journal = self._shared_journal
        slot = journal.slot
        return slot is not None and slot.read() == (journal.size, journal.generation)

    def catch_up(self) -> None:
        """Apply what the other handles wrote (a step of its own)."""
        with self.session:
            pass

    # ------------------------------------------------------------------ the log

    def _may_release(self, message_id: int) -> bool:
        return super()._may_release(message_id) and message_id not in self._foreign

    # ------------------------------------------------------------------ delivery

    # A lease's deadline (the queue's time) goes in its LEASE_BY record, for the other
    # handles to judge its visibility timeout: ``now_ns`` plus this handle's timeout, or
    # 0 - computed here, whatever ``deadline_ns`` the base class's call passed on.

    @in_step
    def take(
        self, n: int, now: float, now_ns: int, deadline_ns: int = 0
    ) -> list[tuple[Entry, int]]:
        self._expire_foreign(now_ns)
        deadline = now_ns + self._visibility_ns if self._visibility_ns else 0
        taken = super().take(n, now, now_ns, deadline)
        if deadline:
            for entry, _ in taken:
                self._own_deadline_ns[entry.id] = deadline
        return taken

    def take_one(self, now: float, now_ns: int, deadline_ns: int = 0) -> tuple[Entry, int] | None:
        with self.session:  # (not @in_step: the polling hot path saves its wrapper's call)
            if self._foreign_deadlines and self._foreign_deadlines[0][0] <= now_ns:
                self._expire_foreign(now_ns)
            deadline = now_ns + self._visibility_ns if self._visibility_ns else 0
            taken = super().take_one(now, now_ns, deadline)
            if deadline and taken is not None:
                self._own_deadline_ns[taken[0].id] = deadline
            return taken

    def _expire_foreign(self, now_ns: int) -> None:
        """Void the other handles' leases whose visibility timeout passed (lock held)."""
        heap = self._foreign_deadlines
        expired: dict[int, dict[int, None]] = {}  # holder -> its ids, in order, once
        while heap and heap[0][0] <= now_ns:
            deadline, message_id, holder = heapq.heappop(heap)
            # (A touch to the deadline it had pushes the same entry twice: once here.)
            if self._foreign.get(message_id) == (holder, deadline):
                expired.setdefault(holder, {})[message_id] = None
        back: set[int] = set()  # (unused: each voided lease is settled below instead)
        for holder, held in expired.items():
            ids = list(held)
            self._shared_journal.append_reclaim(holder, _EXPIRED, ids)
            self._apply_reclaim(holder, _EXPIRED, ids, back, self._cursor.next_id)
        # Each a failed delivery, settled as its holder would at its own expiry: told to
        # the features now, and waiting its retry delay from now - not from whenever a
        # take reaches it (later, if smaller ids are delivered first).
        cursor_next = self._cursor.next_id
        for message_id in sorted(i for ids in expired.values() for i in ids):
            entry = self._manager.read_entry(message_id)
            if entry is None:
                continue  # its segment is gone (retention)
            failures = self._deliveries.get(message_id, 0)
            self._fail_reason.pop(message_id, None)
            behind = message_id < cursor_next
            try:
                if self._report_failure(entry, failures, _TIMED_OUT, now_ns, give_back=behind):
                    continue  # dead-lettered
            except LedgerQError as exc:
                self._move_failed(message_id, exc)  # moved before it is delivered again
                continue
            if behind:
                self._retry_or_give_back(entry, failures, now_ns)
            elif self._retry_policy is not None:
                # Not read here yet: the cursor parks it when it reads it.
                due_ns = now_ns + self._retry_policy.delay_ns(failures)
                if due_ns > now_ns:
                    try:
                        self._append_with_not_before(b"", {message_id: due_ns})
                    except StorageError as exc:
                        logger.warning(
                            "ledgerq: could not record the retry delay of message %d (%s); "
                            "it is delivered again at once",
                            message_id,
                            exc,
                        )
                    else:
                        self._not_before[message_id] = due_ns

    def _note_expired(self, ids: list[int]) -> None:
        self._shared_journal.append_reclaim(self.holder, _EXPIRED, ids)
        for message_id in ids:
            self._own_deadline_ns.pop(message_id, None)
            self._lost[message_id] = "its visibility timeout expired"

    def _forget(self, message_id: int) -> None:
        if message_id >= self._cursor.next_id:
            self._skip.add(message_id)  # finished ahead of the cursor: it must pass over it
        super()._forget(message_id)
        if self._own_deadline_ns:
            self._own_deadline_ns.pop(message_id, None)

    def next_deadline(self) -> float | None:
        """Lease time of the next visibility-timeout expiry, ours or another handle's."""
        own = super().next_deadline()
        heap = self._foreign_deadlines
        while heap and self._foreign.get(heap[0][1]) != (heap[0][2], heap[0][0]):
            heapq.heappop(heap)
        if not heap:
            return own
        clock = self._clock
        foreign = clock.lease_time() + (heap[0][0] - clock.now_ns()) / 1e9
        return foreign if own is None else min(own, foreign)

    @in_step
    def check_leased(self, message_id: int) -> None:
        if message_id not in self._leased:
            why = self._lost.get(message_id)
            if why is not None:
                raise UnknownMessageError(
                    f"message {message_id} is no longer leased by this handle of reader "
                    f"{self.name!r}: {why}"
                )
            if message_id in self._foreign:
                raise UnknownMessageError(
                    f"message {message_id} is leased by another handle of reader "
                    f"{self.name!r}, not by this one"
                )
            super().check_leased(message_id)

    @in_step
    def ack(self, ids: list[int]) -> int:
        for message_id in ids:
            self.check_leased(message_id)
        return super().ack(ids)

    def ack_one(self, message_id: int) -> int:
        with self.session:  # (not @in_step: the hot path saves its wrapper's call)
            return super().ack_one(message_id)

    @in_step
    def nack(self, ids: list[int], reason: str, now_ns: int, delay_ns: int | None = None) -> int:
        for message_id in ids:
            self.check_leased(message_id)
        return super().nack(ids, reason, now_ns, delay_ns)

    @in_step
    def release(self, ids: list[int], now_ns: int, due_ns: int | None = None) -> int:
        for message_id in ids:
            self.check_leased(message_id)
        ticket = super().release(ids, now_ns, due_ns)
        for message_id in ids:
            self._own_deadline_ns.pop(message_id, None)
        return ticket

    @in_step
    def touch(
        self, message_id: int, seconds: float | None, now: float, now_ns: int
    ) -> float | None:
        """Extend this handle's lease, and tell the others (a TOUCH record) first."""
        self.check_leased(message_id)
        if seconds is None:
            if not self._visibility_ns:
                return None
            seconds = self._visibility_ns / 1e9
        deadline_ns = now_ns + int(seconds * 1_000_000_000)
        self._shared_journal.append_touch(deadline_ns, [message_id])
        self._own_deadline_ns[message_id] = deadline_ns
        return super().touch(message_id, seconds, now, now_ns)

    @in_step
    def settle_any(self, message_id: int) -> bool:
        if message_id not in self._foreign:
            return super().settle_any(message_id)
        self.journal.append(_ACK, [message_id])
        del self._foreign[message_id]
        if message_id >= self._cursor.next_id:
            self._skip.add(message_id)
        self._forget(message_id)
        self.counters["acked"] += 1
        return True

    @in_step
    def purge(self, wanted: set[int] | None = None) -> tuple[list[int], int]:
        return super().purge(wanted)

    def _may_purge(self, message_id: int, parked: set[int]) -> bool:
        # Another handle's lease is not purged either: its holder acks it.
        return message_id not in self._foreign and super()._may_purge(message_id, parked)

    @in_step
    def drop_segment(self, first_id: int, last_id: int) -> tuple[int, int]:
        start = self._cursor.next_id
        behind = [i for i in self._foreign if i <= last_id]
        for message_id in behind:
            del self._foreign[message_id]
        lost, leased = super().drop_segment(first_id, last_id)
        # Foreign leases the cursor had passed are not counted by the base class.
        extra = sum(1 for i in behind if i < start)
        self.counters["dropped"] = self.counters.get("dropped", 0) + extra
        return lost + extra, leased + len(behind)

    @in_step
    def seek(self, target: int) -> None:
        for message_id in list(self._leased):
            self._lost[message_id] = "the reader was moved (seek)"
        self._foreign = {}
        self._foreign_deadlines = []
        self._own_deadline_ns = {}
        super().seek(target)
        self.publish_head(moved=True)

    @in_step
    def leased_entries(self) -> list[Entry]:
        entries = super().leased_entries()
        for message_id in sorted(self._foreign):
            entry = self._manager.read_entry(message_id)
            if entry is not None:
                entries.append(entry)
        return entries

    @in_step
    def reclaim_holder(self, holder: int) -> int:
        """Return the leases of ``holder`` (a dead handle) as failed deliveries; how many."""
        ids = sorted(i for i, (h, _) in self._foreign.items() if h == holder)
        if ids:
            self._shared_journal.append_reclaim(holder, _GONE, ids)
            back: set[int] = set()
            self._apply_reclaim(holder, _GONE, ids, back, self._cursor.next_id)
            self._give_back_ids(back)
        return len(ids)

    def foreign_holders(self) -> set[int]:
        """The handles this state says hold leases (as of the last catch-up)."""
        return {holder for holder, _ in self._foreign.values()}

    # ------------------------------------------------------------------ reading ahead

    @in_step
    def peek(self, n: int, now_ns: int) -> list[Entry]:
        return super().peek(n, now_ns)

    @in_step
    def pending(self) -> int:
        unread = super().pending()
        start = self._cursor.next_id
        ahead = sum(1 for i in self._foreign if i >= start)
        ahead += sum(1 for i in self._leased if i >= start)
        return max(unread - ahead, 0)

    @property
    def head(self) -> int:
        head = super().head
        cursor_next = self._cursor.next_id
        if head == cursor_next and self._skip:
            # Other handles finished ids ahead of this cursor: the head is past them.
            skip = self._skip
            while head in skip:
                head += 1
            held = self._selector.min_id()
            if held is not None and held < head:
                head = held
            lowest_leased = min(self._leased, default=head)
            if lowest_leased < head:
                head = lowest_leased
        if self._foreign:
            lowest = min(self._foreign)
            if lowest < head:
                head = lowest
        return head

    @in_step
    def stats(self, now_ns: int) -> ReaderStats:
        return super().stats(now_ns)

    # ------------------------------------------------------------------ persistence

    @in_step
    def publish_head(self, *, moved: bool = False) -> None:
        """Write this reader's head where retention reads it.

        In a section, so it is a lower bound of the true head (every record before it
        applied); and the published value only grows - another handle's cursor may lag
        this one's - except when the reader ``moved`` (seek), which sets it.
        """
        head = self.head
        if not moved:
            published = read_published_head(self._lock_file)
            if published is not None and published > head:
                return
        try:
            os.pwrite(self._lock_file.fd, _HEAD.pack(head), 0)
        except OSError as exc:
            self._head_not_published(head, moved, exc)

    def _head_not_published(self, head: int, moved: bool, exc: OSError) -> None:
        """Decide what a refused write of the published head means (a full disk: a new
        lock file needs a block for its 8 bytes; EIO).

        The published head is retention's lower bound of this reader's head.  Left as
        it was, it still is one when it only had to grow, or when nothing was published
        yet (retention then reads the journal): the call that got here - an open, an
        ack whose record is written - goes on, and a later publish writes it.  Only a
        head that had to move back (a seek, a new session) and stays above the true
        one would let retention delete what this reader has not read: that fails.
        """
        path = self._lock_file.path
        try:
            stale = read_published_head(self._lock_file)
        except OSError:
            stale = head + 1  # unknown: assume the worst
        if moved and stale is not None and stale > head:
            raise StorageError(f"publish the head ({head}) of reader {self.name!r} in", path, exc)
        logger.warning(
            "ledgerq: could not publish the head of reader %r in %s (%s); retention "
            "keeps its segments until a later publish",
            self.name,
            path,
            exc,
        )

    @in_step
    def checkpoint(self, *, keep_leases: bool = True) -> None:
        """Rewrite the journal as one checkpoint (see ``ReaderCore``), in a step."""
        super().checkpoint(keep_leases=keep_leases)

    def _leases_to_keep(self) -> list[tuple[int, int, int]]:
        # Every handle's: a handle that reads the checkpoint alone must know them all.
        leases = [(i, self.holder, self._own_deadline_ns.get(i, 0)) for i in self._leased]
        leases.extend((i, h, deadline) for i, (h, deadline) in self._foreign.items())
        leases.sort()
        return leases

    def maybe_compact(self) -> None:
        # Compact early while the queue's disk reserve is spent - by any handle: this
        # journal must not grow into the room it freed for the acks (see set_low_space).
        journal = self.journal
        journal.set_low_space(self._shared_manager.reserve_spent)
        if journal.wants_compaction:
            with self.session:
                super().maybe_compact()  # (looks again: another handle may just have)

    def close(self) -> None:
        """Return this handle's leases (RECLAIM: failed deliveries), make the journal
        durable and close it.

        A reader another handle removed has nothing left to return.
        """
        session = self.session
        try:
            try:
                session.enter()
            except QueueClosedError:
                return  # (removed: only the entry tells, not what the step does)
            try:
                # The head before the leases go: they come back (RECLAIM) for the others,
                # and a head published past them would let retention delete them.
                self.publish_head()
                if self._leased:
                    ids = sorted(self._leased)
                    self._shared_journal.append_reclaim(self.holder, _GONE, ids)
                    self._leased.clear()
            finally:
                session.leave()
            self.journal.commit.sync_now()
        finally:
            self.journal.close()

    def _check(self) -> None:
        for message_id, (entry, attempt) in self._leased.items():
            assert entry.id == message_id
            assert self._deliveries.get(message_id) == attempt, "lease without its delivery"
        assert not set(self._leased) & set(self._foreign), "leased here and elsewhere"
