"""A segment's sparse-index points in memory behave as the list of points they replace."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st

from ledgerq.format.index import IndexEntry, find_by_id
from ledgerq.segment.points import IndexPoints
from tests.strategies import index_entry_lists


@given(index_entry_lists(max_size=30), st.data())
def test_points_read_as_the_list_they_were_built_from(
    entries: list[IndexEntry], data: st.DataObject
) -> None:
    points = IndexPoints(entries)
    assert len(points) == len(entries) and bool(points) == bool(entries)
    assert list(points) == entries and points == entries
    if entries:
        i = data.draw(st.integers(-len(entries), len(entries) - 1))
        assert points[i] == entries[i]
    cut = data.draw(st.integers(0, len(entries)))
    assert list(points[:cut]) == entries[:cut]
    assert list(points.offsets) == [e.offset for e in entries]
    target = data.draw(st.integers(0, 1 << 41))
    assert points.locate(target) == find_by_id(entries, [e.id for e in entries], target)


@given(index_entry_lists(max_size=30), st.integers(0, 30))
def test_points_added_as_columns_follow_the_earlier_ones(
    entries: list[IndexEntry], split: int
) -> None:
    head, tail = entries[:split], entries[split:]
    points = IndexPoints(head)
    points.extend_columns(
        array("Q", [e.id for e in tail]),
        array("q", [e.timestamp for e in tail]),
        array("Q", [e.offset for e in tail]),
    )
    assert list(points) == entries


def test_a_slice_is_a_copy_the_segment_can_keep() -> None:
    # A batch cut back by recovery keeps the points before it: later appends to the
    # original must not show in the copy.
    points = IndexPoints([IndexEntry(1, 5, 0), IndexEntry(9, 6, 4096)])
    kept = points[:1]
    points.append(IndexEntry(20, 7, 8192))
    assert list(kept) == [IndexEntry(1, 5, 0)]
    assert len(points) == 3
