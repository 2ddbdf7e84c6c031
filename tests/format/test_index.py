"""Sparse index files: round trips, torn and damaged files, lookups."""

from __future__ import annotations

import bisect
import struct
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.format import (
    INDEX_ENTRY,
    INDEX_HEADER,
    OPEN_COUNT,
    CorruptRecord,
    IncompleteRecord,
    IndexEntry,
    decode_index,
    encode_index_entry,
    encode_index_header,
)
from ledgerq.format.index import (
    INDEX_MAGIC,
    INDEX_VERSION,
    encode_index_columns,
    encode_index_points,
    find_by_id,
    find_by_timestamp,
)
from tests.strategies import index_entry_lists

POINTS = [IndexEntry(10, 100, 0), IndexEntry(50, 200, 4100), IndexEntry(99, 150, 8300)]


def index_file(entries: list[IndexEntry], count: int = OPEN_COUNT) -> bytes:
    return encode_index_header(count) + b"".join(encode_index_entry(*e) for e in entries)


# ---------------------------------------------------------------- round trips


def test_header_bytes() -> None:
    assert encode_index_header() == b"LQIX" + struct.pack("<II", 1, 0xFFFFFFFF)
    assert encode_index_header(3) == b"LQIX\x01\x00\x00\x00\x03\x00\x00\x00"
    assert encode_index_entry(1, -2, 3) == struct.pack("<QqQ", 1, -2, 3)


@settings(max_examples=60)
@given(index_entry_lists())
def test_open_round_trip(entries: list[IndexEntry]) -> None:
    decoded, sealed = decode_index(index_file(entries))
    assert decoded == entries
    assert sealed is False


@settings(max_examples=60)
@given(index_entry_lists())
def test_sealed_round_trip(entries: list[IndexEntry]) -> None:
    decoded, sealed = decode_index(index_file(entries, len(entries)))
    assert decoded == entries
    assert sealed is True


@given(index_entry_lists(max_size=40))
def test_points_encoded_from_columns_are_the_same_bytes(entries: list[IndexEntry]) -> None:
    # The batch append and the seal encode from three arrays; the file must not tell.
    ids = array("Q", [e.id for e in entries])
    stamps = array("q", [e.timestamp for e in entries])
    offsets = array("Q", [e.offset for e in entries])
    blob = encode_index_columns(ids, stamps, offsets)
    assert blob == encode_index_points(entries)
    assert decode_index(encode_index_header() + blob) == (entries, False)


def test_columns_keep_the_extremes_of_each_field() -> None:
    top = (1 << 64) - 1
    blob = encode_index_columns(array("Q", [top]), array("q", [-(1 << 63)]), array("Q", [top]))
    assert blob == struct.pack("<QqQ", top, -(1 << 63), top)


def test_decode_accepts_bytes_like() -> None:
    blob = index_file(POINTS, 3)
    for buf in (blob, bytearray(blob), memoryview(blob)):
        assert decode_index(buf) == (POINTS, True)


def test_empty_open_index() -> None:
    assert decode_index(encode_index_header()) == ([], False)


def test_empty_sealed_index() -> None:
    assert decode_index(encode_index_header(0)) == ([], True)


def test_sealed_index_ignores_bytes_after_its_count() -> None:
    # The count is authoritative for a sealed index (docs/format.md says so).
    blob = index_file(POINTS, 2) + b"\xff" * 30
    assert decode_index(blob) == (POINTS[:2], True)


# ---------------------------------------------------------------- torn and damaged


def test_header_cut_short_is_incomplete() -> None:
    header = encode_index_header()
    for cut in range(INDEX_HEADER.size):
        with pytest.raises(IncompleteRecord):
            decode_index(header[:cut])


@settings(max_examples=40)
@given(index_entry_lists(min_size=1))
def test_open_index_drops_a_torn_last_entry(entries: list[IndexEntry]) -> None:
    blob = index_file(entries)
    for cut in range(1, INDEX_ENTRY.size):
        decoded, sealed = decode_index(blob[:-cut])
        assert decoded == entries[:-1]
        assert sealed is False


@settings(max_examples=40)
@given(index_entry_lists(min_size=1))
def test_sealed_index_shorter_than_its_count_is_incomplete(entries: list[IndexEntry]) -> None:
    blob = index_file(entries, len(entries))
    for size in range(INDEX_HEADER.size, len(blob)):
        with pytest.raises(IncompleteRecord) as info:
            decode_index(blob[:size])
        whole = (size - INDEX_HEADER.size) // INDEX_ENTRY.size
        assert info.value.pos == INDEX_HEADER.size + whole * INDEX_ENTRY.size


def test_bad_magic_is_corrupt() -> None:
    for magic in (b"LQIY", b"lqix", b"\x00\x00\x00\x00", b"LQRS"):
        blob = INDEX_HEADER.pack(magic, INDEX_VERSION, OPEN_COUNT)
        with pytest.raises(CorruptRecord, match="magic"):
            decode_index(blob)


