"""The segment scan behind every Spark read task, without Spark.

Its fast paths must return exactly what ledgerq's own log walk
(``ledgerq.tools.iter_messages``, built on ``EntryScanner``) returns - on clean
segments, and on segments with a flipped bit or a cut anywhere - whatever the chunk
size, with the Arrow and the tuple output alike.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.spark import require_spark

require_spark()

import ledgerq  # noqa: E402
from ledgerq.format.checksum import count_valid_records  # noqa: E402
from ledgerq.format.entry import EntryFlags, decode_entry, encode_entry  # noqa: E402
from ledgerq.segment.readonly import find_queues  # noqa: E402
from ledgerq.spark import _runs, _tiers  # noqa: E402
from ledgerq.spark._layout import list_segments, read_reader_state  # noqa: E402
from ledgerq.spark._plan import Pushed, ReadOptions, plan_tasks  # noqa: E402
from ledgerq.spark._scan import ScanStats, SegmentTask, _state_of, scan_segment  # noqa: E402
from ledgerq.tools import iter_messages  # noqa: E402
from tests.spark.helpers import flipped_copy, segment_files  # noqa: E402

Row = tuple[int, bytes, dict[str, str], int, int, int | None]


def _us(ns: int | None) -> int | None:
    return None if ns is None else ns // 1000


def _expected(queue: Path) -> list[Row]:
    return [
        (m.id, m.payload, m.headers, int(m.priority), _us(m.timestamp), _us(m.expires_at))
        for m in iter_messages(queue)
    ]


def _scanned(queue: Path, *, arrow: bool = True, **task: Any) -> list[Row]:
    rows: list[Row] = []
    for seg in list_segments(str(queue)):
        spec = SegmentTask(queue.name, str(queue), seg.first_id, seg.next_first_id, **task)
        for out in scan_segment(spec, arrow=arrow):
            if arrow:
                for r in out.to_pylist():
                    rows.append(_arrow_row(r))
            else:
                rows.append(_tuple_row(out))
    return rows


def _arrow_row(r: dict[str, Any]) -> Row:
    def us(t: Any) -> int | None:
        return None if t is None else round(t.timestamp() * 1_000_000)

    return (r["id"], r["payload"], dict(r["headers"]), r["priority"], us(r["timestamp"]),
            us(r["expires_at"]))  # fmt: skip


def _tuple_row(r: tuple[Any, ...]) -> Row:
    def us(t: Any) -> int | None:
        return None if t is None else round(t.timestamp() * 1_000_000)

    return (r[1], r[6], dict(r[5]), r[4], us(r[2]), us(r[3]))


def _fixed_queue(path: Path, n: int = 40) -> Path:
    """Plain entries of one size (the column-wise walk), then a few of other sizes."""
    with ledgerq.open(path, index_interval=200) as q:
        q.enqueue_batch([b"%06d-fixed-size-payload" % i for i in range(n)])
        q.enqueue_batch([b"tail" * i for i in range(1, 4)])
    return path


def _queue(path: Path, n: int = 60) -> Path:
    with ledgerq.open(path, compression="zstd", compression_min_size=32, index_interval=200) as q:
        for i in range(n):
            payload = f"message {i} ".encode() * (1 + i % 4)
            if i % 4 == 0:
                q.enqueue(payload)
            elif i % 4 == 1:
                q.enqueue_batch([payload, payload + b"!"])
            else:
                q.enqueue(payload, headers={"i": str(i)}, priority=i % 3, ttl=60.0 * (i % 2 + 1))
    return path


@pytest.fixture(params=[4 << 20, 97], ids=["4MiB-chunks", "97-byte-chunks"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(_tiers, "_CHUNK_BYTES", request.param)
    return int(request.param)


def test_clean_segments_read_like_the_log_walk(tmp_path: Path, chunk: int) -> None:
    queue = _queue(tmp_path / "q")
    expected = _expected(queue)
    assert len(expected) == 75
    assert _scanned(queue) == expected
    assert _scanned(queue, arrow=False) == expected


def test_plain_segments_take_the_vectorised_path(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "plain") as q:
        q.enqueue_batch([b"x" * i for i in range(500)])
    expected = _expected(tmp_path / "plain")
    assert _scanned(tmp_path / "plain") == expected
    assert _scanned(tmp_path / "plain", arrow=False) == expected
    _fixed_queue(tmp_path / "fixed", n=300)
    assert _scanned(tmp_path / "fixed") == _expected(tmp_path / "fixed")


def _one_by_one(queue: Path, *, arrow: bool) -> int:
    """How many entries of ``queue`` a scan decoded one by one (left the fast path)."""
    stats = ScanStats()
    for seg in list_segments(str(queue)):
        spec = SegmentTask(queue.name, str(queue), seg.first_id, seg.next_first_id)
        for _ in scan_segment(spec, arrow=arrow, stats=stats):
            pass
    return stats.decoded_one_by_one


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow", "tuples"])
def test_batch_written_segments_take_the_fast_path(tmp_path: Path, arrow: bool) -> None:
    # Every entry of an enqueue_batch but its last carries BATCH_CONTINUES: a flag that
    # does not change how the row is decoded must not send the entry one by one.
    with ledgerq.open(tmp_path / "batches", segment_size=64 * 1024) as q:
        for start in range(0, 2000, 100):
            q.enqueue_batch([b"row %05d" % i for i in range(start, start + 100)])
    with ledgerq.open(tmp_path / "singles") as q:
        for i in range(300):
            q.enqueue(b"row %05d" % i)
    for name in ("batches", "singles"):
        assert _scanned(tmp_path / name, arrow=arrow) == _expected(tmp_path / name)
        assert _one_by_one(tmp_path / name, arrow=arrow) == 0, name
    with ledgerq.open(tmp_path / "ttl") as q:  # an optional field does go one by one
        q.enqueue_batch([ledgerq.Item(b"x", ttl=60.0) for _ in range(10)])
    assert _one_by_one(tmp_path / "ttl", arrow=arrow) == 10


def _as_format_1(log: Path, *, upto_id: int | None = None) -> None:
    """Rewrite a log's entries (those up to ``upto_id``) as a format-1 ledgerq wrote them.

    The same bytes but the type byte's format bits and the CRC (CRC-32): lengths and
    offsets do not change, so the index stays right.
    """
    data = bytearray(log.read_bytes())
    pos = 0
    while pos < len(data):
        entry, stop = decode_entry(data, pos)
        if upto_id is None or entry.id <= upto_id:
            data[pos:stop] = encode_entry(
                entry.id,
                entry.timestamp,
                entry.payload,
                batch_continues=bool(entry.flags & EntryFlags.BATCH_CONTINUES),
                entry_format=1,
            )
        pos = stop
    log.write_bytes(bytes(data))


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow", "tuples"])
@pytest.mark.parametrize("layout", ["format-1", "mixed"])
def test_format_1_and_mixed_segments_take_the_fast_path(
    tmp_path: Path, arrow: bool, layout: str
) -> None:
    """Segments of format 1 (CRC-32), and one a newer ledgerq appended to (format-1 entries,
    then format-2 ones, batch-written), are read through the run check, none one by one."""
    queue = tmp_path / "q"
    with ledgerq.open(queue, segment_size=16 * 1024) as q:
        for start in range(0, 2000, 100):
            q.enqueue_batch([b"row %05d" % i for i in range(start, start + 100)])
        for i in range(50):
            q.enqueue(b"single %03d" % i)
    expected = _expected(queue)
    logs = segment_files(queue)
    assert len(logs) > 2
    for log in logs:
        _as_format_1(log, upto_id=1234 if layout == "mixed" else None)
    formats = set()
    for log in logs:
        data, pos = log.read_bytes(), 0
        while pos < len(data):
            entry, pos = decode_entry(data, pos)
            formats.add(entry.format)
    assert formats == ({1} if layout == "format-1" else {1, 2})
    assert _expected(queue) == expected  # the log walk reads them as before
    assert _scanned(queue, arrow=arrow) == expected
    assert _one_by_one(queue, arrow=arrow) == 0


@pytest.mark.parametrize("entry_format", [1, 2])
def test_a_bad_crc_of_either_format_is_found_by_the_run_check(
    tmp_path: Path, entry_format: int, caplog: pytest.LogCaptureFixture
) -> None:
    """One flipped bit in a run of format-1 or format-2 entries: that row is skipped and
    counted, like the scanner alone does - the run check is as strong as one per entry."""
    queue = tmp_path / "q"
    with ledgerq.open(queue) as q:
        q.enqueue_batch([b"row %05d" % i for i in range(500)])
    (log,) = segment_files(queue)
    if entry_format == 1:
        _as_format_1(log)
    data = bytearray(log.read_bytes())
    offsets = _runs.walk(bytes(data))
    data[offsets[250] + 30] ^= 0x01  # the payload of id 251
    log.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ledgerq"):
        rows = _scanned(queue)
    assert [r[0] for r in rows] == [i for i in range(1, 501) if i != 251]
    assert rows == _expected(queue)


def test_run_checks_find_the_first_bad_entry(tmp_path: Path) -> None:
    _fixed_queue(tmp_path / "q", n=50)
    data = segment_files(tmp_path / "q")[0].read_bytes()
    offsets = _runs.walk(data)
    assert len(offsets) == 54
    size = offsets[1] - offsets[0]
    assert count_valid_records(data, offsets[:51], size) == 50
    assert count_valid_records(data, offsets, None) == 53
    for victim in (0, 7, 49, 52):
        for where in (0, 5, 17, -1):
            damaged = bytearray(data)
            damaged[offsets[victim + 1] + where if where < 0 else offsets[victim] + where] ^= 0x10
            assert count_valid_records(bytes(damaged), offsets, None) == victim
            if victim < 50:
                assert count_valid_records(bytes(damaged), offsets[:51], size) == victim


@pytest.mark.parametrize("kind", ["mixed", "fixed"])
@pytest.mark.parametrize("step", [1, 5, 7])
def test_a_flipped_bit_anywhere_reads_like_the_log_walk(
    tmp_path: Path, chunk: int, step: int, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    clean = _queue(tmp_path / "clean", n=12) if kind == "mixed" else _fixed_queue(tmp_path / "c")
    log = segment_files(clean)[0]
    size = log.stat().st_size
    caplog.set_level(logging.ERROR, logger="ledgerq")  # the skips are logged; not checked here
    for offset in range(step - 1, size, 11 * step):
        damaged = flipped_copy(clean, tmp_path / f"d{offset}", offset)
        assert _scanned(damaged) == _expected(damaged), f"bit flipped at offset {offset}"
        shutil.rmtree(damaged)


def test_corruption_is_counted_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    queue = _queue(tmp_path / "q", n=20)
    log = segment_files(queue)[0]
    data = bytearray(log.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log.write_bytes(bytes(data))
    seg = list_segments(str(queue))[0]
    stats = ScanStats()
    with caplog.at_level(logging.WARNING, logger="ledgerq"):
        rows = sum(b.num_rows for b in scan_segment(
            SegmentTask("q", str(queue), seg.first_id, None), stats=stats))  # fmt: skip
    assert rows == len(_expected(queue)) == 24
    assert stats.corrupt_regions == 1 and stats.lost_messages == 1
    assert any("corrupt bytes" in r.getMessage() and str(log) in r.getMessage()
               for r in caplog.records)  # fmt: skip
    failfast = SegmentTask("q", str(queue), seg.first_id, None, failfast=True)
    with pytest.raises(ledgerq.CorruptionError, match="FAILFAST"):
        list(scan_segment(failfast))


def test_a_cut_tail_reads_like_the_log_walk(tmp_path: Path, chunk: int) -> None:
    clean = _queue(tmp_path / "clean", n=10)
    size = segment_files(clean)[0].stat().st_size
    for cut in range(size - 60, size, 3):
        queue = tmp_path / f"cut{cut}"
        shutil.copytree(clean, queue)
        log = segment_files(queue)[0]
        log.write_bytes(log.read_bytes()[:cut])
        # The newest segment: an incomplete end is an append in flight, never an error.
        assert _scanned(queue, live_tail=True, failfast=True) == _expected(queue)
        shutil.rmtree(queue)


def test_pushed_bounds_seek_and_filter_exactly(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=4096, index_interval=300) as q:
        for _ in range(10):
            q.enqueue_batch([b"p" * 50] * 30)
    every = _expected(tmp_path / "q")
    segments = list_segments(str(tmp_path / "q"))
    assert len(segments) > 3
    options = ReadOptions(paths=(str(tmp_path / "q"),))
    cases = [
        Pushed(id_lo=40, id_hi=95),
        Pushed(ids=frozenset({3, 150, 299, 1000})),
        Pushed(id_lo=290),
        Pushed(id_hi=5),
        Pushed(id_lo=10, id_hi=9),
    ]
    for pushed in cases:
        tasks = plan_tasks(options, pushed)
        got = [r for t in tasks for b in scan_segment(t) for r in map(_arrow_row, b.to_pylist())]
        want = [
            r
            for r in every
            if r[0] >= pushed.id_lo
            and (pushed.id_hi is None or r[0] <= pushed.id_hi)
            and (pushed.ids is None or r[0] in pushed.ids)
        ]
        assert got == want, pushed
        assert len(tasks) < len(segments) or not want


def test_reader_state_replay(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue_batch([b"m"] * 10)
        reader = q.reader("billing")
        got = reader.dequeue_batch(6)
        reader.ack(got[0].id)
        reader.ack(got[3].id)
        reader.nack(got[4].id)
        live = read_reader_state(str(tmp_path / "q"), "billing")
        assert [_state_of(live, i) for i in range(1, 11)] == [
            "acked", "leased", "leased", "acked", "pending", "leased",
            "pending", "pending", "pending", "pending",
        ]  # fmt: skip
    closed = read_reader_state(str(tmp_path / "q"), "billing")
    assert closed.leased == frozenset()  # leases do not survive a close
    assert [_state_of(closed, i) for i in (1, 2, 4, 5)] == ["acked", "pending", "acked", "pending"]
    nobody = read_reader_state(str(tmp_path / "q"), "nobody")
    assert {_state_of(nobody, i) for i in range(1, 11)} == {"pending"}


def test_find_queues_walks_a_tree(tmp_path: Path) -> None:
    for name in ("a/x", "a/y", "b", "_hidden/z", ".dot/z"):
        ledgerq.open(tmp_path / name).close()
    with ledgerq.open(tmp_path / "b", max_retries=1) as q:
        q.enqueue(b"poison")
        q.nack(q.dequeue().id)  # type: ignore[union-attr]
    names = [q.name for q in find_queues(str(tmp_path), include_dlq=False)]
    assert names == ["a/x", "a/y", "b"]
    assert [q.name for q in find_queues(str(tmp_path), include_dlq=True)] == [
        "a/x",
        "a/y",
        "b",
        "b/dlq",
    ]
    assert [q.name for q in find_queues(str(tmp_path / "b"), include_dlq=True)] == ["b", "b/dlq"]
    with pytest.raises(ledgerq.NotAQueueError):
        find_queues(str(tmp_path / "missing"), include_dlq=False)


def test_last_complete_id_ignores_an_append_in_flight(tmp_path: Path) -> None:
    from ledgerq.format.entry import encode_entry
    from ledgerq.segment.readonly import last_complete_id

    with ledgerq.open(tmp_path / "q", segment_size=2000, index_interval=100) as q:
        for _ in range(5):
            q.enqueue_batch([b"e" * 90] * 7)
    assert last_complete_id(str(tmp_path / "q")) == 35
    with open(segment_files(tmp_path / "q")[-1], "ab") as f:
        f.write(encode_entry(36, 1, b"x" * 500)[:300])
    assert last_complete_id(str(tmp_path / "q")) == 35
    assert last_complete_id(str(_queue(tmp_path / "other", n=4))) == 5
    with ledgerq.open(tmp_path / "batch") as q:
        q.enqueue(b"one")
    with open(segment_files(tmp_path / "batch")[-1], "ab") as f:  # a batch being written
        f.write(encode_entry(2, 1, b"two", batch_continues=True))
    assert last_complete_id(str(tmp_path / "batch")) == 1
    ledgerq.open(tmp_path / "empty").close()
    assert last_complete_id(str(tmp_path / "empty")) == 0


def test_deliver_at_is_the_not_before_time_or_null(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        plain = q.enqueue(b"now")
        delayed = q.enqueue(b"later", delay=90.0, group="g")
        batch = q.enqueue_batch([ledgerq.Item(b"b", delay=30.0), b"c"])
    for arrow in (True, False):
        found: dict[int, tuple[Any, Any]] = {}
        for seg in list_segments(str(path)):
            spec = SegmentTask(path.name, str(path), seg.first_id, seg.next_first_id)
            for out in scan_segment(spec, arrow=arrow):
                rows = out.to_pylist() if arrow else [out]
                for r in rows:
                    if arrow:
                        found[r["id"]] = (r["timestamp"], r["deliver_at"])
                    else:
                        found[r[1]] = (r[2], r[7])
        assert found[plain][1] is None and found[batch[1]][1] is None, arrow
        for message_id, delay in ((delayed, 90), (batch[0], 30)):
            stamp, deliver_at = found[message_id]
            assert abs((deliver_at - stamp).total_seconds() - delay) < 0.001, arrow
