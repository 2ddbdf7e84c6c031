"""``ledgerq.follow``: a reader of a queue another process owns, without its lock.

Followers and owners run in separate processes where it matters; they are
synchronised only through their output pipes (a child reports each message it
sees, the test acts when it has read a given report).  This module is also the
child program: ``python test_follow.py follow|produce ...``.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq.format.entry import RecordType, encode_entry, encode_headers
from ledgerq.segment.watch import InotifyWatcher, PollingWatcher
from tests._child import Child, Children

WATCH_MODES = ["inotify", "poll"] if sys.platform.startswith("linux") else ["poll"]
WATCHDOG_SECONDS = 60.0


# ------------------------------------------------------------ child side


def _record(msg: ledgerq.Message) -> dict[str, Any]:
    return {
        "id": msg.id,
        "payload": msg.payload.hex(),
        "headers": msg.headers,
        "priority": int(msg.priority),
        "timestamp": msg.timestamp,
        "expires_at": msg.expires_at,
        "attempts": msg.attempts,
    }


def _payload(i: int) -> bytes:
    """A deterministic payload of varying size (0 to ~250 bytes) for message number i."""
    return (f"<{i}>" * (i % 41)).encode()


def _child_follow(path: str, from_id: str, timeout: str, watch: str, count: str) -> None:
    limit = int(count)
    seen = 0
    follower = ledgerq.follow(
        path, int(from_id), None if timeout == "none" else float(timeout), watch=watch
    )  # type: ignore[arg-type]
    with follower:
        print(f"ready {follower.watch}", flush=True)
        try:
            for msg in follower:
                print(json.dumps(_record(msg)), flush=True)
                seen += 1
                if seen == limit:
                    print("done", flush=True)
                    return
        except ledgerq.CorruptionError as exc:
            print(f"error CorruptionError {exc}", flush=True)
            return
    print("end", flush=True)


def _child_produce(path: str, count: str, segment_size: str) -> None:
    """Enqueue ``count`` messages as fast as possible; then wait for a line on stdin."""
    n = int(count)
    with ledgerq.open(path, segment_size=int(segment_size), sync="never") as q:
        print("ready", flush=True)
        i = 1
        while i <= n:
            if i % 7 == 0 and i + 3 <= n:
                q.enqueue_batch([_payload(j) for j in range(i, i + 3)])
                i += 3
            else:
                q.enqueue(_payload(i), headers={"n": str(i)} if i % 2 else None)
                i += 1
        print(f"wrote {n}", flush=True)
        sys.stdin.readline()


# ------------------------------------------------------------ test side


def records(child: Child, until_id: int) -> list[dict[str, Any]]:
    """Read a follower's message reports up to and including the one with id ``until_id``."""
    got = []
    while True:
        text = child.line()
        assert text.startswith("{"), child.failure(f"reported {text!r}")
        record = json.loads(text)
        got.append(record)
        if record["id"] >= until_id:
            return got


@pytest.fixture
def spawn(children: Children) -> Callable[..., Child]:
    """Run this module as a child: ``spawn("follow" | "produce", *args)``; always reaped."""

    def start(*args: str) -> Child:
        return children.start([__file__, *args], watchdog_seconds=WATCHDOG_SECONDS)

    return start


def follower(spawn: Any, path: Path, *, from_id: int = 1, watch: str, count: int = 0) -> Child:
    """A follower child; returns once it has its watcher (before it reads anything)."""
    child: Child = spawn("follow", str(path), str(from_id), "none", watch, str(count))
    assert child.line() == f"ready {watch}"
    return child


def log_files(path: Path) -> list[Path]:
    return sorted((path / "segments").glob("*.log"))


