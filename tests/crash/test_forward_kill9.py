"""kill -9 around a forward: the items land in the target exactly once, the source
message is acked.

The child forwards one leased message with the target's writes patched to kill its own
process (SIGKILL) at one instant: just after the hand-off record was stored into
``features/forwards.table`` (just before the items' write), just after it (the
source not acked), or just after the forward returned.  Afterwards - in exclusive mode
at the next open, in shared mode in handles that stayed open beside the child and get
its lease back - the message is delivered again unless it was acked, and forwarding it
again (with other items) leaves exactly one batch in the target.  A loop of forwards
killed at random instants, three times over, leaves each source message's batch in the
target once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children
from tests.shared.conftest import locking  # noqa: F401  (the fixture)

AT_INSTANT = """
import os, signal, sys
import ledgerq
from tests.crash._kill_at import kill_in_segment_writes
source, target, shared, instant = sys.argv[1], sys.argv[2], sys.argv[3] == "shared", sys.argv[4]
a = ledgerq.open(source, shared=shared)
b = ledgerq.open(target, shared=shared)
msg = a.dequeue()
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if instant == "record":
    kill_in_segment_writes("before")  # the record is stored, the items are not written
elif instant == "items":
    kill_in_segment_writes("after")  # the items are written, the source is not acked
os.write(1, b"forwarding\\n")
a.forward(msg.id, b, [b"first-1", b"first-2"])
os.write(1, b"returned\\n")
die()
"""

# What the target holds once the message is forwarded again with b"again".
AFTER = {
    "record": [b"again"],
    "items": [b"first-1", b"first-2"],
    "returned": [b"first-1", b"first-2"],
}


def payloads(q: ledgerq.Queue) -> list[bytes]:
    return [m.payload for m in q.peek(100)]


def run_child(children: Children, source: Path, target: Path, mode: str, instant: str) -> None:
    child = children.start(["-c", AT_INSTANT, str(source), str(target), mode, instant])
    assert child.line() == "forwarding"
    assert child.wait() == -9
    if instant == "returned":
        assert child.read_line() == "returned"
    else:
        assert child.read_line() is None  # killed inside the forward


@pytest.mark.parametrize("instant", list(AFTER))
def test_kill9_inside_a_forward_exclusive(tmp_path: Path, children: Children, instant: str) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    with ledgerq.open(source) as a:
        a.enqueue(b"job")
    run_child(children, source, target, "exclusive", instant)
    with ledgerq.open(source) as a, ledgerq.open(target) as b:
        again = a.dequeue()
        if instant == "returned":
            assert again is None  # acked
        else:
            assert again is not None
            assert again.attempts == 2
            ids = a.forward(again.id, b, [b"again"])
            assert ids == list(range(ids[0], ids[0] + len(AFTER[instant])))
        assert payloads(b) == AFTER[instant]
        assert len(a) == 0
        assert a.stats().in_flight == 0
    with ledgerq.open(source) as a, ledgerq.open(target) as b:
        assert a.dequeue() is None
        assert payloads(b) == AFTER[instant]


@pytest.mark.usefixtures("locking")
@pytest.mark.parametrize("instant", list(AFTER))
def test_kill9_inside_a_forward_shared(tmp_path: Path, children: Children, instant: str) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    with (
        ledgerq.open(source, shared=True) as a,
        ledgerq.open(target, shared=True) as b,
    ):
        a.enqueue(b"job")
        run_child(children, source, target, "shared", instant)
        # The dead child's lease comes back within a second (its liveness lock is free).
        again = a.dequeue(timeout=30 if instant != "returned" else 0)
        if instant == "returned":
            assert again is None
        else:
            assert again is not None
            assert again.attempts == 2
            a.forward(again.id, b, [b"again"])
        assert payloads(b) == AFTER[instant]
        assert len(a) == 0
        assert a.stats().in_flight == 0
    with ledgerq.open(target, shared=True) as b:
        assert payloads(b) == AFTER[instant]


LOOP = """
import os, sys
import ledgerq
source, target, shared = sys.argv[1], sys.argv[2], sys.argv[3] == "shared"
a = ledgerq.open(source, shared=shared)
b = ledgerq.open(target, shared=shared)
os.write(1, b"ready\\n")
while (msg := a.dequeue()) is not None:
    # Two items per message, named by it: the target must hold each name once.
    n = msg.payload
    a.forward(msg.id, b, [n + b".1", n + b".2"])
    os.write(1, b"F %s\\n" % n)
os.write(1, b"done\\n")
"""


@pytest.mark.parametrize("mode", ["exclusive", "shared"])
def test_kill9_while_forwarding_loses_and_doubles_nothing(
    tmp_path: Path, children: Children, mode: str
) -> None:
    source, target = tmp_path / "a", tmp_path / "b"
    shared = mode == "shared"
    jobs = [b"%d" % n for n in range(600)]
    with ledgerq.open(source, shared=shared) as a:
        a.enqueue_batch(jobs)
    reported: list[bytes] = []
    for rounds in range(3):
        child = children.start(["-c", LOOP, str(source), str(target), mode])
        assert child.line() == "ready"
        lines = [child.line() for _ in range(40 + 23 * rounds)]
        lines += child.kill_and_drain()
        reported += [line.split()[1].encode() for line in lines if line.startswith("F ")]
    # What the children left: forwarded here (a redelivered message adds nothing).
    with (
        ledgerq.open(source, shared=shared) as a,
        ledgerq.open(target, shared=shared) as b,
    ):
        while (msg := a.dequeue(timeout=5 if shared else 0)) is not None:
            a.forward(msg.id, b, [msg.payload + b".1", msg.payload + b".2"])
            if len(a) == 0 and a.stats().in_flight == 0:
                break
        assert a.stats().in_flight == 0
        seen = Counter(m.payload for m in b.peek(10_000))
    assert max(seen.values()) == 1, [p for p, n in seen.items() if n > 1]
    assert set(seen) == {j + s for j in jobs for s in (b".1", b".2")}
    assert len(set(reported)) == len(reported)  # each forward returned once
