"""Real faults on a real file system (a small tmpfs, see ``tests/realfs.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ledgerq
from ledgerq import StorageError
from ledgerq.segment.appendlog import AppendLog
from tests.realfs import SmallDisk


def test_a_failed_append_on_a_full_disk_is_cut_back(small_disk: SmallDisk) -> None:
    path = small_disk.path / "log"
    path.write_bytes(b"HEAD")
    log = AppendLog(str(path), "test log")
    log.open(4)
    small_disk.fill(leave_bytes=3000)  # room for part of the next append, not all of it
    record = b"r" * 64 * 1024
    with pytest.raises(StorageError, match="disk is full"):
        log.append_record(record)
    assert path.read_bytes() == b"HEAD"  # the fragment that fitted is gone
    assert log.size == 4
    small_disk.free()
    log.append_record(b"next")
    log.close()
    assert path.read_bytes() == b"HEADnext"  # a good record never lands after bad bytes


def test_open_cuts_bytes_past_the_valid_size(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"goodtorn")
    log = AppendLog(str(path), "test log")
    log.open(4)
    log.append_record(b"more")
    log.sync()
    log.close()
    assert path.read_bytes() == b"goodmore"
    with pytest.raises(StorageError, match="closed"):
        log.append_record(b"x")


def test_replace_swaps_the_file_and_appends_to_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"old")
    log = AppendLog(str(path), "test log")
    log.open(3)
    log.replace(b"new")
    log.append_record(b"!")
    log.close()
    assert path.read_bytes() == b"new!"
    assert not os.path.exists(f"{path}.tmp")


def test_dedup_ids_written_after_a_full_disk_are_honoured_after_reopen(
    small_disk: SmallDisk,
) -> None:
    path = small_disk.path / "q"
    ids = {}
    with ledgerq.open(path, dedup_window=3600.0) as q:
        for i in range(20):
            ids[f"a{i}"] = q.enqueue(b"a", dedup_id=f"a{i}")
        small_disk.fill()
        # The last pages of the segment and of dedup.log fill up in turn: sooner or later
        # a dedup record is cut short by the disk after its message was written.
        for i in range(400):
            try:
                ids[f"b{i}"] = q.enqueue(b"", dedup_id=f"b{i}")
            except ledgerq.StorageError:
                pass
        small_disk.free()
        for i in range(20):
            ids[f"c{i}"] = q.enqueue(b"c", dedup_id=f"c{i}")
    with ledgerq.open(path) as q:
        for dedup_id, message_id in ids.items():
            assert q.enqueue(b"again", dedup_id=dedup_id) == message_id, dedup_id
        assert q.stats().duplicates == len(ids)


def test_a_damaged_dedup_record_in_the_middle_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, dedup_window=3600.0) as q:
        ids = [q.enqueue(b"m", dedup_id=f"d{i}") for i in range(10)]
    log = path / "features" / "dedup.log"
    data = bytearray(log.read_bytes())
    record = (len(data) - 8) // 10
    data[8 + 3 * record + 6] ^= 0xFF  # flip a byte inside the fourth record
    log.write_bytes(bytes(data))
    with ledgerq.open(path) as q:
        assert q.stats().corrupt_skipped == 1
        for i, message_id in enumerate(ids):
            if i != 3:
                assert q.enqueue(b"again", dedup_id=f"d{i}") == message_id
    with ledgerq.open(path) as q:  # the rewrite dropped the damage: not counted twice
        assert q.stats().corrupt_skipped == 1