def snapshot(path: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and directory under ``path``: (inode, size, mtime_ns)."""
    found = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            full = os.path.join(root, name)
            st = os.stat(full)
            found[os.path.relpath(full, path)] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def follow_all(path: Path, **kwargs: Any) -> list[ledgerq.Message]:
    with ledgerq.follow(path, timeout=0, **kwargs) as f:
        return list(f)


# ------------------------------------------------------------ following a live owner


@pytest.mark.parametrize("watch", WATCH_MODES)
def test_follower_process_sees_every_message_across_rotations(
    tmp_path: Path, spawn: Any, watch: str
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=256, sync="never") as q:
        # The follower starts before any message exists, then picks them up.
        child = follower(spawn, path, watch=watch, count=60)
        sent: list[tuple[int, bytes, dict[str, str], int]] = []
        received: list[dict[str, Any]] = []
        for round_ in range(6):
            ids = []
            for k in range(10):
                i = round_ * 10 + k + 1
                headers = {"round": str(round_), "k": str(k)} if k % 3 else {}
                priority = ledgerq.Priority(k % 3)
                if k == 9:
                    # a batch of one, just to go through enqueue_batch
                    (mid,) = q.enqueue_batch(
                        [ledgerq.Item(_payload(i), headers=headers, priority=priority)]
                    )
                else:
                    mid = q.enqueue(_payload(i), headers=headers or None, priority=priority)
                ids.append(mid)
                sent.append((mid, _payload(i), headers, int(priority)))
            # Wait (on the pipe) until the follower has seen this round: it is then
            # waiting at the tail when the next round starts.
            received += records(child, ids[-1])
        assert child.line() == "done"
        child.expect_exit(0)
        assert len(log_files(path)) > 5, "the test must rotate segments"
        on_disk = follow_all(path)
    assert [
        (r["id"], bytes.fromhex(r["payload"]), r["headers"], r["priority"]) for r in received
    ] == sent
    assert received == [_record(m) for m in on_disk]
    assert all(r["attempts"] == 0 for r in received)  # a view delivers nothing


@pytest.mark.parametrize("watch", WATCH_MODES)
def test_follower_keeps_up_with_an_owner_writing_flat_out(
    tmp_path: Path, spawn: Any, watch: str
) -> None:
    path = tmp_path / "q"
    n = 1500
    ledgerq.open(path).close()  # exists before the follower starts
    reader = follower(spawn, path, watch=watch, count=n)
    writer: Child = spawn("produce", str(path), str(n), "2048")
    assert writer.line() == "ready"
    got = records(reader, n)
    assert reader.line() == "done"
    reader.expect_exit(0)
    assert writer.line() == f"wrote {n}"
    writer.send("quit")
    writer.expect_exit(0)
    assert [r["id"] for r in got] == list(range(1, n + 1))
    assert [bytes.fromhex(r["payload"]) for r in got] == [_payload(i) for i in range(1, n + 1)]
    assert len(log_files(path)) > 10


def test_owner_killed_and_reopened_is_followed_across_the_id_jump(
    tmp_path: Path, spawn: Any
) -> None:
    path = tmp_path / "q"
    ledgerq.open(path).close()
    reader = follower(spawn, path, watch=WATCH_MODES[0], count=25)
    writer: Child = spawn("produce", str(path), "20", str(1 << 20))
    assert writer.line() == "ready"
    assert writer.line() == "wrote 20"
    assert [r["id"] for r in records(reader, 20)] == list(range(1, 21))
    writer.kill_and_drain()  # no clean close: the reopen skips the reserved ids
    with ledgerq.open(path) as q:
        ids = [q.enqueue(b"after %d" % i) for i in range(5)]
    assert ids[0] > 21, "a crashed owner resumes past its reserved ids"
    after = records(reader, ids[-1])
    assert [r["id"] for r in after] == ids
    assert reader.line() == "done"
    reader.expect_exit(0)


# ------------------------------------------------------------ positions and timeouts


def test_from_id_starts_in_the_middle(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=300, index_interval=64, sync="never") as q:
        for i in range(1, 41):
            q.enqueue(_payload(i))
        firsts = [int(p.stem) for p in log_files(path)]
        assert len(firsts) > 4
        starts = {1, 2, 17, 39, 40, 41, 1000, *firsts, *(f - 1 for f in firsts[1:])}
        for start in sorted(starts):
            got = follow_all(path, from_id=start)
            assert [m.id for m in got] == list(range(start, 41)), start
            assert [m.payload for m in got] == [_payload(i) for i in range(start, 41)]


def test_timeout_zero_yields_exactly_what_is_there(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=500, sync="never") as q:
        assert follow_all(path) == []
        ids = q.enqueue_batch([_payload(i) for i in range(30)])
        f = ledgerq.follow(path, timeout=0)
        assert [m.id for m in f] == ids
        assert f.closed, "the end of the iteration releases the files"
        assert next(f, None) is None
        assert f.next_id == ids[-1] + 1
        # Resuming from next_id sees only what came later.
        more = q.enqueue(b"later")
        assert [m.id for m in follow_all(path, from_id=f.next_id)] == [more]


def test_timeout_ends_an_idle_follow(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"one")
        with ledgerq.follow(path, timeout=0.05) as f:
            assert [m.payload for m in f] == [b"one"]


def test_follow_works_beside_the_lock_holder_and_changes_nothing(
    tmp_path: Path, spawn: Any
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=400, sync="never") as q:
        ids = q.enqueue_batch([_payload(i) for i in range(25)])
        q.sync()
        with pytest.raises(ledgerq.QueueLockedError):
            ledgerq.open(path)
        before = snapshot(path)
        assert [m.id for m in follow_all(path)] == ids
        for watch in WATCH_MODES:
            child = follower(spawn, path, watch=watch, count=len(ids))
            assert [r["id"] for r in records(child, ids[-1])] == ids
            assert child.line() == "done"
            child.expect_exit(0)
        assert snapshot(path) == before


def test_compressed_payloads_come_back_decompressed(tmp_path: Path) -> None:
    path = tmp_path / "q"
    payloads = [json.dumps({"n": i, "text": "lorem ipsum " * 50}).encode() for i in range(20)]
    with ledgerq.open(path, compression="zstd", compression_min_size=0) as q:
        q.enqueue_batch(payloads)
        assert q.stats().disk_bytes < sum(map(len, payloads)) / 3, "payloads must be compressed"
        assert [m.payload for m in follow_all(path)] == payloads


def test_a_followed_message_keeps_its_group(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"a", group="order-17")
        q.enqueue(b"b")
        assert [(m.payload, m.group) for m in follow_all(path)] == [
            (b"a", "order-17"),
            (b"b", None),
        ]


# ------------------------------------------------------------ bytes written by hand


def _hand_queue(path: Path) -> Path:
    """A closed, empty queue; returns its (empty) newest log file."""
    ledgerq.open(path).close()
    (log,) = log_files(path)
    assert log.stat().st_size == 0
    return log


def _entry(message_id: int, payload: bytes, **kwargs: Any) -> bytes:
    return encode_entry(message_id, time.time_ns(), payload, **kwargs)


@pytest.mark.parametrize(
    ("cut", "watch"),
    [(2, WATCH_MODES[0]), (21, WATCH_MODES[0]), (60, WATCH_MODES[0]), (60, "poll")],
)
def test_incomplete_last_record_is_waited_for(
    tmp_path: Path, spawn: Any, caplog: pytest.LogCaptureFixture, cut: int, watch: str
) -> None:
    path = tmp_path / "q"
    log = _hand_queue(path)
    third = _entry(3, b"p" * 100, headers_blob=encode_headers({"h": "v"}))
    with open(log, "ab") as f:
        f.write(_entry(1, b"one") + _entry(2, b"two") + third[:cut])
    # As it stands, the half-written entry is neither a message nor an error.
    with caplog.at_level(logging.WARNING, logger="ledgerq"):
        assert [m.payload for m in follow_all(path)] == [b"one", b"two"]
    assert not caplog.records
    child = follower(spawn, path, watch=watch, count=3)
    assert [r["id"] for r in records(child, 2)] == [1, 2]
    with open(log, "ab") as f:
        f.write(third[cut:])
    (last,) = records(child, 3)
    assert (bytes.fromhex(last["payload"]), last["headers"]) == (b"p" * 100, {"h": "v"})
    assert child.line() == "done"
    child.expect_exit(0)


def test_reserved_types_and_corrupt_entries_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "q"
    log = _hand_queue(path)
    damaged = bytearray(_entry(3, b"three"))
    damaged[-6] ^= 0x01  # a flipped payload bit: the CRC no longer matches
    with open(log, "ab") as f:
        f.write(_entry(1, b"one"))
        f.write(_entry(2, b"", record_type=RecordType.TOMBSTONE))
        f.write(bytes(damaged))
        f.write(_entry(4, b"four"))
    with caplog.at_level(logging.WARNING, logger="ledgerq"):
        got = follow_all(path)
    assert [(m.id, m.payload) for m in got] == [(1, b"one"), (4, b"four")]
    assert any("corrupt" in r.getMessage() and str(log) in r.getMessage() for r in caplog.records)


def _damaged_length_log(path: Path) -> Path:
    """Entries 1, 2 (its length field damaged to run past the end), 3 and 4."""
    log = _hand_queue(path)
    damaged = bytearray(_entry(2, b"two"))
    struct.pack_into("<I", damaged, 0, 5000)
    with open(log, "ab") as f:
        f.write(_entry(1, b"one") + bytes(damaged) + _entry(3, b"three") + _entry(4, b"four"))
    return log


def test_a_damaged_length_in_the_newest_segment_is_skipped_once_nothing_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An entry running past the end of the newest file may be an append in progress;
    # once the file has not been written to for a while, it is damage, searched past.
    log = _damaged_length_log(tmp_path / "q")
    st = log.stat()
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns - 60 * 10**9))
    with caplog.at_level(logging.WARNING, logger="ledgerq"):
        assert [m.id for m in follow_all(tmp_path / "q")] == [1, 3, 4]
    assert any("corrupt" in r.getMessage() for r in caplog.records)


def test_a_damaged_length_stops_a_waiting_follower_only_briefly(tmp_path: Path) -> None:
    # Just written, the damaged entry looks like an append in progress: the follower
    # waits for it, then (after a grace period) searches past it.
    _damaged_length_log(tmp_path / "q")
    with ledgerq.follow(tmp_path / "q") as f:
        assert [m.id for m in itertools.islice(f, 3)] == [1, 3, 4]


def test_an_incomplete_tail_of_a_sealed_segment_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "q"
    log = _hand_queue(path)
    with open(log, "ab") as f:
        f.write(_entry(1, b"one") + _entry(2, b"two")[:20])
    (path / "segments" / f"{3:020d}.log").write_bytes(_entry(3, b"three"))
    with caplog.at_level(logging.WARNING, logger="ledgerq"):
        assert [m.id for m in follow_all(path)] == [1, 3]
    assert any("corrupt" in r.getMessage() for r in caplog.records)


def _batch(first_id: int, payloads: list[bytes]) -> list[bytes]:
    last = len(payloads) - 1
    return [_entry(first_id + i, p, batch_continues=i < last) for i, p in enumerate(payloads)]


@pytest.mark.parametrize("watch", WATCH_MODES)
def test_a_batch_is_yielded_only_once_its_last_entry_is_written(
    tmp_path: Path, spawn: Any, watch: str
) -> None:
    # The owner's recovery cuts a batch whose end is missing: none of it may be yielded.
    path = tmp_path / "q"
    log = _hand_queue(path)
    batch = _batch(2, [b"b2", b"b3", b"b4"])
    with open(log, "ab") as f:
        f.write(_entry(1, b"one") + batch[0] + batch[1])
    with ledgerq.follow(path, timeout=0) as f:
        assert [m.id for m in f] == [1]
        assert f.next_id == 2  # resuming there reads the batch again
    child = follower(spawn, path, watch=watch, count=5)
    assert [r["id"] for r in records(child, 1)] == [1]
    with open(log, "ab") as f:
        f.write(batch[2] + _entry(5, b"five"))
    assert [bytes.fromhex(r["payload"]) for r in records(child, 5)] == [
        b"b2",
        b"b3",
        b"b4",
        b"five",
    ]
    assert child.line() == "done"
    child.expect_exit(0)


def test_an_incomplete_batch_at_the_end_of_a_sealed_segment_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "q"
    log = _hand_queue(path)
    with open(log, "ab") as f:
        f.write(_entry(1, b"one") + b"".join(_batch(2, [b"b2", b"b3", b"b4"])[:2]))
    (path / "segments" / f"{5:020d}.log").write_bytes(_entry(5, b"five"))
    assert [m.id for m in follow_all(path)] == [1, 5]


# ------------------------------------------------------------ failing fast


@pytest.mark.parametrize(
    ("action", "watch"),
    [
        ("truncate", WATCH_MODES[0]),
        ("truncate", "poll"),
        ("delete", WATCH_MODES[0]),
        ("replace", WATCH_MODES[0]),
    ],
)
def test_losing_the_followed_file_raises(
    tmp_path: Path, spawn: Any, action: str, watch: str
) -> None:
    path = tmp_path / "q"
    log = _hand_queue(path)
    first = _entry(1, b"one")
    with open(log, "ab") as f:
        f.write(first + _entry(2, b"two") + _entry(3, b"three"))
    child = follower(spawn, path, watch=watch)
    assert [r["id"] for r in records(child, 3)] == [1, 2, 3]
    if action == "truncate":
        os.truncate(log, len(first) + 5)
        expected = "truncated"
    elif action == "delete":
        log.unlink()
        expected = "deleted"
    else:
        copy = log.with_suffix(".copy")
        copy.write_bytes(log.read_bytes())
        os.replace(copy, log)
        expected = "replaced"
    report = child.line()
    assert report.startswith("error CorruptionError"), report
    assert expected in report and str(log) in report, report
    child.expect_exit(0)


def test_retention_behind_the_follower_is_fine_but_unread_deleted_data_raises(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=1, sync="never") as q:  # one message per segment
        ids = [q.enqueue(b"m%d" % i) for i in range(4)]
        with ledgerq.follow(path) as f:
            assert next(f).id == ids[0]
            # The owner consumes message 1: retention deletes its segment, which the
            # follower is still in (it has not seen its end yet).  Nothing is lost.
            msg = q.dequeue()
            assert msg is not None
            q.ack(msg.id)
            assert not (path / "segments" / f"{ids[0]:020d}.log").exists()
            assert next(f).id == ids[1]
            # Now retention deletes segment 3 before the follower could read it.
            for _ in range(2):
                msg = q.dequeue()
                assert msg is not None
                q.ack(msg.id)
            with pytest.raises(ledgerq.CorruptionError, match="deleted"):
                next(f)
            assert f.closed


def test_follower_finishes_a_segment_deleted_under_it(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=200, sync="never") as q:
        ids = q.enqueue_batch([b"x" * 50 for _ in range(4)])  # one segment of four
        tail = q.enqueue(b"next segment")
        with ledgerq.follow(path, timeout=0) as f:
            assert next(f).id == ids[0]
            got = q.dequeue_batch(4)
            for m in got:
                q.ack(m.id)
            assert not (path / "segments" / f"{ids[0]:020d}.log").exists()
            assert [m.id for m in f] == [*ids[1:], tail]


# ------------------------------------------------------------ the object


def test_bad_arguments_and_missing_queues(tmp_path: Path) -> None:
    with pytest.raises(ledgerq.NotAQueueError, match="does not exist"):
        ledgerq.follow(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ledgerq.NotAQueueError):
        ledgerq.follow(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(ledgerq.NotAQueueError, match="not a ledgerq queue"):
        ledgerq.follow(tmp_path / "other")
    ledgerq.open(tmp_path / "q").close()
    with pytest.raises(ValueError, match="from_id"):
        ledgerq.follow(tmp_path / "q", from_id=0)
    with pytest.raises(TypeError):
        ledgerq.follow(tmp_path / "q", from_id="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        ledgerq.follow(tmp_path / "q", timeout=-1)
    with pytest.raises(ValueError, match="watch"):
        ledgerq.follow(tmp_path / "q", watch="sometimes")  # type: ignore[arg-type]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("watch", WATCH_MODES)
def test_no_file_descriptor_is_leaked(tmp_path: Path, watch: str) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=100, sync="never") as q:
        q.enqueue_batch([b"a" * 60 for _ in range(5)])
        before = len(os.listdir("/proc/self/fd"))
        with ledgerq.follow(path, watch=watch) as f:  # type: ignore[arg-type]
            assert f.watch == watch
            next(f)
            assert len(os.listdir("/proc/self/fd")) > before
        assert len(os.listdir("/proc/self/fd")) == before
        assert f.closed and next(f, None) is None
        f.close()  # idempotent
        f = ledgerq.follow(path, timeout=0, watch=watch)  # type: ignore[arg-type]
        assert len(list(f)) == 5  # exhausting it closes it
        assert len(os.listdir("/proc/self/fd")) == before
        with pytest.raises(ledgerq.NotAQueueError):
            ledgerq.follow(tmp_path / "nope", watch=watch)  # type: ignore[arg-type]
        assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("watch", WATCH_MODES)
def test_watchers_report_changes_to_matching_names_only(tmp_path: Path, watch: str) -> None:
    kind = InotifyWatcher if watch == "inotify" else PollingWatcher
    with kind(str(tmp_path), suffix=".log") as watcher:
        assert watcher.wait(0) is False
        (tmp_path / "a.idx").write_bytes(b"x")
        assert watcher.wait(0) is False, "other names are not watched"
        (tmp_path / "a.log").write_bytes(b"")
        assert watcher.wait(0) is True
        assert watcher.wait(0) is False, "a change is reported once"
        with open(tmp_path / "a.log", "ab") as f:
            f.write(b"more")
        assert watcher.wait(None) is True
        (tmp_path / "a.log").unlink()
        assert watcher.wait(None) is True


if __name__ == "__main__":
    modes = {"follow": _child_follow, "produce": _child_produce}
    modes[sys.argv[1]](*sys.argv[2:])
