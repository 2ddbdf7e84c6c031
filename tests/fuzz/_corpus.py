"""Seed corpora: valid records made by the library's own encoders, plus hostile ones.

``python -m tests.fuzz --make-corpus`` writes :func:`seeds` to ``tests/fuzz/corpus/
<target>/<name>.bin`` (committed); the fuzzers start from the committed files
(:func:`load`), mutate them, and every committed file is also run as a regression
test.  Timestamps are fixed so the files do not change from one generation to the next.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import msgpack
import zstandard

from ledgerq.format import sealing
from ledgerq.format.entry import encode_entry, encode_headers
from ledgerq.format.feature_state import encode_feature_file_header, encode_feature_record
from ledgerq.format.index import encode_index_entry, encode_index_header
from ledgerq.format.reader_state import (
    Checkpoint,
    StateRecordType,
    encode_checkpoint,
    encode_ids_record,
    encode_state_file_header,
)
from tests.fuzz._targets import FUZZ_KEY, FUZZ_QUEUE_ID

__all__ = ["CORPUS", "load", "seeds", "write"]

CORPUS = Path(__file__).with_name("corpus")
_T = 1_700_000_000_000_000_000
_U32 = struct.Struct("<I")


def _crc_framed(head_and_body: bytes) -> bytes:
    return head_and_body + _U32.pack(zlib.crc32(head_and_body))


def _entries() -> dict[str, bytes]:
    headers = encode_headers({"k": "v", "dlq.original_id": "7"})
    frame = zstandard.ZstdCompressor().compress(b"compressible " * 40)
    plain = encode_entry(1, _T, b"hello")
    out = {
        "plain": plain,
        "empty_payload": encode_entry(2, _T, b""),
        "ttl": encode_entry(3, _T, b"x" * 40, expires_at=_T + 10**9),
        "low": encode_entry(4, _T, b"low", priority=0),
        "high_headers": encode_entry(5, -_T, b"h", priority=2, headers_blob=headers),
        "compressed": encode_entry(6, _T, frame, compressed=True),
        "max_id": encode_entry((1 << 64) - 1, _T, b"last"),
        "two": plain + encode_entry(2, _T, b"second"),
        "torn": plain[:-3],
        # Format 1 (CRC-32), alone and followed by format 2 (a segment a newer ledgerq
        # appended to), and each format's type byte under the other's CRC.
        "v1_plain": encode_entry(1, _T, b"hello", entry_format=1),
        "v1_all_fields": encode_entry(
            5, _T, b"h", priority=0, expires_at=_T, headers_blob=headers, entry_format=1
        ),
        "v1_then_v2": encode_entry(1, _T, b"old", entry_format=1) + encode_entry(2, _T, b"new"),
        "v2_with_v1_crc": _crc_framed(plain[:-4]),
        "v1_with_v2_crc": encode_entry(1, _T, b"hello", entry_format=1)[:-4] + plain[-4:],
        "unknown_format": _crc_framed(plain[:4] + b"\x31" + plain[5:-4]),
    }
    # Hostile: lengths that promise far more than is there, or nothing at all.
    out["length_max"] = _U32.pack(0x7FFFFFFF) + plain[4:]
    out["length_zero"] = _U32.pack(0) + plain[4:]
    # A valid CRC around a headers_length field that claims 4 GiB.
    body = struct.pack("<IBBQq", 0, 1, 0x02, 9, _T) + _U32.pack(0xFFFFFFFF) + b"\x80"
    body = _U32.pack(len(body) + 4) + body[4:]
    out["headers_length_huge"] = _crc_framed(body)
    return out


def _indexes() -> dict[str, bytes]:
    points = b"".join(encode_index_entry(1 + 10 * i, _T + i, 4096 * i) for i in range(4))
    return {
        "open": encode_index_header() + points,
        "open_torn": encode_index_header() + points[:-5],
        "sealed": encode_index_header(4) + points,
        "sealed_short": encode_index_header(9) + points,
        "count_huge": encode_index_header(0xFFFFFFFE) + points,
        "out_of_order": encode_index_header() + points[24:48] + points[:24],
    }


def _checkpoints() -> dict[str, bytes]:
    cp = Checkpoint(5, [7, 9], [(5, 2), (6, 1)], {"acked": 4, "nacked": 1})
    record = encode_checkpoint(cp)
    body = record[5:-4]
    return {
        "valid": body,
        "empty": encode_checkpoint(Checkpoint(1, [], [], {}))[5:-4],
        "array32_huge": b"\xdd\xff\xff\xff\xff",
        "map32_huge": b"\x94\x01\x90\x90\xdf\xff\xff\xff\xff",
        "nested": b"\x91" * 2000 + b"\x01",
        "bool_head": msgpack.packb([True, [], [], {}]),
        "float_head": msgpack.packb([1.5, [], [], {}]),
    }


def _reader_states() -> dict[str, bytes]:
    head = encode_state_file_header()
    checkpoint = encode_checkpoint(Checkpoint(1, [], [], {}))
    records = b"".join(
        encode_ids_record(kind, ids)
        for kind, ids in (
            (StateRecordType.LEASE, [1, 2, 3]),
            (StateRecordType.ACK, [2]),
            (StateRecordType.NACK, [1]),
            (StateRecordType.DEAD_LETTER, [1]),
            (StateRecordType.EXPIRE, [3]),
        )
    )
    whole = head + checkpoint + records
    return {
        "journal": whole,
        "torn_tail": whole[:-6],
        "corrupt_middle": whole[:20] + b"\xff" + whole[21:],
        "length_max": head + _U32.pack(0x7FFFFFFF) + b"\x02" + b"\x00" * 12,
        "header_only": head,
        # Version 2 (CRC-32) as a format-1 ledgerq wrote it, and its records under v3.
        "v2_crc32": encode_state_file_header(2) + _v1_records(checkpoint + records),
        "v3_header_crc32_records": head + _v1_records(checkpoint + records),
    }


def _v1_records(data: bytes) -> bytes:
    """The same reader state records, checksummed with CRC-32 (versions 1 and 2)."""
    out, pos = b"", 0
    while pos < len(data):
        (length,) = _U32.unpack_from(data, pos)
        out += _crc_framed(data[pos : pos + length - 4])
        pos += length
    return out


def _feature_files(magic: bytes) -> dict[str, bytes]:
    head = encode_feature_file_header(magic)
    if magic == b"LQDD":
        values = [[b"k" * 16, 3, _T], [b"j" * 16, 4, _T + 1]]
    else:
        values = [["default", 3, _T, "timeout"], ["audit", 4, _T, None]]
    records = b"".join(encode_feature_record(v) for v in values)
    return {
        f"{magic.decode()}_valid": head + records,
        f"{magic.decode()}_torn": head + records[:-2],
        f"{magic.decode()}_length_max": head + _U32.pack(0x7FFFFFFF) + records[4:],
        f"{magic.decode()}_wrong_types": head + encode_feature_record(["x", "y", "z", 1]),
        # Version 1 (CRC-32), and version 1's records under a version 2 header.
        f"{magic.decode()}_v1": encode_feature_file_header(magic, 1) + _v1_records(records),
        f"{magic.decode()}_v2_crc32_records": head + _v1_records(records),
    }


def _metas() -> dict[str, bytes]:
    meta = {
        "format": "ledgerq",
        "version": 1,
        "created_ns": _T,
        "clean": False,
        "next_id": 11,
        "reserved_until": 1 << 20,
        "counters": {"enqueued": 10, "enqueued_through": 11},
        "corrupt_regions": [[1, 96]],
        "options": {"sync": "always", "segment_size": 1024},
    }
    valid = json.dumps(meta).encode()
    return {
        "valid": valid,
        "newer": json.dumps({**meta, "version": 3}).encode(),
        "v2": json.dumps({**meta, "version": 2}).encode(),
        "wrong_types": json.dumps({**meta, "next_id": "11", "counters": [1]}).encode(),
        "huge_ints": json.dumps({**meta, "next_id": 1 << 70, "reserved_until": -5}).encode(),
        "not_object": b"[1, 2, 3]",
        "truncated": valid[: len(valid) // 2],
        "not_utf8": b'{"format": "\xff\xfe"}',
    }


def _memcache() -> dict[str, bytes]:
    return {
        "session": b"set q 0 0 5\r\nhello\r\nget q\r\nget q/t=100/open\r\nget q/close\r\n"
        b"delete q\r\nflush q\r\nstats\r\nversion\r\nquit\r\n",
        "bare_lf": b"set q 7 3600 2\nhi\r\nget q/peek\n",
        "size_huge": b"set q 0 0 4294967295\r\n",
        "bad_trailer": b"set q 0 0 2\r\nhiXX",
        "long_line": b"get " + b"k" * 2000 + b"\r\n",
    }


def _kestrel3() -> dict[str, bytes]:
    writer = bytes.fromhex("27642603")
    put = struct.pack("<BiiqqI", 0x86, 5, 0, 1, _T // 10**6, 0)[:-4] + b"hello"
    head_only = bytes((0x02,)) + struct.pack("<q", 3)
    done = bytes((0x91,)) + struct.pack("<i", 16) + struct.pack("<qq", 4, 6)
    return {
        "writer": writer + put + b"\x00" * 16,
        "bookmark": bytes.fromhex("263C2603") + head_only + done,
        "data_len_max": writer + struct.pack("<BiiqqI", 0x86, 0x7FFFFFFF, 0, 1, 0, 0)[:-4],
    }


def _kestrel_old() -> dict[str, bytes]:
    add = bytes((0,)) + struct.pack("<ii", 9, 0) + b"hello"
    addx = bytes((2,)) + struct.pack("<iqq", 21, _T // 10**6, 0) + b"hello"
    return {
        "journal": add + addx + b"\x01" + bytes((4,)) + struct.pack("<i", 3),
        "size_max": bytes((0,)) + struct.pack("<i", 0x7FFFFFFF),
        "negative_size": bytes((2,)) + struct.pack("<i", -5),
    }


class _FixedNonceSealer(sealing.EntrySealer):
    """The fuzz target's sealer with a nonce fixed per seed, so the corpus is stable."""

    __slots__ = ()

    def seal(self, prefix: bytes, content: bytes | bytearray | memoryview) -> bytes:
        nonce = bytes(sealing.NONCE_SIZE)
        return nonce + self._aead.encrypt(nonce, bytes(content), self._queue_id + prefix)