def test_unknown_version_is_corrupt() -> None:
    for version in (0, 2, 0xFFFFFFFF):
        blob = INDEX_HEADER.pack(INDEX_MAGIC, version, OPEN_COUNT)
        with pytest.raises(CorruptRecord, match="version"):
            decode_index(blob)


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (IndexEntry(10, 100, 4100), "same id"),
        (IndexEntry(9, 100, 4100), "smaller id"),
        (IndexEntry(11, 100, 50), "same offset"),
        (IndexEntry(11, 100, 0), "smaller offset"),
    ],
)
def test_entries_out_of_order_are_corrupt(second: IndexEntry, why: str) -> None:
    entries = [IndexEntry(10, 100, 50), second]
    for count in (OPEN_COUNT, 2):
        with pytest.raises(CorruptRecord, match="out of order") as info:
            decode_index(index_file(entries, count))
        assert info.value.pos == INDEX_HEADER.size + INDEX_ENTRY.size, why


def test_timestamps_may_go_backwards() -> None:
    # Clocks step back; only ids and offsets must grow.
    entries = [IndexEntry(1, 500, 0), IndexEntry(2, 100, 26), IndexEntry(3, -7, 52)]
    assert decode_index(index_file(entries, 3))[0] == entries


@settings(max_examples=100)
@given(st.binary(max_size=120))
def test_garbage_raises_only_decode_errors(tail: bytes) -> None:
    for blob in (tail, encode_index_header() + tail, encode_index_header(2) + tail):
        try:
            entries, _ = decode_index(blob)
        except (CorruptRecord, IncompleteRecord):
            continue
        ids = [e.id for e in entries]
        offsets = [e.offset for e in entries]
        assert ids == sorted(set(ids))
        assert offsets == sorted(set(offsets))


# ---------------------------------------------------------------- lookups


def test_find_by_id_examples() -> None:
    ids = [e.id for e in POINTS]
    assert find_by_id(POINTS, ids, 9) is None
    assert find_by_id(POINTS, ids, 10) == POINTS[0]
    assert find_by_id(POINTS, ids, 49) == POINTS[0]
    assert find_by_id(POINTS, ids, 50) == POINTS[1]
    assert find_by_id(POINTS, ids, 98) == POINTS[1]
    assert find_by_id(POINTS, ids, 99) == POINTS[2]
    assert find_by_id(POINTS, ids, 10**9) == POINTS[2]
    assert find_by_id([], [], 5) is None


@settings(max_examples=100)
@given(index_entry_lists(), st.integers(0, 1 << 41))
def test_find_by_id_is_the_last_point_at_or_below(entries: list[IndexEntry], target: int) -> None:
    ids = [e.id for e in entries]
    found = find_by_id(entries, ids, target)
    below = [e for e in entries if e.id <= target]
    assert found == (below[-1] if below else None)


def test_find_by_timestamp_examples() -> None:
    entries = [IndexEntry(1, 10, 0), IndexEntry(5, 20, 100), IndexEntry(9, 20, 200)]
    assert find_by_timestamp(entries, 10) is None  # id 1 itself may be the answer
    assert find_by_timestamp(entries, 11) == entries[0]
    assert find_by_timestamp(entries, 20) == entries[0]  # ids 5..8 have 20 too
    assert find_by_timestamp(entries, 21) == entries[2]
    assert find_by_timestamp([], 5) is None


def test_find_by_timestamp_stops_at_a_clock_step_back() -> None:
    # Once a point at or after the target is met, later points are not trusted.
    entries = [IndexEntry(1, 10, 0), IndexEntry(5, 50, 100), IndexEntry(9, 20, 200)]
    assert find_by_timestamp(entries, 30) == entries[0]
    assert find_by_timestamp(entries, 60) == entries[2]


@st.composite
def indexed_logs(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Timestamps of consecutive messages (non-decreasing) and which of them are indexed."""
    steps = draw(st.lists(st.integers(0, 3), min_size=1, max_size=40))
    times = [sum(steps[: i + 1]) for i in range(len(steps))]
    chosen = draw(st.sets(st.integers(0, len(times) - 1)))  # 0: always indexed anyway
    return times, sorted(chosen | {0})


@settings(max_examples=150)
@given(indexed_logs(), st.integers(-1, 130))
def test_find_by_timestamp_never_skips_a_match(
    log: tuple[list[int], list[int]], target: int
) -> None:
    # Scanning forward from the point returned (or from the start for None) must
    # meet the first message at or after ``target``, whatever points were sampled.
    times, indexed = log
    entries = [IndexEntry(i + 1, times[i], i * 26) for i in indexed]
    found = find_by_timestamp(entries, target)
    start = 0 if found is None else found.id - 1
    first_match = bisect.bisect_left(times, target)
    assert start <= first_match
    # ... and it is the latest such point: the next one is already at or past the target.
    later = [e for e in entries if e.id - 1 > start]
    if later:
        assert later[0].timestamp >= target
