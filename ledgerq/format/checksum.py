"""The one place the record checksums are chosen.

Format version 2 checksums every record with CRC-32C (the Castagnoli polynomial, as the
Go LedgerQ, iSCSI, ext4 and SCTP do), which x86-64 (SSE 4.2) and ARMv8 compute in
hardware at 20-30 GB/s; format version 1 used CRC-32 (the IEEE 802.3 polynomial, as in
zlib, gzip and PNG), which ``zlib.crc32`` computes at ~5 GB/s - slower than copying the
bytes into the page cache, so it capped the append bandwidth (docs/benchmarks.md).
Either is the checksum of every byte of a record before its checksum field, stored as a
little-endian u32 at the end of the record.

Everything that computes or checks a checksum gets it from here: :data:`checksum` (the
newest format's, what every writer uses) and :data:`checksum_v1` (for reading, and
appending to, version-1 records) are the C functions themselves (no Python call layer:
the append path and the journal's hot path bind them), and the Spark scan's fast path
checks a whole run of records with :func:`count_valid_records`.

CRC-32C comes from the ``crc32c`` package (a dependency: hardware instruction where
the CPU has it, its own C table code where not; docs/dependencies.md says why this one).
When that package is missing - an install that skipped it - :func:`crc32c_software`
computes the same values in pure Python: correct, about a thousand times slower, and
announced by a warning at import.
"""

from __future__ import annotations

import struct
import warnings
import zlib
from collections.abc import Callable, Sequence

__all__ = [
    "CHECKSUM",
    "CHECKSUM_NAME",
    "CHECKSUM_NAME_V1",
    "HAS_FAST_CRC32C",
    "RESIDUE",
    "RESIDUE_V1",
    "Checksum",
    "checksum",
    "checksum_v1",
    "count_valid_records",
    "crc32c_software",
    "recovery_crc_allowance",
]

Checksum = Callable[..., int]  # ``f(data, start=0) -> int``, the signature of zlib.crc32

CHECKSUM_NAME = "crc32c"  # format version 2
CHECKSUM_NAME_V1 = "crc32"  # format version 1


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # reflected Castagnoli poly
        table.append(crc)
    return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c_software(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """Return the CRC-32C of ``data`` continuing from ``value``, in pure Python.

    The fallback when the ``crc32c`` package is missing; the same values, slowly.
    """
    table = _CRC32C_TABLE
    crc = value ^ 0xFFFFFFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:
    from crc32c import crc32c as _crc32c_fast
except ImportError:  # pragma: no cover - exercised by tests/format/test_checksum.py
    HAS_FAST_CRC32C = False
    warnings.warn(
        "ledgerq: the crc32c package is missing; CRC-32C is computed in pure Python, "
        "which makes every append and read very slow (pip install crc32c)",
        RuntimeWarning,
        stacklevel=2,
    )
    _crc32c: Checksum = crc32c_software
else:
    HAS_FAST_CRC32C = True
    _crc32c = _crc32c_fast

# ``checksum(data, start=0)``: the checksum of ``data``, continuing from ``start`` (the
# checksum of the bytes before it; 0 for a fresh sum).  Bound to the C functions so
# that hot paths pay no extra call.
checksum: Checksum = _crc32c
checksum_v1: Checksum = zlib.crc32

CHECKSUM = struct.Struct("<I")  # how a record stores its checksum: u32, little-endian
assert CHECKSUM.size == 4

# The checksum of any record *including* its stored checksum is a constant when the
# record is intact (the CRC residue: for CRC-32, crc32(m + crc32(m) as u32 LE) is
# 0x2144DF1C for every m; for CRC-32C 0x48674BC7).  Computed from the empty record, so
# it follows the functions above.
RESIDUE = checksum(CHECKSUM.pack(checksum(b"")))
RESIDUE_V1 = checksum_v1(CHECKSUM.pack(checksum_v1(b"")))

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
# Per checksum function: its model records by length.
_models_of: dict[Checksum, dict[int, bytes]] = {checksum: {}, checksum_v1: {}}


def _model(crc: Checksum, models: dict[int, bytes], length: int) -> bytes:
    """An intact record of ``length`` bytes: zeros, then their checksum."""
    model = models.get(length)
    if model is None:
        body = bytes(length - CHECKSUM.size)
        model = body + CHECKSUM.pack(crc(body))
        if length <= _MODEL_MAX_BYTES:
            if len(models) >= _MODEL_CACHE_LIMIT:
                models.clear()
            models[length] = model
    return model


def count_valid_records(
    buf: bytes,
    offsets: Sequence[int],
    uniform_length: int | None = None,
    crc: Checksum = checksum,
) -> int:
    """How many records at the start of a run pass their checksum.

    The records are ``buf[offsets[i]:offsets[i + 1]]``, each ending with its stored
    checksum; ``uniform_length`` is their common length when they all have one (the
    caller knows it, and the check is then cheaper still); ``crc`` is their checksum
    (:data:`checksum`, or :data:`checksum_v1` for a run of version-1 records).

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
    models = _models_of.get(crc)
    if models is None:
        models = _models_of[crc] = {}
    if uniform_length is not None:
        expected = crc(_model(crc, models, uniform_length) * count)
    else:
        lengths = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]  # noqa: RUF007
        if max(lengths) > _MODEL_MAX_BYTES:
            expected = -1  # not worth it: check one by one
        else:
            for length in set(lengths).difference(models):
                _model(crc, models, length)
            expected = crc(b"".join(map(models.__getitem__, lengths)))
    if crc(memoryview(buf)[start:stop]) == expected:
        return count
    residue = crc(CHECKSUM.pack(crc(b"")))
    for i in range(count):
        if crc(buf[offsets[i] : offsets[i + 1]]) != residue:
            return i
    return count
