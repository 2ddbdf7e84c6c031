"""Kestrel 3 (libkestrel) writer and reader files: records, end markers, damage."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ledgerq.kestrel.journal3 import (
    BadRecord,
    TruncatedRecord,
    decode_record3,
    read_bookmark,
    read_writer_file,
)
from tests.kestrel._writer import (
    READER_MAGIC,
    WRITER_MAGIC,
    bookmark_file,
    put_record,
    read_done_record,
    read_head_record,
    writer_file,
)


def items_of(path: Path) -> tuple[list[tuple[int | None, bytes]], list[str]]:
    info, items = read_writer_file(str(path))
    found = [(item.item_id, item.data) for item in items]
    return found, [str(d) for d in info.damage]


def test_put_records_carry_every_field(tmp_path: Path) -> None:
    path = tmp_path / "q.1"
    path.write_bytes(
        writer_file(
            [
                put_record(1, b"plain", 1000),
                put_record(2, b"expiring", 2000, expire_ms=9000, error_count=3),
            ]
        )
    )
    info, items = read_writer_file(str(path))
    first, second = list(items)
    assert (first.item_id, first.data, first.add_time_ms, first.expire_time_ms) == (
        1,
        b"plain",
        1000,
        None,
    )
    assert first.error_count == 0
    assert (second.item_id, second.expire_time_ms, second.error_count) == (2, 9000, 3)
    assert (info.first_id, info.last_id, info.records, info.damage) == (1, 2, 2, [])


def test_command_bytes_count_the_length_word_in_the_header() -> None:
    assert put_record(1, b"", 0)[0] == 0x86
    assert put_record(1, b"", 0, expire_ms=5)[0] == 0x88
    assert read_head_record(0)[0] == 0x02
    assert read_done_record([1])[0] == 0x91
    assert len(put_record(1, b"abc", 0)) == 1 + 24 + 3


def test_zero_padding_and_a_half_written_record_end_the_file(tmp_path: Path) -> None:
    # Writer files are mmapped at their maximum size (zero padding), and records are
    # written first byte last, so a half-written record starts with 0 too.
    half = b"\x00" + put_record(3, b"half", 3)[1:]
    path = tmp_path / "q.1"
    path.write_bytes(
        writer_file([put_record(1, b"a", 1), put_record(2, b"b", 2), half], padding=4096)
    )
    assert items_of(path) == ([(1, b"a"), (2, b"b")], [])


def test_a_record_cut_anywhere_is_truncated_damage(tmp_path: Path) -> None:
    last = put_record(2, b"the last one", 2, expire_ms=7)
    blob = writer_file([put_record(1, b"first", 1), last])
    for cut in range(1, len(last)):
        path = tmp_path / f"q.{cut}"
        path.write_bytes(blob[: len(blob) - len(last) + cut])
        found, damage = items_of(path)
        assert found == [(1, b"first")]
        assert len(damage) == 1 and "truncated" in damage[0]
        with pytest.raises(TruncatedRecord):
            decode_record3(last[:cut], 0)


def test_unknown_commands_are_skipped_by_their_size(tmp_path: Path) -> None:
    unknown_plain = bytes([0x52]) + b"\x01" * 8  # command 5, 2 header words
    unknown_data = bytes([0xC1]) + struct.pack("<I", 5) + b"hello"  # command 12, 5 bytes data
    path = tmp_path / "q.1"
    path.write_bytes(writer_file([unknown_plain, put_record(1, b"a", 1), unknown_data]))
    info, items = read_writer_file(str(path))
    assert [i.data for i in items] == [b"a"]
    assert sum(info.quirks.values()) == 2


@pytest.mark.parametrize(
    "record",
    [
        bytes([0x87]) + struct.pack("<IiQqi", 1, 0, 1, 0, 0) + b"x",  # 7 header words
        bytes([0x86]) + struct.pack("<IiQq", 1, 0, 0, 0) + b"x",  # id 0
    ],
    ids=["seven-words", "id-zero"],
)
def test_malformed_puts_are_damage(tmp_path: Path, record: bytes) -> None:
    path = tmp_path / "q.1"
    path.write_bytes(writer_file([put_record(1, b"ok", 1), record, put_record(3, b"lost", 3)]))
    found, damage = items_of(path)
    assert found == [(1, b"ok")]
    assert len(damage) == 1


def test_data_over_16_mib_is_corruption() -> None:
    blob = bytes([0x86]) + struct.pack("<IiQq", 16 * 1024 * 1024 + 1, 0, 1, 0)
    with pytest.raises(BadRecord):
        decode_record3(blob, 0)


def test_a_bookmark_keeps_the_last_head_and_accumulates_done_ids(tmp_path: Path) -> None:
    path = tmp_path / "q.read.r"
    path.write_bytes(
        READER_MAGIC
        + read_head_record(3)
        + read_done_record([5, 9])
        + read_head_record(4)
        + read_done_record([7, 2])
    )
    mark = read_bookmark(str(path))
    assert mark.head == 4
    assert mark.done == {5, 7, 9}  # ids at or below the head are dropped
    assert [i for i in range(1, 11) if not mark.is_read(i)] == [6, 8, 10]


def test_a_damaged_bookmark_keeps_what_came_before(tmp_path: Path) -> None:
    path = tmp_path / "q.read."
    path.write_bytes(bookmark_file(5, [8])[:-3])
    mark = read_bookmark(str(path))
    assert mark.head == 5 and mark.done == set()
    assert mark.damage


def test_a_file_without_the_magic_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "q.1"
    path.write_bytes(READER_MAGIC + put_record(1, b"x", 1))
    assert items_of(path)[1]
    other = tmp_path / "q.read.x"
    other.write_bytes(WRITER_MAGIC + read_head_record(1))
    assert read_bookmark(str(other)).damage
