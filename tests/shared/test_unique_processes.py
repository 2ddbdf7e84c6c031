"""Unique jobs across processes (shared mode): one message per key whoever enqueues it,
and a key that another process's ack frees is free for this one at once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children
from tests.features.test_unique import table_records, unique_table

KEYS = 60

PRODUCER = """
import random, sys
import ledgerq
path, seed = sys.argv[1], int(sys.argv[2])
keys = ["k%d" % n for n in range(int(sys.argv[3]))]
random.Random(seed).shuffle(keys)
q = ledgerq.open(path, shared=True)
print("ready", flush=True)
sys.stdin.readline()
out = []
for n, key in enumerate(keys):
    if n % 3:
        out.append("%s %d" % (key, q.enqueue(key.encode(), unique_key=key)))
    else:  # some in batches, with the key twice
        ids = q.enqueue_batch([ledgerq.Item(key.encode(), unique_key=key)] * 2)
        assert ids[0] == ids[1], ids
        out.append("%s %d" % (key, ids[0]))
print("\\n".join(out), flush=True)
print("done", flush=True)
q.close()
"""

CONSUMER = """
import sys
import ledgerq
q = ledgerq.open(sys.argv[1], shared=True)
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "lease":
        msg = q.dequeue(timeout=10)
        print("leased %d" % msg.id, flush=True)
    elif line.strip() == "ack":
        q.ack(msg.id)
        print("acked", flush=True)
q.close()
"""


KILLED_SWEEPER = """
import os, signal, sys
import ledgerq
from ledgerq.features import unique
unique._SWEEP_AT = unique._REWRITE_SLACK = 4  # a sweep and a rewrite every few keys
path, kill_at = sys.argv[1], sys.argv[2]
q = ledgerq.open(path, shared=True)
print(q.enqueue(b"kept", unique_key="kept", delay=3600), flush=True)  # (not dequeued below)
rename = os.replace
def replace(src, dst):
    if dst.endswith("unique.table"):  # the rewrite's rename: killed on either side of it
        if kill_at == "after":
            rename(src, dst)
        os.kill(os.getpid(), signal.SIGKILL)
    rename(src, dst)
os.replace = replace
for n in range(40):
    q.enqueue(b"done", unique_key="done%d" % n)
    q.ack(q.dequeue().id)
