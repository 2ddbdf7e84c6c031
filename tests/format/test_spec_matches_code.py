"""docs/format.md against ledgerq.format: the spec's tables must describe the code.

Each table in the spec follows a ``<!-- table: NAME -->`` marker.  Besides comparing
the tables with the ``struct`` layouts, enums and constants, these tests decode
encoded records *using only the tables* (a small table-driven reader) and compare the
result with what was encoded: if the document and the bytes disagree, they fail.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ledgerq
from ledgerq.format import entry as entry_mod
from ledgerq.format import index as index_mod
from ledgerq.format import reader_state as state_mod
from ledgerq.format import sealing as sealing_mod
from ledgerq.format.entry import EntryFlags, RecordType, encode_entry
from ledgerq.format.reader_state import Checkpoint, StateRecordType
from ledgerq.segment.meta import DELIVER_AT_VERSION
from tests.strategies import EntrySpec, checkpoints, entry_specs, id_batches, index_entry_lists

# The module (``ledgerq.format.checksum`` the attribute is the function of that name).
checksum_mod = importlib.import_module("ledgerq.format.checksum")

SPEC = Path(__file__).resolve().parents[2] / "docs" / "format.md"

Row = dict[str, str]

# Every table of the spec, each checked by a test below.
CHECKED_TABLES = {
    "entry-formats",
    "types",
    "files",
    "entry",
    "entry-flags",
    "entry-types",
    "priorities",
    "index-header",
    "index-entry",
    "state-header",
    "state-record",
    "state-types",
    "checkpoint",
    "shared-state",
    "shared-tail",
    "shared-lock",
    "shared-reader-slot",
    "meta",
    "options",
    "constants",
    "sealed",
    "sealed-content",
    "sealing-constants",
    "unique-table",
    "unique-record",
    "periodic-record",
    "forward-record",
    "rate-limit",
    "progress-record",
}

_MARKER = re.compile(r"<!--\s*table:\s*([\w-]+)\s*-->")


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("`").strip() for cell in line.strip().strip("|").split("|")]


def parse_tables(text: str) -> dict[str, list[Row]]:
    """Return each marked table as a list of rows keyed by lower-cased column name."""
    tables: dict[str, list[Row]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        marker = _MARKER.search(line)
        if not marker:
            continue
        name = marker.group(1)
        assert name not in tables, f"table {name!r} appears twice"
        body: list[str] = []
        for follow in lines[i + 1 :]:
            if not follow.strip():
                if body:
                    break
                continue
            if not follow.lstrip().startswith("|"):
                break
            body.append(follow)
        assert len(body) >= 3, f"table {name!r} has no rows"
        header = [h.lower() for h in _cells(body[0])]
        assert set(_cells(body[1])) <= {"---", ":---", "---:", ":---:"}, name
        rows = []
        for raw in body[2:]:
            cells = _cells(raw)
            assert len(cells) == len(header), f"table {name!r}: row {raw!r} has wrong width"
            rows.append(dict(zip(header, cells, strict=True)))
        tables[name] = rows
    return tables


TABLES = parse_tables(SPEC.read_text(encoding="utf-8"))


def table(name: str) -> list[Row]:
    return TABLES[name]


def row(name: str, field: str, key: str = "field") -> Row:
    matches = [r for r in table(name) if r[key] == field]
    assert len(matches) == 1, f"{name}: {len(matches)} rows for {field!r}"
    return matches[0]


def type_codes() -> dict[str, str]:
    """struct codes of the fixed-size types of the spec's type table."""
    codes = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i64": "q", "bytes[4]": "4s"}
    return {r["type"]: codes[r["type"]] for r in table("types") if r["type"] in codes}


def struct_fields(layout: struct.Struct) -> list[tuple[int, int, str]]:
    """(offset, size, code) of each field of a little-endian struct."""
    assert layout.format.startswith("<"), "on-disk structs must be little-endian"
    fields = []
    offset = 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", layout.format[1:]):
        one = f"{count}{code}" if code == "s" else code
        repeat = 1 if code == "s" else int(count or 1)
        for _ in range(repeat):
            size = struct.calcsize("<" + one)
            fields.append((offset, size, one))
            offset += size
    assert offset == layout.size
    return fields


def assert_rows_match_struct(rows: list[Row], layout: struct.Struct, start: int = 0) -> None:
    codes = type_codes()
    expected = struct_fields(layout)
    assert len(rows) == len(expected), [r["field"] for r in rows]
    for r, (offset, size, code) in zip(rows, expected, strict=True):
        assert int(r["offset"]) == start + offset, r
        assert int(r["size"]) == size, r
        assert codes[r["type"]] == code, r


# ---------------------------------------------------------------- a reader made of the tables


def _evaluate(expr: str, values: dict[str, Any]) -> int:
    """Evaluate an offset or size cell: ``12``, ``headers_length`` or ``length - 4``."""
    if expr.isdigit():
        return int(expr)
    match = re.fullmatch(r"(\w+)(?: - (\d+))?", expr)
    assert match, f"cannot evaluate {expr!r}"
    name, minus = match.groups()
    value = values[name]
    assert isinstance(value, int)
    return value - int(minus or 0)


def _is_present(r: Row, values: dict[str, Any]) -> bool:
    present = r.get("present", "always")
    if present == "always":
        return True
    return bool(values["flags"] & int(row("entry-flags", present, "name")["value"], 0))


