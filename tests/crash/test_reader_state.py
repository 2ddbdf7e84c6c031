"""A torn or zero-extended reader state file (``readers/default.state``) after a crash.

The journal's last record may be cut anywhere by a crash: reopening cuts it off without
an error, and the lost record's effect is simply undone (at-least-once: a torn ack means
the message is delivered again, never lost).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import ledgerq

from ._harness import state_record_spans, truncate

STATE = Path("readers") / "default.state"


@pytest.fixture
def crashed(tmp_path: Path) -> Path:
    """A copy of a queue taken while open: 10 messages, 1-5 leased, 1-3 acked (in order)."""
    src = tmp_path / "src"
    snapshot = tmp_path / "snapshot"
    q = ledgerq.open(src, sync="never")
    try:
        ids = q.enqueue_batch([f"m{i}".encode() for i in range(1, 11)])
        assert ids == list(range(1, 11))
        for expected in range(1, 6):
            msg = q.dequeue()
            assert msg is not None
            assert msg.id == expected
        for message_id in (1, 2, 3):
            q.ack(message_id)
        shutil.copytree(src, snapshot)  # what kill -9 would leave
    finally:
        q.close()
    return snapshot


def deliveries_after_reopen(path: Path) -> list[tuple[int, int]]:
    with ledgerq.open(path) as q:
        got = q.dequeue_batch(100)
        for msg in got:
            assert msg.payload == f"m{msg.id}".encode()
            q.ack(msg.id)
    return [(m.id, m.attempts) for m in got]


def test_intact_journal_replays(crashed: Path, tmp_path: Path) -> None:
    case = tmp_path / "case"
    shutil.copytree(crashed, case)
    after = [(4, 2), (5, 2)] + [(i, 1) for i in range(6, 11)]
    assert deliveries_after_reopen(case) == after


def test_torn_last_record_is_cut_at_every_offset(crashed: Path, tmp_path: Path) -> None:
    data = (crashed / STATE).read_bytes()
    start, stop = state_record_spans(data)[-1]  # the ack of message 3
    # Without that ack, 3 is a lost lease again: delivered with attempts 2.
    after = [(3, 2), (4, 2), (5, 2)] + [(i, 1) for i in range(6, 11)]
    for cut in range(start + 1, stop):
        case = tmp_path / f"cut-{cut}"
        shutil.copytree(crashed, case)
        truncate(case / STATE, cut)
        with ledgerq.open(case) as q:
            assert (case / STATE).stat().st_size == start, f"cut at {cut}: not cut back"
            assert len(q) == 8, f"cut at {cut}"
        assert deliveries_after_reopen(case) == after, f"cut at {cut}"
        shutil.rmtree(case)


@pytest.mark.parametrize("size", [1, 4, 13, 4096])
def test_zeros_after_last_record_are_cut(crashed: Path, tmp_path: Path, size: int) -> None:
    case = tmp_path / "case"
    shutil.copytree(crashed, case)
    original = (case / STATE).stat().st_size
    with open(case / STATE, "ab") as f:
        f.write(bytes(size))
    with ledgerq.open(case) as q:
        assert (case / STATE).stat().st_size == original
        assert len(q) == 7
    after = [(4, 2), (5, 2)] + [(i, 1) for i in range(6, 11)]
    assert deliveries_after_reopen(case) == after


def test_record_in_the_middle_claiming_past_the_end_is_damage(
    crashed: Path, tmp_path: Path
) -> None:
    """A flipped length field in the middle is not a torn tail: the acks after it stay.

    Cutting there would silently undo every later ack (redelivering acked messages);
    the reader must refuse to open and say what to do instead.
    """
    case = tmp_path / "case"
    shutil.copytree(crashed, case)
    data = bytearray((case / STATE).read_bytes())
    start, _ = state_record_spans(bytes(data))[-3]  # the ack of message 1: two records follow
    data[start : start + 4] = (len(data) * 2).to_bytes(4, "little")
    (case / STATE).write_bytes(bytes(data))
    with pytest.raises(ledgerq.CorruptionError, match=r"default\.state"):
        ledgerq.open(case)
    assert (case / STATE).read_bytes() == bytes(data), "the damaged journal was changed"
