"""A damaged queue directory: segment files deleted, swapped, copied or renamed by hand.

Each case builds a closed queue of 170 messages in 15 segments, damages its
``segments/`` directory as a person (or a careless script, or a restore from backup)
would, and then checks what a user relies on, on real files:

* ``open`` says what it found (a log line naming the files and the ids) and its
  figures are right (``stats().pending``, ``stats().lost``);
* what comes out is exactly what is on disk (a misnamed file is read by its content,
  a copy is not read twice, nothing is lost that a file still holds);
* nothing on disk is cut or deleted: every valid entry stays in some file;
* ``ledgerq verify`` reports it (exit 1), ``ledgerq verify --repair`` fixes it without
  losing a message, and after that ``verify`` is happy and a reopen is quiet and
  delivers everything that was on disk.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledgerq
from ledgerq.format.entry import decode_entry
from ledgerq.format.errors import DecodeError
from tests.cli._run import ok, run

from ._harness import entry_spans, first_id_of, segment_logs

SEGMENT_SIZE = 1024
MESSAGES = 170  # 14 full segments of 12 (1,080 bytes: 90-byte entries), 2 in the newest


def payload(i: int) -> bytes:
    return b"m%03d" % i + b"." * 60


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    """A closed queue of 170 messages (ids 1-170), 12 per segment."""
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=SEGMENT_SIZE) as q:
        ids = [q.enqueue(payload(i)) for i in range(MESSAGES)]
    assert ids == list(range(1, MESSAGES + 1))
    logs = segment_logs(path)
    assert [first_id_of(log) for log in logs[:3]] == [1, 13, 25]
    return path


def seg(path: Path, first_id: int, suffix: str = ".log") -> Path:
    return path / "segments" / f"{first_id:020d}{suffix}"


def valid_entries(path: Path) -> set[tuple[int, bytes]]:
    """Every valid entry (id, bytes) in any segment file, the set-aside ones included."""
    found = set()
    for log in sorted((path / "segments").rglob("*.log*")):
        if log.name.endswith(".idx"):
            continue
        data = log.read_bytes()
        pos = 0
        while pos < len(data):  # every offset: a stale entry may follow garbage
            try:
                entry, stop = decode_entry(data, pos)
            except DecodeError:
                pos += 1
                continue
            found.add((entry.id, data[pos:stop]))
            pos = stop
    return found


def content_names_match(path: Path) -> bool:
    """Whether every segment log is named after its first entry's id."""
    for log in segment_logs(path):
        spans = entry_spans(log.read_bytes())
        if spans and spans[0][2] != first_id_of(log):
            return False
    return True


def drain(path: Path, *, ack: bool) -> list[tuple[int, bytes]]:
    """Open the queue and dequeue everything (acking it or not): (id, payload) in order."""
    out = []
    with ledgerq.open(path) as q:
        while batch := q.dequeue_batch(50):
            for m in batch:
                out.append((m.id, m.payload))
                if ack:
                    q.ack(m.id)
    return out


def expected(ids: list[int]) -> list[tuple[int, bytes]]:
    return [(i, payload(i - 1)) for i in ids]


def follow_ids(path: Path, caplog: pytest.LogCaptureFixture) -> list[int]:
    with (
        caplog.at_level(logging.WARNING, logger="ledgerq"),
        ledgerq.follow(path, timeout=0) as messages,
    ):
        return [m.id for m in messages]


def warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def verify_problems(path: Path) -> list[dict[str, object]]:
    result = run("verify", path, "--json")
    assert result.code == 1, result
    problems: list[dict[str, object]] = result.json()["problems"]
    return problems


