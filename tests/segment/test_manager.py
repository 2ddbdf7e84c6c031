"""SegmentManager on real files: appends, rotation, recovery, deletion, lookups.

The queue tests reach the manager only through whole queues.  Here a model says, for
every append, which segment each entry lands in, at which offset, and where the
sparse index points are; the tests compare the files on disk with it byte for byte,
then damage the files (a torn tail, a torn batch, a bad index, a flipped byte, a file
system that refuses to grow) and check what recovery keeps, cuts and reports.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ledgerq
from ledgerq.format.entry import (
    Entry,
    decode_entry,
    encode_entry,
    encode_plain_batch_parts,
    encode_plain_entry,
)
from ledgerq.format.errors import CorruptRecord
from ledgerq.format.index import (
    INDEX_ENTRY,
    INDEX_HEADER,
    OPEN_COUNT,
    IndexEntry,
    decode_index,
    encode_index_entry,
    encode_index_header,
)
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.scanner import CorruptRegion, EntryScanner
from ledgerq.segment.segment import Segment
from tests._child import run_python
from tests.segment._log import BASE_NS, payload_for

# ---------------------------------------------------------------------- the model


@dataclass
class ModelSegment:
    """What one segment must hold: its first id and its entries' bytes, in order."""

    first_id: int
    entries: list[tuple[int, int, bytes]] = field(default_factory=list)  # id, timestamp, bytes

    @property
    def size(self) -> int:
        return sum(len(data) for _, _, data in self.entries)

    def data(self) -> bytes:
        return b"".join(data for _, _, data in self.entries)

    def index(self, interval: int, *, sealed: bool) -> list[IndexEntry]:
        """The sparse index the manager must keep: a point at offset 0, then at the first
        entry at least ``interval`` bytes past the previous point; sealed, the last entry."""
        points: list[IndexEntry] = []
        offset = 0
        last_point = -1
        for message_id, timestamp, data in self.entries:
            if last_point < 0 or offset - last_point >= interval:
                points.append(IndexEntry(message_id, timestamp, offset))
                last_point = offset
            offset += len(data)
        if sealed and self.entries and points[-1].id != self.entries[-1][0]:
            message_id, timestamp, data = self.entries[-1]
            points.append(IndexEntry(message_id, timestamp, offset - len(data)))
        return points


class Model:
    """The segments a sequence of appends must produce (rotation after each append call)."""

    def __init__(self, segment_size: int, index_interval: int) -> None:
        self.segment_size = segment_size
        self.index_interval = index_interval
        self.segments = [ModelSegment(1)]
        self.next_id = 1

    def appended(self, records: list[tuple[int, bytes]]) -> None:
        """One append call wrote ``records`` (timestamp, bytes), ids from ``next_id``."""
        active = self.segments[-1]
        for timestamp, data in records:
            active.entries.append((self.next_id, timestamp, data))
            self.next_id += 1
        if active.size >= self.segment_size:
            self.segments.append(ModelSegment(self.next_id))


def _segment_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "segments").iterdir())


def assert_matches(manager: SegmentManager, model: Model, root: Path) -> None:
    """The manager's view and the files on disk are exactly what the model says."""
    manager._check()
    expected_names = []
    assert [s.first_id for s in manager.segments] == [s.first_id for s in model.segments]
    for seg, want in zip(manager.segments, model.segments, strict=True):
        sealed = seg is not manager.segments[-1]
        assert seg.sealed == sealed, seg
        with open(seg.log_path, "rb") as f:
            assert f.read() == want.data(), f"{seg.log_path} differs from what was appended"
        assert seg.size == want.size
        points = want.index(model.index_interval, sealed=sealed)
        assert seg.index == points, seg
        with open(seg.idx_path, "rb") as f:
            on_disk, is_sealed = decode_index(f.read())
        assert (on_disk, is_sealed) == (points, sealed), seg.idx_path
        if want.entries:
            assert (seg.last_id, seg.last_timestamp) == want.entries[-1][:2]
        else:
            assert seg.is_empty
        expected_names += [f"{want.first_id:020d}.idx", f"{want.first_id:020d}.log"]
    assert _segment_files(root) == sorted(expected_names)
    assert manager.next_id == model.next_id


