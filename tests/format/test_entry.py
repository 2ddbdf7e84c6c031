"""Segment log entries: round trips, torn writes, bit flips and hostile bytes."""

from __future__ import annotations

import dataclasses
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq.format import (
    CHECKSUM_NAME,
    MAX_ENTRY_SIZE,
    MIN_ENTRY_SIZE,
    CorruptRecord,
    DecodeError,
    EntryFlags,
    IncompleteRecord,
    RecordType,
    checksum,
    checksum_v1,
    decode_entry,
    decode_headers,
    encode_entry,
    encode_headers,
    peek_length,
)
from tests.format._flips import check_bit_flip_is_detected, check_every_bit_flip_is_detected
from tests.strategies import U64_MAX, EntrySpec, entry_specs, header_maps

# A few small entries covering each optional field alone and all together; the
# exhaustive bit-flip and truncation tests walk every byte of these.
FIXED = [
    EntrySpec(id=1, timestamp=0, payload=b""),
    EntrySpec(id=7, timestamp=1_700_000_000_000_000_000, payload=b"hello"),
    EntrySpec(id=U64_MAX, timestamp=-1, payload=b"x", expires_at=5),
    EntrySpec(id=42, timestamp=3, payload=b"pri", priority=2),
    EntrySpec(id=43, timestamp=3, payload=b"low", priority=0),
    EntrySpec(id=9, timestamp=9, payload=b"h", headers={"k": "v", "caf\u00e9": "\u2603"}),
    EntrySpec(id=10, timestamp=10, payload=b"", headers={}),
    EntrySpec(id=11, timestamp=11, payload=b"\x28\xb5\x2f\xfd", compressed=True),
    EntrySpec(
        id=12,
        timestamp=12,
        payload=b"all",
        expires_at=-(1 << 63),
        priority=0,
        headers={"a": ""},
        compressed=True,
        deliver_at=(1 << 63) - 1,
    ),
    EntrySpec(id=13, timestamp=13, payload=b"later", deliver_at=13 + 10**9),
    EntrySpec(id=14, timestamp=14, payload=b"g", group="customer-42 \u00e9", headers={"k": "v"}),
    EntrySpec(id=15, timestamp=15, payload=b"", group="x" * 255),
]
# The same entries as a format-1 ledgerq wrote them (CRC-32): read like the others.
# Format 1 as well, but for the fields format 2 brought (deliver_at, group).
FIXED += [
    dataclasses.replace(spec, entry_format=1)
    for spec in FIXED
    if spec.deliver_at is None and spec.group is None
]
FIXED_IDS = [f"id{s.id}-v{s.entry_format}" for s in FIXED]


def crc_of(raw: bytes | bytearray) -> int:
    """The checksum an entry's type byte selects, over its bytes before the CRC."""
    crc = checksum if raw[4] >> 4 == 2 else checksum_v1
    return crc(bytes(raw[:-4]))


def reseal(raw: bytes | bytearray) -> bytes:
    """Recompute the CRC of an entry whose bytes a test changed on purpose."""
    body = bytes(raw[:-4])
    return body + struct.pack("<I", crc_of(raw))


def decode_or_error(buf: bytes, pos: int = 0) -> type[DecodeError] | None:
    """Return the DecodeError subclass raised, or None if an entry came back."""
    try:
        decode_entry(buf, pos)
    except DecodeError as exc:
        return type(exc)
    return None


# ---------------------------------------------------------------- checksum


def test_checksum_is_crc32c_and_format_1_is_crc32_ieee() -> None:
    assert CHECKSUM_NAME == "crc32c"
    assert checksum(b"123456789") == 0xE3069283  # the catalogued check value of CRC-32C
    assert checksum(b"") == 0
    assert checksum(b"56789", checksum(b"1234")) == 0xE3069283
    assert checksum_v1(b"123456789") == 0xCBF43926  # the catalogued check value of CRC-32
    assert checksum_v1(b"56789", checksum_v1(b"1234")) == 0xCBF43926