def walk(rows: list[Row], raw: bytes, start: int = 0) -> tuple[dict[str, Any], int]:
    """Decode one record from ``raw`` by following a layout table; return fields and end."""
    codes = type_codes()
    values: dict[str, Any] = {}
    pos = start
    for i, r in enumerate(rows):
        if not _is_present(r, values):
            continue
        if r["offset"] != "*":
            assert pos - start == _evaluate(r["offset"], values), r
        if r["size"] == "*":
            after = next((x for x in rows[i + 1 :] if _is_present(x, values)), None)
            if after is None:  # the last field: the rest of the record
                size = len(raw) - pos
            else:
                size = _evaluate(after["offset"], values) - (pos - start)
        else:
            size = _evaluate(r["size"], values)
        assert 0 <= size <= len(raw) - pos, r
        kind = r["type"]
        if kind in codes:
            assert struct.calcsize("<" + codes[kind]) == size, r
            (values[r["field"]],) = struct.unpack_from("<" + codes[kind], raw, pos)
        elif kind == "bytes":
            values[r["field"]] = raw[pos : pos + size]
        elif kind == "msgpack":
            values[r["field"]] = msgpack.unpackb(raw[pos : pos + size], raw=False)
        elif kind == "utf8":
            values[r["field"]] = raw[pos : pos + size].decode()
        else:
            raise AssertionError(f"type {kind!r} is not in the spec's type table")
        pos += size
    return values, pos


def doc_flag(name: str) -> int:
    return int(row("entry-flags", name, "name")["value"], 0)


def doc_default_priority() -> int:
    (default,) = [r for r in table("priorities") if "absent" in r["stored"]]
    return int(default["value"])


# ---------------------------------------------------------------- the tables themselves


def test_every_table_is_checked() -> None:
    assert set(TABLES) == CHECKED_TABLES


def test_types() -> None:
    for r in table("types"):
        if r["type"] in type_codes():
            assert struct.calcsize("<" + type_codes()[r["type"]]) == int(r["size"]), r
    used = {
        r["type"]
        for name in ("entry", "index-header", "index-entry", "state-header", "state-record")
        for r in table(name)
    }
    assert used <= {r["type"] for r in table("types")}


def test_entry_fixed_fields_match_the_struct() -> None:
    rows = table("entry")
    assert [r["field"] for r in rows[:5]] == ["length", "type", "flags", "id", "timestamp"]
    assert_rows_match_struct(rows[:5], entry_mod.ENTRY_HEADER)
    assert all(r["present"] == "always" for r in rows[:5])


def test_entry_optional_fields_match_their_structs() -> None:
    codes = type_codes()
    for field, layout in (
        ("expires_at", entry_mod.EXPIRES_AT),
        ("priority", entry_mod.PRIORITY),
        ("deliver_at", entry_mod.DELIVER_AT),
        ("headers_length", entry_mod.HEADERS_LENGTH),
        ("crc", entry_mod.CRC),
    ):
        r = row("entry", field)
        ((_, size, code),) = struct_fields(layout)
        assert (int(r["size"]), codes[r["type"]]) == (size, code), r
    assert int(row("entry", "expires_at")["offset"]) == entry_mod.ENTRY_HEADER.size
    assert row("entry", "crc")["offset"] == f"length - {entry_mod.CRC.size}"
    assert row("entry", "crc") is table("entry")[-1]


def _doc_checksums() -> dict[int, Any]:
    """The checksum function of each entry format, by the name the spec gives it."""
    by_name = {checksum_mod.CHECKSUM_NAME: checksum_mod.checksum}
    by_name[checksum_mod.CHECKSUM_NAME_V1] = checksum_mod.checksum_v1
    return {int(r["format"]): by_name[r["checksum"]] for r in table("entry-formats")}


def test_entry_formats() -> None:
    rows = table("entry-formats")
    assert {int(r["format"]) for r in rows} == {1, entry_mod.ENTRY_FORMAT}
    data = int(row("entry-types", "DATA", "name")["value"])
    for r in rows:
        fmt = int(r["format"])
        assert int(r["type byte of data"], 0) == int(r["high bits"]) << 4 | data, r
        raw = encode_entry(1, 0, b"x", entry_format=fmt)
        assert raw[4] == int(r["type byte of data"], 0), r
        assert raw[4] >> entry_mod.ENTRY_FORMAT_SHIFT == int(r["high bits"]), r
        assert _doc_checksums()[fmt](raw[:-4]) == struct.unpack_from("<I", raw, len(raw) - 4)[0]


def test_entry_presence_column_names_flags() -> None:
    names = {r["name"] for r in table("entry-flags")}
    for r in table("entry"):
        assert r["present"] == "always" or r["present"] in names, r
    always = [r for r in table("entry") if r["present"] == "always" and r["size"].isdigit()]
    assert sum(int(r["size"]) for r in always) == entry_mod.MIN_ENTRY_SIZE


def test_entry_flags() -> None:
    rows = table("entry-flags")
    for r in rows:
        assert int(r["value"], 0) == 1 << int(r["bit"]) == EntryFlags[r["name"]], r
    assert {r["name"] for r in rows} == {f.name for f in EntryFlags if f.value}
    known = 0
    for r in rows:
        known |= int(r["value"], 0)
    assert known == entry_mod.KNOWN_FLAGS


def test_entry_types() -> None:
    assert {r["name"]: int(r["value"]) for r in table("entry-types")} == {
        t.name: t.value for t in RecordType
    }


def test_priorities() -> None:
    rows = table("priorities")
    assert {r["name"]: int(r["value"]) for r in rows} == {p.name: p.value for p in ledgerq.Priority}
    for r in rows:
        flags = encode_entry(1, 0, b"", priority=int(r["value"]))[5]
        stored = bool(flags & doc_flag("HAS_PRIORITY"))
        assert stored == ("absent" not in r["stored"]), r


def test_index_tables_match_the_structs() -> None:
    assert_rows_match_struct(table("index-header"), index_mod.INDEX_HEADER)
    assert_rows_match_struct(table("index-entry"), index_mod.INDEX_ENTRY)
    assert [r["field"] for r in table("index-header")] == ["magic", "version", "count"]
    assert [r["field"] for r in table("index-entry")] == ["id", "timestamp", "offset"]