def repair_and_check(path: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    """``verify --repair`` (exit 0), then ``verify`` ok and a quiet reopen; the repairs."""
    result = ok("verify", path, "--repair", "--json")
    report = result.json()
    assert report["ok"] is True, report
    assert ok("verify", path).out.startswith("ok: ")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(path):
        pass
    assert warnings(caplog) == ""
    repairs: list[str] = report["repairs"]
    return repairs


def test_a_deleted_middle_segment_is_reported_counted_and_accepted_by_repair(
    queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seg(queue, 37).unlink()
    seg(queue, 37, ".idx").unlink()
    survivors = [i for i in range(1, MESSAGES + 1) if not 37 <= i <= 48]
    assert follow_ids(queue, caplog) == survivors  # a follower says so too
    assert "ids 37-48 are missing" in warnings(caplog)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        stats = q.stats()
    said = warnings(caplog)
    assert "ids 37-48 are missing" in said
    assert f"{25:020d}.log" in said and f"{49:020d}.log" in said
    assert "12 not consumed by the default reader are lost" in said
    assert (stats.pending, stats.lost) == (MESSAGES - 12, 12)
    assert drain(queue, ack=False) == expected(survivors)
    # Every open says it again until a repair; the count does not grow.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        assert q.stats().lost == 12
    assert "ids 37-48 are missing" in warnings(caplog)

    problems = verify_problems(queue)
    assert [(p["kind"], "ids 37-48" in str(p["message"])) for p in problems] == [("gap", True)]
    repairs = repair_and_check(queue, caplog)
    assert any(r.startswith("recorded ids 37-48") and "known lost" in r for r in repairs)
    with ledgerq.open(queue) as q:
        assert q.stats().lost == 12  # still counted, once
    caplog.clear()
    assert follow_ids(queue, caplog) == survivors
    assert warnings(caplog) == ""  # accepted as lost: no more alarms
    assert drain(queue, ack=True) == expected(survivors)


def test_two_swapped_segments_are_read_by_their_content_and_renamed_by_repair(
    queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    on_disk = valid_entries(queue)
    for suffix in (".log", ".idx"):
        a, b, tmp = seg(queue, 25, suffix), seg(queue, 37, suffix), queue / "swap"
        a.rename(tmp)
        b.rename(a)
        tmp.rename(b)
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        stats = q.stats()
    said = warnings(caplog)
    assert f"{25:020d}.log holds ids 37-48" in said and f"{37:020d}.log holds ids 25-36" in said
    assert (stats.pending, stats.lost) == (MESSAGES, 0)
    assert drain(queue, ack=False) == expected(list(range(1, MESSAGES + 1)))
    assert valid_entries(queue) == on_disk

    problems = verify_problems(queue)
    assert sorted(str(p["kind"]) for p in problems) == ["misnamed", "misnamed"]
    repairs = repair_and_check(queue, caplog)
    assert sum(r.startswith("renamed ") for r in repairs) == 2, repairs
    assert content_names_match(queue)
    assert valid_entries(queue) == on_disk
    assert drain(queue, ack=True) == expected(list(range(1, MESSAGES + 1)))


def test_a_segment_copied_under_a_later_id_is_set_aside_not_cut(
    queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = seg(queue, 1169)
    shutil.copy(seg(queue, 1), copy)
    size = copy.stat().st_size
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        assert len(q) == MESSAGES
        new_id = q.enqueue(b"new")
        assert new_id == MESSAGES + 1  # the copy's name is no id handed out
        assert len(q) == MESSAGES + 1  # visible at once
        assert q.stats().lost == 0
    assert copy.stat().st_size == size  # not truncated as "incomplete data"
    said = warnings(caplog)
    assert f"{1169:020d}.log holds ids 1-12" in said and "set aside" in said
    got = drain(queue, ack=False)
    assert got == [*expected(list(range(1, MESSAGES + 1))), (new_id, b"new")]

    problems = verify_problems(queue)
    assert [p["kind"] for p in problems] == ["overlap"]
    repairs = repair_and_check(queue, caplog)
    assert any(r.startswith("moved ") and "damaged" in r for r in repairs), repairs
    moved = queue / "segments" / "damaged" / copy.name
    assert moved.read_bytes() == seg(queue, 1).read_bytes()  # kept, never deleted
    assert not copy.exists()
    assert len(drain(queue, ack=True)) == MESSAGES + 1


def test_a_segment_copied_under_an_earlier_id_overlaps_and_is_set_aside(
    queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for suffix in (".log", ".idx"):  # ids 25-36, named as if it started at 20
        shutil.copy(seg(queue, 25, suffix), seg(queue, 20, suffix))
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        stats = q.stats()
    assert f"{20:020d}.log holds ids 25-36" in warnings(caplog)
    assert (stats.pending, stats.lost) == (MESSAGES, 0)
    assert drain(queue, ack=False) == expected(list(range(1, MESSAGES + 1)))

    problems = verify_problems(queue)
    assert [p["kind"] for p in problems] == ["overlap"]
    repair_and_check(queue, caplog)
    assert (queue / "segments" / "damaged" / seg(queue, 20).name).exists()
    assert drain(queue, ack=True) == expected(list(range(1, MESSAGES + 1)))


@pytest.mark.parametrize("which", ["middle", "newest"])
def test_a_log_renamed_without_its_index_is_read_by_its_content(
    queue: Path, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    first = 61 if which == "middle" else 169
    last = min(first + 11, MESSAGES)
    log = seg(queue, first)
    renamed = seg(queue, first + 4)
    log.rename(renamed)  # its .idx stays behind under the old name
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        stats = q.stats()
        new_id = q.enqueue(b"after")
    assert f"{renamed.name} holds ids {first}-{last}" in warnings(caplog)
    assert (stats.pending, stats.lost) == (MESSAGES, 0)
    assert new_id == MESSAGES + 1
    got = drain(queue, ack=False)
    assert got == [*expected(list(range(1, MESSAGES + 1))), (new_id, b"after")]

    problems = verify_problems(queue)
    assert [p["kind"] for p in problems] == ["misnamed"]
    repair_and_check(queue, caplog)
    assert content_names_match(queue) and log.exists()
    assert len(drain(queue, ack=True)) == MESSAGES + 1


def test_a_tail_holding_an_entry_of_another_segment_is_kept_not_cut(
    queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes after the newest segment's last entry that hold a valid entry of an earlier
    segment (perhaps its only copy) are reported as damage and kept, never cut as a
    torn tail because of their id."""
    newest = seg(queue, 169)
    stale = entry_spans(seg(queue, 1).read_bytes())[0]
    with open(newest, "ab") as f:
        f.write(b"\0" * 7 + seg(queue, 1).read_bytes()[stale[0] : stale[1]])
    size = newest.stat().st_size
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        assert newest.stat().st_size == size
        assert q.stats().corrupt_skipped == 1
        new_id = q.enqueue(b"after")
    assert "corrupt bytes" in warnings(caplog) and "truncating" not in warnings(caplog)
    assert (1, seg(queue, 1).read_bytes()[stale[0] : stale[1]]) in valid_entries(queue)
    got = drain(queue, ack=False)
    assert got == [*expected(list(range(1, MESSAGES + 1))), (new_id, b"after")]
    with ledgerq.open(queue) as q:
        assert q.stats().corrupt_skipped == 1  # counted once


def crash_copy(path: Path, to: Path, more: int) -> list[int]:
    """Enqueue ``more`` messages and copy the directory while the queue is open (what a
    kill -9 leaves: every write in the OS, no close); return the ids enqueued."""
    with ledgerq.open(path) as q:
        ids = [q.enqueue(payload(i % 1000)) for i in range(more)]
        shutil.copytree(path, to)
    return ids


def test_gaps_the_queue_made_raise_no_alarm(
    tmp_path: Path, queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a crash the next segment starts past the reserved ids: a gap the queue
    records before it makes it, so no open and no verify takes it for a lost segment."""
    crashed = tmp_path / "crashed"
    crash_copy(queue, crashed, 30)
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(crashed) as q:
        after_crash = q.enqueue(b"after the crash")
        for i in range(40):  # fill past a rotation or two
            q.enqueue(payload(i))
        assert q.stats().lost == 0
    assert after_crash > MESSAGES + 30 + 1000  # past the reservation: a gap
    assert "missing" not in warnings(caplog)
    assert ok("verify", crashed).out.startswith("ok: ")
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(crashed) as q:
        assert len(q) == MESSAGES + 30 + 41
    assert warnings(caplog) == ""


def test_an_older_queues_unrecorded_gaps_raise_no_alarm(
    tmp_path: Path, queue: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed = tmp_path / "crashed"
    crash_copy(queue, crashed, 30)
    with ledgerq.open(crashed) as q:
        q.enqueue(b"after the crash")
    meta_path = crashed / "meta.json"
    meta = json.loads(meta_path.read_text())
    for key in ("gaps", "gaps_from", "lost", "known_lost"):  # as an older ledgerq wrote it
        del meta[key]
    meta_path.write_text(json.dumps(meta))
    assert ok("verify", crashed).out.startswith("ok: ")
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(crashed) as q:
        q.enqueue(b"later")
        assert q.stats().lost == 0
    assert warnings(caplog) == ""
    assert json.loads(meta_path.read_text())["gaps_from"] > MESSAGES + 30
    assert ok("verify", crashed).out.startswith("ok: ")


@pytest.mark.parametrize("what", ["copy", "misnamed", "misnamed-consumed"])
def test_a_misplaced_file_under_a_name_the_queue_needs_is_moved_out_of_the_way(
    queue: Path, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    """The newest segment (169-170) fills up at 180 and the next one is named 181: a
    misplaced file there is moved (a copy into damaged/, a misnamed file to its
    content's name) instead of failing the rotation - or is gone already, consumed."""
    taken = seg(queue, 181)
    moved_from = 1 if what == "misnamed-consumed" else 61
    if what == "copy":
        shutil.copy(seg(queue, 1), taken)
    else:
        seg(queue, moved_from).rename(taken)
        seg(queue, moved_from, ".idx").rename(taken.with_suffix(".idx"))
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(queue) as q:
        if what == "misnamed-consumed":
            for _ in range(12):  # ids 1-12: retention deletes the misnamed file
                m = q.dequeue()
                assert m is not None
                q.ack(m.id)
            assert not taken.exists()
        ids = [q.enqueue(payload(i)) for i in range(20)]
        assert ids == list(range(MESSAGES + 1, MESSAGES + 21))
        assert len(q) == MESSAGES + 20 - (12 if what == "misnamed-consumed" else 0)
    if what == "copy":
        assert "(its name is needed)" in warnings(caplog)
        assert (queue / "segments" / "damaged" / taken.name).exists()
    elif what == "misnamed":
        assert "(its name is needed)" in warnings(caplog)
        assert seg(queue, 61).exists()
    assert entry_spans(taken.read_bytes())[0][2] == 181  # the queue's own segment now
    assert ok("verify", queue).out.startswith("ok: ")
    first = 13 if what == "misnamed-consumed" else 1
    assert [i for i, _ in drain(queue, ack=True)] == list(range(first, MESSAGES + 21))


# ---------------------------------------------------------------------- any damage


DAMAGES = ["delete", "swap", "copy-later", "copy-earlier", "rename", "rename-log-only"]
META_DAMAGES = ["meta-empty", "meta-deleted", "options-deleted", "reader-empty"]


def damage(path: Path, kind: str, a: int, b: int) -> None:
    """Apply one kind of damage to the segments ``a`` < ``b`` (by position)."""
    logs = segment_logs(path)
    x, y = logs[a], logs[b]
    fx, fy = first_id_of(x), first_id_of(y)
    if kind == "delete":
        x.unlink()
        x.with_suffix(".idx").unlink(missing_ok=True)
    elif kind == "swap":
        for suffix in (".log", ".idx"):
            p, q, tmp = x.with_suffix(suffix), y.with_suffix(suffix), path / "tmp"
            if p.exists() and q.exists():
                p.rename(tmp)
                q.rename(p)
                tmp.rename(q)
    elif kind == "copy-later":
        shutil.copy(x, seg(path, first_id_of(logs[-1]) + 500 + a))
    elif kind == "copy-earlier":
        if fx > 2 and not seg(path, fx - 2).exists():
            shutil.copy(x, seg(path, fx - 2))
    elif kind == "rename":
        target = seg(path, fx + 3)
        if not target.exists() and fx + 3 < fy:
            x.rename(target)
            if x.with_suffix(".idx").exists():  # an earlier damage may have parted them
                x.with_suffix(".idx").rename(target.with_suffix(".idx"))
    elif kind == "rename-log-only":
        target = seg(path, fy + 2)
        if not target.exists():
            y.rename(target)
    elif kind == "meta-empty":
        (path / "meta.json").write_bytes(b"")
    elif kind == "meta-deleted":
        (path / "meta.json").unlink(missing_ok=True)
    elif kind == "options-deleted":
        (path / "options.json").unlink(missing_ok=True)
    elif kind == "reader-empty":
        (path / "readers" / "default.state").write_bytes(b"")


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    damages=st.lists(
        st.tuples(st.sampled_from(DAMAGES + META_DAMAGES), st.integers(0, 12), st.integers(1, 13)),
        min_size=1,
        max_size=4,
    ),
    consume=st.integers(0, 60),
)
def test_no_valid_entry_is_ever_cut_or_deleted_by_open_or_repair(
    tmp_path_factory: pytest.TempPathFactory,
    damages: list[tuple[str, int, int]],
    consume: int,
) -> None:
    """Random damage of the kinds above, after some consumption: open and repair keep
    every valid entry on disk (in ``segments/`` or ``segments/damaged/``), and after the
    repair every message still on disk and not consumed is delivered, once."""
    path = tmp_path_factory.mktemp("q") / "q"
    with ledgerq.open(path, segment_size=SEGMENT_SIZE, retention_max_age=3600) as q:
        for i in range(MESSAGES):
            q.enqueue(payload(i))
        for _ in range(consume):
            m = q.dequeue()
            assert m is not None
            q.ack(m.id)
    for kind, a, b in damages:
        logs = segment_logs(path)
        a, b = min(a, len(logs) - 2), min(max(b, a + 1), len(logs) - 1)
        if a < b:
            damage(path, kind, a, b)
    kinds = {kind for kind, _, _ in damages}
    on_disk = valid_entries(path)
    refusable = "reader-empty" in kinds or (
        "options-deleted" in kinds and bool(kinds & {"meta-empty", "meta-deleted"})
    )
    if refusable:
        # Refused, never started over: the reader state, or meta.json and its copy, lost.
        with pytest.raises(ledgerq.CorruptionError, match="verify --repair"):
            ledgerq.open(path).close()
    else:
        with ledgerq.open(path) as q:
            q._check()
    assert valid_entries(path) >= on_disk
    result = run("verify", path, "--repair")
    assert result.code in (0, 1), result
    assert "Traceback" not in result.err, result
    assert valid_entries(path) >= on_disk
    delivered = drain(path, ack=True)
    ids = [i for i, _ in delivered]
    assert ids == sorted(set(ids))  # in order, each once
    restarted = "reader-empty" in kinds  # at-least-once: the consumed ones come again
    wanted = {i for i, _ in on_disk if restarted or i > consume}
    assert set(ids) == wanted
    for i, data in delivered:
        assert data == payload(i - 1)


# ---------------------------------------------------------------------- metadata


OPTIONS = {"max_retries": 7, "dedup_window": 600.0, "priorities": True}


@pytest.fixture
def configured(tmp_path: Path) -> Path:
    """A closed queue with stored options: 40 messages, the first two acked (but kept:
    retention_max_age), a dedup id recorded."""
    path = tmp_path / "c"
    with ledgerq.open(path, segment_size=SEGMENT_SIZE, retention_max_age=3600, **OPTIONS) as q:
        q.enqueue(payload(0), dedup_id="once")
        for i in range(1, 40):
            q.enqueue(payload(i))
        for _ in range(2):
            m = q.dequeue()
            assert m is not None
            q.ack(m.id)
    return path


def check_options(q: ledgerq.Queue, *, kept: bool) -> None:
    got = {name: getattr(q.options, name) for name in OPTIONS}
    assert got == (
        OPTIONS if kept else {"max_retries": 3, "dedup_window": None, "priorities": False}
    )


@pytest.mark.parametrize("how", ["truncated", "deleted", "garbage"])
def test_a_lost_meta_json_is_rebuilt_at_open_with_the_stored_options(
    configured: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    meta = configured / "meta.json"
    if how == "truncated":
        meta.write_bytes(b"")
    elif how == "deleted":
        meta.unlink()
    else:
        meta.write_bytes(b'{"format": "ledgerq", "ver\x00\xff')
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(configured) as q:
        check_options(q, kept=True)
        stats = q.stats()
        assert (stats.pending, stats.acked, stats.enqueued) == (38, 2, 40)
        assert q.enqueue(b"again", dedup_id="once") == 1  # the dedup table is still honoured
        new_id = q.enqueue(b"new")
    said = warnings(caplog)
    assert "meta.json" in said and "rebuilt it" in said and "options.json" in said
    assert "restart at 0" in said  # says what it could not know
    assert new_id > 40 + 2**20 - 1  # never an id that may have been handed out
    assert ok("verify", configured).out.startswith("ok: ")
    got = drain(configured, ack=True)
    assert got == [*expected(list(range(3, 41))), (new_id, b"new")]


def test_meta_json_and_its_options_copy_both_lost_refuse_to_open_until_repaired(
    configured: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (configured / "meta.json").write_bytes(b"")
    (configured / "options.json").unlink()
    with pytest.raises(ledgerq.CorruptionError, match="ledgerq verify --repair"):
        ledgerq.open(configured)
    assert (configured / "meta.json").read_bytes() == b""  # refused: nothing started over
    problems = verify_problems(configured)
    assert [p["kind"] for p in problems] == ["meta"]
    result = ok("verify", configured, "--repair")
    assert "the stored options were lost" in result.out  # said, not guessed
    assert result.out.rstrip().endswith("after repair")
    with ledgerq.open(configured) as q:
        check_options(q, kept=False)
        assert q.stats().pending == 38
        assert q.enqueue(b"new") > 40 + 2**20 - 1
    assert len(drain(configured, ack=True)) == 39


def test_a_lost_options_copy_is_written_again(configured: Path) -> None:
    copy = configured / "options.json"
    copy.unlink()
    with ledgerq.open(configured) as q:
        check_options(q, kept=True)
    assert json.loads(copy.read_text())["options"]["max_retries"] == 7
    (configured / "meta.json").unlink()
    with ledgerq.open(configured) as q:  # and it serves when meta.json goes
        check_options(q, kept=True)


@pytest.mark.parametrize("reader", ["default", "other"])
@pytest.mark.parametrize("content", [b"", b"garbage!", b"\x00" * 300])
def test_an_empty_or_headerless_reader_state_is_restarted_by_repair(
    configured: Path, reader: str, content: bytes
) -> None:
    with ledgerq.open(configured) as q:
        other = q.reader("other")
        for m in other.dequeue_batch(5):
            other.ack(m.id)
        assert (len(q), len(other)) == (38, 35)
    state = configured / "readers" / f"{reader}.state"
    state.write_bytes(content)
    with pytest.raises(ledgerq.CorruptionError, match="ledgerq verify --repair") as raised:
        ledgerq.open(configured)
    assert "delete" not in str(raised.value)
    problems = verify_problems(configured)
    assert [p["kind"] for p in problems] == ["reader-state"]
    assert "restarts this reader" in str(problems[0]["message"])
    result = ok("verify", configured, "--repair")
    assert f"restarted reader '{reader}' at the oldest retained message" in result.out
    with ledgerq.open(configured) as q:
        # At-least-once: the restarted reader gets every retained message again; the
        # other reader is untouched.
        assert len(q.reader(reader)) == 40
        assert len(q.reader("default" if reader == "other" else "other")) == (
            38 if reader == "other" else 35
        )
