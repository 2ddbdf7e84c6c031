"""format.sealing and the ENCRYPTED flag: what authenticates, what is corrupt."""

from __future__ import annotations

import struct

import pytest

from ledgerq.format.checksum import checksum, checksum_v1
from ledgerq.format.entry import EntryFlags, decode_entry, encode_entry, encode_headers
from ledgerq.format.errors import CorruptRecord
from ledgerq.format.sealing import EntrySealer, key_check, keyed_digest

KEY = bytes(range(32))
QUEUE = bytes(range(16))


def _recrc(raw: bytearray, crc: object = checksum) -> bytes:
    raw[-4:] = struct.pack("<I", crc(bytes(raw[:-4])))  # type: ignore[operator]
    return bytes(raw)


def test_a_sealed_entry_opens_to_what_was_sealed() -> None:
    sealer = EntrySealer(KEY, QUEUE)
    headers = encode_headers({"a": "b"})
    raw = sealer.encode(9, 5, b"body", headers_blob=headers, priority=2, group=b"g")
    entry, end = decode_entry(raw)
    assert end == len(raw) and entry.flags & EntryFlags.ENCRYPTED
    assert entry.headers is None and b"body" not in raw
    opened = sealer.open(entry)
    assert (opened.payload, opened.headers, opened.priority, opened.group) == (
        b"body",
        {"a": "b"},
        2,
        "g",
    )
    assert not opened.flags & EntryFlags.ENCRYPTED and opened.flags & EntryFlags.HAS_HEADERS
    assert sealer.encode(9, 5, b"body") != sealer.encode(9, 5, b"body")  # fresh nonces


def test_visible_fields_are_authenticated() -> None:
    sealer = EntrySealer(KEY, QUEUE)
    raw = bytearray(sealer.encode(9, 5, b"body", priority=2))
    raw[22] = 0  # the priority byte: HIGH -> LOW, CRC made right again
    entry, _ = decode_entry(_recrc(raw))
    with pytest.raises(CorruptRecord, match="fails authentication"):
        sealer.open(entry)
    with pytest.raises(CorruptRecord, match="fails authentication"):
        EntrySealer(KEY, bytes(16)).open(decode_entry(sealer.encode(1, 1, b"x"))[0])
    with pytest.raises(CorruptRecord, match="fails authentication"):
        EntrySealer(bytes(32), QUEUE).open(decode_entry(sealer.encode(1, 1, b"x"))[0])


def test_encrypted_flag_rules() -> None:
    v1 = bytearray(encode_entry(1, 1, b"x" * 40, entry_format=1))
    v1[5] = 0x80
    with pytest.raises(CorruptRecord, match="flags"):
        decode_entry(_recrc(v1, checksum_v1))
    both = bytearray(encode_entry(1, 1, b"x" * 40))
    both[5] = 0x80 | 0x02
    # headers_length 0x78787878 runs past the entry, or the rule says it: corrupt either way
    with pytest.raises(CorruptRecord):
        decode_entry(_recrc(both))
    with pytest.raises(ValueError, match="headers sealed"):
        encode_entry(1, 1, b"x", headers_blob=b"\x80", encrypted=True)


def test_key_check_and_keyed_digests_depend_on_the_key() -> None:
    assert key_check(KEY, QUEUE) != key_check(bytes(32), QUEUE)
    assert key_check(KEY, QUEUE) != key_check(KEY, bytes(16))
    assert KEY not in key_check(KEY, QUEUE)
    assert keyed_digest(KEY, 16)("id") != keyed_digest(bytes(32), 16)("id")
    assert keyed_digest(KEY, 16)("id") != keyed_digest(KEY, 16)(b"id")


@pytest.mark.parametrize("continues", [False, True])
def test_the_plain_sealed_encoder_writes_what_the_general_one_does(continues: bool) -> None:
    sealer = EntrySealer(KEY, QUEUE)
    fast = sealer.encode_plain(7, 11, b"payload", continues)
    general = sealer.encode(7, 11, b"payload", batch_continues=continues)
    assert len(fast) == len(general) and fast[:22] == general[:22]  # same fixed fields
    for raw in (fast, general):
        entry, _ = decode_entry(raw)
        assert sealer.open(entry).payload == b"payload"
        assert bool(entry.flags & EntryFlags.BATCH_CONTINUES) == continues


def test_sealed_batch_parts_are_the_entries_of_a_batch() -> None:
    from ledgerq.format.sealing import sealed_batch_parts

    sealer = EntrySealer(KEY, QUEUE)
    parts, sizes = sealed_batch_parts(sealer, 3, 7, [b"a", b"", b"c" * 5000])
    raw = b"".join(parts)
    assert sum(sizes) == len(raw)
    pos = 0
    bodies = [b"a", b"", b"c" * 5000]
    for message_id, (body, size) in enumerate(zip(bodies, sizes, strict=True), 3):
        entry, end = decode_entry(raw, pos)
        assert (entry.id, end - pos) == (message_id, size)
        assert bool(entry.flags & EntryFlags.BATCH_CONTINUES) == (message_id < 5)
        assert sealer.open(entry).payload == body
        pos = end
