"""Recovery of a log cut inside a batch: the batch is all or nothing (bug 2).

The crash torture kills processes mid-write and the power-loss simulation cuts files
at the points a workload reaches; these tests cut a batch at *every* byte offset and
check what a reopened queue holds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import ledgerq

PAYLOADS = [b"batch-%d " % i * (1 + i) for i in range(6)]


def _cut_copy(src: Path, dest: Path, log_name: str, size: int) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    with open(dest / "segments" / log_name, "r+b") as f:
        f.truncate(size)


def _ids(path: Path) -> list[int]:
    with ledgerq.open(path, sync="never") as q:
        q._check()
        ids = [m.id for m in q.peek(100)]
        assert len(q) == len(ids)
        new_id = q.enqueue(b"after")
        assert new_id > 8, f"id {new_id} reused"
    return ids


def test_a_batch_cut_at_any_offset_is_kept_whole_or_not_at_all(tmp_path: Path) -> None:
    src = tmp_path / "src"
    # A small index interval puts index points inside the batch: recovery must not
    # start its scan at one of them (it would keep the batch's first entries).
    with ledgerq.open(src, sync="never", index_interval=64) as q:
        q.enqueue_batch([b"one", b"two"])
        q.enqueue_batch(PAYLOADS)
    (log,) = (src / "segments").glob("*.log")
    full = log.stat().st_size
    before = full - sum(26 + len(p) for p in PAYLOADS)
    for size in range(before, full + 1):
        _cut_copy(src, tmp_path / "cut", log.name, size)
        ids = _ids(tmp_path / "cut")
        expected = [1, 2, 3, 4, 5, 6, 7, 8] if size == full else [1, 2]
        assert ids == expected, f"log cut at {size} of {full}"


def test_an_older_segment_that_lost_the_end_of_a_batch_is_cut_too(tmp_path: Path) -> None:
    # With sync="never" a rotation's fsyncs wait for the next sync(): a power cut can
    # take the tail of a segment that is no longer the newest.
    src = tmp_path / "src"
    with ledgerq.open(src, sync="never", segment_size=200) as q:
        q.enqueue_batch([b"one", b"two"])
        q.enqueue_batch(PAYLOADS)  # fills the segment: the next enqueue starts another
        q.enqueue(b"nine")
    first, second = sorted((src / "segments").glob("*.log"))
    assert second.name == f"{9:020d}.log"
    _cut_copy(src, tmp_path / "cut", first.name, first.stat().st_size - 10)
    with ledgerq.open(tmp_path / "cut", sync="never") as q:
        q._check()
        assert [m.id for m in q.peek(100)] == [1, 2, 9]
        assert len(q) == 3
