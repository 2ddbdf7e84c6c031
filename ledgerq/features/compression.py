"""zstd payload compression.

With ``compression="zstd"`` a payload of at least ``compression_min_size`` bytes
is compressed (at ``compression_level``) and kept compressed only when that saves
at least 5%; the entry's COMPRESSED flag says so.  Decompression is always
available - a queue written with compression can be read with it off - and its
output is capped at ``max_message_size``: a payload that would decompress past
it (a decompression bomb, or damage) raises :class:`CorruptionError`, and the
queue skips that message as corrupt instead of exhausting memory (the rule itself is
``ledgerq.format.compression.restore_zstd``, which the lock-free readers share).

Compressor and decompressor objects are reused, one per thread (zstandard
objects are not safe to share between threads).
"""

from __future__ import annotations

import threading

import zstandard

from ledgerq._options import Options
from ledgerq.core.feature import Draft, Feature
from ledgerq.format.compression import restore_zstd
from ledgerq.format.entry import Entry

__all__ = ["ZstdCompression", "ZstdDecompression"]

_MIN_SAVING = 0.05


class ZstdDecompression(Feature):
    """Decompress flagged payloads, never past ``max_message_size`` bytes."""

    name = "zstd-decompress"

    def __init__(self, options: Options) -> None:
        self._limit = options.max_message_size
        self._local = threading.local()

    def _decompressor(self) -> zstandard.ZstdDecompressor:
        dctx: zstandard.ZstdDecompressor | None = getattr(self._local, "dctx", None)
        if dctx is None:
            dctx = self._local.dctx = zstandard.ZstdDecompressor()
        return dctx

    def restore(self, entry: Entry, payload: bytes) -> bytes:
        return restore_zstd(
            payload, self._limit, message_id=entry.id, decompressor=self._decompressor()
        )


class ZstdCompression(ZstdDecompression):
    """Compress large payloads when it pays (and decompress them on the way out)."""

    name = "zstd"

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        self._level = options.compression_level
        self._min_size = options.compression_min_size

    def _compressor(self) -> zstandard.ZstdCompressor:
        cctx: zstandard.ZstdCompressor | None = getattr(self._local, "cctx", None)
        if cctx is None:
            cctx = self._local.cctx = zstandard.ZstdCompressor(level=self._level)
        return cctx

    def transform(self, draft: Draft) -> None:
        payload = draft.payload
        size = len(payload)
        if size < self._min_size or draft.compressed:
            return
        packed = self._compressor().compress(payload)
        if len(packed) <= size * (1 - _MIN_SAVING):
            draft.payload = packed
            draft.compressed = True
