"""``segment.layout``: which file holds which ids, on crafted files and in the abstract.

The naming rule reads as little as it can and is never fooled by a damaged first
entry; ``arrange`` makes the same choice among copies whatever order the files are
listed in, and lists exactly the gaps between the files it uses.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ledgerq.format.entry import encode_plain_entry
from ledgerq.segment.layout import (
    SegmentDirectory,
    SegmentFile,
    arrange,
    content_first_id,
    subtract_ranges,
)


def _log(path: Path, ids: range, *, damage_first: bool = False) -> Path:
    data = bytearray(b"".join(encode_plain_entry(i, 1000 + i, b"x" * 30) for i in ids))
    if damage_first:
        data[10] ^= 0x40  # inside the first entry's id field: its CRC fails
    path.write_bytes(bytes(data))
    return path


def _first(path: Path, name_id: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return content_first_id(fd, os.fstat(fd).st_size, name_id)
    finally:
        os.close(fd)


def test_a_files_first_entry_says_which_ids_it_holds(tmp_path: Path) -> None:
    named = _log(tmp_path / "a", range(13, 25))
    assert _first(named, 13) == 13  # named right
    assert _first(named, 37) == 13  # renamed to a later id
    assert _first(named, 5) == 13  # copied under an earlier id
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert _first(empty, 7) == 7
    garbage = tmp_path / "garbage"
    garbage.write_bytes(os.urandom(500))
    assert _first(garbage, 7) == 7


def test_a_damaged_first_entry_does_not_make_a_file_misnamed(tmp_path: Path) -> None:
    damaged = _log(tmp_path / "a", range(13, 25), damage_first=True)
    # Named 13: the first valid entry (14) is above the name - entries lost to damage.
    assert _first(damaged, 13) == 13
    # Named 37: the first valid entry is below the name, which never happens in a file
    # named right - the file is misnamed (and its first entry damaged too).
    assert _first(damaged, 37) == 14


def _f(name: int, first: int, last: int, size: int = 100) -> SegmentFile:
    return SegmentFile(name, first, size, last)


def test_arrange_orders_by_content_sets_copies_aside_and_lists_gaps() -> None:
    files = [
        _f(1, 1, 12),
        _f(13, 13, 24),
        _f(25, 37, 48),  # swapped with 37
        _f(37, 25, 36),
        _f(999, 1, 12),  # a copy of 1 under a later name
        _f(58, 61, 72),  # a copy of 61-72 under an earlier name
        _f(61, 61, 72),  # 49-60 deleted
        _f(73, 73, 80, size=50),
        _f(75, 73, 78, size=40),  # an older, shorter copy of 73
    ]
    layout = arrange(files)
    assert [(f.name_id, f.first_id) for f in layout.used] == [
        (1, 1),
        (13, 13),
        (37, 25),
        (25, 37),
        (61, 61),
        (73, 73),
    ]
    assert sorted(f.name_id for f, _ in layout.set_aside) == [58, 75, 999]
    assert [(a, b) for a, b, _, _ in layout.gaps] == [(49, 60)]
    assert sorted(f.name_id for f in layout.misnamed) == [25, 37]
    assert layout.held_aside == []


def test_a_file_starting_inside_another_but_running_past_it_is_held_aside() -> None:
    layout = arrange([_f(1, 1, 12), _f(10, 10, 20), _f(21, 21, 30)])
    assert [f.name_id for f in layout.used] == [1, 21]
    assert [(a, b, f.name_id) for a, b, f in layout.held_aside] == [(13, 20, 10)]
    assert [(a, b) for a, b, _, _ in layout.gaps] == [(13, 20)]


@given(st.permutations(list(range(6))))
def test_arrange_does_not_depend_on_the_listing_order(order: list[int]) -> None:
    files = [_f(1, 1, 12), _f(13, 13, 24), _f(99, 13, 24), _f(50, 13, 20), _f(25, 37, 48)]
    files.append(_f(37, 25, 36))
    shuffled = [files[i] for i in order]
    layout = arrange(shuffled)
    assert [f.name_id for f in layout.used] == [1, 13, 37, 25]
    assert sorted(f.name_id for f, _ in layout.set_aside) == [50, 99]


@given(
    st.integers(1, 50),
    st.integers(0, 30),
    st.lists(st.tuples(st.integers(1, 90), st.integers(0, 10)), max_size=5),
)
def test_subtract_ranges_keeps_exactly_the_ids_outside(
    first: int, span: int, raw: list[tuple[int, int]]
) -> None:
    last = first + span
    ranges = [(a, a + n) for a, n in raw]
    kept = subtract_ranges(first, last, ranges)
    ids = {i for lo, hi in kept for i in range(lo, hi + 1)}
    assert ids == {i for i in range(first, last + 1) if not any(a <= i <= b for a, b in ranges)}
    assert subtract_ranges(last + 1, last, ranges) == []


def test_a_lock_free_listing_remembers_first_ids_by_inode(tmp_path: Path) -> None:
    segments = tmp_path / "segments"
    segments.mkdir()
    _log(segments / f"{1:020d}.log", range(1, 5))
    _log(segments / f"{5:020d}.log", range(5, 9))
    directory = SegmentDirectory(str(segments))
    assert [f.first_id for f in directory.layout().used] == [1, 5]
    # Swapped behind its back: new inodes for the names, so they are read again.
    a, b, tmp = segments / f"{1:020d}.log", segments / f"{5:020d}.log", tmp_path / "t"
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    used = directory.layout().used
    assert [(f.name_id, f.first_id) for f in used] == [(5, 1), (1, 5)]