def test_state_tables_match_the_structs() -> None:
    assert_rows_match_struct(table("state-header"), state_mod.STATE_FILE_HEADER)
    rows = table("state-record")
    assert [r["field"] for r in rows] == ["length", "type", "body", "crc"]
    assert_rows_match_struct(rows[:2], state_mod.STATE_RECORD_HEADER)
    minimum = state_mod.STATE_RECORD_HEADER.size + 4
    assert rows[2]["size"] == f"length - {minimum}"
    assert rows[3]["offset"] == "length - 4"
    assert minimum == state_mod._MIN_RECORD


def test_state_types() -> None:
    rows = table("state-types")
    assert {r["name"]: int(r["value"]) for r in rows} == {t.name: t.value for t in StateRecordType}
    for r in rows:
        kind = StateRecordType[r["name"]]
        assert r["body"] in ("ids", "checkpoint", "due_ns, ids", *HELD_BODIES), r
        if r["body"] == "ids":
            encode_state_ids = state_mod.encode_ids_record(kind, [1])
            assert encode_state_ids[4] == kind
        elif r["body"] == "checkpoint":
            with pytest.raises(ValueError, match="does not carry ids"):
                state_mod.encode_ids_record(kind, [1])
        elif r["body"] == "due_ns, ids":
            record = state_mod.encode_not_before_record(9, [1, 5])
            decoded, body, _ = state_mod.decode_state_record(record, 0)
            assert (decoded, body) == (kind, (9, 1, 5))
        else:
            # Two u64 as named, then the ids: the decoded body is (first, second, *ids).
            encode = (
                state_mod.encode_touch_record
                if kind is StateRecordType.TOUCH
                else HELD_BODIES[r["body"]]
            )
            record = encode(7, 2, [1, 5])
            decoded, body, _ = state_mod.decode_state_record(record, 0)
            assert (decoded, body) == (kind, (7, 2, 1, 5))


HELD_BODY_NAMES = ("holder, deadline_ns, ids", "holder, cause, ids")


@settings(max_examples=20)
@given(
    st.sampled_from([r for r in TABLES["state-types"] if r["body"] in HELD_BODY_NAMES]),
    st.integers(0, (1 << 64) - 1),
    st.sampled_from([int(c) for c in state_mod.ReclaimCause]),
    id_batches,
)
def test_tables_decode_shared_mode_records(
    kind: Row, holder: int, second: int, ids: list[int]
) -> None:
    """LEASE_BY, RECLAIM and TOUCH walked with the tables alone, checksummed with CRC-32C
    (the format's checksum, computed here by the crc32c package, not by format.checksum)."""
    encode = state_mod.encode_touch_record if kind["name"] == "TOUCH" else HELD_BODIES[kind["body"]]
    raw = encode(holder, second, ids)
    record, end = walk(table("state-record"), raw)
    assert end == len(raw)
    assert record["type"] == int(kind["value"])
    assert record["crc"] == crc32c.crc32c(raw[:-4])
    body = record["body"]
    assert list(struct.unpack(f"<{len(body) // 8}Q", body)) == [holder, second, *ids]


HELD_BODIES = {
    "holder, deadline_ns, ids": state_mod.encode_lease_by_record,
    "holder, cause, ids": lambda h, c, ids: state_mod.encode_reclaim_record(
        h, state_mod.ReclaimCause(c), ids
    ),
}


def test_shared_state_tables_match_the_layout() -> None:
    from ledgerq.format import shared_state as page

    rows = table("shared-state")
    assert_rows_match_struct(rows[:2], page.STATE_HEADER)
    assert (int(rows[2]["offset"]), int(rows[2]["size"])) == (
        page.TAIL_OFFSET,
        page.TAIL_RECORD.size,
    )
    slots = {r["field"]: int(r["offset"]) for r in rows[3:]}
    assert slots == {
        "writing": page.SLOT_WRITING,
        "reserved_until": page.SLOT_RESERVED_UNTIL,
        "duplicates": page.SLOT_DUPLICATES,
        "corrupt_skipped": page.SLOT_CORRUPT_SKIPPED,
        "enqueued_base": page.SLOT_ENQUEUED_BASE,
        "enqueued_through": page.SLOT_ENQUEUED_THROUGH,
        "reserve_spent": page.SLOT_RESERVE_SPENT,
        "locking": page.SLOT_LOCKING,
        **{
            f"{name}_log": page.SLOT_FEATURE_LOGS + 8 * i
            for i, name in enumerate(page.FEATURE_LOGS)
        },
        "append_lock": page.APPEND_LOCK,
        "readers": page.READER_SLOTS_AT,
    }
    assert all(r["size"] == "8" and r["type"] == "u64" for r in rows[3:16])
    assert int(rows[-2]["size"]) == page.LOCK_BLOCK_SIZE
    assert int(rows[-1]["size"]) == page.READER_SLOTS * page.READER_SLOT_SIZE
    assert page.READER_SLOTS_AT + page.READER_SLOTS * page.READER_SLOT_SIZE == page.PAGE_SIZE
    lock = {r["field"]: (int(r["offset"]), int(r["size"])) for r in table("shared-lock")}
    assert lock == {
        "owner": (page.LOCK_OWNER, 8),
        "sequence": (page.LOCK_SEQUENCE, 4),
        "waiters": (page.LOCK_WAITERS, 4),
    }
    reader = {r["field"]: int(r["offset"]) for r in table("shared-reader-slot")}
    assert reader == {
        "key": page.SLOT_KEY,
        "lock": page.SLOT_LOCK,
        "journal_length": page.SLOT_JOURNAL_LENGTH,
        "journal_generation": page.SLOT_JOURNAL_GENERATION,
        "name_length": page.SLOT_NAME,
    }
    assert str(page.SLOT_NAME_MAX) in table("shared-reader-slot")[-1]["meaning"]
    tail_rows = table("shared-tail")
    assert_rows_match_struct(tail_rows, page.TAIL_RECORD)
    assert [r["field"] for r in tail_rows[:7]] == list(page.SharedTail._fields)
    # Decode a page written by the code with the tables alone.
    tail = page.SharedTail(11, 2048, 40, 1999, 1_700_000_000_000_000_000, 1024, 3)
    blob = page.encode_page(tail, reserved_until=99, counters={"duplicates": 5, "reserve_spent": 1})
    values, _ = walk(rows[:2], blob)
    assert values["magic"] == b"LQSP" and values["version"] == page.SHARED_VERSION == 4
    assert struct.unpack_from("<Q", blob, page.SLOT_LOCKING)[0] == page.LOCKING_WORDS
    tail_values, _ = walk(tail_rows, blob[page.TAIL_OFFSET :])
    assert [tail_values[f] for f in page.SharedTail._fields] == list(tail)
    # The tail's checksum is the format's (CRC-32C, what the spec's row names).
    assert "CRC-32C" in tail_rows[7]["meaning"]
    assert tail_values["crc"] == checksum_mod.checksum(
        blob[page.TAIL_OFFSET : page.TAIL_OFFSET + 56]
    )
    assert tail_values["crc"] == crc32c.crc32c(blob[page.TAIL_OFFSET : page.TAIL_OFFSET + 56])
    assert struct.unpack_from("<Q", blob, slots["reserved_until"])[0] == 99
    assert struct.unpack_from("<Q", blob, slots["duplicates"])[0] == 5
    assert struct.unpack_from("<Q", blob, slots["reserve_spent"])[0] == 1


