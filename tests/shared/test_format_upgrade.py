"""Format 2's upgrades at open in shared mode: a rewrite only where no one else reads or
appends to the old file, and a joining handle reads whatever versions are on disk.

The cases that can happen (docs/format.md, "Upgrades in shared mode"):

* a format-1 queue opened shared by several processes: the first of the session
  upgrades ``meta.json``, the journals it loads and its features' files while it is
  alone; the others join a queue that is format 2 by then;
* a reader journal or feature file no handle had loaded yet, met by a joining handle:
  rewritten under the lock every append to it takes (the reader's, the append lock);
* a session a format-1 ledgerq started (its state page is version 1), or one the flock
  design started (version 2: its handles lock with flock, which lock words do not
  exclude), or the lock-word design before the feature-log words (version 3: its
  handles write the feature logs without bumping their words, so ours would miss
  their unique keys and hand-offs), or a newer ledgerq (version 5): a handle refuses
  to join, before it writes anything;
* a version 1, 2 or 3 page left by a finished session: the next first handle keeps its
  counters and writes a version 4 page.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerq
from ledgerq.format.checksum import checksum
from ledgerq.format.feature_state import decode_feature_file
from ledgerq.format.shared_state import (
    LOCKING_WORDS,
    OLD_PAGE_SIZE,
    PAGE_SIZE,
    SHARED_VERSION,
    SLOT_CORRUPT_SKIPPED,
    SLOT_DUPLICATES,
    SLOT_LOCKING,
    STATE_HEADER,
    TAIL_FIELDS,
    TAIL_OFFSET,
)
from tests._child import Children

from ._procs import WORKER

FIXTURES = Path(__file__).parent.parent / "format" / "fixtures"


def _copy(name: str, tmp_path: Path) -> Path:
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def _version(path: Path) -> int:
    return int(struct.unpack_from("<I", path.read_bytes(), 4)[0])


def _meta_version(path: Path) -> int:
    import json

    return int(json.loads((path / "meta.json").read_text())["version"])


def _files(path: Path) -> dict[str, bytes]:
    """Every file of the queue but the shared-mode coordination and the lock."""
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.relative_to(path).parts[0] not in ("shared", "LOCK")
    }


def _old_page(version: int, duplicates: int = 0, corrupt_skipped: int = 0) -> bytes:
    """The state page an older ledgerq writes: 4 KiB; version 1 (format 1, the tail's
    checksum CRC-32) or 2 (format 2 with the flock design, CRC-32C); or 16 KiB, version
    3 (lock words, no feature-log words)."""
    fields = TAIL_FIELDS.pack(1, 0, 0, -1, 0, -1, 1)
    crc = zlib.crc32(fields) if version == 1 else checksum(fields)
    page = bytearray(OLD_PAGE_SIZE if version < 3 else PAGE_SIZE)
    if version >= 3:
        struct.pack_into("<Q", page, SLOT_LOCKING, LOCKING_WORDS)
    STATE_HEADER.pack_into(page, 0, b"LQSP", version)
    page[TAIL_OFFSET : TAIL_OFFSET + 64] = fields + struct.pack("<II", crc, 0)
    struct.pack_into("<Q", page, SLOT_DUPLICATES, duplicates)
    struct.pack_into("<Q", page, SLOT_CORRUPT_SKIPPED, corrupt_skipped)
    return bytes(page)


def _hold_shared(path: Path, page: bytes) -> int:
    """Stand for an older ledgerq's live session: its page, ``LOCK`` held shared."""
    (path / "shared").mkdir(exist_ok=True)
    (path / "shared" / "state").write_bytes(page)
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


@pytest.fixture
def old_session(tmp_path: Path) -> Iterator[Path]:
    """A format-1 queue held open in shared mode by a format-1 ledgerq: ``LOCK`` held
    shared, and the page that ledgerq wrote when it started the session."""
    path = _copy("v1_clean", tmp_path)
    fd = _hold_shared(path, _old_page(1))
    try:
        yield path
    finally:
        os.close(fd)


def test_a_handle_does_not_join_a_session_of_a_format_1_ledgerq(old_session: Path) -> None:
    before = _files(old_session)
    with pytest.raises(ledgerq.IncompatibleFormatError, match="older ledgerq"):
        ledgerq.open(old_session, shared=True)
    assert _files(old_session) == before, "a refused handle wrote nothing"


@pytest.mark.parametrize(
    ("version", "says"),
    [
        (2, r"older ledgerq \(state page version 2\)"),
        (3, r"older ledgerq \(state page version 3\).*feature logs"),
        (5, "newer ledgerq"),
    ],
)
def test_a_handle_does_not_join_a_session_of_another_lock_design(
    tmp_path: Path, version: int, says: str
) -> None:
    # Version 2 is the flock design: its handles take shared/APPEND with flock, which a
    # lock word does not exclude - joining it would let two appenders write at once.
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"kept")
    page = _old_page(version) if version < 4 else _old_page(3).replace(b"LQSP\x03", b"LQSP\x05", 1)
    fd = _hold_shared(path, page)
    try:
        before = _files(path)
        with pytest.raises(ledgerq.IncompatibleFormatError, match=says):
            ledgerq.open(path, shared=True)
        assert _files(path) == before, "a refused handle wrote nothing"
    finally:
        os.close(fd)
    with ledgerq.open(path, shared=True) as q:  # that session over: the next one starts
        assert [m.payload for m in q.dequeue_batch(10)] == [b"kept"]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_the_next_session_keeps_an_older_pages_counters(tmp_path: Path, version: int) -> None:
    path = _copy("v1_clean", tmp_path)
    (path / "shared").mkdir()
    (path / "shared" / "state").write_bytes(_old_page(version, duplicates=1000, corrupt_skipped=77))
    with ledgerq.open(path, shared=True) as q:
        assert (q.stats().duplicates, q.stats().corrupt_skipped) == (1000, 77)
    assert _version(path / "shared" / "state") == SHARED_VERSION