@pytest.mark.parametrize("spec", FIXED, ids=FIXED_IDS)
def test_crc_covers_every_byte_before_it(spec: EntrySpec) -> None:
    raw = spec.encode()
    crc = checksum if spec.entry_format == 2 else checksum_v1
    assert struct.unpack_from("<I", raw, len(raw) - 4)[0] == crc(raw[:-4])
    assert struct.unpack_from("<I", raw, 0)[0] == len(raw)
    assert raw[4] == (0x21 if spec.entry_format == 2 else 0x01)  # the format nibble


@pytest.mark.parametrize("entry_format", [1, 2])
def test_an_entry_checked_with_the_other_formats_crc_is_corrupt(entry_format: int) -> None:
    """The format nibble picks the CRC: flipping it (or a v1 CRC on a v2 entry) is damage."""
    raw = bytearray(EntrySpec(5, 6, b"payload", entry_format=entry_format).encode())
    raw[4] ^= 0x20  # now claims the other format, with the first format's CRC
    with pytest.raises(CorruptRecord, match="checksum"):
        decode_entry(bytes(raw))
    for nibble in (1, 3, 15):  # formats this ledgerq does not know
        raw[4] = nibble << 4 | 1
        with pytest.raises(CorruptRecord, match="unknown format"):
            decode_entry(reseal(raw))


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("spec", FIXED, ids=FIXED_IDS)
def test_round_trip_fixed(spec: EntrySpec) -> None:
    raw = spec.encode()
    entry, stop = decode_entry(raw)
    assert spec.matches(entry), entry
    assert stop == len(raw) == entry.size
    assert entry.type == RecordType.DATA


@settings(max_examples=150)
@given(entry_specs())
def test_round_trip_any(spec: EntrySpec) -> None:
    raw = spec.encode()
    entry, stop = decode_entry(raw)
    assert spec.matches(entry)
    assert stop == len(raw) == entry.size


@settings(max_examples=30)
@given(entry_specs(), st.binary(max_size=40), st.binary(max_size=40))
def test_round_trip_inside_a_larger_buffer(spec: EntrySpec, before: bytes, after: bytes) -> None:
    raw = spec.encode()
    for buf in (before + raw + after, bytearray(before + raw + after)):
        entry, stop = decode_entry(memoryview(buf), len(before))
        assert spec.matches(entry)
        assert stop == len(before) + len(raw)


def test_flags_say_which_optional_fields_are_present() -> None:
    cases = [
        (EntrySpec(1, 1, b""), EntryFlags.NONE),
        (EntrySpec(1, 1, b"", expires_at=0), EntryFlags.HAS_TTL),
        (EntrySpec(1, 1, b"", priority=2), EntryFlags.HAS_PRIORITY),
        (EntrySpec(1, 1, b"", headers={}), EntryFlags.HAS_HEADERS),
        (EntrySpec(1, 1, b"", compressed=True), EntryFlags.COMPRESSED),
        (EntrySpec(1, 1, b"", deliver_at=2), EntryFlags.HAS_DELIVER_AT),
        (EntrySpec(1, 1, b"", group="g"), EntryFlags.HAS_GROUP),
    ]
    for spec, flags in cases:
        raw = spec.encode()
        assert raw[5] == flags
        assert decode_entry(raw)[0].flags == flags


def test_medium_priority_is_not_written() -> None:
    medium = EntrySpec(1, 1, b"p", priority=1).encode()
    high = EntrySpec(1, 1, b"p", priority=2).encode()
    assert len(high) == len(medium) + 1
    assert len(medium) == MIN_ENTRY_SIZE + 1


def test_explicit_medium_priority_is_read() -> None:
    # A writer may store priority 1 explicitly; a reader must accept it.
    raw = bytearray(EntrySpec(5, 6, b"p").encode())
    raw[5] |= EntryFlags.HAS_PRIORITY
    raw[22:22] = b"\x01"
    raw[0:4] = struct.pack("<I", len(raw))
    entry, _ = decode_entry(reseal(raw))
    assert entry.priority == 1
    assert entry.payload == b"p"


