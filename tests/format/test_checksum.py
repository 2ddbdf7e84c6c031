"""The checksum is chosen in one module, and what the fast readers rely on holds."""

from __future__ import annotations

import ast
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from ledgerq.format.checksum import (
    HAS_FAST_CRC32C,
    RESIDUE,
    RESIDUE_V1,
    Checksum,
    checksum,
    checksum_v1,
    count_valid_records,
    crc32c_software,
)
from ledgerq.format.entry import encode_entry, encode_headers, encode_plain_entry
from ledgerq.format.reader_state import StateRecordType, encode_ids_record

PACKAGE = Path(__file__).resolve().parents[2] / "ledgerq"


def _run(payload_sizes: list[int], entry_format: int = 2) -> tuple[bytes, list[int]]:
    """Entries back to back, and their boundaries (one more than entries)."""
    entries = [
        encode_entry(i + 1, 1_000 + i, b"p" * n, entry_format=entry_format)
        for i, n in enumerate(payload_sizes)
    ]
    offsets = [0]
    for entry in entries:
        offsets.append(offsets[-1] + len(entry))
    return b"".join(entries), offsets


_CHECKSUM_MODULES = {"zlib", "crc32c", "google_crc32c"}


def _imports_zlib(node: ast.AST) -> bool:
    """Whether ``node`` imports a module that provides a checksum."""
    if isinstance(node, ast.Import):
        return any(alias.name in _CHECKSUM_MODULES for alias in node.names)
    return isinstance(node, ast.ImportFrom) and node.module in _CHECKSUM_MODULES


def test_no_module_but_checksum_py_picks_a_checksum() -> None:
    """Changing the checksum must be one edit: no other module imports zlib or crc32c."""
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
    assert RESIDUE == 0x48674BC7  # CRC-32C's, as docs/format.md says
    v1 = encode_entry(9, 10, b"x" * 300, entry_format=1)
    assert checksum_v1(v1) == RESIDUE_V1 == 0x2144DF1C  # CRC-32's
    assert checksum(v1) != RESIDUE


def test_the_checksums_are_the_standard_ones() -> None:
    """The check values of the CRC catalogue: CRC-32/ISCSI (CRC-32C) and CRC-32/ISO-HDLC."""
    assert checksum(b"123456789") == 0xE3069283
    assert crc32c_software(b"123456789") == 0xE3069283
    assert checksum_v1 is zlib.crc32
    assert HAS_FAST_CRC32C  # the dependency is installed: the hardware path is used


def test_the_software_fallback_matches_the_package_on_random_data() -> None:
    rng = random.Random(18)
    for size in [0, 1, 2, 3, 7, 8, 15, 16, 63, 64, 126, 1000, 4122, 65_537]:
        data = rng.randbytes(size)
        assert crc32c_software(data) == checksum(data)
        cut = rng.randrange(size + 1)
        # continuing from a previous value, as the batch encoder does
        assert crc32c_software(data[cut:], checksum(data[:cut])) == checksum(data)
        assert crc32c_software(memoryview(data)) == checksum(data)


def test_without_the_package_ledgerq_falls_back_and_still_reads_and_writes(
    tmp_path: Path,
) -> None:
    """A process where ``import crc32c`` fails: a warning, the same bytes, a working queue."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "crc32c.py").write_text("raise ImportError('crc32c blocked for this test')\n")
    queue_dir = tmp_path / "q"
    script = f"""
import warnings, ledgerq
from ledgerq.format.checksum import HAS_FAST_CRC32C, checksum
assert not HAS_FAST_CRC32C
assert checksum(b"123456789") == 0xE3069283
q = ledgerq.open({str(queue_dir)!r})
q.enqueue_batch([b"a", b"b"])
q.enqueue(b"c", headers={{"k": "v"}})
first = q.dequeue()
assert first is not None and first.payload == b"a"
q.ack(first.id)
q.close()
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), *sys.path]))
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "crc32c package is missing" in done.stderr
    # What the fallback wrote, this process (with the package) reads.
    import ledgerq

    q = ledgerq.open(queue_dir)
    try:
        assert [m.payload for m in q.dequeue_batch(5)] == [b"b", b"c"]
        assert q.stats().corrupt_skipped == 0
    finally:
        q.close()


@pytest.mark.parametrize(
    "sizes",
    [[40] * 50, [40] * 50 + [3, 90, 7], [1, 2, 3, 70_000, 5], [0] * 3],
    ids=["uniform", "mixed", "one-longer-than-the-models", "empty-payloads"],
)
@pytest.mark.parametrize(("entry_format", "crc"), [(2, checksum), (1, checksum_v1)])
def test_count_valid_records_finds_the_first_bad_one(
    sizes: list[int], entry_format: int, crc: Checksum
) -> None:
    data, offsets = _run(sizes, entry_format)
    uniform = len(set(sizes)) == 1
    size = offsets[1] if uniform else None
    count = len(sizes)
    assert count_valid_records(data, offsets, size, crc) == count
    assert count_valid_records(data, offsets, None, crc) == count
    for victim in sorted({0, 1, count // 2, count - 1}):
        for where in (0, 5, 17, -1):
            damaged = bytearray(data)
            at = offsets[victim + 1] + where if where < 0 else offsets[victim] + where
            damaged[at] ^= 0x10
            assert count_valid_records(bytes(damaged), offsets, None, crc) == victim
            if uniform:
                assert count_valid_records(bytes(damaged), offsets, size, crc) == victim
