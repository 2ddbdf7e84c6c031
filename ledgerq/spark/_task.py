"""What a Spark task reads and returns: :class:`SegmentTask` (one input partition: a
segment file and the rows wanted from it), the Arrow schema of its rows, and
:class:`ScanStats`, what its scan met.  No pyspark here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pyarrow as pa

from ledgerq.segment.naming import SEGMENTS_DIR, idx_path, log_path
from ledgerq.spark._layout import ReaderSnapshot

__all__ = [
    "ACKED",
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITH_STATE",
    "COLUMNS",
    "HEADERS_MAP",
    "LEASED",
    "PENDING",
    "TIMESTAMP_US",
    "ScanStats",
    "SegmentTask",
]

TIMESTAMP_US = pa.timestamp("us", tz="UTC")
HEADERS_MAP = pa.map_(pa.string(), pa.string())
# What pyspark's to_arrow_schema(schema, timezone="UTC") gives for the read schema; the
# first batch a task yields is compared with it exactly (a test checks the two agree).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("queue", pa.string()),
        pa.field("id", pa.int64()),
        pa.field("timestamp", TIMESTAMP_US),
        pa.field("expires_at", TIMESTAMP_US),
        pa.field("priority", pa.int32()),
        pa.field("headers", HEADERS_MAP),
        pa.field("payload", pa.binary()),
        pa.field("deliver_at", TIMESTAMP_US),  # enqueue(..., delay=): null when none
    ]
)
ARROW_SCHEMA_WITH_STATE = ARROW_SCHEMA.append(pa.field("state", pa.string()))
# Every column a read can give, in the schema's order (``state`` only with a reader).
COLUMNS = tuple(ARROW_SCHEMA_WITH_STATE.names)

PENDING, LEASED, ACKED = "pending", "leased", "acked"


@dataclass(frozen=True, slots=True)
class SegmentTask:
    """One Spark input partition: a segment file and the rows wanted from it.

    Bounds are inclusive; timestamps are microseconds since the epoch (what Spark
    compares).  ``size_limit`` bounds the bytes read (the newest segment's size when it
    was planned, so all tasks of a query read one snapshot); ``live_tail`` says the
    segment was the newest one then, so an incomplete entry at its end is an append in
    flight rather than damage.
    """

    queue: str
    path: str
    first_id: int
    next_first_id: int | None
    size_limit: int | None = None
    live_tail: bool = False
    id_lo: int = 1
    id_hi: int | None = None
    ids: frozenset[int] | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None
    seek_by_time: bool = False
    state: ReaderSnapshot | None = None
    failfast: bool = False
    name_id: int | None = None  # the id in the file's name, when it is not first_id
    # The columns a row has, in order (option ``columns``); None: the whole schema.
    columns: tuple[str, ...] | None = None
    # An encrypted queue's key (checked against the queue when the task was planned);
    # never in repr().  Its entries leave the vectorised path to be opened one by one.
    encryption_key: bytes | None = field(default=None, repr=False)

    @property
    def log_path(self) -> str:
        """Path of the segment's log file."""
        return log_path(os.path.join(self.path, SEGMENTS_DIR), self.name_id or self.first_id)

    @property
    def index_path(self) -> str:
        """Path of the segment's sparse index file."""
        return idx_path(os.path.join(self.path, SEGMENTS_DIR), self.name_id or self.first_id)


class ScanStats:
    """What one task's scan met, for its summary log line and for tests."""

    __slots__ = ("corrupt_bytes", "corrupt_regions", "decoded_one_by_one", "lost_messages", "rows")

    def __init__(self) -> None:
        self.rows = 0
        self.corrupt_regions = 0
        self.corrupt_bytes = 0
        self.lost_messages = 0
        # Entries that left the vectorised path (tiers 2 and 3): what a test checks to
        # know that a kind of segment is read the fast way.
        self.decoded_one_by_one = 0
