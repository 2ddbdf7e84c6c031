"""zstd compression."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import zstandard

import ledgerq
from ledgerq.format.entry import encode_entry


def test_large_compressible_payloads_are_stored_compressed(tmp_path: Path) -> None:
    text = b"the same log line again and again\n" * 500
    with ledgerq.open(tmp_path / "q", compression="zstd") as q:
        q.enqueue(text)
        q.enqueue(b"small")
        q.enqueue(os.urandom(4096))  # incompressible: kept as it is
        disk = q.stats().disk_bytes
        assert disk < len(text) // 4 + 4096 + 200
        got = [q.dequeue() for _ in range(3)]
        assert [m.payload for m in got if m][:2] == [text, b"small"]


def test_compressed_queue_readable_with_compression_off(tmp_path: Path) -> None:
    path = tmp_path / "q"
    text = b"x" * 10_000
    with ledgerq.open(path, compression="zstd") as q:
        q.enqueue(text)
    with ledgerq.open(path) as q:
        msg = q.dequeue()
        assert msg is not None and msg.payload == text


def test_max_message_size_applies_before_compression(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", compression="zstd", max_message_size=1000) as q:
        with pytest.raises(ledgerq.MessageTooLargeError):
            q.enqueue(b"a" * 1001)
        assert q.enqueue(b"a" * 1000) == 1


def test_decompression_bomb_is_skipped_as_corrupt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, max_message_size=1024) as q:
        q.enqueue(b"before")
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 100_000)  # 100 kB from a few bytes
    segment = sorted((path / "segments").glob("*.log"))[-1]
    with open(segment, "ab") as f:
        f.write(encode_entry(2, 1, bomb, compressed=True))
        f.write(encode_entry(3, 1, b"after"))
    with ledgerq.open(path, max_message_size=1024) as q:
        with caplog.at_level(logging.WARNING, logger="ledgerq"):
            first = q.dequeue()
            second = q.dequeue()
        assert first is not None and first.payload == b"before"
        assert second is not None and second.payload == b"after"
        assert q.stats().corrupt_skipped == 1
        assert "max_message_size" in caplog.text


def test_compression_options_validated(tmp_path: Path) -> None:
    with pytest.raises(ledgerq.ConfigError):
        ledgerq.open(tmp_path / "q", compression="lz4")
    with pytest.raises(ledgerq.ConfigError):
        ledgerq.open(tmp_path / "q", compression="zstd", compression_level=99)
