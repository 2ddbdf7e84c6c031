"""``segment.feature_log``: the one protocol of the features' files, on real files.

A small table (a dict of str -> int, records ``[key, value]``; value None deletes)
stands for a feature.  Exclusive mode runs with the queue itself as the host; shared
mode with two real shared-mode handles of one queue, whose append lock the logs take.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq.features.dlq.retries import _MAGIC as RETRIES_MAGIC
from ledgerq.format.checksum import checksum_v1
from ledgerq.format.feature_state import (
    decode_feature_file,
    encode_feature_file_header,
    encode_feature_record,
)
from ledgerq.segment.feature_log import FeatureHost, FeatureLog, read_feature_values

MAGIC = b"LQTT"


class Table:
    """A feature's table and its log."""

    def __init__(self, path: Path, host: FeatureHost | None) -> None:
        self.rows: dict[str, int] = {}
        self.log = FeatureLog(str(path), MAGIC, "test table", host, self)

    def apply_record(self, value: Any) -> bool:
        if type(value) is not list or len(value) != 2 or type(value[0]) is not str:
            return False
        key, number = value
        if number is None:
            self.rows.pop(key, None)
        elif type(number) is int:
            self.rows[key] = number
        else:
            return False
        return True

    def clear_table(self) -> None:
        self.rows.clear()

    def table_records(self) -> Iterator[bytes]:
        for key, number in self.rows.items():
            yield encode_feature_record([key, number])

    def put(self, key: str, number: int | None) -> None:
        with self.log.locked():
            self.log.current(create=True)
            self.apply_record([key, number])
            self.log.append(encode_feature_record([key, number]))


@contextmanager
def _tables_of_two_handles(queue: Path, path: Path) -> Iterator[tuple[Table, Table]]:
    """The table of ``path`` in each of two shared handles of the queue at ``queue``."""
    with (
        ledgerq.open(queue, shared=True) as q1,
        ledgerq.open(queue, shared=True) as q2,
    ):
        yield Table(path, q1), Table(path, q2)


def test_records_survive_a_reopen_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "features" / "t.log"
    table = Table(path, None)
    assert not table.log.load(create=False) and not path.exists()
    table.log.open(compact=False)
    table.put("a", 1)
    table.put("b", 2)
    table.put("a", None)
    table.log.close()
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(encode_feature_record(["c", 3])[:-2])  # a kill in the middle of an append
    again = Table(path, None)
    again.log.open(compact=False)
    assert again.rows == {"b": 2}
    assert path.stat().st_size == size  # the torn record is cut before anything is appended
    again.put("d", 4)
    again.log.close()
    assert read_feature_values(str(path), MAGIC) == [["a", 1], ["b", 2], ["a", None], ["d", 4]]


def test_damage_is_skipped_and_counted_and_a_compaction_drops_it(tmp_path: Path) -> None:
    good = [encode_feature_record(["k", n]) for n in range(3)]
    bad = bytearray(good[1])
    bad[6] ^= 0xFF  # its CRC fails; the record after it is whole
    path = tmp_path / "q" / "features" / "t.log"
    with ledgerq.open(tmp_path / "q") as q:
        path.write_bytes(
            encode_feature_file_header(MAGIC)
            + good[0]
            + bytes(bad)
            + encode_feature_record("not a record")
            + good[2]
        )
        table = Table(path, q)
        table.log.open(compact=True)
        assert table.rows == {"k": 2}
        assert q.stats().corrupt_skipped == 2  # the damaged record and the foreign value
        table.log.close()
    assert decode_feature_file(path.read_bytes(), MAGIC).values == [["k", 2]]


def test_an_unreadable_file_starts_again_empty(tmp_path: Path) -> None:
    path = tmp_path / "q" / "features" / "t.log"
    with ledgerq.open(tmp_path / "q") as q:
        path.write_bytes(b"LQXX\x02\x00\x00\x00" + encode_feature_record(["a", 1]))
        table = Table(path, q)
        table.log.open(compact=False)
        assert table.rows == {} and q.stats().corrupt_skipped == 1
        table.put("b", 2)
        table.log.close()
    assert read_feature_values(str(path), MAGIC) == [["b", 2]]


def _v1_record(value: Any) -> bytes:
    body = encode_feature_record(value)[4:-4]
    framed = struct.pack("<I", len(body) + 8) + body
    return framed + struct.pack("<I", checksum_v1(framed))


def test_a_format_1_file_is_rewritten_as_format_2_with_every_record_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    values: list[Any] = [["a", 1], ["b", 2], ["a", None], "junk"]
    path.write_bytes(encode_feature_file_header(MAGIC, 1) + b"".join(_v1_record(v) for v in values))
    table = Table(path, None)
    table.log.open(compact=False)  # no compaction asked: the upgrade keeps the records
    assert table.rows == {"b": 2}
    found = decode_feature_file(path.read_bytes(), MAGIC)
    assert (found.version, found.values) == (2, values[:3])  # (the junk the table refused: gone)
    table.put("c", 3)
    table.log.close()
    assert decode_feature_file(path.read_bytes(), MAGIC).damaged == 0


