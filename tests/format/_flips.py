"""Bit flips in encoded records, and the check that the decoder notices every one.

An entry (``ledgerq.format.entry``) and a reader-journal record
(``ledgerq.format.reader_state``) both begin with a 4-byte length and end with a
checksum over what is in between: a record with one bit flipped must never decode, and
a flip past the length must read as corruption (all the record's bytes are there).
"""

from __future__ import annotations

from collections.abc import Callable

from ledgerq.format import CorruptRecord, DecodeError

__all__ = ["Outcome", "check_bit_flip_is_detected", "check_every_bit_flip_is_detected", "flip"]

# What a decoder made of some bytes: the DecodeError subclass it raised, None if it decoded.
Outcome = Callable[[bytes], type[DecodeError] | None]

LENGTH_BITS = 32  # the length field's: a flip there may read as a short record instead


def flip(raw: bytes, bit: int) -> bytes:
    """``raw`` with its ``bit``-th bit flipped (bit 0: the lowest of the first byte)."""
    flipped = bytearray(raw)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


def check_bit_flip_is_detected(raw: bytes, bit: int, outcome: Outcome) -> None:
    """The record ``raw`` with its ``bit``-th bit flipped does not decode (``outcome``)."""
    found = outcome(flip(raw, bit))
    assert found is not None, f"flip of bit {bit % 8} of byte {bit // 8} went unnoticed"
    if bit >= LENGTH_BITS:  # the length is intact: the bytes are all there, so corrupt
        assert found is CorruptRecord, (bit // 8, bit % 8)


def check_every_bit_flip_is_detected(raw: bytes, outcome: Outcome) -> None:
    """Every one of the record ``raw``'s bits, flipped, is noticed (``outcome``)."""
    for bit in range(len(raw) * 8):
        check_bit_flip_is_detected(raw, bit, outcome)
