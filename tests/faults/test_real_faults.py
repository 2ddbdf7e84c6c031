"""Real faults on a real file system (a small tmpfs, see ``tests/realfs.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
        log.append(record)
    assert path.read_bytes() == b"HEAD"  # the fragment that fitted is gone
    assert log.size == 4
    small_disk.free()
    log.append(b"next")
    log.close()
    assert path.read_bytes() == b"HEADnext"  # a good record never lands after bad bytes


def test_open_cuts_bytes_past_the_valid_size(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"goodtorn")
    log = AppendLog(str(path), "test log")
    log.open(4)
    log.append(b"more")
    log.sync()
    log.close()
    assert path.read_bytes() == b"goodmore"
    with pytest.raises(StorageError, match="closed"):
        log.append(b"x")


def test_replace_swaps_the_file_and_appends_to_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"old")
    log = AppendLog(str(path), "test log")
    log.open(3)
    log.replace(b"new")
    log.append(b"!")
    log.close()
    assert path.read_bytes() == b"new!"
    assert not os.path.exists(f"{path}.tmp")