def test_constants() -> None:
    required = {
        "format.entry.MIN_ENTRY_SIZE",
        "format.entry.MAX_ENTRY_SIZE",
        "format.entry.KNOWN_FLAGS",
        "format.checksum.CHECKSUM_NAME",
        "format.index.INDEX_MAGIC",
        "format.index.INDEX_VERSION",
        "format.index.OPEN_COUNT",
        "format.reader_state.STATE_MAGIC",
        "format.reader_state.STATE_VERSION",
        "format.checksum.RESIDUE",
        "segment.meta.FORMAT_VERSION",
        "segment.naming.META_NAME",
        "segment.naming.LOCK_NAME",
        "segment.naming.SEGMENTS_DIR",
        "segment.naming.READERS_DIR",
        "segment.naming.FEATURES_DIR",
        "segment.naming.DLQ_DIR",
        "segment.naming.SHARED_DIR",
        "format.shared_state.SHARED_MAGIC",
    }
    rows = table("constants")
    assert required <= {r["constant"] for r in rows}
    for r in rows:
        module, _, name = r["constant"].rpartition(".")
        actual = getattr(importlib.import_module(f"ledgerq.{module}"), name)
        text = r["value"]
        if text.startswith('"'):
            expected: object = json.loads(text)
            if isinstance(actual, bytes):
                expected = str(expected).encode("ascii")
        else:
            expected = int(text, 0)
        assert actual == expected, r


def _feature_log_records(path: Path, magic: bytes) -> list[Any]:
    """The records of a feature log, read as the spec says: an 8-byte header (magic,
    version 2), then records framed by their length and a trailing CRC-32C, each a
    msgpack value."""
    data = path.read_bytes()
    assert struct.unpack_from("<4sI", data, 0) == (magic, 2)
    pos, records = 8, []
    while pos < len(data):
        (length,) = struct.unpack_from("<I", data, pos)
        assert struct.unpack_from("<I", data, pos + length - 4)[0] == crc32c.crc32c(
            data[pos : pos + length - 4]
        )
        records.append(msgpack.unpackb(data[pos + 4 : pos + length - 4]))
        pos += length
    return records


def _key_table_records(path: Path, magic: bytes, rows: list[Row]) -> list[dict[str, object]]:
    """The records of a key table (``features/*.table``) decoded with the spec's header
    table (the unique keys') and the record table ``rows`` alone."""
    header = {r["field"]: r for r in table("unique-table")}
    assert list(header) == ["magic", "version", "replaced", "reserved", "records"]
    offsets = [int(r["offset"]) for r in rows]
    assert offsets == sorted(offsets) and offsets[0] == 0
    record = struct.Struct(
        "<" + "".join({"bytes": f"{r['size']}s", "u64": "Q", "i64": "q"}[r["type"]] for r in rows)
    )
    assert record.size == int(header["records"]["size"])
    data = path.read_bytes()
    at = {name: int(r["offset"]) for name, r in header.items()}
    assert data[at["magic"] : at["magic"] + 4] == magic
    assert struct.unpack_from("<I", data, at["version"])[0] == int(header["version"]["meaning"])
    assert struct.unpack_from("<Q", data, at["replaced"])[0] == 0
    assert data[at["reserved"] : at["records"]] == bytes(int(header["reserved"]["size"]))
    names = [r["field"] for r in rows]
    id_field = names[1]  # the u64 whose 0 ends the records
    records, pos = [], at["records"]
    while True:
        found = dict(zip(names, record.unpack_from(data, pos), strict=True))
        if found[id_field] == 0:
            break
        records.append(found)
        pos += record.size
    assert data[pos:] == bytes(len(data) - pos), "zeros after the records"
    return records


def test_unique_records_read_with_the_table_alone(tmp_path: Path) -> None:
    """features/unique.table decoded with the spec's header and record tables alone."""
    import xxhash

    rows = table("unique-record")
    assert [r["field"] for r in rows] == ["digest", "id", "timestamp", "expires"]
    with ledgerq.open(tmp_path / "q") as q:
        first = q.enqueue(b"a", unique_key="job-1")
        second = q.enqueue(b"b", unique_key="job-2", ttl=60)
        stamps = {m.id: (m.timestamp, m.expires_at) for m in q.peek(2)}
    records = _key_table_records(tmp_path / "q" / "features" / "unique.table", b"LQUT", rows)
    assert records == [
        {
            "digest": xxhash.xxh3_128_digest(b"unique:job-1"),
            "id": first,
            "timestamp": stamps[first][0],
            "expires": 0,
        },
        {
            "digest": xxhash.xxh3_128_digest(b"unique:job-2"),
            "id": second,
            "timestamp": stamps[second][0],
            "expires": stamps[second][1],
        },
    ]