@contextmanager
def opened(root: Path, *, min_next_id: int = 1, **options: int) -> Iterator[SegmentManager]:
    manager = SegmentManager(
        str(root),
        segment_size=options.get("segment_size", 1 << 20),
        index_interval=options.get("index_interval", 128),
    )
    manager.open(min_next_id)
    try:
        yield manager
    finally:
        manager.close()


def _append_one(manager: SegmentManager, model: Model, size: int) -> bytes:
    message_id = model.next_id
    timestamp = BASE_NS + message_id
    record = encode_plain_entry(message_id, timestamp, payload_for(message_id, size))
    rotated = manager.append_one(record, message_id, timestamp)
    segments_before = len(model.segments)
    model.appended([(timestamp, record)])
    assert rotated == (len(model.segments) > segments_before)
    return record


def _append_batch(manager: SegmentManager, model: Model, sizes: list[int]) -> list[bytes]:
    first = model.next_id
    timestamp = BASE_NS + first
    payloads = [payload_for(first + i, n) for i, n in enumerate(sizes)]
    parts, lengths = encode_plain_batch_parts(first, timestamp, payloads)
    manager.append(parts, lengths, first, timestamp)
    blob = b"".join(parts)
    records = []
    at = 0
    for n in lengths:
        records.append(blob[at : at + n])
        at += n
    model.appended([(timestamp, r) for r in records])
    return records


def read_all(manager: SegmentManager) -> list[Entry]:
    """Every entry of every segment, read with a scanner from offset 0."""
    got = []
    for seg in manager.segments:
        scanner = EntryScanner(seg.read_fd(), 0, seg.size, after_id=seg.first_id - 1)
        while (entry := scanner.next()) is not None:
            got.append(entry)
        assert scanner.corrupt == [] and not scanner.incomplete
    return got


# ---------------------------------------------------------------------- appends and rotation

