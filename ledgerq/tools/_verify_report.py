"""The problems :func:`ledgerq.tools.verify` finds and the reports of ``verify`` and
``repair``: the problem kinds (stable strings: they appear in ``ledgerq verify --json``),
:class:`Problem`, :class:`VerifyReport`, :class:`RepairReport`, and the tally a
verification keeps as it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ledgerq.segment.layout import Layout

# Problem kinds: stable strings (they appear in ``ledgerq verify --json``).
META = "meta"  # meta.json missing, unreadable, invalid or inconsistent with the log
CORRUPT_ENTRY = "corrupt-entry"  # bytes in a log that are not a valid entry, valid ones after
TORN_TAIL = "torn-tail"  # incomplete bytes at the end of the newest segment
CORRUPT_TAIL = "corrupt-tail"  # invalid bytes at the end of a sealed segment
ID_ORDER = "id-order"  # ids not consecutive inside a segment
MISNAMED = "misnamed"  # a segment file whose name is not its first entry's id
OVERLAP = "overlap"  # a segment file holding ids another one holds (a copy), set aside
GAP = "gap"  # ids missing between segments that the queue did not leave out on purpose
INDEX = "index"  # a sparse index missing, unreadable or not matching its log
READER_STATE = "reader-state"  # a reader journal the queue refuses to open
READER_STATE_TAIL = "reader-state-tail"  # a torn last record, cut when the queue opens
UNSEALED = "unsealed"  # an entry of an encrypted queue that is not sealed (forged, stripped)

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found in a queue's files: where (file, byte offset) and what."""

    file: str
    offset: int | None
    kind: str
    message: str

    def __str__(self) -> str:
        where = self.file if self.offset is None else f"{self.file}:{self.offset}"
        return f"{where}: {self.kind}: {self.message}"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify` checked and found.  ``ok`` when no problem was found."""

    path: str
    problems: tuple[Problem, ...]
    segments: int
    entries: int
    bytes_checked: int
    index_files: int
    reader_files: int
    queues: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Whether every file checked out."""
        return not self.problems


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What :func:`repair` found before, did, could not do, and found after.

    ``not_done`` says what the repair could not do and why (a read-only file system, a
    full disk...): then ``after`` is a report of the files as they are, not of a
    repaired queue, and :attr:`complete` is False.
    """

    before: VerifyReport
    after: VerifyReport
    actions: tuple[str, ...]
    not_done: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Whether every step of the repair ran."""
        return not self.not_done

    @property
    def fixed(self) -> tuple[Problem, ...]:
        """Problems found before the repair and not after it."""
        remaining = set(self.after.problems)
        return tuple(p for p in self.before.problems if p not in remaining)


@dataclass
class IndexRebuild:
    """An index that a repair should rebuild from its log (named ``name_id``, its first
    entry ``first_id``)."""

    queue_dir: str
    name_id: int
    first_id: int
    sealed: bool


@dataclass
class MetaFacts:
    """What verify needs of a usable meta.json."""

    clean: bool
    next_id: int
    reserved_until: int
    gaps: list[list[int]]
    gaps_from: int | None
    known_lost: list[list[int]]
    version: int = 1


@dataclass
class Tally:
    problems: list[Problem] = field(default_factory=list)
    rebuilds: list[IndexRebuild] = field(default_factory=list)
    layouts: dict[str, tuple[Layout, list[tuple[int, int]]]] = field(default_factory=dict)
    segments: int = 0
    entries: int = 0
    bytes_checked: int = 0
    index_files: int = 0
    reader_files: int = 0
    queues: list[str] = field(default_factory=list)
    done: int = 0
    total: int = 0
    on_progress: ProgressCallback | None = None

    def add(self, file: str, offset: int | None, kind: str, message: str) -> None:
        self.problems.append(Problem(file, offset, kind, message))

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.on_progress is not None:
            self.on_progress(min(self.done, self.total), self.total)
