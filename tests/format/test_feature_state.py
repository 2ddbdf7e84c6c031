"""The fixed-width record encoder of unique keys and hand-offs reads back as any record."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerq.format.feature_state import (
    decode_feature_records,
    encode_feature_record,
    keyed_record_encoder,
)

U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)


@given(st.binary(min_size=16, max_size=16), U64, U64, I64)
def test_a_keyed_record_decodes_as_the_value_it_stands_for(
    key: bytes, a: int, b: int, c: int
) -> None:
    blob = keyed_record_encoder("QQq")(key, a, b, c)
    decoded = decode_feature_records(blob, 0)
    assert decoded.values == [[key, a, b, c]]
    assert decoded.damaged == 0 and decoded.end == len(blob)
    # The same value as the general encoder writes it (shortest ints) decodes the same.
    assert decode_feature_records(encode_feature_record([key, a, b, c]), 0).values == [
        [key, a, b, c]
    ]


def test_signed_fields_keep_their_sign() -> None:
    blob = keyed_record_encoder("Qqq")(bytes(16), 7, -1, -(2**63))
    assert decode_feature_records(blob, 0).values == [[bytes(16), 7, -1, -(2**63)]]


@pytest.mark.parametrize("ints", ["QQ", "QQQQ", "QQd", ""])
def test_a_record_of_other_ints_is_refused(ints: str) -> None:
    with pytest.raises(ValueError, match="three ints typed Q or q"):
        keyed_record_encoder(ints)