def test_shared_handles_see_each_others_records_and_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "q" / "features" / "t.log"
    with _tables_of_two_handles(tmp_path / "q", path) as (one, two):
        one.log.open(compact=True)  # beside another handle: read as it is, not rewritten
        two.log.open(compact=True)
        one.put("a", 1)
        two.put("b", 2)  # after reading a's record (its append lock held)
        assert two.rows == {"a": 1, "b": 2}
        with one.log.locked():
            one.log.catch_up()
            assert one.rows == {"a": 1, "b": 2}
            one.apply_record(["a", None])
            one.log.rewrite()  # replaces the file: the other reads the new one whole
        assert one.log.records == 1
        with two.log.locked():
            two.log.catch_up()
        assert two.rows == {"b": 2}
        two.put("c", 3)  # appended to the new file
        one.log.close()
        two.log.close()
    assert read_feature_values(str(path), MAGIC) == [["b", 2], ["c", 3]]


def test_has_news_tells_a_change_by_another_handle(tmp_path: Path) -> None:
    path = tmp_path / "q" / "features" / "t.log"
    with _tables_of_two_handles(tmp_path / "q", path) as (one, two):
        assert not one.log.has_news()  # no file yet
        one.put("a", 1)
        assert not one.log.has_news()  # its own append
        assert two.log.has_news()  # a file it never read
        two.put("b", 2)
        assert one.log.has_news()
        with one.log.locked():
            one.log.current()
        assert not one.log.has_news() and one.rows == {"a": 1, "b": 2}
        with two.log.locked():
            two.log.current()
            two.log.rewrite()
        assert one.log.has_news()  # same size, another file
        one.log.close()
        two.log.close()


def test_records_written_ahead_are_kept_or_cut_back(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    table = Table(path, None)
    table.log.open(compact=False)
    table.log.append_ahead(encode_feature_record(["a", 1]))  # ahead of an operation...
    table.log.keep_ahead()  # ...that was done
    table.log.append_ahead(encode_feature_record(["b", 2]))
    table.log.append_ahead(encode_feature_record(["b", 3]))  # (one operation, two records)
    table.log.undo_ahead()  # ...that failed
    table.log.undo_ahead()  # (nothing more to undo)
    assert table.log.records == 1  # the records cut back are not counted (compaction)
    table.put("c", 3)
    table.log.close()
    assert read_feature_values(str(path), MAGIC) == [["a", 1], ["c", 3]]


def test_stale_says_whether_current_has_anything_to_do(tmp_path: Path) -> None:
    """Exclusive mode: nothing once loaded; shared mode: always (the others append)."""
    table = Table(tmp_path / "t.log", None)
    assert table.log.stale
    table.log.current(create=True)
    assert not table.log.stale
    table.log.close()
    with (
        ledgerq.open(tmp_path / "q", shared=True) as a,
        ledgerq.open(tmp_path / "q", shared=True) as b,
    ):
        one = Table(tmp_path / "q" / "features" / "t.log", a)
        two = Table(tmp_path / "q" / "features" / "t.log", b)
        with one.log.locked():
            one.log.current(create=True)
        assert one.log.stale
        two.put("a", 1)
        with one.log.locked():
            one.log.current()
        assert one.rows == {"a": 1} and one.log.stale
        one.log.close()
        two.log.close()


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_an_open_rewrites_the_file_only_when_it_holds_what_the_table_dropped(
    tmp_path: Path, shared: bool
) -> None:
    path = tmp_path / "q"
    retries = path / "features" / "retries.log"
    with ledgerq.open(path, max_retries=3, shared=shared) as q:
        q.enqueue_batch([b"a", b"b"])
        for msg in q.dequeue_batch(2):
            q.nack(msg.id, "no")  # one record each
    kept = retries.read_bytes()
    inode = retries.stat().st_ino
    with ledgerq.open(path, max_retries=3, shared=shared):
        pass  # every record live: the file is left as it is (no fsync, no rename)
    assert retries.stat().st_ino == inode and retries.read_bytes() == kept
    with ledgerq.open(path, max_retries=3, shared=shared) as q:
        msg = q.dequeue()
        assert msg is not None
        q.nack(msg.id, "again")  # a new record for it: its older ones are dead
    assert len(read_feature_values(str(retries), RETRIES_MAGIC)) > 2
    with ledgerq.open(path, max_retries=3, shared=shared):
        pass  # the dead records are dropped: rewritten as the table
    values = read_feature_values(str(retries), RETRIES_MAGIC)
    assert sorted((v[1], v[3]) for v in values) == [(1, "again"), (2, "no")]
