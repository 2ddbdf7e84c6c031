"""The checksum is chosen in one module, and what the fast readers rely on holds."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ledgerq.format.checksum import RESIDUE, checksum, count_valid_records
from ledgerq.format.entry import encode_entry, encode_headers, encode_plain_entry
from ledgerq.format.reader_state import StateRecordType, encode_ids_record

PACKAGE = Path(__file__).resolve().parents[2] / "ledgerq"


def _run(payload_sizes: list[int]) -> tuple[bytes, list[int]]:
    """Entries back to back, and their boundaries (one more than entries)."""
    entries = [encode_entry(i + 1, 1_000 + i, b"p" * n) for i, n in enumerate(payload_sizes)]
    offsets = [0]
    for entry in entries:
        offsets.append(offsets[-1] + len(entry))
    return b"".join(entries), offsets


def _imports_zlib(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name == "zlib" for alias in node.names)
    return isinstance(node, ast.ImportFrom) and node.module == "zlib"


def test_no_module_but_checksum_py_picks_a_checksum() -> None:
    """Changing the checksum must be one edit: no other module imports zlib."""
    chooser = PACKAGE / "format" / "checksum.py"
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path != chooser
        and any(map(_imports_zlib, ast.walk(ast.parse(path.read_text(), filename=str(path)))))
    ]
    assert offenders == []


def test_every_intact_record_checks_to_the_residue() -> None:
    records = [
        encode_plain_entry(7, 8, b"payload"),
        encode_entry(
            9, 10, b"x" * 5000, headers_blob=encode_headers({"k": "v"}), priority=2, expires_at=11
        ),
        encode_ids_record(StateRecordType.ACK, [1, 2, 3]),
    ]
    for record in records:
        assert checksum(record) == RESIDUE
        damaged = bytearray(record)
        damaged[len(record) // 2] ^= 0x01
        assert checksum(bytes(damaged)) != RESIDUE
    assert RESIDUE == 0x2144DF1C  # CRC-32's, as docs/format.md says


@pytest.mark.parametrize(
    "sizes",
    [[40] * 50, [40] * 50 + [3, 90, 7], [1, 2, 3, 70_000, 5], [0] * 3],
    ids=["uniform", "mixed", "one-longer-than-the-models", "empty-payloads"],
)
def test_count_valid_records_finds_the_first_bad_one(sizes: list[int]) -> None:
    data, offsets = _run(sizes)
    uniform = len(set(sizes)) == 1
    size = offsets[1] if uniform else None
    count = len(sizes)
    assert count_valid_records(data, offsets, size) == count
    assert count_valid_records(data, offsets, None) == count
    for victim in sorted({0, 1, count // 2, count - 1}):
        for where in (0, 5, 17, -1):
            damaged = bytearray(data)
            at = offsets[victim + 1] + where if where < 0 else offsets[victim] + where
            damaged[at] ^= 0x10
            assert count_valid_records(bytes(damaged), offsets, None) == victim
            if uniform:
                assert count_valid_records(bytes(damaged), offsets, size) == victim
