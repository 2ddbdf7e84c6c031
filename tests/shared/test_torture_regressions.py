"""Bugs of shared mode found by the shared-mode crash torture (tests/torture/_shared.py).

**Retention clearing a dead appender's ``writing`` word.**  A handle that dies in the
middle of an append leaves the ``writing`` word set over bytes it never published; the
next appender repairs that tail first (keeps whole batches, cuts a torn one).  But
retention after an ack also publishes the tail (it deleted a segment: a new
generation), under the append lock, and it published its own view - the dead
appender's bytes outside it - with the word cleared.  The next appender then wrote
after those bytes under ids they already carry: a returned enqueue skipped as a
corrupt region by every reader (found by a campaign of ``python -m tests.torture
--shared``: ``kill -9 left a corrupt region``).

Issue 25 item 7 (the shared torture with a visibility timeout, and the in-process fuzz
of ``tests/torture/_shared_fuzz.py``): a closing handle's published head passing its
own returned leases; the priority index reading the log while other handles' records
were applied; a process preempted while it started its clock expiring others' leases
early; a journal replaced by a holder that died before publishing it, read by the
others as the old file.  See docs/reliability.md, bugs 36-39.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ledgerq
from ledgerq.format.shared_state import SLOT_WRITING
from tests._child import Children


@contextmanager
def _handles(path: Path, **options: Any) -> Iterator[list[ledgerq.Queue]]:
    """Two shared handles on ``path`` (a test may append more); all closed after."""
    handles = [ledgerq.open(path, shared=True, **options) for _ in range(2)]
    try:
        yield handles
    finally:
        for q in handles:
            q.close()


def _killed_in(children: Children, script: str, path: Path, step: str) -> None:
    """Run ``script`` on ``path`` in a child, which must kill itself (in ``step``)."""
    dying = children.start(["-c", script, str(path)])
    assert dying.wait() == -signal.SIGKILL, dying.failure(f"did not die in its {step}")


def _consume(q: ledgerq.Queue, ids: list[int]) -> None:
    """Dequeue exactly ``ids`` through ``q``, in order, acking each."""
    for message_id in ids:
        msg = q.dequeue()
        assert msg is not None and msg.id == message_id
        q.ack(msg.id)


_DIE_AFTER_WRITING_AN_ENTRY = """
import os, sys, time, ledgerq
from ledgerq.format.entry import encode_plain_entry
q = ledgerq.open(sys.argv[1], shared=True, segment_size=64)
manager = q._manager
manager.begin_append()  # the append lock, the writing word set
seg = manager.segments[-1]
record = encode_plain_entry(manager.next_id, time.time_ns(), b"written, never published")
os.write(os.open(seg.log_path, os.O_WRONLY | os.O_APPEND), record)
print("WRITTEN", manager.next_id, flush=True)
time.sleep(60)  # killed here: a whole entry written, the tail not published
"""


def test_retention_repairs_a_dead_appenders_tail_before_it_publishes(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, segment_size=64) as q:
        for n in range(3):  # one entry per segment
            q.enqueue(b"message %d" % n + b"." * 40)
        first, second = q.dequeue(), q.dequeue()
        assert first is not None and second is not None
        dying = children.start(["-c", _DIE_AFTER_WRITING_AN_ENTRY, str(path)])
        orphan = int(dying.line().split()[1])
        dying.kill_and_drain()
        q.ack(first.id)  # retention deletes the first segment, and publishes the tail
        assert q._page.get(SLOT_WRITING) == 0  # type: ignore[attr-defined]
        after = q.enqueue(b"after")
        assert after == orphan + 1, "the dead appender's whole entry is kept, its id used"
        q.ack(second.id)
        got = []
        while (msg := q.dequeue()) is not None:
            q.ack(msg.id)
            got.append((msg.id, msg.payload))
        assert q.stats().corrupt_skipped == 0
    assert got[-2:] == [(orphan, b"written, never published"), (after, b"after")]
    ids = [msg.id for msg in ledgerq.follow(path, timeout=0.05)]
    assert ids == sorted(set(ids))


def test_a_handle_closing_with_leases_publishes_a_head_before_them(tmp_path: Path) -> None:
    # Issue 25 item 7.  ``a`` holds message 1 and has read (and acked) far past it; it
    # closes: its lease comes back to the others (RECLAIM), and the head it publishes
    # must not pass it - it did (the leases were dropped first), so retention deleted
    # the segment of a message the others had to deliver again: never delivered, lost.
    path = tmp_path / "q"
    options = {"segment_size": 256, "max_retries": 0}
    with _handles(path, **options) as (a, b):
        other = b.reader("other")
        ids = [a.enqueue(b"message %02d" % n + b"." * 40) for n in range(30)]
        for _ in ids[:-1]:  # the other reader past the first segments, but for the last
            msg = other.dequeue()
            assert msg is not None
            other.ack(msg.id)
        last = other.dequeue()
        assert last is not None
        held = a.dequeue()
        assert held is not None and held.id == ids[0]
        while (msg := a.dequeue()) is not None:
            a.ack(msg.id)
        a.close()  # its lease of message 1 back to the others
        other.ack(last.id)  # retention: the readers' published heads
        again = b.dequeue()
        assert again is not None and again.id == ids[0], "the closed handle's lease is lost"
        assert again.attempts == 2 and again.payload == held.payload
        b.ack(again.id)


def test_priorities_a_discard_does_not_read_past_the_records_still_to_apply(
    tmp_path: Path,
) -> None:
    # Issue 25 item 7 (the campaigns with priorities).  ``a`` has read ids 1-2.  ``b``
    # leases 2 and 3, then acks 3.  Catching up, ``a`` discards 2 from its priority
    # index; the index read the log on to do so - 3 and 4, 3 not yet known as leased -
    # and the records after were applied as if ``a`` had not read 3: 3 stayed available
    # in ``a``'s index, leased to two handles at once, delivered again once acked.
    path = tmp_path / "q"
    with _handles(path, priorities=True) as (a, b):
        first, second = a.enqueue(b"1"), a.enqueue(b"2")
        msg = a.dequeue()
        assert msg is not None and msg.id == first  # a's index holds 2, its cursor at 3
        a.ack(first)
        third, fourth = b.enqueue(b"3"), b.enqueue(b"4")
        assert [m.id for m in b.dequeue_batch(2)] == [second, third]
        b.ack(third)
        assert [m.id for m in a.dequeue_batch(10)] == [fourth]
        b.ack(second)
        a.ack(fourth)
        assert a.dequeue() is None and b.dequeue() is None


class _Machine:
    """The time of one machine: monotonic and wall clocks moving together."""

    mono = 5_000_000_000_000


class _ProcessClock:
    """A process's view of it; ``preempted``: while it opens, the process waits that
    long (ns) before every read of the wall clock, as a loaded machine may make it."""

    def __init__(self, preempted: int = 0) -> None:
        self.preempted = preempted

    def monotonic_ns(self) -> int:
        return _Machine.mono

    def time_ns(self) -> int:
        _Machine.mono += self.preempted
        return 1_800_000_000_000_000_000 + _Machine.mono


def test_a_process_preempted_while_it_opened_does_not_expire_leases_early(
    tmp_path: Path,
) -> None:
    # Issue 25 item 7 (the campaigns that found leases taken long before their
    # timeout).  ``late`` was preempted for 0.3 s between its first reads of the
    # monotonic and wall clocks: its queue time ran 0.3 s ahead, and it took the
    # others' leases (whose deadlines are written in the holder's queue time) 0.3 s
    # early: here 0.2 s after a dequeue with a 0.5 s timeout.
    path = tmp_path / "q"
    options = {"visibility_timeout": 0.5, "max_retries": 0}
    holder = ledgerq.open(path, shared=True, clock=_ProcessClock(), **options)
    late_clock = _ProcessClock(300_000_000)
    late = ledgerq.open(path, shared=True, clock=late_clock, **options)
    late_clock.preempted = 0
    try:
        holder.enqueue(b"work")
        msg = holder.dequeue()
        assert msg is not None
        _Machine.mono += 200_000_000
        assert late.dequeue() is None, "a lease taken 0.2 s into its 0.5 s timeout"
        _Machine.mono += 310_000_000
        again = late.dequeue()
        assert again is not None and again.id == msg.id and again.attempts == 2
        late.ack(again.id)
    finally:
        holder.close()
        late.close()


_COMPACT_AND_DIE_AFTER_THE_RENAME = """
import os, signal, sys, ledgerq
from ledgerq.segment import files
q = ledgerq.open(sys.argv[1], shared=True)
for _ in range(5):
    q.ack(q.dequeue().id)