def test_forward_records_read_with_the_table_alone(tmp_path: Path) -> None:
    """features/forwards.table decoded with the spec's header and record tables, and the
    key derived as the table says."""
    import xxhash

    rows = table("forward-record")
    assert [r["field"] for r in rows] == ["key", "first_id", "count", "timestamp"]
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b") as b:
        a.enqueue_batch([b"1", b"2"])
        first, second = a.dequeue_batch(2)
        a.forward(first.id, b, [b"x", b"y"])
        a.forward(second.id, b, [ledgerq.Item(b"z", headers={"h": "v"})])
        stamps = {m.id: m.timestamp for m in b.peek(3)}
    records = _key_table_records(tmp_path / "b" / "features" / "forwards.table", b"LQFT", rows)
    source = os.path.realpath(tmp_path / "a")

    def key(message_id: int) -> bytes:
        return xxhash.xxh3_128_digest(f"{source}\0default\0{message_id}\0".encode())

    assert records == [
        {"key": key(first.id), "first_id": 1, "count": 2, "timestamp": stamps[1]},
        {"key": key(second.id), "first_id": 3, "count": 1, "timestamp": stamps[3]},
    ]


def test_periodic_records_read_with_the_table_alone(tmp_path: Path) -> None:
    """features/periodic.log decoded with the spec's header, framing and record table."""
    from ledgerq.features import periodic
    from tests.clocks import SECOND, SteppedClock

    rows = table("periodic-record")
    kinds = {int(r["kind"]): r for r in rows}
    assert {r["name"]: int(r["kind"]) for r in rows} == {
        "ADD": periodic.ADD,
        "REMOVE": periodic.REMOVE,
        "FIRE": periodic.FIRE,
        "DONE": periodic.DONE,
    }
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock) as q:
        q.add_periodic("j", b"pay", every=10, headers={"h": "v"})
        clock.elapse(10)
        msg = q.dequeue()
        assert msg is not None
        q.remove_periodic("j")
    records = []
    for value in _feature_log_records(tmp_path / "q" / "features" / "periodic.log", b"LQPJ"):
        fields = [f.split()[0] for f in kinds[value[0]]["fields"].split(", ")]
        records.append((kinds[value[0]]["name"], dict(zip(fields, value[1:], strict=True))))
    tick = clock.wall_ns
    assert records == [
        (
            "ADD",
            {
                "revision": 1,
                "name": "j",
                "every_ns": 10 * SECOND,
                "cron": "",
                "anchor_ns": tick - 10 * SECOND,
                "priority": 1,
                "body": msgpack.packb([{"h": "v"}, b"pay"]),
                "last_tick": -1,
            },
        ),
        ("FIRE", {"revision": 1, "tick_ns": tick, "id": msg.id, "timestamp": msg.timestamp}),
        ("DONE", {"revision": 1, "tick_ns": tick}),
        ("REMOVE", {"name": "j"}),
    ]


def test_files() -> None:
    from ledgerq.segment import naming

    paths = {r["path"] for r in table("files")}
    segments = naming.SEGMENTS_DIR
    for suffix, make in (
        (naming.LOG_SUFFIX, naming.log_path),
        (naming.INDEX_SUFFIX, naming.idx_path),
    ):
        (pattern,) = [p for p in paths if p.endswith(suffix) and p.startswith(segments + "/")]
        for first_id in (1, 123, (1 << 64) - 1):
            assert pattern.format(first_id=first_id) == make(segments, first_id)
    (state,) = [p for p in paths if p.endswith(naming.STATE_SUFFIX)]
    assert state.format(name="r") == naming.reader_state_path("", "r")
    named = {naming.LOCK_NAME, naming.META_NAME, naming.FEATURES_DIR + "/", naming.DLQ_DIR + "/"}
    assert named <= paths
    from ledgerq.features.unique import UNIQUE_LOG

    assert f"{naming.FEATURES_DIR}/{UNIQUE_LOG}" in paths
    assert f"{naming.FEATURES_DIR}/{naming.UNIQUE_TABLE_NAME}" in paths
    assert f"{naming.FEATURES_DIR}/{naming.FORWARDS_TABLE_NAME}" in paths
    assert f"{naming.FEATURES_DIR}/{naming.PERIODIC_NAME}" in paths
    # Every name a queue directory may hold is in the table (the temp files aside).
    tops = {p.split("/")[0] for p in paths}
    assert {n for n in naming.QUEUE_NAMES if not n.endswith(naming.TMP_SUFFIX)} == tops
    from ledgerq.segment.layout import DAMAGED_DIR

    assert f"{segments}/{DAMAGED_DIR}/" in paths
    shared = naming.SHARED_DIR
    for name in (naming.OPENING_NAME, naming.APPEND_NAME, naming.SHARED_STATE_NAME):
        assert f"{shared}/{name}" in paths
    (reader_lock,) = [p for p in paths if p.endswith(".reader")]
    assert reader_lock.format(name="r") == naming.reader_lock_path("", "r")
    (live,) = [p for p in paths if p.endswith(".live")]
    assert live.format(handle=0xAB) == naming.handle_live_path("", 0xAB)
    assert f"{shared}/{naming.RATE_LIMIT_NAME}" in paths
    assert naming.rate_limit_path("") == f"{shared}/{naming.RATE_LIMIT_NAME}"
    (progress,) = [p for p in paths if p.startswith(f"{shared}/{naming.PROGRESS_DIR}/")]
    assert progress.format(reader="r", id=42) == naming.progress_path("", "r", 42)
    assert naming.parse_progress_name(progress.format(reader="a.b", id=7).split("/")[-1]) == (
        "a.b",
        7,
    )


