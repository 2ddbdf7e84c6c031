"""The one place the record checksum is chosen.

Format version 1 uses CRC-32 (the IEEE 802.3 polynomial, as in zlib, gzip and PNG)
over every byte of a record before its checksum field, stored as a little-endian u32
at the end of the record.  ``zlib.crc32`` is implemented in C and runs at well over
1 GB/s, so it never dominates the cost of an append.

Everything that computes or checks a checksum gets it from here: :data:`checksum` is
the C function itself (no Python call layer: the append path and the journal's hot
path bind it), and the Spark scan's fast path checks a whole run of records with
:func:`count_valid_records`.  Changing the checksum is one edit here (plus a format
version): the two properties that fast path relies on - a fixed residue, and the
checksum being affine over GF(2) - hold for every CRC (CRC-32C included), and the
residue below is computed from :data:`checksum`, not written down.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

__all__ = [
    "CHECKSUM",
    "CHECKSUM_NAME",
    "RESIDUE",
    "checksum",
    "count_valid_records",
    "recovery_crc_allowance",
]

CHECKSUM_NAME = "crc32"

# ``checksum(data, start=0)``: the checksum of ``data``, continuing from ``start`` (the
# checksum of the bytes before it; 0 for a fresh sum).  Bound to the C function so that
# hot paths pay no extra call.
checksum = zlib.crc32

CHECKSUM = struct.Struct("<I")  # how a record stores its checksum: u32, little-endian
assert CHECKSUM.size == 4

# The checksum of any record *including* its stored checksum is this constant when the
# record is intact (the CRC residue: for CRC-32, crc32(m + crc32(m) as u32 LE) is
# 0x2144DF1C for every m).  Computed from the empty record, so it follows ``checksum``.
RESIDUE = checksum(CHECKSUM.pack(checksum(b"")))

# Recovery tells a torn tail from damage in the middle by checksumming each plausible
# record after bad bytes over the length it claims.  Honest damage holds few such
# headers; a crafted file can put one claiming the rest of the file at every offset,
# which is quadratic.  The bytes checksummed in vain are therefore capped, for segments
# and reader journals alike, at this many times the bytes being recovered ...
_RECOVERY_CRC_FACTOR = 16
# ... plus this much, so that small files are never short of allowance.
_RECOVERY_CRC_FLOOR = 256 * 1024


def recovery_crc_allowance(covered: int) -> int:
    """Bytes recovery may checksum in vain over ``covered`` bytes of a file (see above)."""
    return _RECOVERY_CRC_FACTOR * covered + _RECOVERY_CRC_FLOOR


# ---------------------------------------------------------------------- runs of records

_MODEL_CACHE_LIMIT = 4096  # distinct record lengths remembered
_MODEL_MAX_BYTES = 1 << 16  # longer records are checked one by one (the checksum dominates)
_models: dict[int, bytes] = {}


def _model(length: int) -> bytes:
    """An intact record of ``length`` bytes: zeros, then their checksum."""
    model = _models.get(length)
    if model is None:
        body = bytes(length - CHECKSUM.size)
        model = body + CHECKSUM.pack(checksum(body))
        if length <= _MODEL_MAX_BYTES:
            if len(_models) >= _MODEL_CACHE_LIMIT:
                _models.clear()
            _models[length] = model
    return model


def count_valid_records(
    buf: bytes, offsets: Sequence[int], uniform_length: int | None = None
) -> int:
    """How many records at the start of a run pass their checksum.

    The records are ``buf[offsets[i]:offsets[i + 1]]``, each ending with its stored
    checksum; ``uniform_length`` is their common length when they all have one (the
    caller knows it, and the check is then cheaper still).

    First the whole run in one checksum call: a CRC is affine over GF(2), so the
    checksum of a concatenation of intact records depends only on their lengths, and
    equals that of the same lengths of model records (zeros and their checksum).  A
    corrupt record changes it whatever the others hold (its error is shifted by a power
    of x, which the polynomial does not divide); several corrupt records could cancel
    out with a chance of 2**-32, the chance that one corrupt record passes its own
    check.  When the sums differ, each record is checked on its own (its checksum over
    itself must be :data:`RESIDUE`) to find the first bad one.
    """
    count = len(offsets) - 1
    start, stop = offsets[0], offsets[-1]
    crc = checksum
    if uniform_length is not None:
        expected = crc(_model(uniform_length) * count)
    else:
        lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]  # noqa: RUF007
        if max(lengths) > _MODEL_MAX_BYTES:
            expected = -1  # not worth it: check one by one
        else:
            for length in set(lengths).difference(_models):
                _model(length)
            expected = crc(b"".join(map(_models.__getitem__, lengths)))
    if crc(memoryview(buf)[start:stop]) == expected:
        return count
    residue = RESIDUE
    for i in range(count):
        if crc(buf[offsets[i] : offsets[i + 1]]) != residue:
            return i
    return count
