"""``ledgerq bench``: the rates of this disk, with a queue's options, never touching it."""

from __future__ import annotations

from pathlib import Path

import ledgerq

from ._run import fails, ok

_RATES = {"enqueue", "dequeue_ack", "enqueue_batch", "dequeue_ack_batch", "enqueue_sync_always"}


def test_bench_measures_a_scratch_queue_in_a_directory_and_removes_it(tmp_path: Path) -> None:
    report = ok("bench", tmp_path, "-n", "200", "--json").json()
    assert set(report["rates"]) == _RATES
    assert all(rate > 0 for rate in report["rates"].values())
    assert report["fsync_ms"]["median"] > 0
    assert (report["messages"], report["size"], report["shared"]) == (200, 100, False)
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    text = ok("bench", tmp_path, "-n", "100", "--size", "1KiB", "--shared").out
    assert "100 messages of 1,024 B, shared" in text
    assert "dequeue + ack, one at a time" in text and "messages/s" in text


def test_bench_of_a_queue_uses_its_options_beside_it_and_leaves_it_as_it_was(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs"
    with ledgerq.open(path, compression="zstd", segment_size=1 << 20) as q:
        q.enqueue_batch([b"keep me"] * 3)
    before = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*") if p.is_file())
    report = ok("bench", path, "-n", "100", "-o", "priorities=true", "--json").json()
    assert report["options"]["compression"] == "zstd"
    assert report["options"]["segment_size"] == 1 << 20
    assert report["options"]["priorities"] is True  # -o for this run
    assert report["directory"] == str(tmp_path)  # the scratch queue was made beside it
    after = sorted((p.relative_to(path), p.read_bytes()) for p in path.rglob("*") if p.is_file())
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs"]
    with ledgerq.open(path) as q:
        assert q.stats().pending == 3
        assert q.options.priorities is False  # not stored


def test_bench_refuses_bad_input_before_measuring(tmp_path: Path) -> None:
    missing = fails("bench", tmp_path / "nowhere", code=1).err
    assert "neither a queue nor a directory" in missing
    assert "-n" in fails("bench", tmp_path, "-n", "5", code=2).err
    assert "--size" in fails("bench", tmp_path, "--size", "lots", code=2).err
    big = fails(
        "bench", tmp_path, "-n", "100", "--size", "2KiB", "-o", "max_message_size=1024", code=2
    ).err
    assert "--size" in big and "max_message_size" in big
    assert "segment_size" in fails("bench", tmp_path, "-o", "segment_size=-1", code=2).err
    assert list(tmp_path.iterdir()) == []
