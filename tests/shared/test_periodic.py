"""Periodic jobs in shared mode: one message per tick whatever number of handles and
processes look at it, a job added in one process fired by another, and the file's
news (replace, remove) seen by every handle."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ledgerq
from ledgerq.features.periodic import NAME_HEADER
from tests._child import Children
from tests.clocks import SECOND, SteppedClock
from tests.drain import drain_ticks

START = SteppedClock().wall_ns


@contextmanager
def _two_handles(path: Path) -> Iterator[tuple[SteppedClock, ledgerq.Queue, ledgerq.Queue]]:
    """Two shared handles of the queue at ``path``, on one stepped clock."""
    clock = SteppedClock()
    with (
        ledgerq.open(path, shared=True, clock=clock) as a,
        ledgerq.open(path, shared=True, clock=clock) as b,
    ):
        yield clock, a, b


def test_two_handles_fire_a_tick_once(tmp_path: Path, locking: str) -> None:
    with _two_handles(tmp_path / "q") as (clock, a, b):
        a.add_periodic("j", b"p", every=10)
        b.poll_timer()  # (its housekeeper's look): b knows the job too
        for n in range(1, 4):
            clock.elapse(10)
            # Both views say the tick is due; the first to dequeue fires it, the other
            # finds it fired (under the append lock) and adds nothing.
            first, second = (a, b) if n % 2 else (b, a)
            assert drain_ticks(first) == [START + 10 * n * SECOND]
            assert drain_ticks(second) == []
        assert [j.last_run_ns for j in b.periodic()] == [START + 30 * SECOND]


def test_replace_and_remove_in_one_handle_are_seen_by_another(tmp_path: Path, locking: str) -> None:
    with _two_handles(tmp_path / "q") as (clock, a, b):
        a.add_periodic("j", b"old", every=10)
        b.poll_timer()
        clock.elapse(5)
        a.add_periodic("j", b"new", every=10)  # replaced: next tick at START + 15 s
        clock.elapse(5)
        assert drain_ticks(b) == []  # b's stale view says START + 10 s: found not due
        clock.elapse(5)
        msg = b.dequeue()
        assert msg is not None and msg.payload == b"new"
        assert msg.headers[NAME_HEADER] == "j"
        b.ack(msg.id)
        assert a.remove_periodic("j")
        clock.elapse(10)
        assert drain_ticks(b) == []  # fired only after checking: the job is gone
        assert b.periodic() == [] and a.periodic() == []


def test_a_handle_that_never_heard_of_the_job_learns_it_by_polling(
    tmp_path: Path, locking: str
) -> None:
    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, clock=clock) as b:
        with ledgerq.open(path, shared=True, clock=clock) as a:
            a.add_periodic("j", b"p", every=10)
        # The adder is gone: b's housekeeper round (poll_timer) reads the file and fires.
        clock.elapse(10)
        b.poll_timer()
        assert len(b) == 1
        assert drain_ticks(b) == [START + 10 * SECOND]


STEPPER = """
import sys
import ledgerq
from tests.clocks import SteppedClock
clock = SteppedClock()
q = ledgerq.open(sys.argv[1], shared=True, clock=clock)
print("ready", flush=True)
for line in sys.stdin:
    command = line.split()
    if command[0] == "elapse":
        clock.elapse(float(command[1]))
        print("ok", flush=True)
    elif command[0] == "fire":
        q.poll_timer()  # what the housekeeper does; a dequeue would fire it too
        msg = q.dequeue()
        print("took %s" % (msg.headers["periodic.tick"] if msg else "-"), flush=True)
        if msg:
            q.ack(msg.id)
q.close()
"""


def test_processes_fire_each_tick_once(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    clock = SteppedClock()
    with ledgerq.open(path, shared=True, clock=clock) as q:
        q.add_periodic("j", b"p", every=10)
        procs = [children.start(["-c", STEPPER, str(path)]) for _ in range(3)]
        for child in procs:
            assert child.line() == "ready"
        taken: list[int] = []
        for n in range(1, 6):
            for child in procs:
                child.send("elapse 10")
            for child in procs:
                assert child.line() == "ok"
            for child in procs:
                child.send("fire")  # all at once: their fires race for the tick
            for child in procs:
                took = child.line().split()[1]
                if took != "-":
                    taken.append(int(took))
            clock.elapse(10)
            taken += drain_ticks(q)
            assert taken == [START + 10 * k * SECOND for k in range(1, n + 1)], taken
        for child in procs:
            child.finish()