operations = st.lists(
    st.one_of(
        st.tuples(st.just("one"), st.integers(min_value=0, max_value=120)),
        st.tuples(
            st.just("batch"),
            st.lists(st.integers(min_value=0, max_value=80), min_size=1, max_size=6),
        ),
        st.tuples(st.just("reopen"), st.none()),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=50, deadline=None)
@given(
    ops=operations,
    segment_size=st.sampled_from([64, 200, 1000, 1 << 20]),
    index_interval=st.sampled_from([1, 50, 4096]),
)
def test_appends_land_where_the_model_says_and_survive_reopen(
    ops: list[tuple[str, object]], segment_size: int, index_interval: int
) -> None:
    options = {"segment_size": segment_size, "index_interval": index_interval}
    model = Model(segment_size, index_interval)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manager = SegmentManager(tmp, **options)
        manager.open()
        try:
            for kind, arg in ops:
                if kind == "one":
                    assert isinstance(arg, int)
                    _append_one(manager, model, arg)
                elif kind == "batch":
                    assert isinstance(arg, list)
                    _append_batch(manager, model, arg)
                else:
                    manager.close()
                    manager = SegmentManager(tmp, **options)
                    manager.open(model.next_id)
                    assert manager.truncated_bytes == 0
                assert_matches(manager, model, root)
            assert [e.id for e in read_all(manager)] == list(range(1, model.next_id))
        finally:
            manager.close()


def test_rotation_at_segment_size_names_each_file_by_its_first_id(tmp_path: Path) -> None:
    model = Model(segment_size=100, index_interval=4096)
    with opened(tmp_path, segment_size=100, index_interval=4096) as manager:
        sizes = [len(_append_one(manager, model, 24)) for _ in range(5)]  # 50 bytes each
        assert sizes == [50] * 5
        # 100 bytes reached after every second entry: 1-2, 3-4, then 5 in the active one.
        assert [(s.first_id, s.last_id, s.size, s.sealed) for s in manager.segments] == [
            (1, 2, 100, True),
            (3, 4, 100, True),
            (5, 5, 50, False),
        ]
        _append_one(manager, model, 24)
        assert [s.first_id for s in manager.segments] == [1, 3, 5, 7]
        assert manager.segments[-1].is_empty
        assert_matches(manager, model, tmp_path)
    assert _segment_files(tmp_path)[-2:] == ["00000000000000000007.idx", "00000000000000000007.log"]


def test_a_batch_is_written_whole_into_one_segment(tmp_path: Path) -> None:
    """A batch never straddles a rotation, even when it overfills the segment."""
    model = Model(segment_size=100, index_interval=1)
    with opened(tmp_path, segment_size=100, index_interval=1) as manager:
        _append_one(manager, model, 24)
        _append_batch(manager, model, [24] * 4)  # 200 bytes on top of 50
        assert [(s.first_id, s.last_id, s.size) for s in manager.segments] == [
            (1, 5, 250),
            (6, 0, 0),
        ]
        assert_matches(manager, model, tmp_path)


# ---------------------------------------------------------------------- torn tails


def _filled(root: Path, sizes: list[int], **options: int) -> Model:
    """A closed manager directory holding one appended entry per size."""
    model = Model(options.get("segment_size", 1 << 20), options.get("index_interval", 128))
    with opened(root, **options) as manager:
        for size in sizes:
            _append_one(manager, model, size)
    return model


def test_every_cut_of_the_last_entry_is_cut_back_on_open(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each offset inside the last entry: the manager keeps the whole entries before it,
    cuts the rest durably, says so (path and offset), and appends after them."""
    sizes = [30, 0, 70, 45]
    options = {"index_interval": 40}
    template = tmp_path / "template"
    model = _filled(template, sizes, **options)
    log_name = "00000000000000000001.log"
    data = (template / "segments" / log_name).read_bytes()
    last_offset = sum(len(d) for _, _, d in model.segments[0].entries[:-1])
    for cut in range(last_offset + 1, len(data)):
        root = tmp_path / f"cut{cut}"
        (root / "segments").mkdir(parents=True)
        for name in ("00000000000000000001.idx", log_name):
            (root / "segments" / name).write_bytes((template / "segments" / name).read_bytes())
        os.truncate(root / "segments" / log_name, cut)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ledgerq"), opened(root, **options) as m:
            assert m.truncated_bytes == cut - last_offset
            assert (m.active.size, m.active.last_id, m.log_next_id) == (last_offset, 3, 4)
            assert os.path.getsize(m.active.log_path) == last_offset
            assert f"at the end of {m.active.log_path} (offset {last_offset})" in caplog.text
            expected = Model(1 << 20, 40)
            expected.appended([(t, d) for _, t, d in model.segments[0].entries[:-1]])
            assert_matches(m, expected, root)
            _append_one(m, expected, 5)  # the next append gets id 4, right after
            assert_matches(m, expected, root)


def test_ids_of_a_cut_tail_are_never_reused(tmp_path: Path) -> None:
    """Opened with the next id the queue had handed out, the manager starts a new
    segment there instead of giving the cut entry's id to another message."""
    model = _filled(tmp_path, [30, 30, 30])
    log = tmp_path / "segments" / "00000000000000000001.log"
    os.truncate(log, os.path.getsize(log) - 1)
    with opened(tmp_path, min_next_id=model.next_id) as manager:
        assert [(s.first_id, s.last_id) for s in manager.segments] == [(1, 2), (4, 0)]
        assert manager.next_id == 4
        manager._check()


def test_garbage_after_the_last_entry_is_cut(tmp_path: Path) -> None:
    model = _filled(tmp_path, [30, 30])
    log = tmp_path / "segments" / "00000000000000000001.log"
    size = os.path.getsize(log)
    with open(log, "ab") as f:
        f.write(b"\x00" * 300)  # zeroed pages a crash left at the end
    with opened(tmp_path) as manager:
        assert manager.truncated_bytes == 300 and os.path.getsize(log) == size
        assert_matches(manager, model, tmp_path)


@pytest.mark.parametrize("keep", ["two whole entries", "half of the third"])
def test_a_torn_batch_is_cut_whole(tmp_path: Path, keep: str) -> None:
    """A batch is all-or-nothing: entries flagged BATCH_CONTINUES at the end of the log
    are cut with the rest of their batch, even when each is whole."""
    model = Model(1 << 20, 1)
    with opened(tmp_path, index_interval=1) as manager:
        _append_one(manager, model, 20)
        records = _append_batch(manager, model, [20, 20, 20])
    before_batch = len(model.segments[0].entries[0][2])
    cut = before_batch + len(records[0]) + len(records[1])
    if keep == "half of the third":
        cut += len(records[2]) // 2
    log = tmp_path / "segments" / "00000000000000000001.log"
    os.truncate(log, cut)
    with opened(tmp_path, index_interval=1) as manager:
        assert os.path.getsize(log) == before_batch
        assert manager.truncated_bytes == cut - before_batch
        expected = Model(1 << 20, 1)
        expected.appended([model.segments[0].entries[0][1:]])
        assert_matches(manager, expected, tmp_path)


# ---------------------------------------------------------------------- damage in the middle


def test_a_damaged_entry_in_the_newest_segment_is_reported_not_cut(tmp_path: Path) -> None:
    model = _filled(tmp_path, [30, 30, 30, 30, 30], index_interval=1 << 20)
    log = tmp_path / "segments" / "00000000000000000001.log"
    data = bytearray(log.read_bytes())
    entries = model.segments[0].entries
    start = len(entries[0][2])
    stop = start + len(entries[1][2])
    data[start + 25] ^= 0x40  # inside entry 2's payload
    log.write_bytes(data)
    reported: list[tuple[int, int, int]] = []

    def on_corrupt(seg: Segment, region: CorruptRegion) -> None:
        reported.append((seg.first_id, region.start, region.stop))

    manager = SegmentManager(
        str(tmp_path), segment_size=1 << 20, index_interval=1 << 20, on_corrupt=on_corrupt
    )
    manager.open()
    try:
        assert reported == [(1, start, stop)]
        assert manager.truncated_bytes == 0 and os.path.getsize(log) == len(data)
        assert (manager.active.last_id, manager.active.count) == (5, 4)
        assert manager.reported_regions == [(1, start)]
    finally:
        manager.close()


INDEX_DAMAGE = [
    "deleted",
    "cut short",
    "bad magic",
    "left open",
    "no entries",
    "points out of order",
    "last point past the end",
    "last point names another id",
    "last point at another entry",
]


def _damaged_index(kind: str, blob: bytes, entry_size: int) -> bytes | None:
    """``blob``, a sealed index, damaged the way ``kind`` says (None: the file is gone).

    Each damage is one the manager must detect by itself: the index decodes badly, is
    not sealed, or its last point does not match the log's last entry.
    """
    header, points = blob[: INDEX_HEADER.size], blob[INDEX_HEADER.size :]
    first, second = points[: INDEX_ENTRY.size], points[INDEX_ENTRY.size : 2 * INDEX_ENTRY.size]
    last = IndexEntry(*INDEX_ENTRY.unpack_from(blob, len(blob) - INDEX_ENTRY.size))
    if kind == "deleted":
        return None
    if kind == "cut short":
        return blob[: INDEX_HEADER.size + INDEX_ENTRY.size + 5]
    if kind == "bad magic":
        return b"XXXX" + blob[4:]
    if kind == "left open":
        return encode_index_header(OPEN_COUNT) + points
    if kind == "no entries":
        return encode_index_header(0)
    if kind == "points out of order":
        return header + second + first + points[2 * INDEX_ENTRY.size :]
    if kind == "last point past the end":
        wrong = last._replace(offset=1 << 30)
    elif kind == "last point names another id":
        wrong = last._replace(id=last.id - 1)  # still after the point before it
    else:
        wrong = last._replace(offset=last.offset - entry_size)  # the entry before it
    return blob[: -INDEX_ENTRY.size] + encode_index_entry(*wrong)


@pytest.mark.parametrize("damage", INDEX_DAMAGE)
def test_a_sealed_segment_with_a_bad_index_is_rescanned_and_its_index_rebuilt(
    tmp_path: Path, damage: str
) -> None:
    # Entries of 66 bytes, 5 to a segment; index points at ids 1, 3 and 5 (offsets 0,
    # 132, 264), so a wrong id or offset in the last point keeps the points in order.
    options = {"segment_size": 300, "index_interval": 130}
    model = _filled(tmp_path, [40] * 14, **options)
    assert len(model.segments) >= 3
    idx = tmp_path / "segments" / "00000000000000000001.idx"
    original = idx.read_bytes()
    assert decode_index(original) == (
        [IndexEntry(i, BASE_NS + i, (i - 1) * 66) for i in (1, 3, 5)],
        True,
    )
    damaged = _damaged_index(damage, original, entry_size=66)
    if damaged is None:
        idx.unlink()
    else:
        idx.write_bytes(damaged)
    with opened(tmp_path, **options) as manager:
        assert idx.read_bytes() == original, "the index was not rebuilt as it was written"
        assert manager.truncated_bytes == 0
        assert_matches(manager, model, tmp_path)
        assert [e.id for e in read_all(manager)] == list(range(1, model.next_id))


def test_invalid_bytes_at_the_end_of_a_sealed_segment_are_reported_never_cut(
    tmp_path: Path,
) -> None:
    """Only the newest segment can have a torn tail: an older one was fsynced whole."""
    options = {"segment_size": 100, "index_interval": 64}
    _filled(tmp_path, [24] * 5, **options)
    log = tmp_path / "segments" / "00000000000000000001.log"
    (tmp_path / "segments" / "00000000000000000001.idx").unlink()  # forces a rescan
    with open(log, "ab") as f:
        f.write(b"\xff" * 10)
    reported: list[tuple[int, int, int]] = []
    manager = SegmentManager(
        str(tmp_path),
        segment_size=100,
        index_interval=64,
        on_corrupt=lambda seg, r: reported.append((seg.first_id, r.start, r.stop)),
    )
    manager.open()
    try:
        assert reported == [(1, 100, 110)]
        assert os.path.getsize(log) == 110 and manager.truncated_bytes == 0
        assert [(s.first_id, s.last_id) for s in manager.segments[:2]] == [(1, 2), (3, 4)]
    finally:
        manager.close()


# ---------------------------------------------------------------------- lookups and deletion


def test_read_entry_at_and_position_of_find_every_entry(tmp_path: Path) -> None:
    options = {"segment_size": 200, "index_interval": 64}
    model = Model(200, 64)
    with opened(tmp_path, **options) as manager:
        for n in range(20):
            _append_one(manager, model, 5 + 7 * (n % 4))
        for want in model.segments:
            offset = 0
            for message_id, _, data in want.entries:
                seg = manager.segments[manager.find(message_id)]
                assert seg.first_id == want.first_id
                start, after_id = manager.position_of(seg, message_id)
                scanner = EntryScanner(seg.read_fd(), start, seg.size, after_id=after_id)
                found = scanner.next()
                while found is not None and found.id < message_id:
                    found = scanner.next()
                assert found is not None and found.id == message_id
                assert manager.read_entry_at(message_id, offset) == decode_entry(data)[0]
                offset += len(data)
        with pytest.raises(CorruptRecord, match="expected entry 2, found 1"):
            manager.read_entry_at(2, 0)


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=40),
    probes=st.lists(st.integers(min_value=-2, max_value=130), max_size=15),
)
def test_first_id_at_or_after_a_time(gaps: list[int], probes: list[int]) -> None:
    """Against a linear search, over several segments and index points; equal times
    (a batch shares one) included."""
    with tempfile.TemporaryDirectory() as tmp:
        manager = SegmentManager(tmp, segment_size=150, index_interval=40)
        manager.open()
        try:
            times = []
            now = BASE_NS
            for message_id, gap in enumerate(gaps, start=1):
                now += gap
                times.append(now)
                record = encode_entry(message_id, now, b"x" * (message_id % 9))
                manager.append_one(record, message_id, now)
            for probe in [*probes, 0, len(gaps) * 3 + 1]:
                at = BASE_NS + probe
                want = next((i for i, t in enumerate(times, start=1) if t >= at), None)
                assert manager.first_id_at_or_after(at) == want, probe
        finally:
            manager.close()