def test_two_processes_open_a_format_1_queue_shared(tmp_path: Path, children: Children) -> None:
    """Both race to be the session's first; either way every message is delivered once
    between them, and what they leave is format 2 that an exclusive open reads."""
    reference = _copy("v1_queue", tmp_path / "reference")
    with ledgerq.open(reference) as q:
        expected = sorted(m.id for m in q.dequeue_batch(1000))
    assert expected, "the fixture has messages to deliver"
    path = _copy("v1_queue", tmp_path)
    workers = [children.start([*WORKER, "hold", str(path)]) for _ in range(2)]
    for worker in workers:
        worker.wait_for("READY")
    delivered: list[int] = []
    for _ in range(len(expected) + 1):
        for worker in workers:
            worker.send("deq")
            message_id = int(worker.line().split()[1])
            if message_id:
                worker.send(f"ack {message_id}")
                assert worker.line() == f"A {message_id}"
                delivered.append(message_id)
    assert sorted(delivered) == expected, "each message once, between the two processes"
    for token, worker in enumerate(workers):
        worker.send(f"enq {token}")
        assert worker.line().startswith("E ")
    for worker in workers:
        worker.send("close")
        worker.wait_for("BYE")
    assert _meta_version(path) == 2
    for state in (path / "readers").glob("*.state"):
        assert _version(state) == 3, state
    with ledgerq.open(path) as q:
        assert len(q.dequeue_batch(10)) == 2


def test_a_joining_handle_upgrades_a_dedup_file_it_is_the_first_to_load(tmp_path: Path) -> None:
    path = _copy("v1_clean", tmp_path)
    old = decode_feature_file((path / "features" / "dedup.log").read_bytes(), b"LQDD")
    a = ledgerq.open(path, shared=True, dedup_window=None)  # no dedup: the file stays as is
    try:
        assert _version(path / "features" / "dedup.log") == 1
        b = ledgerq.open(path, shared=True, dedup_window=3600.0)
        c = ledgerq.open(path, shared=True, dedup_window=3600.0)
        try:
            found = decode_feature_file((path / "features" / "dedup.log").read_bytes(), b"LQDD")
            assert (found.version, found.values) == (2, old.values), "every record kept"
            first = b.enqueue(b"x", dedup_id="fresh")
            assert c.enqueue(b"y", dedup_id="fresh") == first  # b's record, read by c
            assert c.stats().corrupt_skipped == 0
        finally:
            b.close()
            c.close()
    finally:
        a.close()


def test_a_joining_handle_upgrades_a_retry_file_it_is_the_first_to_load(tmp_path: Path) -> None:
    path = _copy("v1_clean", tmp_path)
    retries = path / "features" / "retries.log"
    old = decode_feature_file(retries.read_bytes(), b"LQRT")
    a = ledgerq.open(path, shared=True, max_retries=0)  # no DLQ: the file stays as it is
    try:
        assert _version(retries) == 1
        with ledgerq.open(path, shared=True, max_retries=5) as b:
            b.enqueue(b"fails")
            msg = None
            while (got := b.dequeue()) is not None:
                msg = got
            assert msg is not None
            b.nack(msg.id, "the reason")
            found = decode_feature_file(retries.read_bytes(), b"LQRT")
            assert found.version == 2
            assert found.values[: len(old.values)] == old.values, "every record kept"
            assert found.values[-1][1:] == [msg.id, found.values[-1][2], "the reason"]
    finally:
        a.close()


def _figures(stats: ledgerq.ReaderStats) -> tuple[int, int, int, int]:
    return (stats.pending, stats.in_flight, stats.acked, stats.nacked)


def test_the_first_handle_upgrades_every_journal_and_the_others_read_them(
    tmp_path: Path,
) -> None:
    """Every reader on disk is loaded by the session's first handle (it holds retention
    back, opened by the user or not), so a joining handle never meets an old journal:
    the named reader ``other`` is version 3 before anyone asks for it, and both handles
    read and write it."""
    path = _copy("v1_clean", tmp_path)
    journal = path / "readers" / "other.state"
    with ledgerq.open(_copy("v1_clean", tmp_path / "reference")) as q:
        expected = q.reader("other").stats()
    a = ledgerq.open(path, shared=True)
    try:
        assert _version(journal) == 3
        with ledgerq.open(path, shared=True) as b:
            assert _figures(b.reader("other").stats()) == _figures(expected)
            assert _figures(a.reader("other").stats()) == _figures(expected)
            got = a.reader("other").dequeue()
            assert got is not None
            a.reader("other").ack(got.id)
            assert b.reader("other").stats().acked == expected.acked + 1
    finally:
        a.close()