def _sealed_entries() -> dict[str, bytes]:
    sealer = _FixedNonceSealer(FUZZ_KEY, FUZZ_QUEUE_ID)
    headers = encode_headers({"k": "v", "trace": "abc"})
    frame = zstandard.ZstdCompressor().compress(b"z" * 300)
    plain = sealer.encode(1, _T, b"hello")
    return {
        "plain": plain,
        "empty": sealer.encode(2, _T, b""),
        "headers": sealer.encode(3, _T, b"h", headers_blob=headers, priority=2),
        "all_fields": sealer.encode(
            4,
            _T,
            b"x" * 50,
            headers_blob=headers,
            expires_at=_T + 10**9,
            priority=0,
            deliver_at=_T + 5,
            group=b"grp",
        ),
        "compressed": sealer.encode(5, _T, frame, compressed=True),
        "batch": sealer.encode(6, _T, b"a", batch_continues=True) + sealer.encode(7, _T, b"b"),
        "moved": plain[:6] + struct.pack("<Q", 9) + plain[14:-4] + plain[-4:],
        "with_headers_flag": plain[:5] + bytes((plain[5] | 0x02,)) + plain[6:],
        "content_flags_only": bytes((1,)),
        "content_headers": bytes((2,)) + struct.pack("<I", len(headers)) + headers + b"body",
        "content_headers_long": bytes((2,)) + struct.pack("<I", 0xFFFFFFFF) + headers,
    }