real = os.replace
def replace_then_die(src, dst):
    real(src, dst)
    if dst.endswith(".state"):  # the reader's journal: its checkpoint is in place
        os.kill(os.getpid(), signal.SIGKILL)
files.os.replace = replace_then_die
q.compact()
"""


def test_a_journal_replaced_by_a_holder_that_died_is_a_new_generation(
    tmp_path: Path, children: Children, locking: str
) -> None:
    # Issue 25 item 7 (campaign 50101504: a handle killed inside a reader-journal
    # checkpoint, acked messages delivered again).  The killed handle's checkpoint was
    # in place, its new generation never published; the next holder (``a``) read the
    # new file (the lock said its holder died) and published its length under the old
    # generation - so ``b``, at that generation, read on in the old, unlinked file: it
    # missed what the checkpoint holds (the child's acks: message 1 delivered again),
    # and wrote its own records where nobody reads them.
    path = tmp_path / "q"
    with _handles(path) as (a, b):
        ids = [a.enqueue(b"m%d" % n) for n in range(20)]
        _killed_in(children, _COMPACT_AND_DIE_AFTER_THE_RENAME, path, "compaction")
        assert a.stats().readers["default"].acked == 5  # a repairs: the new file, whole
        _consume(b, ids[5:])
        assert a.dequeue() is None, "a handle went on reading a replaced journal"
        assert a.stats().readers["default"].acked == 20


def test_a_journal_replaced_by_a_holder_that_died_is_a_new_generation_for_an_opener(
    tmp_path: Path, children: Children, locking: str
) -> None:
    # The CI run of 2026-12-02 (shared torture, kills inside compactions: "lease of 203
    # lost ... another handle moved the reader (seek) or dropped it").  As above, but the
    # next to take the reader's lock is a handle *opening* (``c``): its load reads the
    # new file whole, and it published that file's length under the old generation.
    # Once ``c``'s records took that length past ``b``'s, ``b`` read on in the unlinked
    # file: it never saw ``c``'s acks (acked messages delivered again), and its own
    # leases went where nobody reads them (a later checkpoint dropped them).
    path = tmp_path / "q"
    with _handles(path) as handles:
        a, b = handles
        ids = [a.enqueue(b"m%d" % n) for n in range(40)]
        _killed_in(children, _COMPACT_AND_DIE_AFTER_THE_RENAME, path, "compaction")
        c = ledgerq.open(path, shared=True)  # takes the lock over: its load repairs
        handles.append(c)
        _consume(c, ids[5:25])  # c's records: the new file grows past b's length
        got = b.dequeue()
        assert got is not None and got.id == ids[25], "acked messages delivered again"
        taken = a.dequeue()
        assert taken is not None and taken.id == ids[26], "a lease nobody else saw"
        b.ack(got.id)
        a.ack(taken.id)
        assert c.stats().readers["default"].acked == 27


_LEASE_AND_DIE_BEFORE_PUBLISHING = """
import os, signal, sys, ledgerq
from ledgerq.core.journal import SharedReaderJournal
q = ledgerq.open(sys.argv[1], shared=True)
def die(self):
    os.kill(os.getpid(), signal.SIGKILL)  # its LEASE_BY written, the step not ended
