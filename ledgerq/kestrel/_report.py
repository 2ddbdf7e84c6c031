"""What an import found, did and skipped: the running tally and the final report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from ledgerq.kestrel._types import JournalDamage

__all__ = ["ImportReport", "Progress", "ProgressCallback", "Tally"]

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What :func:`import_kestrel` found, imported and skipped, and why.

    ``ok`` is False when a journal was damaged (corrupt, or truncated anywhere but at
    the end of the file Kestrel was writing): everything readable was imported and
    ``damage`` says where the rest is.  A torn record at the end of a queue's newest
    file - what a Kestrel crash leaves, and Kestrel cuts on start - is no damage: it is
    listed in ``cut``.
    """

    source: str
    dest: str
    queue: str
    format: str
    reader: str | None  # the Kestrel reader whose unread items the default reader got
    found: int  # items the journal still held (pending, open transactions included)
    imported: int
    already_imported: int
    expired_dropped: int
    expired_kept: int
    read_by_reader: int  # Kestrel 3: consumed by every reader imported
    open_transactions: int  # old journals: open reads restored as pending items
    files: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...]
    quirks: tuple[str, ...]
    damage: tuple[JournalDamage, ...]
    readers: tuple[tuple[str, str], ...] = ()  # ledgerq reader -> what was done with it
    children: tuple[ImportReport, ...] = ()
    cut: tuple[JournalDamage, ...] = ()  # torn records cut at the end of newest files

    @property
    def ok(self) -> bool:
        """Whether every journal (children included) was read to its end or a torn tail."""
        return not self.damage and all(child.ok for child in self.children)


# The counts of an ImportReport, by field name.
Count = Literal[
    "found",
    "imported",
    "already_imported",
    "expired_dropped",
    "expired_kept",
    "read_by_reader",
    "open_transactions",
]


@dataclass
class Tally:
    """The counts and lists of an import while it runs (what its report will say)."""

    counts: Counter[Count] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    quirks: list[str] = field(default_factory=list)
    damage: list[JournalDamage] = field(default_factory=list)
    cut: list[JournalDamage] = field(default_factory=list)
    readers: list[tuple[str, str]] = field(default_factory=list)

    def count(self, name: Count, n: int = 1) -> None:
        """Add ``n`` to the count ``name``."""
        self.counts[name] += n

    def note_damage(self, damage: Iterable[JournalDamage], newest_file: str | None) -> None:
        """Sort what could not be read: a torn record ending ``newest_file`` was cut;
        anything else is damage."""
        for region in damage:
            (self.cut if region.is_torn and region.file == newest_file else self.damage).append(
                region
            )

    def report(
        self,
        *,
        source: str,
        dest: str,
        queue: str,
        format: str,  # noqa: A002 - the report's field
        reader: str | None,
        children: tuple[ImportReport, ...],
    ) -> ImportReport:
        """The frozen report of this tally."""
        return ImportReport(
            source=source,
            dest=dest,
            queue=queue,
            format=format,
            reader=reader,
            found=self.counts["found"],
            imported=self.counts["imported"],
            already_imported=self.counts["already_imported"],
            expired_dropped=self.counts["expired_dropped"],
            expired_kept=self.counts["expired_kept"],
            read_by_reader=self.counts["read_by_reader"],
            open_transactions=self.counts["open_transactions"],
            files=tuple(self.files),
            ignored=tuple(self.ignored),
            quirks=tuple(self.quirks),
            damage=tuple(self.damage),
            readers=tuple(self.readers),
            children=children,
            cut=tuple(self.cut),
        )


class Progress:
    """Bytes of journal read and imported, reported to an ``on_progress(done, total)``."""

    def __init__(self, callback: ProgressCallback | None) -> None:
        self.callback = callback
        self.done = 0
        self.total = 0

    def plan(self, nbytes: int) -> None:
        """``nbytes`` more to do."""
        self.total += nbytes
        self.report()

    def advance(self, nbytes: int) -> None:
        """``nbytes`` done."""
        self.done += nbytes
        self.report()

    def report(self) -> None:
        """Tell the callback where we are."""
        if self.callback is not None:
            self.callback(self.done, max(self.total, self.done))
