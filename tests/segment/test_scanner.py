"""EntryScanner on real files: chunk boundaries, resynchronisation, torn tails, the CRC budget.

The queue tests meet the scanner only through whole queues; here each test writes a
log byte by byte (``_log.Log`` knows every entry's offset), damages it precisely and
says exactly what must come back: which entries, which corrupt regions, where reading
stopped and whether the tail is incomplete.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ledgerq.format.entry as entry_format
from ledgerq.format.checksum import Checksum, recovery_crc_allowance
from ledgerq.format.entry import ENTRY_HEADER, MIN_ENTRY_SIZE
from ledgerq.segment.scanner import EntryScanner
from tests.segment._log import Log, payload_for, scan


def _log(sizes: list[int], *, headers_every: int = 2) -> Log:
    log = Log()
    for n, size in enumerate(sizes):
        log.add(size, headers=n % headers_every == 0)
    return log


def _regions(scanner: EntryScanner) -> list[tuple[int, int]]:
    return [(r.start, r.stop) for r in scanner.corrupt]


# ---------------------------------------------------------------------- clean reads


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=25),
    chunk_size=st.integers(min_value=1, max_value=700),
    headers_every=st.integers(min_value=1, max_value=3),
)
def test_any_chunk_size_reads_every_entry_once(
    sizes: list[int], chunk_size: int, headers_every: int
) -> None:
    log = _log(sizes, headers_every=headers_every)
    with tempfile.TemporaryDirectory() as tmp:
        got, scanner = scan(log.write(Path(tmp, "log")), chunk_size=chunk_size)
    assert [(e.id, e.size, e.timestamp) for e in got] == [
        (w.id, len(w.data), w.timestamp) for w in log.entries
    ]
    payloads = [payload_for(w.id, n) for w, n in zip(log.entries, sizes, strict=True)]
    assert [e.payload for e in got] == payloads
    assert (scanner.pos, scanner.incomplete, scanner.corrupt) == (log.size, False, [])


def test_reading_starts_at_an_index_point(tmp_path: Path) -> None:
    log = _log([40, 10, 200, 0, 33])
    path = log.write(tmp_path / "log")
    third = log.entries[2]
    got, scanner = scan(path, start=third.offset, after_id=third.id - 1)
    assert [e.id for e in got] == log.ids()[2:]
    assert (scanner.pos, scanner.incomplete, scanner.corrupt) == (log.size, False, [])


# ---------------------------------------------------------------------- resynchronisation


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_a_flipped_byte_anywhere_in_an_entry_costs_that_entry_only(
    tmp_path: Path, mask: int
) -> None:
    """Every byte of every entry but the last, its length field included."""
    log = _log([30, 0, 120, 7, 64, 15])
    data = log.data()
    path = tmp_path / "log"
    for victim in log.entries[:-1]:
        for at in range(victim.offset, victim.end):
            damaged = bytearray(data)
            damaged[at] ^= mask
            path.write_bytes(damaged)
            got, scanner = scan(path)
            where = f"byte {at} (entry {victim.id}) ^ {mask:#x}"
            assert [e.id for e in got] == [i for i in log.ids() if i != victim.id], where
            assert _regions(scanner) == [(victim.offset, victim.end)], where
            assert (scanner.pos, scanner.incomplete) == (log.size, False), where


@pytest.mark.parametrize("mask", [0x01, 0xFF])
def test_a_flipped_byte_in_the_last_entry_reads_as_a_torn_tail(tmp_path: Path, mask: int) -> None:
    """No valid entry follows: the bytes may be an append still in progress."""
    log = _log([30, 0, 120])
    data = log.data()
    last = log.entries[-1]
    path = tmp_path / "log"
    for at in range(last.offset, last.end):
        damaged = bytearray(data)
        damaged[at] ^= mask
        path.write_bytes(damaged)
        got, scanner = scan(path)
        assert [e.id for e in got] == log.ids()[:-1], at
        assert (scanner.pos, scanner.incomplete, scanner.corrupt) == (last.offset, True, []), at


def test_a_stale_copy_of_an_older_entry_is_skipped(tmp_path: Path) -> None:
    """Valid bytes whose id does not follow the last one are not the log's next entry."""
    log = _log([20, 20, 20, 20])
    stale = log.entries[1].data
    path = tmp_path / "log"
    path.write_bytes(log.data()[: log.entries[3].offset] + stale + log.entries[3].data)
    got, scanner = scan(path)
    at = log.entries[3].offset
    assert [e.id for e in got] == log.ids()
    assert _regions(scanner) == [(at, at + len(stale))]


def test_zeroed_entries_are_skipped_exactly_in_pieces_split_at_index_points(
    tmp_path: Path,
) -> None:
    """A zero-filled stretch of three entries (a lost page): exactly those bytes are
    skipped; an index point inside the stretch is where a new region starts."""
    log = _log([50] * 8)
    first, inside, stop = log.entries[2], log.entries[3], log.entries[5]
    data = bytearray(log.data())
    data[first.offset : stop.offset] = bytes(stop.offset - first.offset)
    path = tmp_path / "log"
    path.write_bytes(data)
    for boundaries, regions in (
        (None, [(first.offset, stop.offset)]),
        ([0, inside.offset], [(first.offset, inside.offset), (inside.offset, stop.offset)]),
    ):
        got, scanner = scan(path, boundaries=boundaries)
        assert [e.id for e in got] == [1, 2, 6, 7, 8]
        assert _regions(scanner) == regions
        assert (scanner.pos, scanner.incomplete) == (log.size, False)


