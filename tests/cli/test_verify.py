"""``ledgerq verify`` and ``verify --repair`` on healthy and damaged queues."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import ledgerq
from ledgerq.format.entry import encode_entry

from ._run import ok, run

PAYLOAD = b"." * 60


def _build(path: Path, count: int = 40, **options: object) -> None:
    with ledgerq.open(path, segment_size=1024, **options) as q:
        for i in range(count):
            q.enqueue(b"message %03d " % i + PAYLOAD)


def _logs(path: Path) -> list[Path]:
    return sorted((path / "segments").glob("*.log"))


def _fingerprint(path: Path) -> dict[str, str]:
    return {
        str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(path.rglob("*"))
        if f.is_file()
    }


def test_healthy_queue_verifies_without_writing_or_locking(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q, max_retries=1)
    with ledgerq.open(q, max_retries=1) as queue:  # make a DLQ, so it is checked too
        message = queue.dequeue()
        assert message is not None
        queue.nack(message.id, "boom")
    before = _fingerprint(q)
    with ledgerq.open(q):
        # The queue is open (locked) in this process: verify runs beside it.
        result = ok("verify", q)
    assert result.out.startswith("ok: ")
    assert result.stderr == b""  # no progress bar when stderr is not a terminal
    report = ok("verify", q, "--json").json()
    assert report["ok"] is True and report["problems"] == []
    assert report["entries"] == 40 + 1 and report["segments"] >= 4
    assert len(report["queues"]) == 2  # the queue and its dead-letter queue
    assert _fingerprint(q) == before  # the lock file aside, verify wrote nothing


def test_flipped_byte_and_torn_tail_are_found_and_the_tail_repaired(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    logs = _logs(q)
    assert len(logs) >= 3
    sealed = logs[0]
    data = bytearray(sealed.read_bytes())
    (size,) = struct.unpack_from("<I", data, 0)
    flipped_offset = 2 * size  # the third entry of the first (sealed) segment: id 3
    data[flipped_offset + 30] ^= 0xFF
    sealed.write_bytes(bytes(data))
    newest = logs[-1]
    good_size = newest.stat().st_size
    torn = encode_entry(10**6, 0, b"never finished")[:20]
    with newest.open("ab") as f:
        f.write(torn)

    found = run("verify", q)
    assert found.code == 1, found
    assert "Traceback" not in found.err
    assert f"{sealed.name}:{flipped_offset}: corrupt-entry" in found.out
    assert f"{newest.name}:{good_size}: torn-tail" in found.out
    assert "2 problems" in found.out
    report = run("verify", q, "--json").json()
    kinds = {(p["kind"], Path(p["file"]).name, p["offset"]) for p in report["problems"]}
    assert kinds == {
        ("corrupt-entry", sealed.name, flipped_offset),
        ("torn-tail", newest.name, good_size),
    }
    assert newest.stat().st_size == good_size + len(torn)  # verify alone changed nothing

    repaired = run("verify", q, "--repair", "--json")
    assert repaired.code == 1  # the flipped entry cannot be repaired: still reported
    result = repaired.json()
    assert [p["kind"] for p in result["fixed"]] == ["torn-tail"]
    assert [(p["kind"], p["offset"]) for p in result["problems"]] == [
        ("corrupt-entry", flipped_offset)
    ]
    assert any("truncating" in action for action in result["repairs"])
    assert newest.stat().st_size == good_size

    again = run("verify", q)
    assert again.code == 1 and "torn-tail" not in again.out and "corrupt-entry" in again.out
    # Nothing good was deleted: every message but the flipped one is still there.
    dumped = [m["id"] for m in ok("dump", q).json_lines()]
    assert dumped == [i for i in range(1, 41) if i != 3]
    with ledgerq.open(q) as queue:
        payloads = [m.payload for m in queue.dequeue_batch(100)]
    assert payloads == [b"message %03d " % i + PAYLOAD for i in range(40) if i != 2]


def test_bad_indexes_and_reader_state_are_reported_and_indexes_rebuilt(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q, index_interval=200)
    indexes = sorted((q / "segments").glob("*.idx"))
    with indexes[0].open("r+b") as f:
        f.seek(12 + 24 + 16)  # the offset of the second point
        f.write(struct.pack("<Q", 5))
    indexes[1].unlink()
    state = q / "readers" / "default.state"
    state.write_bytes(state.read_bytes() + b"\x30\x00\x00\x00\x03torn")

    found = run("verify", q)
    assert found.code == 1
    assert f"{indexes[0].name}:36: index:" in found.out
    assert f"{indexes[1].name}: index: missing" in found.out
    assert "default.state:" in found.out and "reader-state-tail" in found.out

    repaired = run("verify", q, "--repair")
    assert repaired.code == 0, repaired
    assert repaired.out.count("fixed: ") == 3
    assert f"rebuilt {q / 'segments' / indexes[0].name}" in repaired.out
    assert ok("verify", q).out.startswith("ok: ")
    assert [m["id"] for m in ok("dump", q).json_lines()] == list(range(1, 41))


def test_verify_reports_a_queue_it_cannot_open(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q, count=3)
    state = q / "readers" / "default.state"
    with ledgerq.open(q) as queue:
        message = queue.dequeue()
        assert message is not None
        queue.ack(message.id)
        journal = bytearray(state.read_bytes())  # CHECKPOINT, LEASE, ACK (before close)
    journal[12] ^= 0x01  # damage the checkpoint, with valid records after it
    state.write_bytes(bytes(journal))
    found = run("verify", q, "--json")
    assert found.code == 1
    problems = found.json()["problems"]
    assert [(p["kind"], p["offset"]) for p in problems] == [("reader-state", 8)]
    repaired = run("verify", q, "--repair")
    assert repaired.code == 1  # the queue refuses to open: nothing is thrown away
    assert "could not open the queue" in repaired.out
    assert state.read_bytes() == bytes(journal)


def test_repair_keeps_the_stored_options(tmp_path: Path) -> None:
    q = tmp_path / "q"
    stored = {"priorities": True, "max_retries": 0, "dedup_window": 60.0, "compression": "zstd"}
    with ledgerq.open(q, **stored) as queue:
        queue.enqueue(b"low", priority=ledgerq.Priority.LOW)
        queue.enqueue(b"high", priority=ledgerq.Priority.HIGH, dedup_id="h")
    ok("verify", q, "--repair")
    with ledgerq.open(q) as queue:
        for name, value in stored.items():
            assert getattr(queue.options, name) == value, name
        assert queue.enqueue(b"again", dedup_id="h") == 2  # the window is remembered
        message = queue.dequeue()
        assert message is not None and message.payload == b"high"  # priority order kept