def test_delete_first_removes_the_oldest_files_and_never_the_active(tmp_path: Path) -> None:
    options = {"segment_size": 100, "index_interval": 64}
    model = _filled(tmp_path, [24] * 5, **options)
    assert [s.first_id for s in model.segments] == [1, 3, 5]
    with opened(tmp_path, **options) as manager:
        gone = manager.delete_first()
        assert (gone.first_id, gone.deleted) == (1, True)
        assert not Path(gone.log_path).exists() and not Path(gone.idx_path).exists()
        assert [s.first_id for s in manager.segments] == [3, 5]
        assert manager.find(3) == 0 and manager.find(5) == 1 and manager.find(1) == 0
        manager.delete_first()
        with pytest.raises(ValueError, match="active segment"):
            manager.delete_first()
        assert [s.first_id for s in manager.segments] == [5]
        manager._check()
    with opened(tmp_path, **options) as manager:
        assert [(s.first_id, s.last_id) for s in manager.segments] == [(5, 5)]
        assert manager.next_id == 6


# ---------------------------------------------------------------------- a file that cannot grow

_SHORT_WRITE_CHILD = """
import json, os, resource, signal, sys
from ledgerq.format.entry import encode_plain_batch_parts, encode_plain_entry
from ledgerq.segment.files import StorageError
from ledgerq.segment.manager import SegmentManager

root, = sys.argv[1:]
m = SegmentManager(root, segment_size=1 << 20, index_interval=64)
m.open()
for i in (1, 2, 3):
    m.append_one(encode_plain_entry(i, i, b"p%d" % i * 20), i, i)
size = m.active.size
# The file may grow 10 more bytes: a write past that is cut short, the next one fails
# with EFBIG (SIGXFSZ ignored, as a process that handles it would).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, hard))
failures = []
for attempt in ("append_one", "append"):
    try:
        if attempt == "append_one":
            m.append_one(encode_plain_entry(4, 4, b"x" * 100), 4, 4)
        else:
            parts, sizes = encode_plain_batch_parts(4, 4, [b"y" * 30, b"z" * 30])
            m.append(parts, sizes, 4, 4)
    except StorageError as exc:
        failures.append([attempt, exc.errno, str(exc), os.path.getsize(m.active.log_path),
                         m.active.size, m.next_id])
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
m.append_one(encode_plain_entry(4, 4, b"after"), 4, 4)
m.close()
print(json.dumps({"size": size, "failures": failures}))
"""


