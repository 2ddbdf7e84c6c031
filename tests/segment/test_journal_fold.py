"""``segment.journal_fold``: the one fold of reader-journal records, and the read-only
sink (``ReaderState``) on records written with the real encoders.

(The live shared reader, the other sink, is compared with this one on random record
sequences in ``tests/shared/test_journal_fold.py``.)
"""

from __future__ import annotations

from collections.abc import Sequence

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
from ledgerq.segment.journal_fold import FoldTables, fold_records
from ledgerq.segment.readonly_state import ReaderState, StateRecord, journal_records

A, B = 0xA, 0xB
T = StateRecordType


def _records(*blobs: bytes) -> list[StateRecord]:
    data = encode_state_file_header() + encode_checkpoint(Checkpoint(1, [], [], {}), shared=True)
    return list(journal_records(data + b"".join(blobs), "journal"))


def _state(*blobs: bytes) -> ReaderState:
    state = ReaderState()
    state.apply(_records(*blobs))
    return state


class _Recorder:
    """A sink that notes each call (and keeps the fold's tables)."""

    def __init__(self) -> None:
        self.tables: FoldTables = ({}, {}, {})
        self.calls: list[tuple[object, ...]] = []

    def fold_tables(self) -> FoldTables:
        return self.tables

    def on_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.calls.append(("checkpoint", checkpoint.head))
        self.tables = (dict(checkpoint.deliveries), dict(checkpoint.not_before), {})

    def on_lease(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        self.calls.append(("lease", holder, deadline_ns, tuple(ids)))

    def on_touch(self, holder: int, deadline_ns: int, ids: Sequence[int]) -> None:
        self.calls.append(("touch", holder, deadline_ns, tuple(ids)))

    def on_reclaim(self, holder: int, cause: int, ids: Sequence[int]) -> None:
        self.calls.append(("reclaim", holder, cause, tuple(ids)))

    def on_nack(self, ids: Sequence[int]) -> None:
        self.calls.append(("nack", tuple(ids)))

    def on_release(self, ids: Sequence[int]) -> None:
        self.calls.append(("release", tuple(ids)))

    def on_not_before(self, due_ns: int, ids: Sequence[int]) -> None:
        self.calls.append(("not_before", due_ns, tuple(ids)))

    def on_finish(self, kind: StateRecordType, ids: Sequence[int]) -> None:
        self.calls.append(("finish", kind, tuple(ids)))


def test_each_record_reaches_the_sink_decoded_after_the_shared_rules() -> None:
    sink = _Recorder()
    fold_records(
        _records(
            encode_ids_record(T.LEASE, [1]),
            encode_lease_by_record(A, 50, [2, 3]),
            encode_touch_record(A, 70, [2]),
            encode_ids_record(T.RELEASE, [3]),
            encode_ids_record(T.NACK, [2]),
            encode_not_before_record(9, [2]),
            encode_reclaim_record(B, ReclaimCause.TIMED_OUT, [1]),
            encode_ids_record(T.DEAD_LETTER, [1]),
        ),
        sink,
    )
    assert sink.calls == [
        ("checkpoint", 1),
        ("lease", 0, 0, (1,)),  # a plain LEASE: no holder
        ("lease", A, 50, (2, 3)),
        ("touch", A, 70, (2,)),
        ("release", (3,)),
        ("nack", (2,)),
        ("not_before", 9, (2,)),
        ("reclaim", B, ReclaimCause.TIMED_OUT, (1,)),
        ("finish", T.DEAD_LETTER, (1,)),
    ]
    deliveries, not_before, counters = sink.tables
    # 1 finished (dropped), 2 leased once (nacked: still a delivery), 3 leased and released.
    assert deliveries == {2: 1}
    assert not_before == {2: 9}
    assert counters == {"nacked": 1, "dead_lettered": 1}


def test_a_reclaim_voids_only_the_leases_its_holder_still_holds() -> None:
    # A's lease of 5 timed out; B voided it and leased 5 itself; a RECLAIM of A's
    # leases naming 5 again must not void B's.  (No ledgerq writes one - each RECLAIM is
    # decided after catching up - but the live reader always read it so, while the
    # read-only replay voided any lease of the ids: the console and Spark would have
    # shown 5 pending while B held it.)
    state = _state(
        encode_lease_by_record(A, 10, [5, 6]),
        encode_reclaim_record(A, ReclaimCause.TIMED_OUT, [5]),
        encode_lease_by_record(B, 20, [5]),
        encode_reclaim_record(A, ReclaimCause.GONE, [5, 6]),
    )
    assert state.holders == {5: (B, 20)}
    assert state.leased == {5}
    assert state.deliveries == {5: 2, 6: 1}  # a void lease stays a (failed) delivery


def test_touch_extends_only_the_holders_own_leases() -> None:
    state = _state(
        encode_lease_by_record(A, 10, [1]),
        encode_lease_by_record(B, 10, [2]),
        encode_touch_record(A, 99, [1, 2]),
    )
    assert state.holders == {1: (A, 99), 2: (B, 10)}


def test_release_undoes_its_lease_count_and_a_lease_voids_not_before() -> None:
    state = _state(
        encode_lease_by_record(A, 0, [1, 2]),
        encode_ids_record(T.NACK, [1]),
        encode_not_before_record(77, [1]),
        encode_ids_record(T.RELEASE, [2, 3]),  # 3 was never leased: its count stays 0
    )
    assert state.deliveries == {1: 1}
    assert state.not_before == {1: 77}
    assert state.leased == set() and state.holders == {}
    leased_again = _state(
        encode_ids_record(T.NACK, [1]),
        encode_not_before_record(77, [1]),
        encode_lease_by_record(B, 0, [1]),
    )
    assert leased_again.not_before == {}
