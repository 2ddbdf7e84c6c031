"""Reader state journal records: round trips, torn writes, bit flips, hostile bytes."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.format import (
    Checkpoint,
    CorruptRecord,
    DecodeError,
    IncompleteRecord,
    StateRecordType,
    decode_checkpoint,
    decode_state_file_header,
    decode_state_record,
    encode_checkpoint,
    encode_ids_record,
    encode_lease_by_record,
    encode_not_before_record,
    encode_reclaim_record,
    encode_state_file_header,
    encode_touch_record,
    state_file_version,
)
from ledgerq.format.checksum import checksum, checksum_v1
from ledgerq.format.reader_state import (
    STATE_FILE_HEADER,
    STATE_MAGIC,
    STATE_RECORD_HEADER,
    STATE_VERSION,
    ReclaimCause,
    state_checksum,
)
from tests.format._flips import check_bit_flip_is_detected, check_every_bit_flip_is_detected
from tests.strategies import U64_MAX, checkpoints, id_batches

# Every record type but CHECKPOINT carries a batch of ids; LEASE_BY and RECLAIM carry two
# more u64 first (the holder, and a deadline or a cause) and have encoders of their own.
# NOT_BEFORE carries one u64 first (the due time) and has its own encoder too.
HELD_TYPES = [StateRecordType.LEASE_BY, StateRecordType.RECLAIM, StateRecordType.TOUCH]
ID_TYPES = [
    t
    for t in StateRecordType
    if t is not StateRecordType.CHECKPOINT
    and t not in HELD_TYPES
    and t is not StateRecordType.NOT_BEFORE
]
UNKNOWN_TYPES = [0, max(StateRecordType) + 1, 255]

CHECKPOINT = Checkpoint(5, [7, 9], [(5, 2), (6, 1)], {"acked": 4, "nacked": 1})
FIXED = [
    encode_ids_record(StateRecordType.LEASE, [1]),
    encode_ids_record(StateRecordType.ACK, [3, U64_MAX]),
    encode_ids_record(StateRecordType.NACK, [10, 11, 12]),
    encode_checkpoint(Checkpoint(1, [], [], {})),
    encode_checkpoint(CHECKPOINT),
    encode_lease_by_record(0xABCDEF, 1_700_000_000_000_000_000, [4, 5]),
    encode_reclaim_record(0xABCDEF, ReclaimCause.GONE, [4]),
    encode_checkpoint(CHECKPOINT._replace(leases=[(5, 0xABCDEF, 0)]), shared=True),
    encode_not_before_record(1_700_000_000_000_000_000, [6]),
    encode_checkpoint(CHECKPOINT._replace(not_before=[(6, 1_700_000_000_000_000_000)])),
]


def frame(record_type: int, body: bytes) -> bytes:
    """Build a record with a correct length and CRC around any type and body."""
    head = struct.pack("<IB", 9 + len(body), record_type)
    return head + body + struct.pack("<I", checksum(head + body))


def outcome_of(buf: bytes) -> type[DecodeError] | None:
    try:
        decode_state_record(buf, 0)
    except DecodeError as exc:
        return type(exc)
    return None


# ---------------------------------------------------------------- file header


def test_file_header_round_trip() -> None:
    header = encode_state_file_header()
    assert header == b"LQRS\x03\x00\x00\x00"
    assert decode_state_file_header(header) == STATE_FILE_HEADER.size == 8
    assert decode_state_file_header(header + FIXED[0]) == 8


def test_file_header_cut_short_is_incomplete() -> None:
    header = encode_state_file_header()
    for cut in range(len(header)):
        with pytest.raises(IncompleteRecord):
            decode_state_file_header(header[:cut])


def test_file_header_bad_magic_or_version_is_corrupt() -> None:
    for magic in (b"LQRT", b"LQIX", b"\x00" * 4):
        with pytest.raises(CorruptRecord, match="magic"):
            decode_state_file_header(STATE_FILE_HEADER.pack(magic, STATE_VERSION))
    for version in (0, 4, 0xFFFFFFFF):
        with pytest.raises(CorruptRecord, match="version"):
            decode_state_file_header(STATE_FILE_HEADER.pack(STATE_MAGIC, version))


def test_every_version_is_read_and_version_3_is_written() -> None:
    for version in (1, 2, 3):
        header = encode_state_file_header(version)
        assert state_file_version(header) == version
        assert decode_state_file_header(header) == 8
    assert state_file_version(encode_state_file_header()) == 3
    with pytest.raises(ValueError, match="version 4"):
        encode_state_file_header(4)
    # Versions 1 and 2 are CRC-32, version 3 CRC-32C.
    assert state_checksum(1) is state_checksum(2) is checksum_v1
    assert state_checksum(3) is checksum


@pytest.mark.parametrize("version", [1, 2])
def test_a_crc32_record_of_an_old_file_reads_with_its_checksum_only(version: int) -> None:
    head = struct.pack("<IBQ", 17, StateRecordType.ACK, 5)
    old = head + struct.pack("<I", checksum_v1(head))
    assert decode_state_record(old, 0, state_checksum(version))[1] == (5,)
    with pytest.raises(CorruptRecord, match="checksum"):
        decode_state_record(old, 0)  # read as a version-3 record: its CRC-32C is wrong
    new = encode_ids_record(StateRecordType.ACK, [5])
    with pytest.raises(CorruptRecord, match="checksum"):
        decode_state_record(new, 0, state_checksum(version))


@settings(max_examples=30)
@given(due=st.integers(0, U64_MAX), ids=id_batches)
def test_not_before_record_round_trip(due: int, ids: list[int]) -> None:
    raw = encode_not_before_record(due, ids)
    assert len(raw) == 9 + 8 + 8 * len(ids)
    got, body, stop = decode_state_record(raw, 0)
    assert got is StateRecordType.NOT_BEFORE
    assert body == (due, *ids)
    assert stop == len(raw)


def test_not_before_record_without_an_id_is_corrupt() -> None:
    with pytest.raises(CorruptRecord):
        decode_state_record(frame(StateRecordType.NOT_BEFORE, struct.pack("<Q", 1)), 0)
    with pytest.raises(ValueError, match="due time"):
        encode_ids_record(StateRecordType.NOT_BEFORE, [1])
    with pytest.raises(ValueError, match="at least one id"):
        encode_not_before_record(1, [])


def test_checkpoint_carries_the_retry_times_in_a_sixth_element() -> None:
    cp = CHECKPOINT._replace(not_before=[(5, 99), (6, 100)])
    body = encode_checkpoint(cp)[5:-4]
    fields = msgpack.unpackb(body)
    assert fields[4:] == [[], [[5, 99], [6, 100]]]
    assert decode_checkpoint(body) == cp
    shared = cp._replace(leases=[(5, 7, 0)])
    assert decode_checkpoint(encode_checkpoint(shared, shared=True)[5:-4]) == shared
    # Without retry times the four-element form every version reads.
    assert len(msgpack.unpackb(encode_checkpoint(CHECKPOINT)[5:-4])) == 4


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", ID_TYPES)
@settings(max_examples=30)
@given(ids=id_batches)
def test_ids_record_round_trip(kind: StateRecordType, ids: list[int]) -> None:
    raw = encode_ids_record(kind, ids)
    assert len(raw) == 9 + 8 * len(ids)
    assert raw[4] == kind
    got, body, stop = decode_state_record(raw, 0)
    assert got is kind
    assert body == tuple(ids)
    assert stop == len(raw)


@pytest.mark.parametrize("kind", HELD_TYPES)
@settings(max_examples=30)
@given(holder=st.integers(0, U64_MAX), second=st.integers(0, U64_MAX), ids=id_batches)
def test_held_record_round_trip(
    kind: StateRecordType, holder: int, second: int, ids: list[int]
) -> None:
    if kind is StateRecordType.LEASE_BY:
        raw = encode_lease_by_record(holder, second, ids)
    elif kind is StateRecordType.TOUCH:
        raw = encode_touch_record(holder, second, ids)
    else:
        raw = encode_reclaim_record(holder, ReclaimCause(1 + second % 2), ids)
        second = 1 + second % 2
    assert len(raw) == 9 + 16 + 8 * len(ids)
    got, body, stop = decode_state_record(raw, 0)
    assert got is kind
    assert body == (holder, second, *ids)
    assert stop == len(raw)


@pytest.mark.parametrize("kind", HELD_TYPES)
def test_held_record_without_an_id_is_corrupt(kind: StateRecordType) -> None:
    """Holder and deadline (or cause) but no id: a body of 16 bytes is not a record."""
    with pytest.raises(CorruptRecord):
        decode_state_record(frame(kind, struct.pack("<QQ", 1, 2)), 0)
    with pytest.raises(ValueError, match="needs its holder"):
        encode_ids_record(kind, [1])


def test_shared_checkpoint_carries_the_leases() -> None:
    cp = CHECKPOINT._replace(leases=[(5, 7, 0), (6, 8, 123)])
    body = encode_checkpoint(cp, shared=True)[5:-4]
    assert msgpack.unpackb(body)[4] == [[5, 7, 0], [6, 8, 123]]
    assert decode_checkpoint(body) == cp
    with pytest.raises(ValueError, match="shared-mode"):
        encode_checkpoint(cp)  # leases only in the five-element (version 2) form


def test_ids_record_bytes() -> None:
    raw = encode_ids_record(StateRecordType.ACK, (2,))
    head = struct.pack("<IB", 17, 3) + struct.pack("<Q", 2)
    assert raw == head + struct.pack("<I", checksum(head))


@settings(max_examples=80)
@given(checkpoints())
def test_checkpoint_round_trip(checkpoint: Checkpoint) -> None:
    raw = encode_checkpoint(checkpoint)
    kind, body, stop = decode_state_record(raw, 0)
    assert kind is StateRecordType.CHECKPOINT
    assert stop == len(raw)
    assert isinstance(body, bytes)
    assert decode_checkpoint(body) == checkpoint


def test_checkpoint_body_is_a_msgpack_array() -> None:
    raw = encode_checkpoint(CHECKPOINT)
    body = raw[5:-4]
    assert msgpack.unpackb(body) == [5, [7, 9], [[5, 2], [6, 1]], {"acked": 4, "nacked": 1}]


def test_checkpoint_accepts_tuples() -> None:
    cp = Checkpoint(3, (4, 5), ((6, 1),), {"x": 0})  # type: ignore[arg-type]
    body = encode_checkpoint(cp)[5:-4]
    assert decode_checkpoint(body) == Checkpoint(3, [4, 5], [(6, 1)], {"x": 0})


@settings(max_examples=30)
@given(st.lists(checkpoints() | st.tuples(st.sampled_from(ID_TYPES), id_batches), max_size=8))
def test_walk_a_journal(records: list[Checkpoint | tuple[StateRecordType, list[int]]]) -> None:
    blobs = [
        encode_checkpoint(r) if isinstance(r, Checkpoint) else encode_ids_record(*r)
        for r in records
    ]
    journal = encode_state_file_header() + b"".join(blobs)
    pos = decode_state_file_header(journal)
    for record in records:
        kind, body, pos = decode_state_record(journal, pos)
        if isinstance(record, Checkpoint):
            assert kind is StateRecordType.CHECKPOINT
            assert isinstance(body, bytes)
            assert decode_checkpoint(body) == record
        else:
            assert (kind, body) == (record[0], tuple(record[1]))
    assert pos == len(journal)
    with pytest.raises(IncompleteRecord):
        decode_state_record(journal, pos)


# ---------------------------------------------------------------- torn writes


def check_every_prefix_is_incomplete(raw: bytes) -> None:
    for lead in (b"", b"\x00" * 5):
        for cut in range(len(raw)):
            with pytest.raises(IncompleteRecord) as info:
                decode_state_record(lead + raw[:cut], len(lead))
            assert info.value.pos == len(lead)


@pytest.mark.parametrize("raw", FIXED)
def test_every_prefix_is_incomplete_fixed(raw: bytes) -> None:
    check_every_prefix_is_incomplete(raw)


@settings(max_examples=30)
@given(checkpoints() | st.builds(encode_ids_record, st.sampled_from(ID_TYPES), id_batches))
def test_every_prefix_is_incomplete_any(record: Checkpoint | bytes) -> None:
    raw = encode_checkpoint(record) if isinstance(record, Checkpoint) else record
    check_every_prefix_is_incomplete(raw)


# ---------------------------------------------------------------- bit flips


@pytest.mark.parametrize("raw", FIXED)
def test_every_bit_flip_is_detected_fixed(raw: bytes) -> None:
    check_every_bit_flip_is_detected(raw, outcome_of)


@settings(max_examples=150)
@given(
    checkpoints() | st.builds(encode_ids_record, st.sampled_from(ID_TYPES), id_batches),
    st.data(),
)
def test_random_bit_flip_is_detected(record: Checkpoint | bytes, data: st.DataObject) -> None:
    raw = encode_checkpoint(record) if isinstance(record, Checkpoint) else record
    bit = data.draw(st.integers(0, len(raw) * 8 - 1), label="bit")
    check_bit_flip_is_detected(raw, bit, outcome_of)


# ---------------------------------------------------------------- invalid but checksummed


def test_impossible_lengths_are_corrupt() -> None:
    for length in (0, 8, 0x80000000, 0xFFFFFFFF):
        buf = struct.pack("<IB", length, 2) + bytes(20)
        with pytest.raises(CorruptRecord, match="length"):
            decode_state_record(buf, 0)


def test_unknown_record_type_is_corrupt() -> None:
    for rtype in UNKNOWN_TYPES:
        with pytest.raises(CorruptRecord, match="type"):
            decode_state_record(frame(rtype, struct.pack("<Q", 1)), 0)


@pytest.mark.parametrize("kind", ID_TYPES)
def test_ids_body_of_bad_size_is_corrupt(kind: StateRecordType) -> None:
    for body in (b"", b"\x01", bytes(7), bytes(9), bytes(15)):
        with pytest.raises(CorruptRecord, match="size"):
            decode_state_record(frame(kind, body), 0)


@pytest.mark.parametrize(
    "value",
    [
        [1, [], []],  # three fields
        [1, [], [], {}, 0],  # five fields
        {"head": 1},
        "text",
        [-1, [], [], {}],  # negative head
        [1, [-2], [], {}],  # negative done id
        [1.5, [], [], {}],  # float head
        ["5", [], [], {}],  # text head
        [True, [], [], {}],  # bool head
        [1, [2.0], [], {}],
        [1, [True], [], {}],
        [1, "12", [], {}],  # done is not an array
        [1, [], [[5]], {}],  # delivery without a count
        [1, [], [[5, 1, 2]], {}],
        [1, [], ["ab"], {}],
        [1, [], [[5, "2"]], {}],
        [1, [], [[-5, 2]], {}],
        [1, [], [[5, -2]], {}],
        [1, [], [{"5": "2", "6": "3"}], {}],
        [1, [], [], []],  # counters not a map
        [1, [], [], {"acked": "7"}],
        [1, [], [], {"acked": 1.0}],
        [1, [], [], {"acked": -1}],
        [1, [], [], {"acked": False}],
        [1, [], [], {b"acked": 1}],
    ],
)
def test_malformed_checkpoint_is_corrupt(value: object) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    with pytest.raises(CorruptRecord, match="checkpoint"):
        decode_checkpoint(body, 40)
    # The same body in a well-framed record still decodes as a record: the
    # checkpoint is checked by decode_checkpoint, which names the record's offset.
    kind, raw_body, _ = decode_state_record(frame(StateRecordType.CHECKPOINT, body), 0)
    assert kind is StateRecordType.CHECKPOINT
    assert raw_body == body


def test_checkpoint_that_is_not_msgpack_is_corrupt() -> None:
    for body in (b"", b"\xc1", b"\x94\x01", msgpack.packb([1, [], [], {}]) + b"\x00"):
        with pytest.raises(CorruptRecord) as info:
            decode_checkpoint(body, 17)
        assert info.value.pos == 17


# ---------------------------------------------------------------- encoder input checks


def test_ids_record_needs_ids_and_an_ids_type() -> None:
    with pytest.raises(ValueError, match="does not carry ids"):
        encode_ids_record(StateRecordType.CHECKPOINT, [1])
    for kind in ID_TYPES:
        with pytest.raises(ValueError, match="at least one id"):
            encode_ids_record(kind, [])


@pytest.mark.parametrize(
    "checkpoint",
    [
        Checkpoint(-1, [], [], {}),
        Checkpoint(1 << 64, [], [], {}),
        Checkpoint(1, [-3], [], {}),
        Checkpoint(1, [], [(2, -1)], {}),
        Checkpoint(1, [], [(-2, 1)], {}),
        Checkpoint(1, [], [], {"acked": -1}),
        Checkpoint(1, [], [], {"acked": 1 << 64}),
    ],
)
def test_encode_checkpoint_refuses_what_decode_would_reject(checkpoint: Checkpoint) -> None:
    # Written, such a checkpoint would make the reader's journal unreadable on reopen.
    with pytest.raises(ValueError, match="checkpoint"):
        encode_checkpoint(checkpoint)


@pytest.mark.parametrize(
    "checkpoint",
    [
        Checkpoint("1", [], [], {}),  # type: ignore[arg-type]
        Checkpoint(1, [2.5], [], {}),  # type: ignore[list-item]
        Checkpoint(1, [], [(2, 1, 0)], {}),  # type: ignore[list-item]
        Checkpoint(1, [], [], {1: 1}),  # type: ignore[dict-item]
        Checkpoint(1, [], [], {"acked": "1"}),  # type: ignore[dict-item]
    ],
)
def test_encode_checkpoint_refuses_wrong_types(checkpoint: Checkpoint) -> None:
    with pytest.raises((TypeError, ValueError), match="checkpoint"):
        encode_checkpoint(checkpoint)


# ---------------------------------------------------------------- hostile input


@settings(max_examples=300, deadline=1000)
@given(st.binary(max_size=120), st.integers(0, 6))
def test_garbage_raises_only_decode_errors(buf: bytes, pos: int) -> None:
    try:
        _, _, stop = decode_state_record(buf, pos)
    except DecodeError:
        return
    assert pos < stop <= len(buf)


@settings(max_examples=300, deadline=1000)
@given(st.integers(0, 255), st.binary(max_size=100))
def test_checksummed_garbage_raises_only_corrupt(rtype: int, body: bytes) -> None:
    try:
        kind, decoded, stop = decode_state_record(frame(rtype, body), 0)
    except CorruptRecord:
        return
    assert stop == 9 + len(body)
    if kind is StateRecordType.CHECKPOINT:
        assert isinstance(decoded, bytes)
        try:
            decode_checkpoint(decoded)
        except CorruptRecord:
            return
    else:
        assert isinstance(decoded, tuple)
        assert len(decoded) * 8 == len(body) > 0


@settings(max_examples=200, deadline=1000)
@given(st.binary(max_size=200))
def test_decode_checkpoint_on_garbage(body: bytes) -> None:
    try:
        checkpoint = decode_checkpoint(body)
    except CorruptRecord:
        return
    _assert_writable_as_is(checkpoint)


def _assert_writable_as_is(checkpoint: Checkpoint) -> None:
    """What the decoder accepts, the encoder writes back and the decoder reads the same.

    A checkpoint the decoder let through but the encoder refuses would make the next
    checkpoint of that reader fail; one that changes on the way would change its state.
    """
    kind, body, _ = decode_state_record(encode_checkpoint(checkpoint), 0)
    assert kind is StateRecordType.CHECKPOINT and isinstance(body, bytes)
    assert decode_checkpoint(body) == checkpoint


# Values shaped like a checkpoint with one field off (a negative, huge, float or bool
# id, a string count, a bad pair): the edge the decoder's checks stand on.
_near_ids = st.one_of(
    st.integers(min_value=-2, max_value=5),
    st.integers(min_value=U64_MAX - 1, max_value=U64_MAX + 1),
    st.booleans(),
    st.floats(allow_nan=False, max_value=10, min_value=-1),
    st.just("7"),
)
_near_checkpoints = st.tuples(
    _near_ids,
    st.lists(_near_ids, max_size=3),
    st.lists(st.lists(_near_ids, min_size=1, max_size=3), max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 3)), _near_ids, max_size=3),
).map(list)


@settings(max_examples=100, deadline=1000)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=12,
    )
    | _near_checkpoints,
)
def test_decode_checkpoint_on_any_msgpack(value: object) -> None:
    try:
        body = msgpack.packb(value)
    except (OverflowError, TypeError, ValueError):
        return  # not representable in msgpack
    try:
        checkpoint = decode_checkpoint(body)
    except CorruptRecord:
        return
    _assert_writable_as_is(checkpoint)


def test_state_record_header_size() -> None:
    assert STATE_RECORD_HEADER.size == 5
