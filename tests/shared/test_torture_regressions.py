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
"""

from __future__ import annotations

from pathlib import Path

import ledgerq
from ledgerq.format.shared_state import SLOT_WRITING
from tests._child import Children

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