def test_optional_fields_in_order() -> None:
    headers = encode_headers({"k": "v"})
    raw = encode_entry(
        3, 4, b"PAYLOAD", expires_at=0x0102030405060708, priority=2, headers_blob=headers
    )
    assert raw[22:30] == struct.pack("<q", 0x0102030405060708)
    assert raw[30] == 2
    assert raw[31:35] == struct.pack("<I", len(headers))
    assert raw[35 : 35 + len(headers)] == headers
    assert raw[35 + len(headers) : -4] == b"PAYLOAD"


def test_empty_payload_is_the_smallest_entry() -> None:
    raw = encode_entry(1, 0, b"")
    assert len(raw) == MIN_ENTRY_SIZE == 26
    assert decode_entry(raw)[0].payload == b""


def test_large_payload() -> None:
    payload = bytes(range(256)) * 8192 + b"tail"  # 2 MiB and a bit
    raw = encode_entry(77, 1, payload, headers_blob=encode_headers({"big": "yes"}))
    entry, stop = decode_entry(raw)
    assert entry.payload == payload
    assert entry.headers == {"big": "yes"}
    assert stop == len(raw)
    with pytest.raises(IncompleteRecord):
        decode_entry(raw[:-1])


def test_payload_accepts_any_bytes_like() -> None:
    for payload in (b"abc", bytearray(b"abc"), memoryview(b"xabcx")[1:4]):
        assert decode_entry(encode_entry(1, 1, payload))[0].payload == b"abc"


@settings(max_examples=60)
@given(header_maps)
def test_headers_round_trip(headers: dict[str, str]) -> None:
    assert decode_headers(encode_headers(headers)) == headers


def test_unicode_headers() -> None:
    headers = {
        "\u65e5\u672c": "\u8a9e",
        "emoji \U0001f600": "\U0001f4e6" * 50,
        "": "empty name",
        "nul\x00": "\x00",
        "long": "x" * 70_000,
    }
    raw = EntrySpec(1, 1, b"", headers=headers).encode()
    assert decode_entry(raw)[0].headers == headers


# ---------------------------------------------------------------- concatenation


@settings(max_examples=40)
@given(st.lists(entry_specs(), min_size=1, max_size=8))
def test_walk_concatenated_entries(specs: list[EntrySpec]) -> None:
    blobs = [s.encode() for s in specs]
    buf = b"".join(blobs)
    pos = 0
    for spec, blob in zip(specs, blobs, strict=True):
        entry, nxt = decode_entry(buf, pos)
        assert spec.matches(entry)
        assert nxt == pos + len(blob)
        assert peek_length(buf, pos) == len(blob)
        pos = nxt
    assert pos == len(buf)
    with pytest.raises(IncompleteRecord):
        decode_entry(buf, pos)


def test_walk_stops_at_torn_tail() -> None:
    blobs = [s.encode() for s in FIXED]
    buf = b"".join(blobs)
    torn = buf[:-3]
    pos = 0
    for _ in FIXED[:-1]:
        _, pos = decode_entry(torn, pos)
    assert pos == len(buf) - len(blobs[-1])
    with pytest.raises(IncompleteRecord) as info:
        decode_entry(torn, pos)
    assert info.value.pos == pos
    assert info.value.needed == len(blobs[-1])


# ---------------------------------------------------------------- torn writes


def check_every_prefix_is_incomplete(raw: bytes, lead: bytes = b"") -> None:
    for cut in range(len(raw)):
        buf = lead + raw[:cut]
        with pytest.raises(IncompleteRecord) as info:
            decode_entry(buf, len(lead))
        exc = info.value
        assert exc.pos == len(lead)
        if exc.needed is not None:
            assert len(lead) + exc.needed > len(buf), "claims to need bytes it already has"
            assert exc.needed <= len(raw)


@pytest.mark.parametrize("spec", FIXED, ids=FIXED_IDS)
def test_every_prefix_is_incomplete_fixed(spec: EntrySpec) -> None:
    raw = spec.encode()
    check_every_prefix_is_incomplete(raw)
    check_every_prefix_is_incomplete(raw, lead=b"\xff" * 3)


@settings(max_examples=40)
@given(entry_specs())
def test_every_prefix_is_incomplete_any(spec: EntrySpec) -> None:
    check_every_prefix_is_incomplete(spec.encode())


