"""The one fold of reader-journal records (``segment.journal_fold``), through both sinks.

A live shared reader folds the records other handles append into its cursor, selector
and lease tables; ``ReaderState`` (the queue's recovery, verify, the console, Spark)
folds the same file read-only, whole (``replay_reader``: recovery, verify, Spark) or
incrementally across compactions (``JournalTail``: the console, ship).  Random record
sequences - written by other handles,
with compactions (a random checkpoint replacing the file) between them - must leave
both with the same deliveries, NOT_BEFORE times, counters, finished ids and leases.

The records are those handles could write: nobody else nacks or releases the live
handle's own leases (its ``ack``/``nack`` refuse an id another handle holds), and a
checkpoint lists of the live handle's leases only ones it holds.  Anything else goes:
ids finished twice, RECLAIMs and TOUCHes of leases their holder no longer holds.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, example, given, settings

import ledgerq
from ledgerq.core.shared_reader import SharedReaderCore
from ledgerq.format.reader_state import (
    Checkpoint,
    ReclaimCause,
    StateRecordType,
    encode_checkpoint,
    encode_ids_record,
    encode_lease_by_record,
    encode_not_before_record,
    encode_reclaim_record,
    encode_state_file_header,
    encode_touch_record,
)
from ledgerq.segment.naming import reader_state_path
from ledgerq.segment.readonly_state import JournalTail, ReaderState, replay_reader

N = 6  # messages in the queue
IDS = st.lists(st.integers(1, N), min_size=1, max_size=3, unique=True).map(sorted)
FOREIGN = st.sampled_from([1, 2])  # the other handles (their holder ids are drawn later)
DEADLINES = st.sampled_from([0, 5_000, 9_000])
FINISHING = [StateRecordType.ACK, StateRecordType.DEAD_LETTER, StateRecordType.EXPIRE]

RECORDS = st.one_of(
    st.tuples(st.just("lease"), FOREIGN, DEADLINES, IDS),
    st.tuples(st.just("touch"), FOREIGN, DEADLINES, IDS),
    st.tuples(st.just("reclaim"), st.sampled_from([0, 1, 2]), st.sampled_from([1, 2]), IDS),
    st.tuples(st.just("finish"), st.sampled_from(FINISHING), st.just(0), IDS),
    st.tuples(st.just("nack"), st.just(0), st.just(0), IDS),
    st.tuples(st.just("release"), st.just(0), st.just(0), IDS),
    st.tuples(st.just("not_before"), st.just(0), st.sampled_from([7, 8]), IDS),
    st.tuples(st.just("catch_up"), st.just(0), st.just(0), st.just([1])),
)
CHECKPOINTS = st.fixed_dictionaries(
    {
        "head": st.integers(1, 4),
        "done": st.sets(st.integers(1, N), max_size=3),
        "deliveries": st.dictionaries(st.integers(1, N), st.integers(1, 3), max_size=4),
        "counters": st.dictionaries(st.sampled_from(["acked", "nacked"]), st.integers(0, 9)),
        "leases": st.dictionaries(st.integers(1, N), st.tuples(FOREIGN, DEADLINES), max_size=3),
        "keep_own": st.sets(st.integers(1, N)),
        "not_before": st.dictionaries(st.integers(1, N), st.sampled_from([3, 4]), max_size=2),
    }
)
# Between compactions, a run of records; after it the incremental reader looks, or not
# (then two compactions can pass between its reads: see the explicit example).
RUNS = st.lists(
    st.tuples(
        st.lists(RECORDS, min_size=2, max_size=12),
        st.one_of(st.none(), CHECKPOINTS),
        st.booleans(),
    ),
    min_size=1,
    max_size=4,
)
_SAME = {"done": set(), "deliveries": {}, "counters": {}, "leases": {}, "keep_own": set()}


def _core(q: ledgerq.Queue) -> SharedReaderCore:
    core = q._default._core  # type: ignore[attr-defined]
    assert isinstance(core, SharedReaderCore)
    return core


class _Run:
    """A live handle (``a``) and two writers on one queue; the test's view of ``a``'s
    own leases."""

    def __init__(self, path: str, own_taken: int, own_released: int) -> None:
        self.path = path
        self.a = ledgerq.open(path, shared=True)
        for _ in range(N):
            self.a.enqueue(b"x")
        taken = [self.a.dequeue() for _ in range(own_taken)]
        for msg in taken[:own_released]:  # behind the cursor, available again
            assert msg is not None
            self.a.release(msg.id)
        self.writers = [ledgerq.open(path, shared=True) for _ in range(2)]
        self.live = _core(self.a)
        self.holders = [self.live.holder] + [_core(w).holder for w in self.writers]
        self.own = set(self.live._leased)
        self.floor = 1  # ids below the last checkpoint's head are finished

    def write(self, blob: bytes) -> None:
        core = _core(self.writers[0])
        with core.session:
            core._shared_journal.append_record(blob)

    def record(self, what: str, a: int, b: int, ids: list[int]) -> None:
        if what == "lease":
            self.own.difference_update(ids)  # (the live handle learns it lost them)
            self.write(encode_lease_by_record(self.holders[a], b, ids))
        elif what == "touch":
            self.write(encode_touch_record(self.holders[a], b, ids))
        elif what == "reclaim":
            if a == 0:
                self.own.difference_update(ids)
            self.write(encode_reclaim_record(self.holders[a], ReclaimCause(b), ids))
        elif what == "finish":
            self.own.difference_update(ids)
            self.write(encode_ids_record(StateRecordType(a), ids))
        elif what in ("nack", "release"):
            ids = [i for i in ids if i not in self.own]  # only the holder gives it back
            if ids:
                kind = StateRecordType.NACK if what == "nack" else StateRecordType.RELEASE
                self.write(encode_ids_record(kind, ids))
        elif what == "not_before":
            self.write(encode_not_before_record(b, ids))
        else:
            self.live.catch_up()

    def compact(self, spec: dict[str, Any]) -> None:
        head = spec["head"]
        leases = {i: (self.holders[h], d) for i, (h, d) in spec["leases"].items()}
        deliveries = dict(spec["deliveries"])
        for message_id in self.own & spec["keep_own"]:
            # (the live handle's lease, with its delivery count: a compaction keeps both)
            leases[message_id] = (self.holders[0], 0)
            deliveries[message_id] = self.live._leased[message_id][1]
        self.own = {i for i in self.own if leases.get(i, (0, 0))[0] == self.holders[0]}
        done = sorted(i for i in spec["done"] if i >= head and i not in leases)
        checkpoint = Checkpoint(
            head,
            done,
            sorted(deliveries.items()),
            dict(spec["counters"]),
            sorted((i, h, d) for i, (h, d) in leases.items()),
            sorted(spec["not_before"].items()),
        )
        core = _core(self.writers[1])
        with core.session:
            core._shared_journal.rewrite(checkpoint)
        self.floor = head

    def close(self) -> None:
        for q in [self.a, *self.writers]:
            q.close()


def _nonzero(counters: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counters.items() if v}


def _assert_agree(run: _Run, state: ReaderState) -> None:
    live = run.live
    assert live._deliveries == state.deliveries
    assert live._not_before == state.not_before
    assert _nonzero(live.counters) == _nonzero(state.counters)
    foreign = {i: holder for i, (holder, _) in live._foreign.items()}
    own = dict.fromkeys(live._leased, live.holder)
    assert {**foreign, **own} == {i: holder for i, (holder, _) in state.holders.items()}
    assert state.leased == set(state.holders)
    assert live._foreign == {i: state.holders[i] for i in live._foreign}  # the deadlines
    assert set(live._leased) == run.own
    everything = set(range(1, N + 1))
    live_done = {i for i in everything if i < run.floor} | live.finished_from(1)
    assert live_done & everything == {i for i in everything if i < state.head} | (
        state.done & everything
    )
    live._check()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# A RECLAIM of a holder that no longer holds the lease (another leased it since) voids
# nothing: the read-only replay voided the other handle's lease too, once.
@example(own=(2, 1), runs=[([("lease", 2, 0, [5]), ("reclaim", 1, 1, [5])], None, True)])
# Two compactions between two looks of the incremental reader: ext4 gives the second new
# file the inode number of the file it read last (it alternates two), so only the bytes
# it read tell that the file is another one.
@example(
    own=(0, 0),
    runs=[
        ([("finish", 3, 0, [1]), ("nack", 0, 0, [4])], None, True),
        ([("nack", 0, 0, [4]), ("nack", 0, 0, [5])], {**_SAME, "head": 2, "not_before": {}}, False),
        ([("nack", 0, 0, [5]), ("nack", 0, 0, [6])], {**_SAME, "head": 3, "not_before": {}}, False),
        ([("nack", 0, 0, [4, 5, 6])] * 6, None, True),  # (past the offset it read to)
    ],
)
@given(
    own=st.tuples(st.integers(0, 4), st.integers(0, 4)).map(lambda t: (t[0], min(t))),
    runs=RUNS,
)
def test_live_reader_and_read_only_replay_agree(
    own: tuple[int, int],
    runs: list[tuple[list[tuple[str, int, int, list[int]]], dict[str, Any] | None, bool]],
) -> None:
    path = tempfile.mkdtemp(prefix="lq-fold-")
    run = _Run(path, *own)
    tail = JournalTail(reader_state_path(path, "default"))
    followed = ReaderState()
    try:
        for position, (records, checkpoint, look) in enumerate(runs):
            for record in records:
                run.record(*record)
            if checkpoint is not None:
                run.compact(checkpoint)
            run.live.catch_up()
            _assert_agree(run, replay_reader(path, "default"))
            if not look and position + 1 < len(runs):
                continue
            news = tail.read()
            if tail.restarted:
                followed = ReaderState()  # (as the console: a new file is read whole)
            followed.apply(news)
            _assert_agree(run, followed)
    finally:
        run.close()
        shutil.rmtree(path, ignore_errors=True)


def test_a_journal_swapped_in_place_is_read_whole_again(tmp_path: Path) -> None:
    # Another journal written over this one's bytes by hand (the same inode, a size past
    # where the incremental reader stopped): what it read is not there any more, so it
    # starts over instead of reading on from the middle of a record.
    path = tmp_path / "default.state"
    header = encode_state_file_header()
    acks = [encode_ids_record(StateRecordType.ACK, [i]) for i in (2, 3)]
    path.write_bytes(header + encode_checkpoint(Checkpoint(1, [], [], {})) + b"".join(acks))
    tail = JournalTail(str(path))
    state = ReaderState()
    state.apply(tail.read())
    assert (state.head, state.done) == (1, {2, 3})

    other = header + encode_checkpoint(Checkpoint(5, [7], [], {"acked": 5}))
    other += b"".join(encode_ids_record(StateRecordType.NACK, [9]) for _ in range(8))
    assert len(other) > tail.offset
    with open(path, "r+b") as f:
        f.write(other)
    news = tail.read()
    assert tail.restarted
    state = ReaderState()
    state.apply(news)
    assert (state.head, state.done, state.counters["acked"]) == (5, {7}, 5)
