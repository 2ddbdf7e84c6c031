"""kill -9 around a periodic job's fire: the tick is neither lost nor doubled.

The child fires a tick with its segment manager patched to kill its own process
(SIGKILL) just before the message's bytes are written - the FIRE record is already in
``features/periodic.log`` - or just after them, before the call returns.  Afterwards,
in exclusive mode the next open, and in shared mode a handle that stayed open beside
the child, finds exactly one message for that tick: the first case fires it again (the
record names a message that was never written), the second keeps the one written.
A third child is killed at random instants of a loop of ticks; every tick it reported
fired has one message, and none has two.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import ledgerq
from ledgerq.features.periodic import TICK_HEADER
from tests._child import Children
from tests.clocks import SECOND, SteppedClock
from tests.drain import drain_ticks
from tests.shared.conftest import locking  # noqa: F401  (the fixture)

START = SteppedClock().wall_ns

AT_INSTANT = """
import os, sys
import ledgerq
from tests.crash._kill_at import kill_in_segment_writes
from tests.clocks import SteppedClock
path, shared, instant = sys.argv[1], sys.argv[2] == "shared", sys.argv[3]
clock = SteppedClock()
q = ledgerq.open(path, shared=shared, clock=clock)
q.add_periodic("j", b"p", every=10)
kill_in_segment_writes(instant)
clock.elapse(10)
os.write(1, b"firing\\n")
q.dequeue()  # fires the tick: killed inside
os.write(1, b"returned\\n")
"""


@pytest.mark.parametrize("instant", ["before", "after"])
def test_kill9_inside_a_fire_exclusive(tmp_path: Path, children: Children, instant: str) -> None:
    path = tmp_path / "q"
    child = children.start(["-c", AT_INSTANT, str(path), "exclusive", instant])
    assert child.line() == "firing"
    assert child.wait() == -9
    assert child.read_line() is None  # killed inside the fire
    clock = SteppedClock()
    clock.elapse(10)  # the tick's instant: nothing later is due
    with ledgerq.open(path, clock=clock) as q:
        assert drain_ticks(q) == [START + 10 * SECOND]
        assert q.periodic()[0].last_run_ns == START + 10 * SECOND
    with ledgerq.open(path, clock=clock) as q:
        assert drain_ticks(q) == []


@pytest.mark.usefixtures("locking")
@pytest.mark.parametrize("instant", ["before", "after"])
def test_kill9_inside_a_fire_shared(tmp_path: Path, children: Children, instant: str) -> None:
    path = tmp_path / "q"
    clock = SteppedClock()
    with ledgerq.open(path, shared=True, clock=clock) as beside:
        child = children.start(["-c", AT_INSTANT, str(path), "shared", instant])
        assert child.line() == "firing"
        assert child.wait() == -9
        assert child.read_line() is None
        clock.elapse(10)
        # The dead child held the append lock: taken over, its tail repaired (a whole
        # message kept), its FIRE record read back and checked against the log.
        beside.poll_timer()
        assert drain_ticks(beside) == [START + 10 * SECOND]
        assert beside.periodic()[0].last_run_ns == START + 10 * SECOND
    with ledgerq.open(path, shared=True, clock=clock) as q:
        assert drain_ticks(q) == []


LOOP = """
import os, sys
import ledgerq
from tests.clocks import SteppedClock
path, shared, at = sys.argv[1], sys.argv[2] == "shared", int(sys.argv[3])
clock = SteppedClock()
clock.elapse(at)
q = ledgerq.open(path, shared=shared, clock=clock)
if not q.periodic():
    q.add_periodic("j", b"p", every=1)
os.write(1, b"ready\\n")
while True:
    at += 1
    os.write(1, b"C %d\\n" % at)  # said before the clock moves: the parent's bound on it
    clock.elapse(1)
    q.poll_timer() if shared else None
    msg = q.dequeue()  # fires the tick (and takes its message, left unacked)
    if msg is not None:
        os.write(1, b"T %s\\n" % msg.headers["periodic.tick"].encode())
"""


@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_kill9_while_ticking_loses_and_doubles_nothing(
    tmp_path: Path, children: Children, mode: str
) -> None:
    path = tmp_path / "q"
    shared = mode == "shared"
    at = 0
    reported: list[int] = []
    for rounds in range(3):
        child = children.start(["-c", LOOP, str(path), mode, str(at)])
        assert child.line() == "ready"
        lines = [child.line() for _ in range(30 + 17 * rounds)]
        lines += child.kill_and_drain()
        reported += [int(line.split()[1]) for line in lines if line.startswith("T ")]
        # The child's clock stood at its last "C" or one second before it.  A reported
        # tick is no bound: a message taken may be an older one, redelivered after the
        # previous child died holding it, while the tick fired is a later one.
        at = max(int(line.split()[1]) for line in lines if line.startswith("C "))
    clock = SteppedClock()
    # Where the last child's clock stood at most: it may have died inside the fire of
    # its last tick (the FIRE record written, the message not).  That tick is due at
    # this clock, and the open settles it - fires it again - where a clock behind it
    # would leave the record unchecked (periodic() shows a pending record's tick as fired).
    clock.elapse(at)
    with ledgerq.open(path, shared=shared, clock=clock) as q:
        seen = Counter(int(m.headers[TICK_HEADER]) for m in q.peek(10_000))
        # Every message the children took was leased, never acked: back in the queue.
        assert seen, "no tick was fired"
        assert max(seen.values()) == 1, [t for t, n in seen.items() if n > 1]
        assert set(reported) <= set(seen)
        last = q.periodic()[0].last_run_ns
        assert last == max(seen)
