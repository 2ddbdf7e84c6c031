"""``ledgerq import-kestrel`` run as a user would (a subprocess)."""

from __future__ import annotations

from pathlib import Path

import ledgerq
from tests.cli._run import fails, ok, run
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


def test_a_torn_newest_file_is_cut_reported_and_exits_0(tmp_path: Path) -> None:
    """What a Kestrel crash leaves: the last record of the current journal cut short."""
    src = tmp_path / "kestrel"
    src.mkdir()
    OldJournal().addx(b"rotated", 1).write(src / "q.5")
    journal = OldJournal().addx(b"kept", 1).addx(b"torn", 2)
    (src / "q").write_bytes(journal.bytes()[:-2])
    result = run("import-kestrel", src, tmp_path / "dest")
    assert result.code == 0, result
    where = f"q:{journal.offsets[1]}"
    assert "imported 2 of 2 items" in result.out
    assert f"cut: {where}: truncated record" in result.out
    assert "damaged" not in result.out
    (warning,) = result.err.splitlines()
    assert warning.startswith("ledgerq: warning: cut a torn record") and where in warning
    again = run("import-kestrel", src, tmp_path / "dest", "--json")
    assert again.code == 0, again
    report = again.json()
    assert (report["ok"], report["damage"], report["already_imported"]) == (True, [], 2)
    assert report["cut"] == [
        {
            "file": "q",
            "offset": journal.offsets[1],
            "message": "truncated record (opcode 2): the file ends inside it; "
            f"{len(journal.bytes()) - 2 - journal.offsets[1]} bytes not replayed",
        }
    ]
    with ledgerq.follow(tmp_path / "dest", timeout=0) as found:
        assert [m.payload for m in found] == [b"rotated", b"kept"]


def test_damage_elsewhere_imports_what_it_can_and_exits_1(tmp_path: Path) -> None:
    src = tmp_path / "kestrel"
    src.mkdir()
    rotated = OldJournal().addx(b"a", 1).addx(b"cut in an older file", 2)
    (src / "q.5").write_bytes(rotated.bytes()[:-3])  # torn, but not the newest file
    OldJournal().addx(b"b", 3).raw(b"\x0b").write(src / "q")  # not a record at all
    result = fails("import-kestrel", src, tmp_path / "dest", code=1)
    assert "damaged" in result.err and "q.5:" in result.err and "q:" in result.err
    assert "imported 2 of 2 items" in result.out
    assert f"damaged: q.5:{rotated.offsets[1]}: truncated record" in result.out
    assert "damaged: q:" in result.out and "cut:" not in result.out


def test_kestrel_3_readers_and_reader_choice(tmp_path: Path) -> None:
    src = tmp_path / "kestrel"
    src.mkdir()
    (src / "q.1").write_bytes(writer_file([put_record(i, b"%d" % i, i) for i in range(1, 6)]))
    (src / "q.read.fast").write_bytes(bookmark_file(4))
    (src / "q.read.slow").write_bytes(bookmark_file(1))
    result = ok("import-kestrel", src, tmp_path / "all")
    assert "imported 4 of 5 items of kestrel-3 queue 'q'" in result.out
    assert "reader 'fast': reader created with 1 pending messages" in result.out
    assert "reader 'slow': reader created with 4 pending messages" in result.out
    assert "skipped: 1 already read by every reader" in result.out
    with ledgerq.open(tmp_path / "all") as q:
        assert q.peek(10) == []
        assert [m.payload for m in q.reader("slow").peek(10)] == [b"2", b"3", b"4", b"5"]
        assert [m.payload for m in q.reader("fast").peek(10)] == [b"5"]
    report = ok("import-kestrel", src, tmp_path / "dest", "--reader", "slow", "--json").json()
    assert (report["format"], report["reader"], report["imported"]) == ("kestrel-3", "slow", 4)
    assert (report["read_by_reader"], report["readers"]) == (1, [])
    fails("import-kestrel", src, tmp_path / "dest", "--reader", "none", code=1)
    fails("import-kestrel", tmp_path / "missing", tmp_path / "dest2", code=1)
