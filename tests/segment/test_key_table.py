"""``segment.key_table``: the mapped table of the unique keys and hand-offs, on real files.

Two real shared-mode handles of one queue are the hosts, each with its own mapping of
one table file: a stateful test against a model (the list of records the file holds)
stores, cuts back, rewrites, grows and reopens through either, and checks that each
sees exactly the file's records when it looks - the others' stores, a rewrite under its
mapping, a growth past its mapping.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

import ledgerq
from ledgerq.segment.key_table import KeyRecord, KeyTable
from tests.features._key_table import key_table_records

MAGIC = b"LQTK"
KEYS = [bytes([n]) * 16 for n in range(8)]


def _last_per_key(records: list[KeyRecord]) -> list[KeyRecord]:
    by_key: dict[bytes, KeyRecord] = {}
    for record in records:
        by_key.pop(record[0], None)
        by_key[record[0]] = record
    return list(by_key.values())


class TwoMappings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ledgerq-key-table-"))
        path = self.dir / "q"
        self.handles = [ledgerq.open(path, shared=True) for _ in range(2)]
        table_path = str(path / "features" / "test.table")
        self.tables = [KeyTable(table_path, MAGIC, "test table", h) for h in self.handles]
        self.file: list[KeyRecord] = []  # the model: the records the file holds
        self.views: list[list[KeyRecord]] = [[], []]  # what each table has taken
        self.next_id = 1
        for n, table in enumerate(self.tables):
            with self.handles[n].appends_locked():
                self.views[n] = list(table.open(create=True) or [])
        self.table_path = Path(table_path)

    def _catch_up(self, n: int) -> None:
        replaced, records = self.tables[n].news()
        self.views[n] = list(records) if replaced else self.views[n] + records

    def _record(self, key: int) -> KeyRecord:
        record = (KEYS[key], self.next_id, self.next_id * 10, -self.next_id)
        self.next_id += 1
        return record

    @rule(n=st.integers(0, 1), key=st.integers(0, 7), count=st.sampled_from([1, 2, 900]))
    def store(self, n: int, key: int, count: int) -> None:
        table = self.tables[n]
        with self.handles[n].appends_locked():
            self._catch_up(n)
            for _ in range(count):
                record = self._record(key)
                table.append(*record)
                self.file.append(record)
                self.views[n].append(record)

    @rule(n=st.integers(0, 1), key=st.integers(0, 7), count=st.integers(1, 3))
    def store_then_cut_back(self, n: int, key: int, count: int) -> None:
        """Records stored ahead of a write that then failed."""
        table = self.tables[n]
        with self.handles[n].appends_locked():
            self._catch_up(n)
            end = table.end
            for _ in range(count):
                table.append(*self._record(key))
            table.undo(end)

    @rule(n=st.integers(0, 1))
    def rewrite(self, n: int) -> None:
        table = self.tables[n]
        with self.handles[n].appends_locked():
            self._catch_up(n)
            kept = _last_per_key(self.views[n])
            table.rewrite(kept)
            self.file = kept
            self.views[n] = list(kept)

    @rule(n=st.integers(0, 1))
    def look(self, n: int) -> None:
        with self.handles[n].appends_locked():
            self._catch_up(n)
        assert self.views[n] == self.file

    @rule(n=st.integers(0, 1))
    def unchanged_means_nothing_new(self, n: int) -> None:
        """The hot path's two reads of memory say "nothing new" only when so."""
        with self.handles[n].appends_locked():
            if self.tables[n].unchanged():
                assert self.views[n] == self.file
            else:
                self._catch_up(n)
                table = self.tables[n]
                assert table.unchanged() or table.end + 40 > table.size  # (a full mapping)
        assert self.views[n] == self.file

    @rule(n=st.integers(0, 1))
    def reopen(self, n: int) -> None:
        table = self.tables[n]
        table.close()
        with self.handles[n].appends_locked():
            self.views[n] = list(table.open(create=True) or [])
        assert self.views[n] == self.file

    @precondition(lambda self: self.file)
    @rule()
    def the_file_reads_as_the_spec_says(self) -> None:
        assert key_table_records(self.table_path, MAGIC) == self.file

    def teardown(self) -> None:
        for table in self.tables:
            table.close()
        for handle in self.handles:
            handle.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestTwoMappings = TwoMappings.TestCase
TestTwoMappings.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)


def test_a_table_with_a_damaged_header_is_replaced_and_counted(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        path = tmp_path / "q" / "features" / "t.table"
        table = KeyTable(str(path), MAGIC, "test table", q)
        assert table.open(create=True) == []
        table.append(KEYS[0], 1, 2, 3)
        table.close()
        assert KeyTable(str(path), MAGIC, "test table", q).open(create=False) == [
            (KEYS[0], 1, 2, 3)
        ]
        for damage in (b"XXXX", b"LQTK\x02\x00\x00\x00"):  # another magic, a newer version
            with open(path, "r+b") as f:
                f.write(damage)
            before = q.stats().corrupt_skipped
            again = KeyTable(str(path), MAGIC, "test table", q)
            assert again.open(create=True) == []
            assert q.stats().corrupt_skipped == before + 1
            again.close()
        assert key_table_records(path, MAGIC) == []
        assert KeyTable(str(path), MAGIC, "test table", q).open(create=False) == []
        assert (
            KeyTable(str(tmp_path / "q" / "features" / "none"), MAGIC, "t", q).open(create=False)
            is None
        )
