"""A consumer blocked in another process is woken by an enqueue, whatever the timing.

Found by examples/multiprocess.py, whose consumers (and a ``ledgerq worker`` pool, a
``ledgerq dequeue --timeout``, a ``serve --shared`` waiter) sometimes waited forever
beside a queue that held messages: an appender's ``write()`` wakes the waiters of the
other processes (inotify), but it publishes the new tail in the state page only after
that, with no file event; a waiter that looks in between finds nothing published and
waits again - for good.  The test stops a producer between the two steps.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import ledgerq
from tests._child import Child, Children

# Reports "waiting" before each wait of its dequeue (after a look that found nothing).
_CONSUMER = """
import sys, ledgerq
from ledgerq.core.shared_queue import SharedQueueCore
prepare = SharedQueueCore._prepare_wait
def reporting(self):
    print("waiting", flush=True)
    return prepare(self)
SharedQueueCore._prepare_wait = reporting
with ledgerq.open(sys.argv[1], shared=True) as q:
    m = q.dequeue(timeout=None)
    print("took", m.payload.decode(), flush=True)
    q.ack(m.id)
"""

# Stops between its write() and the publication of the tail until told to go on.
_PRODUCER = """
import sys, ledgerq
from ledgerq.segment.shared_manager import SharedSegmentManager
end_append = SharedSegmentManager.end_append
def pausing(self):
    print("written", flush=True)
    sys.stdin.readline()
    end_append(self)
SharedSegmentManager.end_append = pausing
with ledgerq.open(sys.argv[1], shared=True) as q:
    q.enqueue(b"job")
    print("enqueued", flush=True)
    sys.stdin.readline()  # open until told: its close writes files, which wake waiters
"""


def _lines(child: Child) -> queue.Queue[str | None]:
    """The child's lines as they come (None at its end), read by a thread."""
    found: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        while (line := child.read_line()) is not None:
            found.put(line)
        found.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return found


def test_a_waiter_that_looked_before_the_publication_is_woken(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path):
        pass
    consumer = children.start(["-c", _CONSUMER, str(path)])
    said = _lines(consumer)
    assert said.get(timeout=120) == "waiting"  # looked: nothing; armed its watch
    assert said.get(timeout=120) == "waiting"  # looked again: now it waits
    producer = children.start(["-c", _PRODUCER, str(path)])
    assert producer.line() == "written"
    # The write woke the consumer, which looked before the publication (a bound on an
    # event that may not come once publishing wakes waiters itself, not a sleep).
    looked = said.get(timeout=30)
    assert looked == "waiting", consumer.failure(f"said {looked!r}")
    producer.send("go")
    assert producer.line() == "enqueued"
    try:
        took = said.get(timeout=10)  # the promise is within a second, even under load
    except queue.Empty:
        took = None
    producer.send("close")
    producer.expect_exit(0)
    assert took == "took job", consumer.failure("was not woken by the published enqueue")
