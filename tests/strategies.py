"""Shared hypothesis strategies for ledgerq's tests.

The building blocks draw values across the whole range the on-disk format allows
(u64 ids, i64 nanosecond times), not only the values a running queue produces,
so format tests meet the edges (id 1, id 2**64-1, negative times).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from ledgerq.format.entry import Entry, EntryFlags, encode_entry, encode_headers
from ledgerq.format.index import IndexEntry
from ledgerq.format.reader_state import Checkpoint

__all__ = [
    "U64_MAX",
    "EntrySpec",
    "checkpoints",
    "entry_specs",
    "header_maps",
    "id_batches",
    "index_entry_lists",
    "message_ids",
    "payloads",
    "priorities",
    "timestamps_ns",
]

U64_MAX = (1 << 64) - 1
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1

message_ids = st.integers(min_value=1, max_value=U64_MAX)
"""Any id the format can hold (ids are u64 and never 0)."""

timestamps_ns = st.integers(min_value=I64_MIN, max_value=I64_MAX)
"""Any i64 nanosecond time, including before the epoch."""

priorities = st.sampled_from([0, 1, 2])
"""LOW, MEDIUM, HIGH as stored."""

# Header text: any unicode except lone surrogates (which no UTF-8 encoder accepts).
_header_text = st.text(max_size=20)
header_maps = st.dictionaries(_header_text, _header_text, max_size=6)
"""A ``Mapping[str, str]`` as ``enqueue(headers=...)`` takes it."""

payloads = st.binary(max_size=300)
"""Small payloads; tests of large payloads build them explicitly."""


@dataclass(frozen=True, slots=True)
class EntrySpec:
    """Everything that goes into one encoded entry, and the expectations about it."""

    id: int
    timestamp: int
    payload: bytes
    expires_at: int | None = None
    priority: int = 1
    headers: dict[str, str] | None = None
    compressed: bool = False
    deliver_at: int | None = None
    group: str | None = None
    entry_format: int = 2  # 1: as a format-1 ledgerq wrote it (CRC-32; no deliver_at, group)

    def encode(self) -> bytes:
        """Return the entry's bytes, as the queue (of ``entry_format``) would write them."""
        blob = encode_headers(self.headers) if self.headers is not None else None
        return encode_entry(
            self.id,
            self.timestamp,
            self.payload,
            expires_at=self.expires_at,
            priority=self.priority,
            headers_blob=blob,
            compressed=self.compressed,
            deliver_at=self.deliver_at,
            group=None if self.group is None else self.group.encode(),
            entry_format=self.entry_format,
        )

    def matches(self, entry: Entry) -> bool:
        """Whether a decoded entry carries exactly this spec's values."""
        return (
            entry.id == self.id
            and entry.timestamp == self.timestamp
            and entry.payload == self.payload
            and entry.expires_at == self.expires_at
            and entry.priority == self.priority
            and entry.headers == self.headers
            and bool(entry.flags & EntryFlags.COMPRESSED) == self.compressed
            and entry.deliver_at == self.deliver_at
            and entry.group == self.group
            and entry.format == self.entry_format
        )


# Message group names: 1 to 255 bytes of UTF-8 (no lone surrogates: not encodable).
group_names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60).filter(
    lambda g: len(g.encode()) <= 255
)


def entry_specs(
    *,
    ids: st.SearchStrategy[int] = message_ids,
    payload: st.SearchStrategy[bytes] = payloads,
) -> st.SearchStrategy[EntrySpec]:
    """Entries with random ids and times and every combination of the optional fields."""
    return st.builds(
        EntrySpec,
        id=ids,
        timestamp=timestamps_ns,
        payload=payload,
        expires_at=st.none() | timestamps_ns,
        priority=priorities,
        headers=st.none() | header_maps,
        compressed=st.booleans(),
        deliver_at=st.none() | timestamps_ns,
        group=st.none() | group_names,
        entry_format=st.sampled_from([2, 1]),
    ).map(
        # A format-1 entry has no deliver_at nor group (format 2 brought them).
        lambda spec: spec if spec.entry_format == 2 else replace(spec, deliver_at=None, group=None)
    )


@st.composite
def index_entry_lists(
    draw: st.DrawFn, *, min_size: int = 0, max_size: int = 12
) -> list[IndexEntry]:
    """Valid index contents: ids and offsets strictly increasing, the first at offset 0."""
    n = draw(st.integers(min_value=min_size, max_value=max_size))
    if n == 0:
        return []
    first_id = draw(st.integers(min_value=1, max_value=1 << 40))
    id_steps = draw(st.lists(st.integers(1, 1000), min_size=n - 1, max_size=n - 1))
    offset_steps = draw(st.lists(st.integers(26, 1 << 16), min_size=n - 1, max_size=n - 1))
    times = draw(st.lists(timestamps_ns, min_size=n, max_size=n))
    entries = [IndexEntry(first_id, times[0], 0)]
    for id_step, offset_step, ts in zip(id_steps, offset_steps, times[1:], strict=True):
        prev = entries[-1]
        entries.append(IndexEntry(prev.id + id_step, ts, prev.offset + offset_step))
    return entries


id_batches = st.lists(message_ids, min_size=1, max_size=20)
"""The ids of one LEASE/ACK/NACK record (never empty)."""

_counter_names = st.sampled_from(["acked", "nacked", "expired", "dead_lettered"]) | st.text(
    max_size=12
)


@st.composite
def checkpoints(draw: st.DrawFn) -> Checkpoint:
    """A reader's state as the reader writes it: done ids and deliveries above the head."""
    head = draw(st.integers(min_value=1, max_value=1 << 62))
    above = st.integers(min_value=head, max_value=U64_MAX)
    done = sorted(draw(st.sets(above, max_size=15)))
    delivered = sorted(draw(st.sets(above, max_size=15)))
    deliveries = [(i, draw(st.integers(min_value=1, max_value=1000))) for i in delivered]
    counters = draw(st.dictionaries(_counter_names, st.integers(0, U64_MAX), max_size=6))
    return Checkpoint(head, done, deliveries, counters)