def _strip(entry: bytes) -> bytes:
    """``entry`` with ENCRYPTED cleared (the forger pass of the target fixes its CRC)."""
    return entry[:5] + bytes((entry[5] & ~0x80,)) + entry[6:]


def _forged_logs() -> dict[str, bytes]:
    """Logs of an encrypted queue an attacker without the key wrote or changed."""
    sealer = _FixedNonceSealer(FUZZ_KEY, FUZZ_QUEUE_ID)
    headers = encode_headers({"task": "genuine"})
    one, two, three = (
        sealer.encode(i, _T + i, b"genuine %d" % i, headers_blob=headers if i == 2 else None)
        for i in (1, 2, 3)
    )
    genuine = one + two + three
    frame = zstandard.ZstdCompressor().compress(b"genuine compressed " * 20)
    compressed = sealer.encode(4, _T, frame, compressed=True)
    return {
        "genuine": genuine,
        "forged_tail": genuine + encode_entry(4, _T, b"FORGED"),
        "forged_headers": genuine + encode_entry(4, _T, b"FORGED", headers_blob=headers),
        "forged_batch": genuine
        + encode_entry(4, _T, b"FORGED a", batch_continues=True)
        + encode_entry(5, _T, b"FORGED b"),
        "forged_in_place": one + encode_entry(2, _T, b"FORGED") + three,
        "forged_v1": genuine + encode_entry(4, _T, b"FORGED", entry_format=1),
        "stripped": one + _strip(two) + three,
        "stripped_compressed": genuine + _strip(compressed),
        "moved": genuine + three[:6] + struct.pack("<Q", 4) + three[14:],
        "replayed": genuine + two,
        "genuine_compressed": genuine + compressed,
    }


def seeds() -> dict[str, dict[str, bytes]]:
    """Every seed, by target."""
    states = _reader_states()
    dedup = _feature_files(b"LQDD")
    retries = _feature_files(b"LQRT")
    return {
        "entry": _entries(),
        "sealed_entry": _sealed_entries(),
        "forged_log": _forged_logs(),
        "index": _indexes(),
        "reader_state": states,
        "checkpoint": _checkpoints(),
        "feature_state": {**dedup, **retries},
        "meta": _metas(),
        "journal": states,
        "dedup_file": dedup,
        "retry_file": retries,
        "memcache": _memcache(),
        "kestrel3": _kestrel3(),
        "kestrel_old": _kestrel_old(),
    }


def write(root: Path = CORPUS) -> int:
    """Write the seeds as files; return how many."""
    count = 0
    for target, files in seeds().items():
        directory = root / target
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (directory / f"{name}.bin").write_bytes(data)
            count += 1
    return count


def load(target: str, root: Path = CORPUS) -> list[bytes]:
    """The committed seeds of ``target`` (sorted by file name)."""
    directory = root / target
    if not directory.is_dir():
        return []
    return [p.read_bytes() for p in sorted(directory.glob("*.bin"))]