def test_rate_limit_table_matches_the_layout(tmp_path: Path) -> None:
    """shared/ratelimit decoded with the table alone, as a limiter wrote it."""
    from ledgerq.segment import ratelimit

    rows = table("rate-limit")
    assert_rows_match_struct(rows, ratelimit.HEADER)
    assert "128" in SPEC.read_text().split("<!-- table: rate-limit -->")[0].rsplit("###", 1)[1]
    assert ratelimit.HEADER_SIZE == 128 and ratelimit.SLOT.size == 8
    assert str(ratelimit.MAX_COUNT) in row("rate-limit", "count")["meaning"]
    now = [7_000_000_000]
    limiter = ratelimit.RateLimiter(str(tmp_path), 3, 1_000_000_000, lambda: now[0])
    for step in range(4):
        limiter.acquire()
        now[0] += 1000 * step
    limiter.close()
    raw = (tmp_path / "shared" / "ratelimit").read_bytes()
    values, end = walk(rows, raw)
    assert values["magic"] == b"LQRL" and values["version"] == ratelimit.VERSION == 1
    assert (values["count"], values["period_ns"], values["head"], values["starts"]) == (
        3,
        1_000_000_000,
        0,
        3,
    )
    assert raw[end:128] == bytes(128 - end) and len(raw) == 128 + 3 * 8
    slots = [v for (v,) in struct.iter_unpack("<Q", raw[128:])]
    assert slots == [7_000_000_000, 7_000_000_000, 7_000_001_000]


def test_progress_record_read_with_the_table_alone() -> None:
    from ledgerq.segment import progress

    rows = table("progress-record")
    assert_rows_match_struct(rows[:-1], progress.RECORD)
    assert str(progress.MAX_NOTE_CHARS) in rows[-1]["meaning"]
    blob = progress.encode_progress(42, 2, 0.25, "résumé", 1_700_000_000_000_000_000)
    values, end = walk(rows, blob)
    assert end == len(blob)
    assert values == {
        "magic": b"LQPG",
        "version": progress.VERSION,
        "id": 42,
        "attempts": 2,
        "updated": 1_700_000_000_000_000_000,
        "fraction_ppm": 250_000,
        "note_length": len("résumé".encode()),
        "note": "résumé",
    }


def test_meta_fields() -> None:
    from ledgerq.segment.meta import Meta

    rows = table("meta")
    assert [r["field"] for r in rows] == [f.name for f in dataclasses.fields(Meta)]
    json_types = {"string": str, "integer": int, "boolean": bool, "object": dict, "array": list}
    saved = json.loads(json.dumps(dataclasses.asdict(Meta())))
    for r in rows:
        assert type(saved[r["field"]]) is json_types[r["json type"]], r
    assert f"`{saved['format']}`" in row("meta", "format")["meaning"]
    assert f", {saved['version']};" in row("meta", "version")["meaning"]
    # A queue that can hold a delayed or grouped entry says this version.
    assert saved["version"] == DELIVER_AT_VERSION
    assert "no delayed or grouped entry" in row("meta", "version")["meaning"]


def test_options_fields() -> None:
    from ledgerq.segment.meta import OPTIONS_FORMAT, OptionsCopy

    rows = table("options")
    assert [r["field"] for r in rows] == [f.name for f in dataclasses.fields(OptionsCopy)]
    json_types = {"string": str, "integer": int, "object": dict}
    saved = json.loads(json.dumps(dataclasses.asdict(OptionsCopy())))
    for r in rows:
        assert type(saved[r["field"]]) is json_types[r["json type"]], r
    assert OPTIONS_FORMAT in row("options", "format")["meaning"]
    assert saved["format"] == OPTIONS_FORMAT
    assert row("options", "version")["meaning"].startswith(f"{saved['version']};")


def test_checkpoint_table() -> None:
    rows = table("checkpoint")
    assert [int(r["index"]) for r in rows] == list(range(len(Checkpoint._fields)))
    assert [r["field"] for r in rows] == [
        "head",
        "done_ids",
        "deliveries",
        "counters",
        "leases",
        "not_before",
    ]


# ---------------------------------------------------------------- decoding by the tables


@settings(max_examples=100)
@given(entry_specs())
def test_tables_decode_entries(spec: EntrySpec) -> None:
    raw = spec.encode()
    values, end = walk(table("entry"), raw)
    assert end == len(raw) == values["length"]
    high_bits = {int(r["format"]): int(r["high bits"]) for r in table("entry-formats")}
    crc = _doc_checksums()[spec.entry_format]
    assert values["crc"] == crc(raw[: values["length"] - 4])
    assert values["type"] >> 4 == high_bits[spec.entry_format]
    assert values["type"] & 0xF == int(row("entry-types", "DATA", "name")["value"])
    assert values["id"] == spec.id
    assert values["timestamp"] == spec.timestamp
    assert values.get("expires_at") == spec.expires_at
    assert values.get("deliver_at") == spec.deliver_at
    assert values.get("group") == spec.group
    assert values.get("priority", doc_default_priority()) == spec.priority
    assert values.get("headers") == spec.headers
    assert values["payload"] == spec.payload
    assert bool(values["flags"] & doc_flag("COMPRESSED")) == spec.compressed


