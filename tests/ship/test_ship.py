"""``ledgerq.ship``: byte-exact, CRC-verified, resumable copies of a live queue.

Producers and killed shippers run as child processes (``_child.py``, through
``tests._child``), synchronised only through their output: the test acts when it has
read a given line.  Every child is reaped, and a watchdog kills one that hangs.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import ledgerq
from ledgerq.ship import ShipError, Shipper, durable_reader_heads, ship_queue
from ledgerq.tools import verify
from tests._child import Child, Children
from tests.cli._run import environment, fails, ok

CHILD = Path(__file__).with_name("_child.py")
WATCHDOG_SECONDS = 60.0


@pytest.fixture
def child(children: Children) -> Callable[..., Child]:
    """Start ``_child.py ARGS`` (or ``python COMMAND``), always reaped; use it in a ``with``."""

    def start(*args: str | Path | int, command: list[str] | None = None) -> Child:
        argv = command or [str(CHILD), *(str(a) for a in args)]
        return children.start(argv, env=environment(), watchdog_seconds=WATCHDOG_SECONDS)

    return start


def logs(queue_dir: Path) -> dict[str, bytes]:
    """The segment logs of a queue, by file name."""
    segments = queue_dir / "segments"
    return {p.name: p.read_bytes() for p in sorted(segments.glob("*.log"))}


def messages(queue_dir: Path) -> list[tuple[int, bytes, dict[str, str]]]:
    with ledgerq.follow(queue_dir, timeout=0) as found:
        return [(m.id, m.payload, m.headers) for m in found]


def assert_same(src: Path, dest: Path) -> None:
    """The destination holds every segment of the source, byte for byte, and checks out."""
    assert logs(dest) == logs(src)
    report = verify(dest)
    assert report.ok, report.problems
    assert messages(dest) == messages(src)
    assert not list((dest / "segments").glob("*.tmp"))


def fill(q: ledgerq.Queue, count: int, start: int = 1) -> None:
    for i in range(start, start + count):
        q.enqueue(b"payload-%d " % i * (1 + i % 13), headers={"n": str(i)})


# ---------------------------------------------------------------------- copies


def test_the_copy_is_byte_exact_and_a_readable_queue(tmp_path: Path) -> None:
    src = tmp_path / "orders"
    with ledgerq.open(src, segment_size=3000, index_interval=256, compression="zstd") as q:
        fill(q, 150)
        q.enqueue(b"z" * 5000, ttl=3600, priority=ledgerq.Priority.HIGH)  # compressed
        report = ship_queue(src, tmp_path / "hub", "edge-1")
    dest = tmp_path / "hub" / "edge-1.orders"
    assert report.dest == str(dest)
    assert (report.messages, report.last_id, report.corrupt) == (151, 151, ())
    assert report.segments == len(logs(src)) > 3
    assert_same(src, dest)
    meta = json.loads((dest / "meta.json").read_text())
    assert (meta["format"], meta["next_id"], meta["clean"]) == ("ledgerq", 152, True)
    assert meta["options"]["compression"] == "zstd"
    state = json.loads((dest / "ship.json").read_text())
    assert (state["client_id"], state["queue"]) == ("edge-1", "orders")
    with ledgerq.open(dest) as hub:
        got = hub.dequeue_batch(200)
        assert [m.payload for m in got] == [p for _, p, _ in messages(src)]
        assert got[-1].priority == ledgerq.Priority.HIGH
        assert got[-1].expires_at == got[-1].timestamp + 3600 * 10**9  # ttl=3600


def test_sealed_segments_are_copied_once_and_runs_are_idempotent(tmp_path: Path) -> None:
    src = tmp_path / "q"
    hub = tmp_path / "hub"
    dest = hub / "c.q"
    with ledgerq.open(src, segment_size=2000) as q:
        fill(q, 60)
        ship_queue(src, hub, "c")
        sealed = sorted((dest / "segments").glob("*.log"))[:-1]
        before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sealed}
        again = ship_queue(src, hub, "c")
        assert (again.messages, again.bytes, again.segments) == (0, 0, 0)
        fill(q, 40, start=61)
        more = ship_queue(src, hub, "c")
        assert more.messages == 40 and more.last_id == 100
        after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sealed}
        assert after == before
        assert_same(src, dest)


def test_an_empty_queue_ships_to_an_empty_readable_queue(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q"):
        pass
    report = ship_queue(tmp_path / "q", tmp_path / "hub", "c")
    assert (report.messages, report.last_id) == (0, 0)
    with ledgerq.open(tmp_path / "hub" / "c.q") as hub:
        assert len(hub) == 0


def test_a_killed_shipper_resumes_and_never_shows_half_a_file(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    src = tmp_path / "big"
    with ledgerq.open(src, segment_size=1 << 20, sync="never") as q:
        for i in range(400):
            q.enqueue(bytes([i % 251]) * 16_000, headers={"n": str(i)})
    source = logs(src)
    newest = max(source)
    dest = tmp_path / "hub" / "c.big"
    interrupted = 0
    for kill_after in (1, 3, 7, 12, 20):  # progress reports of this run (one per 64 KiB)
        with child("ship", src, tmp_path / "hub", "c", 64 * 1024) as shipper:
            for _ in range(kill_after):
                shipper.wait_for("progress")
            shipper.kill()
            assert shipper.finish() == -signal.SIGKILL
        # Whatever the kill interrupted: a sealed source segment is at the hub whole or
        # not at all, and the live one's copy is a prefix of it.
        for name, data in logs(dest).items():
            if name == newest:
                assert source[name].startswith(data)
            else:
                assert data == source[name], name
        interrupted += logs(dest) != source
    assert interrupted >= 3
    report = ship_queue(src, tmp_path / "hub", "c")
    assert report.last_id == 400 and report.messages > 0
    assert_same(src, dest)


def test_a_torn_tail_left_by_a_killed_append_is_cut_and_shipped_again(tmp_path: Path) -> None:
    src = tmp_path / "q"
    with ledgerq.open(src, segment_size=1 << 20) as q:
        fill(q, 30)
        ship_queue(src, tmp_path / "hub", "c")
        fill(q, 5, start=31)
        dest_log = sorted((tmp_path / "hub" / "c.q" / "segments").glob("*.log"))[-1]
        source_bytes = (src / "segments" / dest_log.name).read_bytes()
        shipped = dest_log.stat().st_size
        with open(dest_log, "ab") as f:  # half of the next entry, as a killed write leaves
            f.write(source_bytes[shipped : shipped + 20])
        report = ship_queue(src, tmp_path / "hub", "c")
        assert report.messages == 5
        assert_same(src, tmp_path / "hub" / "c.q")


def test_a_batch_is_shipped_only_once_its_last_entry_is_written(tmp_path: Path) -> None:
    src = tmp_path / "q"
    with ledgerq.open(src, segment_size=1 << 20) as q:
        fill(q, 3)
        q.enqueue_batch([b"b4", b"b5", b"b6"])
    (log,) = (src / "segments").glob("*.log")
    with open(log, "r+b") as f:  # the batch's last entry not written yet (or never)
        f.truncate(log.stat().st_size - len(b"b6") - 26)
    report = ship_queue(src, tmp_path / "hub", "c")
    assert (report.messages, report.last_id) == (3, 3)
    with ledgerq.open(src) as q:  # the owner's recovery cuts the incomplete batch
        assert [m.id for m in q.peek(10)] == [1, 2, 3]
        q.enqueue(b"after")
    ship_queue(src, tmp_path / "hub", "c")
    assert_same(src, tmp_path / "hub" / "c.q")


def test_shipping_beside_a_concurrent_writer(tmp_path: Path, child: Callable[..., Child]) -> None:
    src = tmp_path / "live"
    hub = tmp_path / "hub"
    with child("produce", src, 1500, 4096) as producer:
        producer.wait_for("ready")
        shipped = []
        while True:
            line = producer.line()
            if line == "done":
                break
            shipped.append(ship_queue(src, hub, "edge").last_id)
        final = ship_queue(src, hub, "edge")
        assert final.last_id == 1500
        assert shipped == sorted(shipped)
        assert_same(src, hub / "edge.live")
        producer.send("close")
        assert producer.finish() == 0


def test_follow_mode_keeps_shipping_until_stopped(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    src = tmp_path / "live"
    hub = tmp_path / "hub"
    with child("produce", src, 600, 2048) as producer:
        producer.wait_for("ready")
        seen: list[int] = []
        stop = threading.Event()

        def on_pass(report: object) -> None:
            last = report.last_id  # type: ignore[attr-defined]
            seen.append(last)
            if last == 600:
                stop.set()

        result: list[object] = []
        shipper = threading.Thread(
            target=lambda: result.append(
                ship_queue(src, hub, "edge", follow=True, stop=stop, on_pass=on_pass)
            )
        )
        shipper.start()
        producer.wait_for("done")
        shipper.join(timeout=WATCHDOG_SECONDS)
        assert not shipper.is_alive()
        assert seen[-1] == 600 and seen == sorted(seen)
        assert_same(src, hub / "edge.live")
        producer.send("close")
        assert producer.finish() == 0


def test_follow_mode_stops_after_the_idle_timeout(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        fill(q, 3)
        report = ship_queue(tmp_path / "q", tmp_path / "hub", "c", follow=True, timeout=0)
    assert report.last_id == 3


# ---------------------------------------------------------------------- deleting


def test_delete_shipped_waits_for_every_reader(tmp_path: Path) -> None:
    src = tmp_path / "q"
    hub = tmp_path / "hub"
    with ledgerq.open(src, segment_size=1500, retention_max_age=3600) as q:
        fill(q, 100)
        slow = q.reader("slow")
        for message in q.dequeue_batch(80):
            q.ack(message.id)
        q.sync()
        shipped = logs(src)
        report = ship_queue(src, hub, "c", delete_shipped=True)
        assert report.deleted_segments == 0  # "slow" has read nothing
        for message in slow.dequeue_batch(40):
            slow.ack(message.id)
        q.sync()
        heads = durable_reader_heads(src)
        assert heads == {"default": 81, "slow": 41}
        report = ship_queue(src, hub, "c", delete_shipped=True)
        assert report.deleted_segments > 0
        left = logs(src)
        deleted = sorted(set(shipped) - set(left))
        assert deleted == sorted(shipped)[: len(deleted)]  # oldest first
        dest = logs(hub / "c.q")
        for name in deleted:
            assert dest[name] == shipped[name]  # every deleted byte is at the hub
        # What is left still holds id 41 (the slow reader's next message) and more.
        assert int(min(left).split(".")[0]) <= 41
        assert max(shipped) in left  # never the active segment
        # The owner goes on undisturbed.
        fill(q, 10, start=101)
        assert slow.dequeue_batch(100)[0].headers["n"] == "41"
    with ledgerq.open(src) as q:  # and reopens fine
        assert len(q) == 30


def test_delete_shipped_never_deletes_what_is_not_shipped(tmp_path: Path) -> None:
    src = tmp_path / "q"
    hub = tmp_path / "hub"
    with ledgerq.open(src, segment_size=1500, retention_max_age=3600) as q:
        fill(q, 40)
        ship_queue(src, hub, "c")
        shipped = set(logs(src))
        fill(q, 60, start=41)  # the rest of the then-active segment, and new ones
        for message in q.dequeue_batch(100):
            q.ack(message.id)
        q.sync()
        before = set(logs(src))
        shipper = Shipper(src, hub, "c")
        shipper.open()
        try:
            deleted, _ = shipper.delete_shipped()  # no pass: only earlier copies count
        finally:
            shipper.close()
        left = set(logs(src))
        assert deleted == len(before - left) > 0
        assert before - shipped <= left  # nothing that was never shipped
        assert max(shipped) in left  # nor the segment shipped only in part
        assert before - left < shipped


def test_delete_shipped_does_nothing_when_a_reader_state_is_damaged(tmp_path: Path) -> None:
    src = tmp_path / "q"
    with ledgerq.open(src, segment_size=1500, retention_max_age=3600) as q:
        fill(q, 60)
        for message in q.dequeue_batch(60):
            q.ack(message.id)
    state = src / "readers" / "default.state"
    data = bytearray(state.read_bytes())
    data[12] ^= 0xFF  # inside the first record
    state.write_bytes(bytes(data) + bytes(state.read_bytes()[8:]))
    before = logs(src)
    report = ship_queue(src, tmp_path / "hub", "c", delete_shipped=True)
    assert report.deleted_segments == 0
    assert any("damaged" in note for note in report.notes)
    assert logs(src) == before


def test_segments_the_owner_deleted_before_they_were_shipped_are_reported(
    tmp_path: Path,
) -> None:
    src = tmp_path / "q"
    with ledgerq.open(src, segment_size=1500) as q:  # default retention: delete when consumed
        fill(q, 20)
        ship_queue(src, tmp_path / "hub", "c")
        fill(q, 60, start=21)
        for message in q.dequeue_batch(100):
            q.ack(message.id)  # the owner deletes every consumed sealed segment
        report = ship_queue(src, tmp_path / "hub", "c")
    assert report.last_id == 80
    assert any("not at the source" in note for note in report.notes)
    shipped = {m[0] for m in messages(tmp_path / "hub" / "c.q")}
    assert {1, 20, 80} <= shipped and len(shipped) < 80


# ---------------------------------------------------------------------- errors


def test_the_destination_is_locked_and_must_be_this_sources(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a" / "q") as q:
        fill(q, 3)
    with ledgerq.open(tmp_path / "b" / "q") as q:  # same name, another queue
        fill(q, 3)
    hub = tmp_path / "hub"
    holder = Shipper(tmp_path / "a" / "q", hub, "c")
    holder.open()
    try:
        with pytest.raises(ledgerq.QueueLockedError):
            ship_queue(tmp_path / "a" / "q", hub, "c")
    finally:
        holder.close()
    with pytest.raises(ShipError, match="another queue"):
        ship_queue(tmp_path / "b" / "q", hub, "c")
    assert ship_queue(tmp_path / "b" / "q", hub, "d").last_id == 3
    for bad in ("a.b", "", "x/y", "a\n"):
        with pytest.raises(ShipError, match="client id"):
            ship_queue(tmp_path / "a" / "q", hub, bad)
    with pytest.raises(ledgerq.NotAQueueError):
        ship_queue(tmp_path / "nothing", hub, "c")


def test_damage_in_the_source_is_copied_as_it_is_and_reported(tmp_path: Path) -> None:
    src = tmp_path / "q"
    with ledgerq.open(src, segment_size=4000, index_interval=100) as q:
        fill(q, 60)
    first = sorted((src / "segments").glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x55  # a bit flip inside one entry of a sealed segment
    first.write_bytes(bytes(data))
    report = ship_queue(src, tmp_path / "hub", "c")
    assert len(report.corrupt) == 1 and report.corrupt[0][0] == first.name
    assert logs(tmp_path / "hub" / "c.q") == logs(src)
    assert messages(tmp_path / "hub" / "c.q") == messages(src)


# ---------------------------------------------------------------------- command line


def test_the_ship_command(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=2000) as q:
        fill(q, 50)
    first = ok("ship", tmp_path / "q", tmp_path / "hub", "--client-id", "edge")
    assert "shipped 50 messages" in first.out and "last id 50" in first.out
    again = ok("ship", tmp_path / "q", tmp_path / "hub", "--client-id", "edge", "--json").json()
    assert (again["messages"], again["last_id"]) == (0, 50)
    assert_same(tmp_path / "q", tmp_path / "hub" / "edge.q")
    fails("ship", tmp_path / "missing", tmp_path / "hub", "--client-id", "edge", code=1)
    fails("ship", tmp_path / "q", tmp_path / "hub", "--client-id", "a.b", code=1)


def test_the_ship_command_follows_until_terminated(
    tmp_path: Path, child: Callable[..., Child]
) -> None:
    src = tmp_path / "live"
    command = [
        "-m",
        "ledgerq.cli",
        "ship",
        str(src),
        str(tmp_path / "hub"),
        "--client-id",
        "edge",
        "--follow",
        "--json",
    ]
    with ledgerq.open(src, segment_size=2048) as q:
        fill(q, 10)
        with child(command=command) as shipper:
            assert json.loads(shipper.line())["last_id"] == 10
            fill(q, 90, start=11)
            while json.loads(shipper.line())["last_id"] < 100:
                pass
            shipper.signal(signal.SIGTERM)
            assert shipper.finish() == 143
        assert_same(src, tmp_path / "hub" / "edge.live")