"""


def _replaced_word(path: Path) -> int:
    return int.from_bytes(unique_table(path).read_bytes()[8:16], "little")


@pytest.mark.parametrize("kill_at", ["before", "after"])
def test_a_rewriter_killed_at_its_rename_leaves_every_handle_on_one_file(
    tmp_path: Path, children: Children, kill_at: str
) -> None:
    """kill -9 of a process rewriting the table, just before or just after its rename:
    the other handles go on with the file that holds the name - none stores its keys
    into the unlinked one, where a handle opened later would not see them - and a mark
    the dead one left on the file still holding the name is cleared."""
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        mine = q.enqueue(b"mine", unique_key="mine", delay=3600)  # the table mapped
        sweeper = children.start(["-c", KILLED_SWEEPER, str(path), kill_at])
        kept = int(sweeper.line())
        sweeper.expect_exit(-signal.SIGKILL)
        after = q.enqueue(b"after", unique_key="after")
        assert q.enqueue(b"kept", unique_key="kept") == kept
        assert q.enqueue(b"mine", unique_key="mine") == mine
        assert _replaced_word(path) == 0
        with ledgerq.open(path, shared=True) as later:  # maps the name now
            assert later.enqueue(b"after", unique_key="after") == after
            assert later.enqueue(b"mine", unique_key="mine") == mine
            assert later.enqueue(b"kept", unique_key="kept") == kept
    with ledgerq.open(path) as q:  # and after a reopen
        assert q.enqueue(b"after", unique_key="after") == after


# 2500 keys: the table (1637 records in its first 64 KiB) grows while both store into
# it - one process grows the file, the other finds its mapping short and maps it again.
@pytest.mark.parametrize("keys", [KEYS, 2500])
def test_processes_enqueueing_the_same_keys_make_one_message_each(
    tmp_path: Path, children: Children, keys: int
) -> None:
    path = tmp_path / "q"
    producers = [
        children.start(["-c", PRODUCER, str(path), str(seed), str(keys)]) for seed in range(2)
    ]
    for child in producers:
        assert child.line() == "ready"
    for child in producers:
        child.send("go")  # all at once: their appends interleave
    answers: list[dict[str, int]] = []
    for child in producers:
        got = {}
        while (line := child.line()) != "done":
            key, message_id = line.split()
            got[key] = int(message_id)
        answers.append(got)
        child.expect_exit(0)
    assert answers[0] == answers[1], "the processes disagree on a key's message"
    assert len(answers[0]) == keys
    with ledgerq.open(path, shared=True) as q:
        messages = q.peek(10 * keys)
        assert sorted(m.payload.decode() for m in messages) == sorted(answers[0])
        assert {m.payload.decode(): m.id for m in messages} == answers[0]


def test_a_lease_elsewhere_holds_and_an_ack_elsewhere_frees(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        consumer = children.start(["-c", CONSUMER, str(path)])
        assert consumer.line() == "ready"
        first = q.enqueue(b"job", unique_key="nightly")
        consumer.send("lease")
        assert consumer.line() == f"leased {first}"
        assert q.enqueue(b"job", unique_key="nightly") == first  # leased by the other
        consumer.send("ack")
        assert consumer.line() == "acked"
        again = q.enqueue(b"job", unique_key="nightly")  # freed by its ack, just now
        assert again > first
        assert q.enqueue(b"job", unique_key="nightly") == again
        consumer.send("lease")
        assert consumer.line() == f"leased {again}"
        consumer.finish()  # closed with the lease: it comes back, and holds the key
        assert q.enqueue(b"job", unique_key="nightly") == again
        assert len(q) == 1


def test_two_handles_judge_a_key_by_every_reader_as_the_other_left_it(tmp_path: Path) -> None:
    # The handle that enqueues answers a held key from its view of the readers when the
    # page says no step ended elsewhere since; the other handle's acks, each reader's
    # in turn, must be seen at the next enqueue all the same.
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as a, ledgerq.open(path, shared=True) as b:
        audit_b = b.reader("audit")
        first = a.enqueue(b"job", unique_key="nightly")
        a.reader("audit")  # (a knows both readers)
        assert a.enqueue(b"job", unique_key="nightly") == first  # nothing moved: held
        msg = b.dequeue()
        assert msg is not None and msg.id == first
        b.ack(first)  # the default reader is done with it; the audit reader is not
        assert a.enqueue(b"job", unique_key="nightly") == first
        audited = audit_b.dequeue()
        assert audited is not None and audited.id == first
        assert a.enqueue(b"job", unique_key="nightly") == first  # leased by audit in b
        audit_b.ack(first)
        again = a.enqueue(b"job", unique_key="nightly")  # every reader is done: freed
        assert again > first
        assert a.enqueue(b"job", unique_key="nightly") == again


SWEEPER = """
import sys
import ledgerq
from ledgerq.features import unique
unique._SWEEP_AT = unique._REWRITE_SLACK = 4  # a sweep and a rewrite every few keys
q = ledgerq.open(sys.argv[1], shared=True)
for n in range(40):
    q.enqueue(b"done", unique_key="done%d" % n)
    q.ack(q.dequeue().id)
print(q.enqueue(b"kept", unique_key="kept"), flush=True)
q.close()
"""


def test_a_table_another_process_rewrote_is_read_again(tmp_path: Path, children: Children) -> None:
    """The other process's sweeps replace the table file under this handle's mapping:
    the old file says so, and this handle reads the new one whole."""
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        # The table mapped, and a key held (delayed: the sweeper's dequeues pass it by).
        mine = q.enqueue(b"mine", unique_key="mine", delay=3600)
        sweeper = children.start(["-c", SWEEPER, str(path)])
        kept = int(sweeper.line())
        sweeper.expect_exit(0)
        assert len(table_records(path)) < 20, "rewritten with the keys still held"
        assert q.enqueue(b"kept", unique_key="kept") == kept
        assert q.enqueue(b"mine", unique_key="mine") == mine
        assert q.enqueue(b"done", unique_key="done0") > kept  # acked: free
        assert len(q) == 3