def test_short_prefix_with_impossible_length_is_corrupt() -> None:
    # Once the length field is there, an impossible value is corruption, not a short read.
    for length in (0, 1, MIN_ENTRY_SIZE - 1, MAX_ENTRY_SIZE + 1, 0xFFFFFFFF):
        prefix = struct.pack("<I", length) + b"\x01\x00"
        with pytest.raises(CorruptRecord):
            decode_entry(prefix)
        with pytest.raises(CorruptRecord):
            peek_length(prefix, 0)
    assert peek_length(struct.pack("<I", MIN_ENTRY_SIZE), 0) == MIN_ENTRY_SIZE
    with pytest.raises(IncompleteRecord):
        peek_length(b"\x1a\x00\x00", 0)


# ---------------------------------------------------------------- bit flips


@pytest.mark.parametrize("spec", FIXED, ids=FIXED_IDS)
def test_every_bit_flip_is_detected_fixed(spec: EntrySpec) -> None:
    check_every_bit_flip_is_detected(spec.encode(), decode_or_error)


@settings(max_examples=200)
@given(entry_specs(), st.data())
def test_random_bit_flip_is_detected(spec: EntrySpec, data: st.DataObject) -> None:
    raw = spec.encode()
    bit = data.draw(st.integers(0, len(raw) * 8 - 1), label="bit")
    check_bit_flip_is_detected(raw, bit, decode_or_error)


def test_length_flip_that_grows_the_entry_looks_incomplete() -> None:
    raw = bytearray(EntrySpec(1, 2, b"abc").encode())
    raw[0] ^= 0x40
    assert decode_or_error(bytes(raw)) is IncompleteRecord


# ---------------------------------------------------------------- invalid but checksummed


def test_checksummed_but_invalid_fields_are_corrupt() -> None:
    base = bytearray(EntrySpec(5, 6, b"payload").encode())

    def variant(offset: int, value: int) -> bytes:
        raw = bytearray(base)
        raw[offset] = value
        return reseal(raw)

    for rtype in (0, 4, 15, 0x20, 0x24, 0x2F):
        with pytest.raises(CorruptRecord, match="type"):
            decode_entry(variant(4, rtype))
    # ENCRYPTED (issue 18) over a payload too short to be a sealed blob.
    with pytest.raises(CorruptRecord, match="sealed payload"):
        decode_entry(variant(5, 1 << 7))
    # HAS_GROUP over a payload whose first byte is no valid group length for it.
    with pytest.raises(CorruptRecord, match="group"):
        decode_entry(variant(5, 1 << 6))
    # HAS_DELIVER_AT on an entry too short for its field (a 7-byte payload).
    with pytest.raises(CorruptRecord, match="deliver_at"):
        decode_entry(variant(5, 1 << 5))
    raw = bytearray(base)
    raw[6:14] = bytes(8)
    with pytest.raises(CorruptRecord, match="id 0"):
        decode_entry(reseal(raw))


@pytest.mark.parametrize("flag", [EntryFlags.HAS_DELIVER_AT, EntryFlags.HAS_GROUP])
def test_a_format_1_entry_cannot_be_delayed_or_grouped(flag: EntryFlags) -> None:
    # Format 2 brought both flags: no ledgerq wrote a format-1 entry with them, so one
    # that says so is damage (its field would be read from the payload).
    raw = bytearray(EntrySpec(5, 6, b"\x01g" + bytes(8), entry_format=1).encode())
    raw[5] = int(flag)
    with pytest.raises(CorruptRecord, match="flags"):
        decode_entry(reseal(raw))
    raw[4] = 0x21  # the same bytes as a format-2 entry are valid
    assert decode_entry(reseal(raw))[0].flags == int(flag)
    # Nor does this ledgerq write one.
    field = {"deliver_at": 7} if flag is EntryFlags.HAS_DELIVER_AT else {"group": b"g"}
    with pytest.raises(ValueError, match="format-1"):
        encode_entry(5, 6, b"", entry_format=1, **field)  # type: ignore[arg-type]


