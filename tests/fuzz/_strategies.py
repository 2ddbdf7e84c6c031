"""Hypothesis strategies of fuzz inputs: random bytes, and mutated seeds.

A mutated seed is a committed seed with a few of: a flipped byte, a u32 overwritten
with a hostile length (0, 8, 9, 26, 2^31 - 1, 2^32 - 1, or near the input's size), a
cut, an insertion, a deleted span, a duplicated span, or a splice with another seed.
Mutating valid records reaches the paths behind the checksums, which random bytes
almost never do.
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

__all__ = ["inputs"]

_HOSTILE = (0, 1, 8, 9, 25, 26, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)


@st.composite
def _mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 6))
        size = len(data)
        at = draw(st.integers(0, max(size - 1, 0)))
        if kind == 0 and size:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == 1 and size >= 4:
            at = min(at, size - 4)
            value = draw(st.sampled_from((*_HOSTILE, size, size - at, size + 1)))
            data[at : at + 4] = struct.pack("<I", value & 0xFFFFFFFF)
        elif kind == 2:
            del data[at:]
        elif kind == 3:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == 4 and size:
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == 5 and size:
            span = bytes(data[at : at + draw(st.integers(1, 64))])
            data[at:at] = span
        elif kind == 6:
            other = draw(st.sampled_from(seeds))
            data[at:] = other[draw(st.integers(0, len(other))) :]
    return bytes(data)


def inputs(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    """Fuzz inputs for a target with these seeds."""
    raw = st.binary(max_size=600)
    if not seeds:
        return raw
    return st.one_of(raw, _mutated(seeds), _mutated(seeds))
