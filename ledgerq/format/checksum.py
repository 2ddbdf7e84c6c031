"""The one place the record checksum is chosen.

CRC-32 (the IEEE 802.3 polynomial, as in zlib, gzip and PNG) over every byte of a
record before the checksum field.  ``zlib.crc32`` is implemented in C and runs at
well over 1 GB/s, so it never dominates the cost of an append.
(``entry.encode_plain_entry`` binds ``zlib.crc32`` directly for the append hot path;
a test checks that it encodes exactly what the general encoder does.)
"""

from __future__ import annotations

import zlib

__all__ = ["CHECKSUM_NAME", "checksum", "recovery_crc_allowance"]

CHECKSUM_NAME = "crc32"

# Recovery tells a torn tail from damage in the middle by checksumming each plausible
# record after bad bytes over the length it claims.  Honest damage holds few such
# headers; a crafted file can put one claiming the rest of the file at every offset,
# which is quadratic.  The bytes checksummed in vain are therefore capped, for segments
# and reader journals alike, at this many times the bytes being recovered ...
_RECOVERY_CRC_FACTOR = 16
# ... plus this much, so that small files are never short of allowance.
_RECOVERY_CRC_FLOOR = 256 * 1024


def checksum(data: bytes | bytearray | memoryview, start: int = 0) -> int:
    """Return the CRC-32 of ``data``, continuing from ``start`` (0 for a fresh sum)."""
    return zlib.crc32(data, start)


def recovery_crc_allowance(covered: int) -> int:
    """Bytes recovery may checksum in vain over ``covered`` bytes of a file (see above)."""
    return _RECOVERY_CRC_FACTOR * covered + _RECOVERY_CRC_FLOOR