# ---------------------------------------------------------------------- incomplete tails


def test_every_cut_of_the_last_entry_stops_there_and_the_rest_is_read_once_appended(
    tmp_path: Path,
) -> None:
    log = _log([30, 90, 45])
    data = log.data()
    last = log.entries[-1]
    path = tmp_path / "log"
    for cut in range(last.offset + 1, last.end):
        path.write_bytes(data[:cut])
        fd = os.open(path, os.O_RDONLY)
        try:
            scanner = EntryScanner(fd, 0, cut)
            got = []
            while (entry := scanner.next()) is not None:
                got.append(entry.id)
            assert got == log.ids()[:-1], cut
            assert (scanner.pos, scanner.incomplete, scanner.corrupt) == (last.offset, True, [])
            # The writer finishes the append (a follower's view): the entry comes whole.
            with open(path, "ab") as f:
                f.write(data[cut:])
            scanner.extend(last.end)
            assert not scanner.incomplete
            entry = scanner.next()
            assert entry is not None and entry.id == last.id and entry.size == len(last.data)
            assert scanner.next() is None and scanner.pos == last.end and not scanner.incomplete
        finally:
            os.close(fd)


def test_an_empty_range_is_complete(tmp_path: Path) -> None:
    path = _log([10]).write(tmp_path / "log")
    fd = os.open(path, os.O_RDONLY)
    try:
        scanner = EntryScanner(fd, 0, 0)
        assert scanner.next() is None and not scanner.incomplete
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- the CRC budget


def _claims_to_the_end(size: int, first_id: int) -> bytes:
    """Entry headers end to end, each claiming to run exactly to the end of ``size`` bytes.

    Every one is plausible (type, flags and a newer id all fine), so checking each
    costs a CRC over the rest of the file: quadratic without a budget.
    """
    out = bytearray()
    while len(out) < size:
        out += ENTRY_HEADER.pack(size - len(out), 1, 0, first_id, 0)
    return bytes(out[:size])


def _count_crc(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the bytes the entry decoder checksums (it calls ``entry._crc32`` for format 2
    entries, ``entry._crc32_v1`` for format 1)."""
    seen = {"bytes": 0}

    for name in ("_crc32", "_crc32_v1"):
        crc = getattr(entry_format, name)

        def counting(data: bytes | memoryview, *args: int, crc: Checksum = crc) -> int:
            seen["bytes"] += len(data)
            return crc(data, *args)

        monkeypatch.setattr(entry_format, name, counting)
    return seen


@pytest.mark.parametrize("garbage_size", [1 << 16, 1 << 19])
def test_a_crafted_file_costs_at_most_the_crc_allowance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, garbage_size: int
) -> None:
    """A damaged entry followed by headers that each claim the rest of the file: checking
    every one is quadratic; the scanner stops checking once its allowance is spent."""
    head = _log([20, 20])
    bad = bytearray(head.entries[-1].data)
    bad[-1] ^= 0xFF  # the CRC: entry 2 is damaged, resynchronisation begins
    data = head.entries[0].data + bytes(bad) + _claims_to_the_end(garbage_size, 99)
    path = tmp_path / "log"
    path.write_bytes(data)
    seen = _count_crc(monkeypatch)
    got, scanner = scan(path)
    assert [e.id for e in got] == [1]
    assert scanner.incomplete and scanner.pos == head.entries[1].offset  # a garbage tail
    honest = sum(len(w.data) for w in head.entries)
    assert honest < seen["bytes"] <= recovery_crc_allowance(len(data)) + honest + MIN_ENTRY_SIZE


def test_an_index_point_after_a_crafted_region_is_still_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the allowance spent, a known entry boundary (sparse index point) is where
    reading goes on: the entries after the crafted bytes are not lost."""
    garbage_size = 1 << 19
    log = Log()
    log.add(20)
    log.add(20)
    after = Log(first_id=3)
    for _ in range(3):
        after.add(20)
    bad = bytearray(log.entries[-1].data)
    bad[-1] ^= 0xFF
    crafted = _claims_to_the_end(garbage_size + after.size, 99)[:garbage_size]
    prefix = log.entries[0].data + bytes(bad) + crafted
    path = tmp_path / "log"
    path.write_bytes(prefix + after.data())
    boundary = len(prefix)
    # Without the index point the allowance runs out before the scanner gets there:
    # the rest reads as a garbage tail, as documented.
    got, scanner = scan(path)
    assert [e.id for e in got] == [1] and scanner.incomplete
    seen = _count_crc(monkeypatch)
    got, scanner = scan(path, boundaries=[0, boundary])
    assert [e.id for e in got] == [1, 3, 4, 5]
    assert _regions(scanner) == [(log.entries[1].offset, boundary)]
    assert (scanner.pos, scanner.incomplete) == (boundary + after.size, False)
    assert seen["bytes"] <= recovery_crc_allowance(scanner.pos) + log.size + after.size