@pytest.mark.parametrize("entry_format", [1, 2])
def test_reserved_record_types_decode(entry_format: int) -> None:
    for rtype in (RecordType.TOMBSTONE, RecordType.CHECKPOINT):
        raw = encode_entry(3, 4, b"", record_type=rtype, entry_format=entry_format)
        entry, _ = decode_entry(raw)
        assert entry.type == rtype
        assert entry.format == entry_format


def test_priority_above_high_is_corrupt() -> None:
    raw = bytearray(EntrySpec(5, 6, b"p", priority=2).encode())
    for value in (3, 255):
        raw[22] = value
        with pytest.raises(CorruptRecord, match="priority"):
            decode_entry(reseal(raw))


@pytest.mark.parametrize(
    ("flag", "room"),
    [
        (EntryFlags.HAS_TTL, 7),
        (EntryFlags.HAS_PRIORITY, 0),
        (EntryFlags.HAS_HEADERS, 3),
    ],
)
def test_optional_field_that_does_not_fit_is_corrupt(flag: EntryFlags, room: int) -> None:
    raw = bytearray(encode_entry(5, 6, b"\x00" * room))
    raw[5] = flag
    with pytest.raises(CorruptRecord, match="too short"):
        decode_entry(reseal(raw))


def test_headers_longer_than_the_entry_are_corrupt() -> None:
    raw = bytearray(EntrySpec(5, 6, b"p", headers={"a": "b"}).encode())
    raw[22:26] = struct.pack("<I", 1000)
    with pytest.raises(CorruptRecord, match="headers run past"):
        decode_entry(reseal(raw))


def test_headers_that_are_not_a_str_map_are_corrupt() -> None:
    for blob in (
        msgpack.packb([1, 2]),
        msgpack.packb({"a": 1}),
        msgpack.packb({"a": b"bytes"}, use_bin_type=True),
        msgpack.packb({b"a": "x"}, use_bin_type=True),
        msgpack.packb({"a": "b"}) + b"\x00",  # trailing bytes
        b"\xc1",  # never-used msgpack byte
        b"",
    ):
        raw = encode_entry(5, 6, b"p", headers_blob=blob)
        with pytest.raises(CorruptRecord, match="headers"):
            decode_entry(raw)


# ---------------------------------------------------------------- hostile input


@settings(max_examples=300, deadline=1000)
@given(st.binary(max_size=200), st.integers(0, 8))
def test_garbage_raises_only_decode_errors(buf: bytes, pos: int) -> None:
    try:
        entry, stop = decode_entry(buf, pos)
    except DecodeError:
        return
    assert pos < stop <= len(buf)
    assert entry.size == stop - pos


@settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 255),
    st.integers(0, 255),
    st.binary(min_size=16, max_size=120),
)
def test_checksummed_garbage_raises_only_corrupt(rtype: int, flags: int, rest: bytes) -> None:
    # Valid length and CRC around random fields: exercises every check after the CRC.
    length = 6 + len(rest) + 4
    body = struct.pack("<IBB", length, rtype, flags) + rest
    raw = body + struct.pack("<I", crc_of(body + bytes(4)))
    try:
        entry, stop = decode_entry(raw)
    except CorruptRecord:
        return
    assert stop == len(raw)
    assert entry.id > 0
    assert entry.priority in (0, 1, 2)
    assert entry.headers is None or all(
        type(k) is str and type(v) is str for k, v in entry.headers.items()
    )


@settings(max_examples=200, deadline=1000)
@given(st.binary(max_size=300))
def test_decode_headers_on_garbage(blob: bytes) -> None:
    try:
        headers = decode_headers(blob)
    except CorruptRecord:
        return
    assert all(type(k) is str and type(v) is str for k, v in headers.items())


# ---------------------------------------------------------------- encoder input checks


@pytest.mark.parametrize(
    "headers",
    [
        [("a", "b")],
        "a=b",
        None,
        42,
        {1: "a"},
        {b"a": "b"},
        {"a": b"b"},
        {"a": 1},
        {"a": None},
        {"a": "b", "c": ["d"]},
    ],
)
def test_encode_headers_rejects_non_str_maps(headers: object) -> None:
    with pytest.raises(TypeError):
        encode_headers(headers)


