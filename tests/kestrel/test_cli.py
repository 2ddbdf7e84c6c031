"""``ledgerq import-kestrel`` run as a user would (a subprocess)."""

from __future__ import annotations

from pathlib import Path

import ledgerq
from tests.cli._run import fails, ok
from tests.kestrel._writer import OldJournal, bookmark_file, put_record, writer_file


def test_import_prints_what_it_did_and_is_idempotent(tmp_path: Path) -> None:
    src = tmp_path / "kestrel"
    src.mkdir()
    OldJournal().addx(b"a", 1).addx(b"b", 2).remove_tentative_xid(1).write(src / "jobs")
    OldJournal().raw(b"\xff\xff").write(src / "jobs~~1700000000000")
    dest = tmp_path / "dest"
    first = ok("import-kestrel", src, dest)
    assert "imported 2 of 2 items of kestrel-1/2 queue 'jobs'" in first.out
    assert "restored 1 open transactions" in first.out
    assert "ignored jobs~~1700000000000" in first.out
    report = ok("import-kestrel", src, dest, "--json").json()
    assert (report["imported"], report["already_imported"], report["ok"]) == (0, 2, True)
    with ledgerq.follow(dest, timeout=0) as found:
        assert [m.payload for m in found] == [b"a", b"b"]


def test_a_damaged_journal_imports_what_came_before_and_exits_1(tmp_path: Path) -> None:
    src = tmp_path / "kestrel"
    src.mkdir()
    journal = OldJournal().addx(b"kept", 1).addx(b"torn", 2)
    (src / "q").write_bytes(journal.bytes()[:-2])
    result = fails("import-kestrel", src, tmp_path / "dest", code=1)
    assert "damaged" in result.err and "q:" in result.err
    assert "imported 1 of 1 items" in result.out
    assert "damaged: q:" in result.out


def test_kestrel_3_reader_choice_and_errors(tmp_path: Path) -> None:
    src = tmp_path / "kestrel"
    src.mkdir()
    (src / "q.1").write_bytes(writer_file([put_record(i, b"%d" % i, i) for i in range(1, 6)]))
    (src / "q.read.fast").write_bytes(bookmark_file(4))
    (src / "q.read.slow").write_bytes(bookmark_file(1))
    result = fails("import-kestrel", src, tmp_path / "dest", code=1)
    assert "--reader" in result.err
    report = ok("import-kestrel", src, tmp_path / "dest", "--reader", "slow", "--json").json()
    assert (report["format"], report["reader"], report["imported"]) == ("kestrel-3", "slow", 4)
    assert report["read_by_reader"] == 1
    fails("import-kestrel", tmp_path / "missing", tmp_path / "dest2", code=1)
