"""A full disk must not lock the user out (issue 15 item 7).

With the disk 100% full, ``open`` (and so ``ledgerq stats``, ``peek``, ``dequeue``)
failed writing an index file or ``meta.json``: nobody could drain the queue to free
space.  Open now works read-mostly - index rewrites and the id reservation wait - and
acks work on a 100% full disk through the queue's disk reserve (docs/reliability.md,
"A full disk"): a drain goes on until retention deletes segments and enqueues work
again.  Every disk here is a real tmpfs filled to its last byte.

On a read-only file system ``open`` fails on ``LOCK``: ``stats``, ``peek`` and ``dump``
read the queue without its lock there and say so, and ``verify --repair`` says it could
not run instead of "ok after repair".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerq
from tests.cli._run import run
from tests.realfs import SmallDisk, crash_child, drain_until_enqueue_works, fill_with_messages


def _fill_with_messages(path: Path, disk: SmallDisk, **options: object) -> list[int]:
    """Enqueue 1 KB messages until the disk refuses, then fill the rest with ballast."""
    q = ledgerq.open(path, **options)  # type: ignore[arg-type]
    ids = fill_with_messages(q, disk)
    q.close()  # on the full disk: a close raised there too, before
    return ids


def test_the_commands_work_on_a_full_disk(small_disk: SmallDisk) -> None:
    # Before: every one of them exited 1 with "could not write .../<first-id>.idx".
    path = small_disk.path / "q"
    ids = _fill_with_messages(path, small_disk, segment_size=512 * 1024)
    stats = run("stats", path, "--json")
    assert stats.code == 0, stats
    assert stats.json()["pending"] == len(ids)
    peek = run("peek", path, "-n", "2", "--json")
    assert peek.code == 0, peek
    assert [m["id"] for m in peek.json_lines()] == ids[:2]
    dequeue = run("dequeue", path, "-n", "3")
    assert dequeue.code == 0, dequeue
    assert dequeue.stdout == b"x" * 1000 + b"\n" + b"x" * 1000 + b"\n" + b"x" * 1000 + b"\n"
    assert run("stats", path, "--json").json()["pending"] == len(ids) - 3
    # The commands open the queue shared (they run beside live applications): the first
    # shared open wrote the state page's block into the room of the disk reserve, and
    # nothing else was freed.
    assert small_disk.free_bytes() < 32 * 1024


def test_a_full_disk_is_drained_until_enqueues_work_again(small_disk: SmallDisk) -> None:
    path = small_disk.path / "q"
    ids = _fill_with_messages(path, small_disk, segment_size=256 * 1024)
    with ledgerq.open(path) as q:
        segments = q.stats().segments
        assert segments > 3
        with pytest.raises(ledgerq.StorageError, match="No space left"):
            q.enqueue(b"refused")  # nothing written: the last space is for acks
        assert q.stats().pending == len(ids)
        drained: list[int] = []
        new_id = drain_until_enqueue_works([q], q, drained)
        assert q.stats().segments < segments  # retention deleted what the acks consumed
        assert new_id > ids[-1]
    with ledgerq.open(path) as q:
        rest = [m.id for m in q.dequeue_batch(len(ids) + 1)]
    assert drained + rest == [*ids, new_id]


def test_a_crashed_queue_reopens_on_a_full_disk(small_disk: SmallDisk) -> None:
    # After a crash the next open starts a new segment past the ids reserved before it
    # (never reused): on a disk with no free page, that new file takes the reserve's room.
    path = small_disk.path / "q"
    [[ids]] = crash_child(
        small_disk.path,
        """
        q = ledgerq.open(ARGS["queue"], segment_size=256 * 1024)
        report(fill_with_messages(q, disk))
        """,
        queue=str(path),
    )
    assert small_disk.is_full()
    with ledgerq.open(path) as q:
        assert [m.id for m in q.peek(len(ids) + 1)] == ids
        message = q.dequeue()
        assert message is not None
        q.ack(message.id)
    assert run("stats", path, "--json").json()["pending"] == len(ids) - 1


def test_an_enqueue_refused_for_the_reserve_writes_nothing(small_disk: SmallDisk) -> None:
    path = small_disk.path / "q"
    with ledgerq.open(path, dedup_window=60.0) as q:
        first = q.enqueue(b"first", dedup_id="a")
        (path / "reserve").unlink()  # spent (as after acks on a full disk)
        q._make_room()
        ballast = small_disk.fill(leave_bytes=16 * 1024)  # room, but less than the reserve
        assert ballast > 0
        with pytest.raises(ledgerq.StorageError, match="kept for acks"):
            q.enqueue(b"second", dedup_id="b")
        with pytest.raises(ledgerq.StorageError, match="kept for acks"):
            q.enqueue_batch([b"third", b"fourth"])
        assert q.stats().next_id == first + 1
        assert [m.payload for m in q.peek(5)] == [b"first"]
        small_disk.free()
        assert q.enqueue(b"second", dedup_id="b") == first + 1  # the dedup id was not kept
        assert (path / "reserve").stat().st_size > 0  # written again


# ---------------------------------------------------------------------- read-only


@pytest.fixture
def read_only_queue(small_disk: SmallDisk) -> Iterator[tuple[Path, ledgerq.Stats]]:
    """A queue with acked, dead-lettered, nacked and leased messages, on a disk then
    remounted read-only; with its stats as a reopen showed them before the remount."""
    path = small_disk.path / "q"
    with ledgerq.open(path, max_retries=2) as q:
        q.enqueue_batch([b"m%d" % i for i in range(10)])
        q.reader("audit")
        first = q.dequeue()
        assert first is not None
        q.ack(first.id)
        for _ in range(2):  # the second failure moves it to the DLQ
            failing = q.dequeue()
            assert failing is not None
            q.nack(failing.id, "bad")
        assert q.dequeue() is not None  # leased at close: delivered again after a reopen
    with ledgerq.open(path) as q:
        expected = q.stats()
    small_disk.remount(read_only=True)
    try:
        yield path, expected
    finally:
        small_disk.remount(read_only=False)


def test_stats_peek_and_dump_work_on_a_read_only_disk(
    read_only_queue: tuple[Path, ledgerq.Stats],
) -> None:
    # Before: stats and peek failed with "could not open the lock file ...: Read-only
    # file system".
    path, expected = read_only_queue
    with pytest.raises(ledgerq.StorageError, match="Read-only file system"):
        ledgerq.open(path)
    stats = run("stats", path, "--json")
    assert stats.code == 0, stats
    got = stats.json()
    assert "read without its lock" in got["read_without_lock"]
    for field in ("pending", "in_flight", "enqueued", "acked", "nacked", "dead_lettered"):
        assert got[field] == getattr(expected, field), field
    assert got["next_id"] == expected.next_id
    assert got["dlq"] == 1
    assert got["readers"]["audit"]["pending"] == expected.readers["audit"].pending
    text = run("stats", path)
    assert text.code == 0 and "read without its lock" in text.out, text
    peek = run("peek", path, "-n", "3", "--json")
    assert peek.code == 0, peek
    assert "read without its lock" in peek.err
    assert [(m["payload"], m["attempts"]) for m in peek.json_lines()] == [
        ("m2", 2),  # its lease was lost at close: its second delivery comes next
        ("m3", 1),
        ("m4", 1),
    ]
    dump = run("dump", path)
    assert dump.code == 0 and len(dump.json_lines()) == 10, dump
    assert "read-only" in dump.err


def test_repair_on_a_read_only_disk_says_it_did_not_run(
    read_only_queue: tuple[Path, ledgerq.Stats],
) -> None:
    # Before: "ok: ... after repair", exit 0, though the repair could not open the queue.
    path, _ = read_only_queue
    result = run("verify", path, "--repair")
    assert result.code == 1, result
    assert "after repair" not in result.out
    assert "not repaired: could not open the queue" in result.out
    assert "Read-only file system" in result.out
    as_json = run("verify", path, "--repair", "--json")
    assert as_json.code == 1
    assert as_json.json()["repaired"] is False
    assert as_json.json()["not_done"]