def test_encode_headers_accepts_any_mapping() -> None:
    from types import MappingProxyType

    blob = encode_headers(MappingProxyType({"a": "b"}))
    assert decode_headers(blob) == {"a": "b"}


def test_encode_headers_rejects_lone_surrogates() -> None:
    with pytest.raises(ValueError, match="unicode"):
        encode_headers({"a": "\ud800"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"message_id": 0}, "id"),
        ({"message_id": -1}, "id"),
        ({"message_id": 1 << 64}, "id"),
        ({"timestamp": 1 << 63}, "timestamp"),
        ({"expires_at": -(1 << 63) - 1}, "expires_at"),
        ({"priority": 3}, "priority"),
        ({"priority": -1}, "priority"),
        ({"record_type": 0}, "type"),
        ({"record_type": 9}, "type"),
    ],
)
def test_encode_entry_refuses_what_decode_would_reject(kwargs: dict[str, int], match: str) -> None:
    # An encoder that wrote these would turn an accepted enqueue into a "corrupt"
    # entry that recovery skips: the message would be lost without an error.
    args: dict[str, int] = {"message_id": 1, "timestamp": 0}
    args.update(kwargs)
    message_id = args.pop("message_id")
    timestamp = args.pop("timestamp")
    with pytest.raises(ValueError, match=match):
        encode_entry(message_id, timestamp, b"", **args)  # type: ignore[arg-type]


@given(
    message_id=st.integers(min_value=1, max_value=(1 << 64) - 1),
    timestamp=st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    payload=st.binary(max_size=200),
)
def test_plain_fast_path_encodes_exactly_like_encode_entry(
    message_id: int, timestamp: int, payload: bytes
) -> None:
    from ledgerq.format.entry import encode_plain_entry

    assert encode_plain_entry(message_id, timestamp, payload) == encode_entry(
        message_id, timestamp, payload
    )


@given(
    message_id=st.integers(min_value=1, max_value=(1 << 64) - 1),
    timestamp=st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    deliver_at=st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    payload=st.binary(max_size=200),
)
def test_delayed_fast_path_encodes_exactly_like_encode_entry(
    message_id: int, timestamp: int, deliver_at: int, payload: bytes
) -> None:
    from ledgerq.format.entry import encode_delayed_entry

    assert encode_delayed_entry(message_id, timestamp, payload, deliver_at) == encode_entry(
        message_id, timestamp, payload, deliver_at=deliver_at
    )


@given(
    first_id=st.integers(min_value=1, max_value=1 << 40),
    # Small and large payloads, mixed: the encoder joins small ones to their header.
    payloads=st.lists(
        st.binary(max_size=100) | st.binary(min_size=990, max_size=1100), min_size=1, max_size=20
    ),
)
def test_plain_batch_parts_are_the_entries(first_id: int, payloads: list[bytes]) -> None:
    from ledgerq.format.entry import encode_plain_batch_parts

    parts, sizes = encode_plain_batch_parts(first_id, 7, payloads)
    last = len(payloads) - 1
    expected = [
        encode_entry(first_id + i, 7, p, batch_continues=i < last) for i, p in enumerate(payloads)
    ]
    assert b"".join(parts) == b"".join(expected)
    assert sizes == [len(e) for e in expected]


def test_batch_continues_marks_every_entry_of_a_batch_but_its_last() -> None:
    from ledgerq.format.entry import encode_plain_batch_parts

    parts, _ = encode_plain_batch_parts(5, 7, [b"a", b"b", b"c"])
    blob = b"".join(parts)
    flags = []
    pos = 0
    while pos < len(blob):
        entry, pos = decode_entry(blob, pos)
        flags.append(entry.flags)
    assert flags == [EntryFlags.BATCH_CONTINUES, EntryFlags.BATCH_CONTINUES, EntryFlags.NONE]
    assert encode_plain_batch_parts(5, 7, []) == ([], [])
    single, _ = encode_plain_batch_parts(5, 7, [b"only"])
    assert decode_entry(b"".join(single))[0].flags == EntryFlags.NONE
