"""Many tiny segments: rotation at nearly every append, and index files repaired on open."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

import ledgerq

from ._harness import (
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_OPEN_COUNT,
    entry_spans,
    first_id_of,
    read_index,
    segment_logs,
    truncate,
)
from ._payload import make_item, make_message, matches

SEGMENT_SIZE = 200
MESSAGES = 3000


def build(path: Path) -> dict[int, int]:
    """A queue of ``MESSAGES`` messages over many segments; returns id -> token."""
    rng = random.Random(6)
    expected: dict[int, int] = {}
    token = 0
    with ledgerq.open(path, segment_size=SEGMENT_SIZE, sync="never") as q:
        while token < MESSAGES:
            if rng.random() < 0.8:
                payload, headers = make_message(token)
                expected[q.enqueue(payload, headers=headers)] = token
                token += 1
            else:
                n = min(rng.randint(2, 5), MESSAGES - token)
                ids = q.enqueue_batch([make_item(t) for t in range(token, token + n)])
                expected.update(zip(ids, range(token, token + n), strict=True))
                token += n
    return expected


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, int]]:
    path = tmp_path_factory.mktemp("rotation") / "q"
    return path, build(path)


def check_all_there(path: Path, expected: dict[int, int]) -> None:
    with ledgerq.open(path, segment_size=SEGMENT_SIZE) as q:
        got = q.peek(len(expected) + 10)
        assert len(q) == len(expected)
        assert q.stats().corrupt_skipped == 0
    assert [m.id for m in got] == sorted(expected)
    for msg in got:
        assert matches(msg, expected[msg.id]), f"message {msg.id} damaged"


def check_index(log: Path) -> None:
    """The segment's index is sealed and points at real entries, first and last included."""
    count, points = read_index(log.with_suffix(".idx"))
    assert count != INDEX_OPEN_COUNT, f"{log.name}: index not sealed"
    assert len(points) == count
    spans = entry_spans(log.read_bytes())
    starts = {start: entry_id for start, _, entry_id in spans}
    first_start, _, first_id = spans[0]
    last_start, _, last_id = spans[-1]
    assert (points[0][0], points[0][2]) == (first_id_of(log), first_start) == (first_id, 0)
    assert (points[-1][0], points[-1][2]) == (last_id, last_start)
    for entry_id, _, offset in points:
        assert starts.get(offset) == entry_id, f"{log.name}: index point {entry_id}@{offset}"


def test_many_tiny_segments_reopen_in_order(built: tuple[Path, dict[int, int]]) -> None:
    path, expected = built
    logs = segment_logs(path)
    assert len(logs) > MESSAGES // 4, f"only {len(logs)} segments"
    names = {p.name for p in (path / "segments").iterdir()}
    for log in logs:
        assert log.with_suffix(".idx").name in names, f"{log.name} has no index"
    assert not [n for n in names if n.endswith(".tmp")]
    for log in logs[:-1]:
        check_index(log)
    check_all_there(path, expected)


def _delete(idx: Path) -> None:
    idx.unlink()


def _empty(idx: Path) -> None:
    truncate(idx, 0)


def _header_only(idx: Path) -> None:
    truncate(idx, INDEX_HEADER.size)


def _mid_entry(idx: Path) -> None:
    truncate(idx, INDEX_HEADER.size + INDEX_ENTRY.size + 7)


def _drop_last_point(idx: Path) -> None:
    truncate(idx, idx.stat().st_size - INDEX_ENTRY.size)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "deleted": _delete,
    "empty": _empty,
    "header-only": _header_only,
    "mid-entry": _mid_entry,
    "last-point-dropped": _drop_last_point,
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_sealed_index_is_rebuilt(
    built: tuple[Path, dict[int, int]], tmp_path: Path, damage: str
) -> None:
    source, expected = built
    path = tmp_path / "q"
    shutil.copytree(source, path)
    logs = segment_logs(path)
    victims = [logs[0], logs[len(logs) // 2], logs[-2]]  # oldest, middle, newest sealed
    for log in victims:
        DAMAGE[damage](log.with_suffix(".idx"))
    check_all_there(path, expected)
    for log in victims:
        check_index(log)
    check_all_there(path, expected)  # and the rebuilt index is trusted on the next open


def test_drain_across_many_segments_retires_them(
    built: tuple[Path, dict[int, int]], tmp_path: Path
) -> None:
    source, expected = built
    path = tmp_path / "q"
    shutil.copytree(source, path)
    with ledgerq.open(path, segment_size=SEGMENT_SIZE) as q:
        got: list[ledgerq.Message] = []
        while batch := q.dequeue_batch(100):
            for msg in batch:
                q.ack(msg.id)
            got.extend(batch)
        segments = q.stats().segments
    assert [m.id for m in got] == sorted(expected)
    assert segments == len(segment_logs(path)) <= 2, "consumed segments were kept"
    with ledgerq.open(path, segment_size=SEGMENT_SIZE) as q:
        assert q.dequeue() is None
