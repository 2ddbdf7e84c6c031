"""Compressed payloads: a zstd frame, restored never past a size limit.

An entry with the COMPRESSED flag holds a zstd frame as its payload.  Restoring one is
a pure function of its bytes, shared by the queue's compression feature and by the
readers that work without the queue (``ledgerq.follow``, ``ledgerq dump``, the Spark
source): the frame's own size claim is never trusted for an allocation, and output
past ``limit`` bytes (a decompression bomb, or damage) is an error, not memory
exhaustion.
"""

from __future__ import annotations

import zstandard

from ledgerq._errors import CorruptionError

__all__ = ["restore_zstd"]

_CHUNK = 1 << 16


def restore_zstd(
    payload: bytes,
    limit: int,
    *,
    message_id: int,
    decompressor: zstandard.ZstdDecompressor | None = None,
) -> bytes:
    """Return the decompressed ``payload`` of message ``message_id``.

    ``decompressor`` may be reused between calls of one thread (zstandard objects are
    not safe to share between threads); a new one is made when it is None.  Raises
    :class:`CorruptionError` when the frame is damaged or decompresses to more than
    ``limit`` bytes.
    """
    dctx = decompressor if decompressor is not None else zstandard.ZstdDecompressor()
    try:
        # A streaming read bounded by the limit: the frame's own size claim is never
        # trusted for an allocation.
        with dctx.stream_reader(payload) as reader:
            parts = []
            total = 0
            while True:
                chunk = reader.read(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > limit:
                    raise CorruptionError(
                        f"message {message_id} decompresses to more than "
                        f"max_message_size={limit} bytes"
                    )
                parts.append(chunk)
    except zstandard.ZstdError as exc:
        raise CorruptionError(f"message {message_id} has a damaged zstd payload ({exc})") from exc
    return b"".join(parts)