def test_a_write_the_file_system_cuts_short_is_cut_back_and_retried_whole(
    tmp_path: Path,
) -> None:
    """A real short write (RLIMIT_FSIZE in a child process, as a filling disk does):
    the append raises StorageError naming the log, the file is back at its size, and
    the next append after room returns lands right after the earlier entries."""
    run = run_python("-c", _SHORT_WRITE_CHILD, str(tmp_path), timeout=60)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    size = report["size"]
    log_path = str(tmp_path / "segments" / "00000000000000000001.log")
    assert len(report["failures"]) == 2
    for attempt, code, message, on_disk, known, next_id in report["failures"]:
        assert code == errno.EFBIG, attempt
        assert log_path in message, attempt
        assert (on_disk, known, next_id) == (size, size, 4), attempt
    with opened(tmp_path, index_interval=64) as manager:
        assert manager.truncated_bytes == 0
        got = read_all(manager)
        assert [(e.id, e.payload) for e in got] == [
            (1, b"p1" * 20),
            (2, b"p2" * 20),
            (3, b"p3" * 20),
            (4, b"after"),
        ]


@pytest.mark.parametrize("payload_sizes", [[4096] * 50, [100] * 300, [5000, 10, 9000, 3, 4100]])
def test_a_batchs_index_points_follow_the_interval_rule(
    tmp_path: Path, payload_sizes: list[int]
) -> None:
    """A point for each entry at least index_interval bytes after the previous point, the
    first entry included - whether every entry of the batch is a point (4 KiB messages,
    made without a search) or few are."""
    path = tmp_path / "q"
    with ledgerq.open(path, index_interval=4096, segment_size=1 << 30) as q:
        q.enqueue(b"first")
        for _ in range(3):
            q.enqueue_batch([b"p" * n for n in payload_sizes])
        q.enqueue(b"last")
        (idx,) = (path / "segments").glob("*.idx")
        points, _ = decode_index(idx.read_bytes())
    (log,) = (path / "segments").glob("*.log")
    data = log.read_bytes()
    expected, last, pos = [], -1, 0
    while pos < len(data):
        entry, stop = decode_entry(data, pos)
        if last < 0 or pos - last >= 4096:
            expected.append((entry.id, entry.timestamp, pos))
            last = pos
        pos = stop
    assert [tuple(p) for p in points] == expected