@settings(max_examples=40)
@given(index_entry_lists(), st.booleans())
def test_tables_decode_index_files(entries: list[index_mod.IndexEntry], sealed: bool) -> None:
    count = len(entries) if sealed else index_mod.OPEN_COUNT
    raw = index_mod.encode_index_header(count) + b"".join(
        index_mod.encode_index_entry(*e) for e in entries
    )
    header, pos = walk(table("index-header"), raw)
    assert header["magic"] == b"LQIX"
    assert header["version"] == 1
    open_count = int(row("constants", "format.index.OPEN_COUNT", "constant")["value"], 0)
    assert (header["count"] != open_count) == sealed
    decoded = []
    while pos < len(raw):
        point, pos = walk(table("index-entry"), raw, pos)
        decoded.append((point["id"], point["timestamp"], point["offset"]))
    assert decoded == [tuple(e) for e in entries]


def _doc_checkpoint(body: list[Any]) -> dict[str, Any]:
    """Check a checkpoint body against the table's msgpack types; return it by field."""
    shapes = {
        "uint": lambda v: type(v) is int and v >= 0,
        "array of uint": lambda v: type(v) is list and all(type(i) is int for i in v),
        "array of [uint, uint]": lambda v: (
            type(v) is list and all(type(p) is list and len(p) == 2 for p in v)
        ),
        "map of str to uint": lambda v: type(v) is dict and all(type(k) is str for k in v),
        "array of [uint, uint, uint]": lambda v: (
            type(v) is list and all(type(p) is list and len(p) == 3 for p in v)
        ),
    }
    # Four elements, or five (the leases, a shared-mode version 2 checkpoint).
    rows = table("checkpoint")[: len(body)]
    assert len(body) in (4, 5)
    for r in rows:
        assert shapes[r["msgpack type"]](body[int(r["index"])]), r
    return {r["field"]: body[int(r["index"])] for r in rows}


@settings(max_examples=40)
@given(checkpoints())
def test_tables_decode_checkpoints(checkpoint: Checkpoint) -> None:
    raw = state_mod.encode_state_file_header() + state_mod.encode_checkpoint(checkpoint)
    header, pos = walk(table("state-header"), raw)
    assert header == {"magic": b"LQRS", "version": 3}
    record, end = walk(table("state-record"), raw, pos)
    assert end == len(raw)
    assert record["crc"] == checksum_mod.checksum(raw[pos : end - 4])
    assert record["type"] == int(row("state-types", "CHECKPOINT", "name")["value"])
    fields = _doc_checkpoint(msgpack.unpackb(record["body"], raw=False))
    assert fields["head"] == checkpoint.head
    assert fields["done_ids"] == checkpoint.done
    assert [tuple(p) for p in fields["deliveries"]] == checkpoint.deliveries
    assert fields["counters"] == checkpoint.counters


@settings(max_examples=20)
@given(checkpoints(), st.lists(st.tuples(*[st.integers(0, (1 << 64) - 1)] * 3), max_size=4))
def test_tables_decode_shared_checkpoints(
    checkpoint: Checkpoint, leases: list[tuple[int, int, int]]
) -> None:
    cp = checkpoint._replace(leases=leases)
    raw = state_mod.encode_state_file_header() + state_mod.encode_checkpoint(cp, shared=True)
    header, pos = walk(table("state-header"), raw)
    assert header["version"] == 3
    record, end = walk(table("state-record"), raw, pos)
    assert record["crc"] == crc32c.crc32c(raw[pos : end - 4])
    fields = _doc_checkpoint(msgpack.unpackb(record["body"], raw=False))
    assert [tuple(lease) for lease in fields["leases"]] == leases


@settings(max_examples=40)
@given(st.sampled_from([r for r in TABLES["state-types"] if r["body"] == "ids"]), id_batches)
def test_tables_decode_ids_records(kind: Row, ids: list[int]) -> None:
    raw = state_mod.encode_ids_record(StateRecordType[kind["name"]], ids)
    record, end = walk(table("state-record"), raw)
    assert end == len(raw)
    assert record["type"] == int(kind["value"])
    assert record["crc"] == checksum_mod.checksum(raw[:-4])
    u64 = "<" + type_codes()["u64"]
    width = struct.calcsize(u64)
    body = record["body"]
    assert [struct.unpack_from(u64, body, i)[0] for i in range(0, len(body), width)] == ids


# ---------------------------------------------------------------- encrypted entries


def test_sealing_constants() -> None:
    for r in table("sealing-constants"):
        module, _, name = r["constant"].rpartition(".")
        actual = getattr(importlib.import_module(f"ledgerq.{module}"), name)
        text = r["value"]
        expected = json.loads(text) if text.startswith('"') else int(text, 0)
        if isinstance(actual, bytes):
            actual = actual.decode("ascii")
        assert actual == expected, r
    rows = {r["field"]: r for r in table("sealed")}
    assert int(rows["nonce"]["size"]) == sealing_mod.NONCE_SIZE
    assert int(rows["tag"]["size"]) == sealing_mod.TAG_SIZE
    assert rows["tag"]["offset"] == f"size - {sealing_mod.TAG_SIZE}"


def _sealed_entry(sealer: sealing_mod.EntrySealer, spec: EntrySpec) -> bytes:
    """The ENCRYPTED entry of ``spec`` (format 2), sealed by ``sealer``."""
    return sealer.encode(
        spec.id,
        spec.timestamp,
        spec.payload,
        headers_blob=msgpack.packb(spec.headers) if spec.headers is not None else None,
        expires_at=spec.expires_at,
        priority=spec.priority,
        compressed=spec.compressed,
        deliver_at=spec.deliver_at,
        group=spec.group.encode() if spec.group is not None else None,
    )


