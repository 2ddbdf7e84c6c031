"""Real faults on a real file system (a small tmpfs, see ``tests/realfs.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ledgerq
from ledgerq import StorageError
from ledgerq.segment.appendlog import AppendLog
from tests.realfs import SmallDisk, crash_child


def _open_log(path: Path, content: bytes, valid_size: int) -> AppendLog:
    """An append log over a file that holds ``content``, opened at ``valid_size``."""
    path.write_bytes(content)
    log = AppendLog(str(path), "test log")
    log.open(valid_size)
    return log


def test_a_failed_append_on_a_full_disk_is_cut_back(small_disk: SmallDisk) -> None:
    path = small_disk.path / "log"
    log = _open_log(path, b"HEAD", 4)
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
    log = _open_log(path, b"goodtorn", 4)
    log.append_record(b"more")
    log.sync()
    log.close()
    assert path.read_bytes() == b"goodmore"
    with pytest.raises(StorageError, match="closed"):
        log.append_record(b"x")


def test_replace_swaps_the_file_and_appends_to_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = _open_log(path, b"old", 3)
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


@pytest.mark.parametrize("shared", [False, True])
def test_dedup_ids_returned_on_a_disk_full_to_its_last_page_survive_a_crash(
    small_disk: SmallDisk, shared: bool
) -> None:
    # Issue 25: on a disk filled to its last page, with a page freed now and then, the
    # segment took every freed page and each dedup record met the full disk: the
    # enqueues returned, their ids waited in memory for the next sync, and a crash
    # forgot 2,890 of 3,200.  Every dedup id whose enqueue returned must survive.
    reports = crash_child(
        small_disk.path,
        """
        q = ledgerq.open(ARGS["queue"], dedup_window=3600.0, sync="never", shared=ARGS["shared"])
        disk.fill()
        ids, failures, i = {}, 0, 0
        for _ in range(1000):  # a failed call is retried with the same dedup id
            try:
                ids[f"d{i}"] = q.enqueue(b"p" * 100, dedup_id=f"d{i}")
            except ledgerq.StorageError:
                failures += 1
                if failures % 2 == 0:  # two refusals: give the disk one page back
                    disk.give_back(4096)
                continue
            i += 1
        returned_while_full = len(ids)
        disk.free()
        for j in range(50):
            ids[f"e{j}"] = q.enqueue(b"p" * 100, dedup_id=f"e{j}")
        report(ids, failures, returned_while_full)
        """,
        queue=str(small_disk.path / "q"),
        shared=shared,
    )
    [[ids, failures, returned_while_full]] = reports
    assert failures > 0, "the disk never refused: the test tests nothing"
    assert returned_while_full >= 50, "too few enqueues returned on the full disk"
    with ledgerq.open(small_disk.path / "q", dedup_window=3600.0) as q:
        forgotten = [k for k, v in ids.items() if q.enqueue(b"again", dedup_id=k) != v]
        assert forgotten == []
        assert q.stats().corrupt_skipped == 0