SharedReaderJournal.publish = die
q.dequeue()
"""


def test_a_journal_read_whole_again_keeps_the_leases_its_reader_took_since_the_checkpoint(
    tmp_path: Path, children: Children, locking: str
) -> None:
    # Found with the fix above (a random kill in the shared torture: "message 394 is no
    # longer leased by this handle ... another handle moved the reader (seek) or dropped
    # it").  A handle that died mid-step, its file not replaced, and an opener then: the
    # new generation makes every handle read the file whole, its checkpoint first - and
    # a handle's own leases taken since that checkpoint were revoked by it, although its
    # own LEASE_BY records follow in the same file.
    path = tmp_path / "q"
    with _handles(path) as handles:
        a, b = handles
        ids = [a.enqueue(b"m%d" % n) for n in range(6)]
        mine = a.dequeue()
        assert mine is not None and mine.id == ids[0]
        _killed_in(children, _LEASE_AND_DIE_BEFORE_PUBLISHING, path, "step")
        c = ledgerq.open(path, shared=True)  # takes the reader's lock over in its load
        handles.append(c)
        a.ack(mine.id)  # still a's lease: no UnknownMessageError
        seen = [mine.id]
        for q in (b, c, a, b, c):
            msg = q.dequeue()
            if msg is not None:
                seen.append(msg.id)
                q.ack(msg.id)
        assert len(seen) == len(set(seen)), f"a message delivered twice: {seen}"
        assert ids[0] not in seen[1:]


def test_priorities_a_message_nacked_in_a_catch_up_is_delivered_again(tmp_path: Path) -> None:
    # Issue 25 item 7's loss itself (bug 37): ``a`` has read ids 1-2; ``b`` leases 3
    # (high priority), then 2, then nacks 3.  ``a``'s catch-up: 3 noted leased, then
    # discarding 2 read the log on (3 passed over as leased, 4 indexed), then the NACK
    # of 3 was taken as for an id not read yet - so nothing gave it back: nacked, never
    # delivered again by ``a``, and the head ``a`` publishes may pass it.
    path = tmp_path / "q"
    with _handles(path, priorities=True) as (a, b):
        first = a.enqueue(b"1")
        second = a.enqueue(b"2")
        msg = a.dequeue()
        assert msg is not None and msg.id == first
        a.ack(first)
        third = b.enqueue(b"3", priority=ledgerq.Priority.HIGH)
        fourth = b.enqueue(b"4")
        leased = b.dequeue(), b.dequeue()
        assert [m.id for m in leased if m is not None] == [third, second]
        b.nack(third, "failed")
        got = a.dequeue_batch(10)
        assert [m.id for m in got] == [third, fourth], "the nacked message was passed over"
        assert got[0].attempts == 2
        for m in got:
            a.ack(m.id)
        b.ack(second)
