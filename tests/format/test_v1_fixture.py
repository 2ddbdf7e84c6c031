"""A queue written by a format-1 ledgerq: opened, read, appended to and verified.

``fixtures/v1_queue`` was written by ``make_v1_fixture.py`` with the code of main before
format 2 (every record type of format 1: entries with every optional field, batches,
two segments, reader journals with every record type, the dedup and retry logs, a DLQ).
Each test works on a copy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerq
from ledgerq.format import CorruptRecord, decode_entry, peek_length
from ledgerq.format.feature_state import FEATURE_FILE_HEADER
from ledgerq.format.reader_state import STATE_FILE_HEADER

FIXTURE = Path(__file__).with_name("fixtures") / "v1_queue"  # left as a killed process leaves it
CLEAN = FIXTURE.with_name("v1_clean")  # closed cleanly: its newest segment gets appended to
EMPTY = FIXTURE.with_name("v1_empty")  # no message: tests/core/test_behaviour.py's "format-1"


@pytest.fixture
def v1_queue(tmp_path: Path) -> Path:
    dest = tmp_path / "q"
    shutil.copytree(FIXTURE, dest)
    return dest


@pytest.fixture
def v1_clean(tmp_path: Path) -> Path:
    dest = tmp_path / "clean"
    shutil.copytree(CLEAN, dest)
    return dest


def _entry_formats(log: Path) -> list[int]:
    data = log.read_bytes()
    formats, pos = [], 0
    while pos < len(data):
        entry, pos = decode_entry(data, pos)
        formats.append(entry.format)
    return formats


def _file_version(path: Path) -> int:
    return int(STATE_FILE_HEADER.unpack_from(path.read_bytes(), 0)[1])


def _verify(path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ledgerq.cli", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("fixture", [FIXTURE, CLEAN, EMPTY], ids=["killed", "clean", "empty"])
def test_the_fixtures_are_format_1(fixture: Path) -> None:
    """What the tests below start from: nothing of format 2 in it."""
    assert json.loads((fixture / "meta.json").read_text())["version"] == 1
    for log in fixture.rglob("*.log"):
        if log.parent.name == "segments":
            assert set(_entry_formats(log)) <= {1}  # (v1_empty: none at all)
    for state in fixture.rglob("*.state"):
        assert _file_version(state) in (1, 2)
    for feature in (fixture / "features").iterdir():
        assert FEATURE_FILE_HEADER.unpack_from(feature.read_bytes(), 0)[1] == 1


def test_verify_reads_a_format_1_queue(v1_queue: Path) -> None:
    assert "ok:" in _verify(v1_queue)


def test_a_format_1_queue_is_read_appended_to_and_verified(v1_queue: Path) -> None:
    q = ledgerq.open(v1_queue)
    try:
        stats = q.stats()
        assert stats.corrupt_skipped == 0
        assert len(q.dlq.peek(10)) == 3
        pending_before = stats.pending
        # Appending: to the format-1 newest segment (format-2 entries after its own).
        new_id = q.enqueue(b"format 2", headers={"v": "2"})
        batch = q.enqueue_batch([b"b1", b"b2", b"b3"])
        assert q.stats().pending == pending_before + 4
        got = []
        while (m := q.dequeue()) is not None:
            got.append(m)
            q.ack(m.id)
        payloads = [m.payload for m in got]
        assert payloads[-4:] == [b"format 2", b"b1", b"b2", b"b3"]
        assert [m.id for m in got[-4:]] == [new_id, *batch]
        assert b"after reopen" in payloads
        assert b"x" * 300 in payloads  # the format-1 batch, read as it was written
        assert got[-4].headers == {"v": "2"}
        # The DLQ (a format-1 queue too) gives its messages back.
        assert q.requeue_dlq() == 3
        assert q.stats().corrupt_skipped == 0
    finally:
        q.close()
    meta = json.loads((v1_queue / "meta.json").read_text())
    assert meta["version"] == 2  # an older ledgerq now refuses the queue
    for state in v1_queue.rglob("*.state"):
        assert _file_version(state) == 3  # rewritten as CRC-32C before any append
    for feature in (v1_queue / "features").iterdir():
        assert FEATURE_FILE_HEADER.unpack_from(feature.read_bytes(), 0)[1] == 2
    assert "ok:" in _verify(v1_queue)
    # And again: everything reopens with nothing counted as damage.
    q = ledgerq.open(v1_queue)
    try:
        assert q.stats().corrupt_skipped == 0
        assert q.stats().lost == 0
    finally:
        q.close()


def test_follow_reads_a_format_1_queue_and_its_appends(v1_queue: Path) -> None:
    q = ledgerq.open(v1_queue)
    try:
        q.enqueue(b"appended in format 2")
    finally:
        q.close()
    with ledgerq.follow(v1_queue, timeout=0) as follower:
        payloads = [m.payload for m in follower]
    assert payloads[0] == b"plain"
    assert payloads[-1] == b"appended in format 2"


def test_a_cleanly_closed_format_1_segment_is_appended_to(v1_clean: Path) -> None:
    """Its newest segment goes on: format-2 entries after format-1 ones, read in order."""
    (log,) = (v1_clean / "segments").glob("*.log")
    before = _entry_formats(log)
    q = ledgerq.open(v1_clean)
    try:
        q.enqueue(b"single")
        q.enqueue_batch([b"b1", b"b2"])
        payloads = []
        while (m := q.dequeue()) is not None:
            payloads.append(m.payload)
            q.ack(m.id)
        assert {b"single", b"b1", b"b2"} <= set(payloads)  # (the queue has priorities on)
        assert q.stats().corrupt_skipped == 0
    finally:
        q.close()
    assert _entry_formats(log) == [*before, 2, 2, 2]  # one segment, mixed
    assert "ok:" in _verify(v1_clean)
    with ledgerq.follow(v1_clean, timeout=0) as follower:
        seen = [m.payload for m in follower]
    assert seen[-3:] == [b"single", b"b1", b"b2"]


def _flip_payload_of(log: Path, payload: bytes) -> int:
    """Flip a bit in the payload of the entry holding ``payload``; return its format."""
    data = bytearray(log.read_bytes())
    pos = 0
    while pos < len(data):
        stop = pos + peek_length(data, pos)
        try:
            entry, _ = decode_entry(data, pos)
        except CorruptRecord:
            pos = stop  # flipped already
            continue
        if entry.payload == payload:
            data[stop - 5] ^= 0x04  # the payload's last byte
            log.write_bytes(bytes(data))
            return entry.format
        pos = stop
    raise AssertionError(f"no entry holds {payload!r}")


def test_a_bad_crc_is_counted_and_never_delivered_in_either_format(v1_clean: Path) -> None:
    """A format-1 entry failing its CRC-32 and a format-2 entry failing its CRC-32C, in one
    segment: each skipped and counted as corrupt, by the queue, follow and verify."""
    q = ledgerq.open(v1_clean)
    try:
        q.enqueue_batch([b"v2-%d" % i for i in range(5)])
    finally:
        q.close()
    (log,) = (v1_clean / "segments").glob("*.log")
    assert _flip_payload_of(log, b"headed") == 1
    assert _flip_payload_of(log, b"v2-2") == 2
    with ledgerq.follow(v1_clean, timeout=0) as follower:
        followed = [m.payload for m in follower]
    assert b"headed" not in followed and b"v2-2" not in followed
    assert {b"plain", b"v2-1", b"v2-3"} <= set(followed)
    done = subprocess.run(
        [sys.executable, "-m", "ledgerq.cli", "verify", str(v1_clean)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stdout.count("corrupt") >= 2, done.stdout
    q = ledgerq.open(v1_clean)
    try:
        delivered = []
        while (m := q.dequeue()) is not None:
            delivered.append(m.payload)
            q.ack(m.id)
        assert b"headed" not in delivered and b"v2-2" not in delivered
        assert {b"v2-0", b"v2-1", b"v2-3", b"v2-4"} <= set(delivered)
        assert q.stats().corrupt_skipped == 2
    finally:
        q.close()


def test_the_version_bump_is_on_disk_before_anything_is_appended(v1_clean: Path) -> None:
    """An older ledgerq reads meta.json first (its open, follow, ship, Spark) and refuses a
    version it does not know: so the queue says 2 from the open on, before a format-2
    record can exist - a crash right after the open leaves nothing it could misread."""
    q = ledgerq.open(v1_clean)
    try:
        assert json.loads((v1_clean / "meta.json").read_text())["version"] == 2
        for state in v1_clean.rglob("*.state"):
            if state.parent.parent == v1_clean:  # the DLQ's are upgraded when it opens
                assert _file_version(state) == 3
        (log,) = (v1_clean / "segments").glob("*.log")
        assert set(_entry_formats(log)) == {1}  # nothing appended yet: still all format 1
    finally:
        q.close()
