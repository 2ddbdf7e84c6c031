"""``ledgerq.segment.readonly``: reading a queue directory without its lock, on real files.

Each rule is checked where it lives and through the readers that share it (follow,
dump, verify, ship, the Spark planner's helpers, the queue's own recovery): they must
give the same answer.  Bytes another process would append are written by hand with the
real encoders.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ledgerq
from ledgerq import tools
from ledgerq.core.journal import ReaderJournal
from ledgerq.format.entry import RecordType, encode_entry
from ledgerq.format.index import INDEX_ENTRY, INDEX_HEADER, IndexEntry
from ledgerq.format.reader_state import (
    Checkpoint,
    StateRecordType,
    encode_checkpoint,
    encode_ids_record,
    encode_state_file_header,
)
from ledgerq.segment import readonly
from ledgerq.segment.index_file import read_index
from ledgerq.segment.readonly import (
    JournalTail,
    LogTail,
    ReaderState,
    find_queues,
    last_complete_id,
    queue_dir_problem,
)
from ledgerq.segment.readonly_tail import IN_FLIGHT_GRACE_S
from ledgerq.segment.scanner import checked_start
from ledgerq.ship import durable_reader_heads, ship_queue

# ---------------------------------------------------------------------- helpers


def _queue(path: Path, count: int = 0, **options: object) -> Path:
    with ledgerq.open(path, **options) as q:
        for i in range(count):
            q.enqueue(b"message %04d " % i + b"." * 40)
    return path


def _logs(path: Path) -> list[Path]:
    return sorted((path / "segments").glob("*.log"))


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def _follow_ids(path: Path, from_id: int = 1) -> list[int]:
    with ledgerq.follow(path, from_id=from_id, timeout=0) as messages:
        return [m.id for m in messages]


def _dump_ids(path: Path, from_id: int = 1) -> list[int]:
    return [m.id for m in tools.iter_messages(path, from_id)]


# ---------------------------------------------------------------------- what a queue is


def _layouts(root: Path) -> dict[str, tuple[Path, bool]]:
    """Directories, and whether each is a queue by the one rule."""
    made: dict[str, tuple[Path, bool]] = {}
    (root / "file").write_text("x")
    made["a file"] = (root / "file", False)
    made["missing"] = (root / "missing", False)
    (root / "empty").mkdir()
    made["an empty directory"] = (root / "empty", False)
    (root / "notes").mkdir()
    (root / "notes" / "notes.txt").write_text("mine")
    made["a directory of other files"] = (root / "notes", False)
    (root / "foreign" / "segments").mkdir(parents=True)
    (root / "foreign" / "notes.txt").write_text("mine")
    made["segments/ beside foreign files"] = (root / "foreign", False)
    partial = _queue(root / "partial")
    # What a first open killed before its meta.json leaves: no reader state yet either.
    os.unlink(partial / "meta.json")
    for state in (partial / "readers").iterdir():
        state.unlink()
    (partial / "readers").rmdir()
    made["segments/ and queue names, no meta.json"] = (partial, True)
    made["a queue"] = (_queue(root / "queue", 3), True)
    return made


def test_every_reader_agrees_on_what_a_queue_directory_is(tmp_path: Path) -> None:
    for what, (path, is_queue) in _layouts(tmp_path).items():
        answers = {
            "readonly": readonly.is_queue_dir(path),
            "tools.not_a_queue (the CLI)": tools.not_a_queue(path) is None,
            "find_queues (Spark, verify)": path.is_dir()
            and [q.path for q in find_queues(path, include_dlq=False)] == [str(path)],
        }
        try:
            _follow_ids(path)
            answers["follow"] = True
        except ledgerq.NotAQueueError:
            answers["follow"] = False
        if path.is_dir():
            report = tools.verify(path)
            answers["verify"] = not any(p.kind == tools.META for p in report.problems) or (
                report.problems[0].message.startswith("missing: the queue was never opened")
            )
        assert set(answers.values()) == {is_queue}, (what, answers)
        if not is_queue:
            assert queue_dir_problem(path) == tools.not_a_queue(path)
            with pytest.raises(ledgerq.NotAQueueError):
                ship_queue(path, tmp_path / "hub", "c")
        if not is_queue and path.is_dir() and os.listdir(path):
            # ledgerq.open creates a queue only where it would be the directory's owner
            with pytest.raises(ledgerq.NotAQueueError):
                ledgerq.open(path)
        elif is_queue:
            ledgerq.open(path).close()  # the partial queue is taken up as it is


def test_queues_under_a_directory_are_found_and_each_verified(tmp_path: Path) -> None:
    _queue(tmp_path / "a" / "x", 2)
    _queue(tmp_path / "b", 3, max_retries=1)
    with ledgerq.open(tmp_path / "b", max_retries=1) as q:
        message = q.dequeue()
        assert message is not None
        q.nack(message.id)  # into b/dlq
    (tmp_path / "_staging" / "segments").mkdir(parents=True)  # skipped: starts with "_"
    names = [q.name for q in find_queues(tmp_path, include_dlq=True)]
    assert names == ["a/x", "b", "b/dlq"]
    report = tools.verify(tmp_path)
    assert report.ok and len(report.queues) == 3 and report.entries == 2 + 3 + 1


# ---------------------------------------------------------------------- where to start


def _rewrite_point(index_path: Path, i: int, point: IndexEntry) -> None:
    data = bytearray(index_path.read_bytes())
    INDEX_ENTRY.pack_into(data, INDEX_HEADER.size + i * INDEX_ENTRY.size, *point)
    index_path.write_bytes(bytes(data))


def test_a_damaged_index_point_costs_a_longer_scan_never_a_wrong_start(tmp_path: Path) -> None:
    q = _queue(tmp_path / "q", 60, index_interval=300)
    (log,) = _logs(q)
    index_path = log.with_suffix(".idx")
    points, _ = read_index(str(index_path))
    assert len(points) >= 6
    target = points[4].id + 1
    fd = os.open(log, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        assert checked_start(fd, points, size, target, 1) == (points[4].offset, points[4].id - 1)
        # The point says another id than the entry at its offset holds: not trusted.
        _rewrite_point(index_path, 4, points[4]._replace(id=points[4].id + 2))
        damaged, _ = read_index(str(index_path))
        assert checked_start(fd, damaged, size, target, 1) == (points[3].offset, points[3].id - 1)
        # A point at an offset where no entry starts: not trusted either.
        _rewrite_point(index_path, 4, points[4]._replace(offset=points[4].offset + 3))
        damaged, _ = read_index(str(index_path))
        assert checked_start(fd, damaged, size, target, 1) == (points[3].offset, points[3].id - 1)
        # A point past what the reader may read (a size seen earlier) is not used.
        assert checked_start(fd, points, points[4].offset, target, 1)[0] == points[3].offset
        # No point checks out: the segment's start.
        assert checked_start(fd, [], size, target, 1) == (0, 0)
    finally:
        os.close(fd)
    # Whoever starts from the damaged index reads exactly the messages asked for.
    wanted = list(range(target, 61))
    assert _follow_ids(q, target) == _dump_ids(q, target) == wanted


# ---------------------------------------------------------------------- the live tail


def test_the_live_tail_waits_at_an_append_in_flight_and_reads_it_once_written(
    tmp_path: Path,
) -> None:
    q = _queue(tmp_path / "q", 3)
    log = _logs(q)[-1]
    tail = LogTail(str(q))
    try:
        assert [e.id for e in iter(tail.next_entry, None)] == [1, 2, 3]
        entry = encode_entry(4, 1, b"being written " * 100)
        _append(log, entry[:700])  # the owner's write() is not atomic for readers
        assert tail.next_entry() is None
        patience = tail.patience_left()
        assert patience is not None and 0 < patience <= IN_FLIGHT_GRACE_S
        assert last_complete_id(str(q)) == 3
        assert _follow_ids(q) == [1, 2, 3]
        _append(log, entry[700:])
        got = tail.next_entry()
        assert got is not None and got.id == 4 and got.payload == b"being written " * 100
        assert tail.next_entry() is None and tail.patience_left() is None
        assert tail.next_id == 5
    finally:
        tail.close()


def test_a_batch_is_held_back_until_its_last_entry_is_written(tmp_path: Path) -> None:
    q = _queue(tmp_path / "q", 2)
    log = _logs(q)[-1]
    size = log.stat().st_size
    tail = LogTail(str(q))
    try:
        assert [e.id for e in iter(tail.next_entry, None)] == [1, 2]
        _append(log, b"".join(encode_entry(i, 1, b"b%d" % i, batch_continues=True) for i in (3, 4)))
        # Every entry there is whole and valid, but the batch's end is not written yet.
        assert tail.next_entry() is None
        assert tail.patience_left() is None  # nothing looks half-written: just wait
        assert last_complete_id(str(q)) == 2
        assert _follow_ids(q) == [1, 2]
        report = tools.verify(q)
        assert [(p.kind, p.offset) for p in report.problems] == [(tools.TORN_TAIL, size)]
        assert "incomplete batch" in report.problems[0].message
        shipped = ship_queue(q, tmp_path / "hub", "c")
        assert shipped.last_id == 2
        _append(log, encode_entry(5, 1, b"b5"))  # the batch's last entry
        assert [e.id for e in iter(tail.next_entry, None)] == [3, 4, 5]
        assert last_complete_id(str(q)) == 5
        assert _follow_ids(q) == _dump_ids(q) == [1, 2, 3, 4, 5]
        # (meta.json, written at the clean close, lags the bytes appended by hand here)
        assert {p.kind for p in tools.verify(q).problems} == {tools.META}
        assert ship_queue(q, tmp_path / "hub", "c").last_id == 5
    finally:
        tail.close()


def test_a_corrupt_region_inside_a_held_batch_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = _queue(tmp_path / "q", 1)
    log = _logs(q)[-1]
    tail = LogTail(str(q))
    try:
        assert [e.id for e in iter(tail.next_entry, None)] == [1]
        _append(log, encode_entry(2, 1, b"first", batch_continues=True))
        _append(log, b"\xee" * 30)  # damage inside the batch (not an entry in flight)
        _append(log, encode_entry(4, 1, b"third", batch_continues=True))
        with caplog.at_level("WARNING", logger="ledgerq"):
            for _ in range(3):  # looked at again and again while the batch is open
                assert tail.next_entry() is None
            assert not caplog.records
            _append(log, encode_entry(5, 1, b"last"))
            assert [e.id for e in iter(tail.next_entry, None)] == [2, 4, 5]
        assert len([r for r in caplog.records if "corrupt" in r.getMessage()]) == 1
    finally:
        tail.close()


def test_the_live_tail_follows_rotations(tmp_path: Path) -> None:
    q = tmp_path / "q"
    tail = None
    with ledgerq.open(q, segment_size=600) as owner:
        owner.enqueue(b"first")
        tail = LogTail(str(q))
        got = [e.id for e in iter(tail.next_entry, None)]
        for i in range(40):
            owner.enqueue(b"%02d" % i + b"." * 50)
            if i % 7 == 0:
                got += [e.id for e in iter(tail.next_entry, None)]
        assert len(_logs(q)) > 3
        got += [e.id for e in iter(tail.next_entry, None)]
    tail.close()
    assert got == list(range(1, 42))


# ---------------------------------------------------------------------- reader journals


def _journal(tmp_path: Path) -> tuple[Path, Path]:
    q = tmp_path / "q"
    with ledgerq.open(q) as queue:
        for i in range(6):
            queue.enqueue(b"m%d" % i)
        for message in queue.dequeue_batch(3):
            queue.ack(message.id)
    return q, q / "readers" / "default.state"


def test_journal_replay_is_incremental_and_stops_at_a_record_in_flight(tmp_path: Path) -> None:
    _, path = _journal(tmp_path)
    tail = JournalTail(str(path))
    state = ReaderState()
    first = tail.read()
    assert tail.restarted and first[0][0] is StateRecordType.CHECKPOINT
    state.apply(first)
    assert state.durable_head() == 4
    offset = tail.offset
    assert offset == path.stat().st_size
    assert tail.read() == [] and not tail.restarted  # nothing new

    lease = encode_ids_record(StateRecordType.LEASE, [4, 5])
    ack = encode_ids_record(StateRecordType.ACK, [5])
    _append(path, lease + ack[:7])  # an ack being appended by the owner
    new = tail.read()
    assert [(kind, ids, at) for kind, ids, _, at in new] == [
        (StateRecordType.LEASE, (4, 5), offset)
    ]
    assert tail.offset == offset + len(lease)  # stopped before the ack, without error
    state.apply(new)
    assert state.leased == {4, 5} and state.deliveries == {4: 1, 5: 1}
    _append(path, ack[7:])
    state.apply(tail.read())
    assert state.leased == {4} and state.durable_head() == 4 and 5 in state.done

    # The owner's compaction replaces the file: the read starts over from its checkpoint.
    compacted = path.with_suffix(".new")
    compacted.write_bytes(
        encode_state_file_header() + encode_checkpoint(Checkpoint(6, [], [], {"acked": 5}))
    )
    os.replace(compacted, path)
    again = tail.read()
    assert tail.restarted and [r[0] for r in again] == [StateRecordType.CHECKPOINT]
    state.apply(again)
    assert state.durable_head() == 6 and state.leased == set()


def _replays(q: Path) -> dict[str, object]:
    """What each lock-free replay of the default reader's journal says: its head, or
    that the journal is damaged."""
    from ledgerq.spark._layout import read_reader_state

    answers: dict[str, object] = {}
    for name, replay in {
        "replay_reader": lambda: readonly.replay_reader(str(q), "default").durable_head(),
        "ship": lambda: durable_reader_heads(q)["default"],
        "spark": lambda: read_reader_state(str(q), "default").head,
    }.items():
        try:
            answers[name] = replay()
        except ledgerq.CorruptionError:
            answers[name] = "damaged"
    problems = {p.kind for p in tools.verify(q).problems}
    answers["verify"] = "damaged" if tools.READER_STATE in problems else "ok"
    return answers


def test_a_torn_tail_is_ignored_and_damage_in_the_middle_refused_by_every_replay(
    tmp_path: Path,
) -> None:
    q, path = _journal(tmp_path)
    whole = path.read_bytes()
    # Garbage after the last record, nothing valid after it: a torn append.
    path.write_bytes(whole + b"\x01\x00\x00\x00" + bytes(9))
    answers = _replays(q)
    assert answers == {"replay_reader": 4, "ship": 4, "spark": 4, "verify": "ok"}, answers
    journal = ReaderJournal(str(path))
    assert journal.load().head <= 4
    journal.close()
    assert path.read_bytes() == whole  # the queue's recovery cut exactly the torn tail

    # A record whose (flipped) length runs past the end, with valid records after it:
    # damage in the middle, not a tail.
    flipped = bytearray(encode_ids_record(StateRecordType.ACK, [4]))
    flipped[2] = 0x7F
    path.write_bytes(whole + bytes(flipped) + encode_ids_record(StateRecordType.ACK, [5]))
    answers = _replays(q)
    assert set(answers.values()) == {"damaged"}, answers
    with pytest.raises(ledgerq.CorruptionError):
        ReaderJournal(str(path)).load()
    with pytest.raises(ledgerq.CorruptionError) as info:
        JournalTail(str(path)).read()
    assert (info.value.path, info.value.offset) == (str(path), len(whole))


def test_an_incremental_read_refuses_damage_after_its_offset(tmp_path: Path) -> None:
    _, path = _journal(tmp_path)
    tail = JournalTail(str(path))
    tail.read()
    offset = tail.offset
    bad = bytearray(encode_ids_record(StateRecordType.ACK, [4]))
    bad[6] ^= 0x01
    _append(path, bytes(bad) + encode_ids_record(StateRecordType.ACK, [5]))
    with pytest.raises(ledgerq.CorruptionError) as info:
        tail.read()
    assert info.value.offset == offset  # the file offset of the damaged record
    assert tail.offset == offset  # nothing was taken past the damage


# ---------------------------------------------------------------------- views


def test_follow_and_dump_yield_the_same_messages_with_the_same_attempts(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q, compression="zstd", compression_min_size=10) as queue:
        queue.enqueue(b"plain")
        queue.enqueue(b"z" * 500, headers={"k": "v"}, priority=ledgerq.Priority.HIGH)
        first = queue.dequeue()
        assert first is not None and first.attempts == 1  # a delivery counts
        queue.nack(first.id)
    _append(_logs(q)[-1], encode_entry(3, 1, b"reserved", record_type=RecordType.TOMBSTONE))
    with ledgerq.follow(q, timeout=0) as messages:
        followed = list(messages)
    dumped = list(tools.iter_messages(q))
    assert followed == dumped
    assert [m.id for m in followed] == [1, 2]  # the reserved record is no message
    assert {m.attempts for m in followed} == {readonly.VIEW_ATTEMPTS} == {0}
    assert followed[1].payload == b"z" * 500 and followed[1].headers == {"k": "v"}


# ---------------------------------------------------------------------- which file holds which ids


def test_every_reader_takes_a_misnamed_segment_by_its_content_and_skips_a_copy(
    tmp_path: Path,
) -> None:
    """Two segments swapped and one copied under a later name: the owner, follow, dump,
    last_complete_id and the Spark planner read the same ids from the same files; ship
    refuses to copy a file under a name its entries contradict."""
    from ledgerq.spark._layout import list_segments

    path = _queue(tmp_path / "q", 60, segment_size=1024)
    logs = _logs(path)
    assert len(logs) >= 5
    a, b = logs[1], logs[2]
    for suffix in (".log", ".idx"):
        x, y, tmp = a.with_suffix(suffix), b.with_suffix(suffix), tmp_path / "tmp"
        x.rename(tmp)
        y.rename(x)
        tmp.rename(y)
    copy = path / "segments" / f"{10_000:020d}.log"
    copy.write_bytes(logs[0].read_bytes())
    everything = list(range(1, 61))

    assert _follow_ids(path) == everything
    assert _follow_ids(path, from_id=int(a.stem) + 1) == everything[int(a.stem) :]
    assert _dump_ids(path) == everything
    assert last_complete_id(str(path)) == 60
    planned = list_segments(str(path))
    assert [s.first_id for s in planned] == sorted(int(log.stem) for log in logs)
    assert {s.name_id for s in planned} == {None, int(a.stem), int(b.stem)}
    layout = readonly.SegmentDirectory(str(path / "segments")).layout()
    assert [f.file_name for f, _ in layout.set_aside] == [copy.name]
    assert {f.file_name for f in layout.misnamed} == {a.name, b.name}
    with pytest.raises(ledgerq.CorruptionError, match="verify --repair"):
        ship_queue(path, tmp_path / "hub", "c")
    with ledgerq.open(path) as q:
        assert [m.id for m in q.peek(100)] == everything
