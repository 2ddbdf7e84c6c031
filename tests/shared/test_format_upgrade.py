"""Format 2's upgrades at open in shared mode: a rewrite only where no one else reads or
appends to the old file, and a joining handle reads whatever versions are on disk.

The cases that can happen (docs/format.md, "Upgrades in shared mode"):

* a format-1 queue opened shared by several processes: the first of the session
  upgrades ``meta.json``, the journals it loads and its features' files while it is
  alone; the others join a queue that is format 2 by then;
* a reader journal or feature file no handle had loaded yet, met by a joining handle:
  rewritten under the lock every append to it takes (the reader's, the append lock);
* a session a format-1 ledgerq started (its state page is version 1): a format-2
  handle refuses to join, before it writes anything;
* a format-1 page left by a finished session: the next first handle keeps its counters.
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
from ledgerq.format.feature_state import decode_feature_file
from ledgerq.format.shared_state import (
    PAGE_SIZE,
    SLOT_CORRUPT_SKIPPED,
    SLOT_DUPLICATES,
    STATE_HEADER,
    TAIL_FIELDS,
    TAIL_OFFSET,
)

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


def _format_1_page(duplicates: int = 0, corrupt_skipped: int = 0) -> bytes:
    """The state page a format-1 ledgerq writes: version 1, the tail's checksum CRC-32."""
    fields = TAIL_FIELDS.pack(1, 0, 0, -1, 0, -1, 1)
    page = bytearray(PAGE_SIZE)
    STATE_HEADER.pack_into(page, 0, b"LQSP", 1)
    page[TAIL_OFFSET : TAIL_OFFSET + 64] = fields + struct.pack("<II", zlib.crc32(fields), 0)
    struct.pack_into("<Q", page, SLOT_DUPLICATES, duplicates)
    struct.pack_into("<Q", page, SLOT_CORRUPT_SKIPPED, corrupt_skipped)
    return bytes(page)


@pytest.fixture
def old_session(tmp_path: Path) -> Iterator[Path]:
    """A format-1 queue held open in shared mode by a format-1 ledgerq: ``LOCK`` held
    shared, and the page that ledgerq wrote when it started the session."""
    path = _copy("v1_clean", tmp_path)
    (path / "shared").mkdir()
    (path / "shared" / "state").write_bytes(_format_1_page())
    fd = os.open(path / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        yield path
    finally:
        os.close(fd)


def test_a_handle_does_not_join_a_session_of_a_format_1_ledgerq(old_session: Path) -> None:
    before = _files(old_session)
    with pytest.raises(ledgerq.IncompatibleFormatError, match="older ledgerq"):
        ledgerq.open(old_session, shared=True)
    assert _files(old_session) == before, "a refused handle wrote nothing"


def test_the_next_session_keeps_a_format_1_pages_counters(tmp_path: Path) -> None:
    path = _copy("v1_clean", tmp_path)
    (path / "shared").mkdir()
    (path / "shared" / "state").write_bytes(_format_1_page(duplicates=1000, corrupt_skipped=77))
    with ledgerq.open(path, shared=True) as q:
        assert (q.stats().duplicates, q.stats().corrupt_skipped) == (1000, 77)
    assert _version(path / "shared" / "state") == 2


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
