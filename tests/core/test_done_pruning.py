"""Acks above a head held back by one old message stay cheap.

A reader keeps the ids finished above its head (the first id it may still deliver);
one old message that stays unfinished - leased by a slow task, delayed, waiting for its
retry - holds the head back, and every later ack adds to that set.  Pruning it at a
fixed size made each ack past that size rewrite the whole set: a queue with one stuck
message slowed to a few hundred acks a second after 65,536 (found by
benchmarks/scheduling.py).  Counted structurally here: prunes per ack, not time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq
from ledgerq.core import reader as reader_module


@pytest.mark.parametrize("shared", [False, True])
def test_a_held_head_prunes_the_done_set_a_logarithmic_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    monkeypatch.setattr(reader_module, "_PRUNE_DONE_AT", 16)
    prunes = 0
    prune = reader_module.ReaderCore._prune_done

    def counting(self: reader_module.ReaderCore) -> None:
        nonlocal prunes
        prunes += 1
        prune(self)

    monkeypatch.setattr(reader_module.ReaderCore, "_prune_done", counting)
    with ledgerq.open(tmp_path / "q", shared=shared) as q:
        q.enqueue(b"stuck", delay=3600.0)  # holds the head back for an hour
        q.enqueue_batch([b"m%d" % i for i in range(2000)])
        for _ in range(2000):
            m = q.dequeue()
            assert m is not None
            q.ack(m.id)
        assert q.stats().acked == 2000
        assert q.stats().delayed == 1
    # 16, 32, 64, ... 2048: one prune per doubling, not one per ack past 16.
    assert prunes <= 12, prunes
