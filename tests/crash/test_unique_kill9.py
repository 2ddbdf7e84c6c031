"""kill -9 and unique jobs: whatever instant the kill hits, every message written with a
key holds it afterwards, and no key ever has two unfinished messages.

The child enqueues unique jobs over a small set of keys as fast as it can - a new key,
the same key again (which must answer the first id), now and then a lease and an ack
that frees a key - and reports each returned call.  The test kills it (SIGKILL, nothing
closed or flushed) while it runs, so kills land inside enqueues too: between the
key's record and its message, in the message write, before the call returns.  After
the kill, each key has at most one unfinished message; enqueueing the key again
returns that message's id, or adds one message when the key is free.  In shared mode a
second process goes on beside the killed one, on the same keys, and is killed later.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children

KEYS = 40

CHILD = """
import os, random, sys
import ledgerq
path, shared, seed = sys.argv[1], sys.argv[2] == "shared", int(sys.argv[3])
rng = random.Random(seed)
q = ledgerq.open(path, shared=shared, max_retries=0)
os.write(1, b"ready\\n")
while True:
    key = "k%d" % rng.randrange(%(keys)d)
    first = q.enqueue(key.encode(), unique_key=key)
    again = q.enqueue(key.encode(), unique_key=key)
    # (In shared mode the other process may have acked it in between.)
    assert again == first or shared, (key, first, again)
    os.write(1, b"E %%s %%d\\n" %% (key.encode(), first))
    if rng.random() < 0.3:
        msg = q.dequeue()
        if msg is not None:
            q.ack(msg.id)
            os.write(1, b"A %%d\\n" %% msg.id)
""".replace("%(keys)d", str(KEYS)).replace("%%", "%")


def unfinished_by_key(q: ledgerq.Queue) -> dict[str, list[int]]:
    """Every unfinished message's id, by key (the payload is the key)."""
    found: dict[str, list[int]] = {}
    for msg in q.peek(10 * KEYS):
        found.setdefault(msg.payload.decode(), []).append(msg.id)
    return found


def check_after_kill(path: Path, shared: bool) -> None:
    with ledgerq.open(path, shared=shared, max_retries=0) as q:
        held = unfinished_by_key(q)
        assert all(len(ids) == 1 for ids in held.values()), f"a key held twice: {held}"
        before = len(q)
        for n in range(KEYS):
            key = f"k{n}"
            got = q.enqueue(key.encode(), unique_key=key)
            if key in held:
                assert got == held[key][0], f"{key} is held by {held[key]}, enqueue gave {got}"
        assert len(q) == before + sum(1 for n in range(KEYS) if f"k{n}" not in held)
        counts = Counter(m.payload for m in q.peek(10 * KEYS))
        assert set(counts.values()) == {1}, counts


@pytest.mark.parametrize("rounds", [3])
def test_kill9_exclusive_keeps_every_key_held_once(
    tmp_path: Path, children: Children, rounds: int
) -> None:
    path = tmp_path / "q"
    for seed in range(rounds):
        child = children.start(["-c", CHILD, str(path), "exclusive", str(seed)])
        assert child.line() == "ready"
        for _ in range(150 + 50 * seed):  # a different instant each round
            child.line()
        child.kill_and_drain()
        check_after_kill(path, shared=False)


def test_kill9_shared_keeps_every_key_held_once(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    for seed in range(2):
        killed = children.start(["-c", CHILD, str(path), "shared", str(2 * seed)])
        beside = children.start(["-c", CHILD, str(path), "shared", str(2 * seed + 1)])
        assert killed.line() == "ready"
        assert beside.line() == "ready"
        for _ in range(150):
            killed.line()
            beside.line()
        killed.kill_and_drain()
        # The other process goes on past the dead one's last append (its lock taken
        # over, its records read back), then dies too.
        for _ in range(150):
            beside.line()
        beside.kill_and_drain()
        check_after_kill(path, shared=True)


# A kill at a chosen instant of one enqueue: the child's segment manager kills its own
# process (SIGKILL) just before the message's bytes are written - the key's record is
# already stored into features/unique.table - or just after them, before the call returns.
AT_INSTANT = """
import os, sys
import ledgerq
from tests.crash._kill_at import kill_in_segment_writes
path, shared, instant = sys.argv[1], sys.argv[2] == "shared", sys.argv[3]
q = ledgerq.open(path, shared=shared)
os.write(1, b"E k0 %d\\n" % q.enqueue(b"k0", unique_key="k0"))
kill_in_segment_writes(instant)
q.enqueue(b"k1", unique_key="k1", **({"headers": {"h": "v"}} if sys.argv[4] == "1" else {}))
os.write(1, b"returned\\n")
"""


@pytest.mark.parametrize("mode", ["exclusive", "shared"])
@pytest.mark.parametrize("instant", ["before", "after"])
@pytest.mark.parametrize("checked", ["0", "1"], ids=["bytes-and-key", "with-headers"])
def test_kill9_inside_an_enqueue(
    tmp_path: Path, children: Children, mode: str, instant: str, checked: str
) -> None:
    path = tmp_path / "q"
    child = children.start(["-c", AT_INSTANT, str(path), mode, instant, checked])
    first = int(child.line().split()[2])
    assert child.wait() == -9
    assert child.read_line() is None  # killed inside the call: it never returned
    shared = mode == "shared"
    with ledgerq.open(path, shared=shared) as q:
        written = unfinished_by_key(q)
        assert written.get("k0") == [first]
        assert q.enqueue(b"k0", unique_key="k0") == first
        again = q.enqueue(b"k1", unique_key="k1")
        if instant == "after":
            # The message reached the log: its key is held (its record came first).
            assert written.get("k1") == [again]
        else:
            # Only the record reached its file: it names a message that does not exist,
            # and holds nothing - the retried enqueue adds the job once.
            assert "k1" not in written
            assert unfinished_by_key(q)["k1"] == [again]
        assert len(q) == 2