@settings(max_examples=60)
@given(entry_specs(), st.binary(min_size=32, max_size=32), st.binary(min_size=16, max_size=16))
def test_tables_decode_sealed_entries(spec: EntrySpec, key: bytes, queue_id: bytes) -> None:
    """An ENCRYPTED entry opened by following the spec alone (key derivation, associated
    data, the sealed tables) gives back what was sealed."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if spec.entry_format != 2:
        return
    raw = _sealed_entry(sealing_mod.EntrySealer(key, queue_id), spec)
    values, end = walk(table("entry"), raw)
    assert end == len(raw)
    assert values["flags"] & doc_flag("ENCRYPTED")
    assert not values["flags"] & doc_flag("HAS_HEADERS")
    assert values["id"] == spec.id and values.get("group") == spec.group
    blob = values["payload"]
    payload_at = len(raw) - 4 - len(blob)
    info = json.loads(
        row("sealing-constants", "format.sealing.ENTRY_KEY_INFO", "constant")["value"]
    )
    entry_key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=queue_id, info=info.encode()
    ).derive(key)
    nonce_size = int(row("sealed", "nonce")["size"])
    content = AESGCM(entry_key).decrypt(
        blob[:nonce_size], blob[nonce_size:], queue_id + raw[:payload_at]
    )
    inner, inner_end = walk(table("sealed-content"), content)
    assert inner_end == len(content)
    assert inner.get("headers") == spec.headers
    assert inner["body"] == spec.payload


def _us_toward_zero(ns: int | None) -> int | None:
    """Nanoseconds to Spark's microseconds, truncated toward zero (docs/spark.md)."""
    if ns is None:
        return None
    return -(-ns // 1000) if ns < 0 else ns // 1000


@pytest.mark.parametrize("sealed", [False, True], ids=["plain", "sealed"])
# One example of three segments: the JVM reader reads them in one ``java`` process (a
# JVM start per example would cost most of the test).
@settings(max_examples=1, deadline=None)
@given(
    st.lists(st.lists(entry_specs(), min_size=1, max_size=80), min_size=3, max_size=3),
    st.binary(min_size=32, max_size=32),
    st.binary(min_size=16, max_size=16),
)
def test_the_jvm_reader_decodes_entries_as_the_tables_say(
    sealed: bool, segments_specs: list[list[EntrySpec]], key: bytes, queue_id: bytes
) -> None:
    """The JVM reader (ledgerq/spark/jvm) reads segments of entries of both formats and
    every optional field - or of sealed entries, opened with the key - into the values
    that went in: the format is defined once, and every reader of it is held to this
    file."""
    import tempfile

    pytest.importorskip("pyspark")
    import zstandard

    from ledgerq.spark._jvm import jvm_scan
    from ledgerq.spark._scan import SegmentTask

    first_id = 1000
    sealer = sealing_mod.EntrySealer(key, queue_id)
    with tempfile.TemporaryDirectory() as root:
        tasks, wanted = [], []
        for number, specs in enumerate(segments_specs):
            made = []
            for i, spec in enumerate(specs):
                # Ids are consecutive in a segment; a COMPRESSED payload is a zstd frame.
                body = spec.payload
                stored = zstandard.ZstdCompressor().compress(body) if spec.compressed else body
                s = dataclasses.replace(spec, id=first_id + i, payload=stored)
                if not sealed:
                    made.append((s, body, s.encode()))
                    continue
                s = dataclasses.replace(s, entry_format=2)
                made.append((s, body, _sealed_entry(sealer, s)))
            queue = Path(root) / f"q{number}"
            segments = queue / "segments"
            segments.mkdir(parents=True)
            (segments / f"{first_id:020d}.log").write_bytes(b"".join(raw for _, _, raw in made))
            task = {
                "queue": "q",
                "path": str(queue),
                "first_id": first_id,
                "next_first_id": None,
                "size_limit": None,
                "live_tail": False,
                "id_lo": 1,
                "id_hi": None,
                "ids": None,
                "ts_lo": None,
                "ts_hi": None,
                "seek_by_time": False,
                "state": None,
                "failfast": True,
                "name_id": None,
                "columns": None,
                "encryption_key_hex": key.hex() if sealed else None,
                "queue_id_hex": queue_id.hex() if sealed else None,
            }
            assert set(task) >= {f.name for f in dataclasses.fields(SegmentTask)} - {
                "encryption_key"
            }
            tasks.append(json.dumps(task))
            wanted.append(
                [
                    [
                        s.id,
                        _us_toward_zero(s.timestamp),
                        _us_toward_zero(s.expires_at),
                        s.priority,
                        s.headers or {},
                        body.hex(),
                        _us_toward_zero(s.deliver_at),
                    ]
                    for s, body, _ in made
                ]
            )
        got = jvm_scan(tasks)
    if got is None:
        pytest.skip("no JDK: the JVM reader cannot be built")
    assert len(got) == len(wanted)
    for read, expected in zip(got, wanted, strict=True):
        assert read.get("rows") == expected, read.get("error")
        assert read["corrupt_regions"] == 0


def test_the_digest_key_is_sealed_and_used_as_the_spec_says(tmp_path: Path) -> None:
    """encryption.md's "Digest key": after a rotation, meta.json's digest_key opens as
    the spec says, is the old key's derived digest key, and digests the unique keys."""
    import hashlib
    import hmac
    import json

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    from ledgerq.tools import rekey

    old, new = bytes(range(32)), bytes(range(32, 64))
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=old) as q:
        q.enqueue(b"a", unique_key="job")
    rekey(path, old, new)
    block = json.loads((path / "meta.json").read_text())["encryption"]
    queue_id = bytes.fromhex(block["queue_id"])
    blob = bytes.fromhex(block["digest_key"])

    def hkdf(key: bytes, salt: bytes | None, info: bytes) -> bytes:
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(key)

    wrap = hkdf(new, queue_id, b"ledgerq digest key wrap v1")
    digest_key = AESGCM(wrap).decrypt(blob[:12], blob[12:], queue_id)
    assert digest_key == hkdf(old, None, b"ledgerq dedup digest v1")
    expected = hmac.new(digest_key, b"s" + b"unique:job", hashlib.sha256).digest()[:16]
    data = (path / "features" / "unique.table").read_bytes()
    assert data[64:80] == expected
