"""Misuse that must fail loudly, before anything changes (issue 15 items 9, 14, 17).

Each test is one thing a user did - requeue DLQ ids given as a string, pickle a queue to
send it to a worker, put 100 MB in a header, open ``""`` - on real queue directories.
"""

from __future__ import annotations

import asyncio
import copy
import multiprocessing
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerq
import ledgerq.aio
from tests.forked import in_a_forked_child


@pytest.fixture
def dead(tmp_path: Path) -> Iterator[ledgerq.Queue]:
    """A queue with messages 1..12 in its DLQ (DLQ ids 1..12) and 3 pending."""
    with ledgerq.open(tmp_path / "q", sync="never", max_retries=1) as q:
        q.enqueue_batch([b"dead-%d" % n for n in range(1, 13)])
        for message in q.dequeue_batch(12):
            q.nack(message.id, "boom")
        q.enqueue_batch([b"live-1", b"live-2", b"live-3"])
        assert len(q.dlq) == 12
        yield q


# ---------------------------------------------------------------- ids (item 14)


@pytest.mark.parametrize(
    "ids", ["12", b"12", bytearray(b"12"), [1.5], [True], [1, "2"], [None], 12, 3.0]
)
def test_requeue_dlq_refuses_ids_that_are_not_ints_and_moves_nothing(
    dead: ledgerq.Queue, ids: object
) -> None:
    with pytest.raises(TypeError, match=r"ids must be an iterable|message id must be an int"):
        dead.requeue_dlq(ids)  # type: ignore[arg-type]
    assert len(dead.dlq) == 12, "nothing left the DLQ"
    assert len(dead) == 3, "nothing came back"


@pytest.mark.parametrize("ids", ["12", b"1", [1.0], [False], 7])
def test_purge_refuses_ids_that_are_not_ints_and_removes_nothing(
    dead: ledgerq.Queue, ids: object
) -> None:
    with pytest.raises(TypeError):
        dead.purge(ids)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        dead.dlq.purge(ids)  # type: ignore[arg-type]
    assert (len(dead), len(dead.dlq)) == (3, 12)


def test_asyncio_requeue_dlq_checks_ids_the_same_way(dead: ledgerq.Queue) -> None:
    aq = ledgerq.aio.AsyncQueue(dead)
    with pytest.raises(TypeError, match="ids must be an iterable"):
        asyncio.run(aq.requeue_dlq("12"))  # type: ignore[arg-type]
    assert len(dead.dlq) == 12
    assert asyncio.run(aq.requeue_dlq(i for i in (1, 2))) == 2, "a generator is read once"
    assert len(dead.dlq) == 10


def test_int_ids_still_move_exactly_those(dead: ledgerq.Queue) -> None:
    assert dead.requeue_dlq([12]) == 1
    assert dead.requeue_dlq((1, 2)) == 2
    assert sorted(int(m.headers["dlq.original_id"]) for m in dead.dlq.peek(20)) == list(
        range(3, 12)
    )
    assert dead.purge({13, 14}) == 2, "live-1 and live-2 (ids 13, 14) removed"


# ---------------------------------------------------------------- pickling (item 9)


def test_pickling_a_queue_or_its_faces_says_to_pass_the_path(tmp_path: Path) -> None:
    with (
        ledgerq.open(tmp_path / "q") as q,
        ledgerq.open_sharded(tmp_path / "s", 2) as sharded,
    ):
        aq = ledgerq.aio.AsyncQueue(q)
        faces: list[object] = [q, q.reader("audit"), q.dlq, sharded, aq, aq._default]
        for face in faces:
            for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError) as info:
                    attempt(face)
                message = str(info.value)
                assert "cannot pickle" in message
                assert "pass the path" in message and "open the queue in the other process" in (
                    message
                )
                assert str(tmp_path) in message, "names the queue"
        q.enqueue(b"still usable")
        assert len(q) == 1


def test_a_queue_handed_to_a_process_pool_fails_with_the_advice(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with (
        ledgerq.open(tmp_path / "q") as q,
        ctx.Pool(1) as pool,
        pytest.raises(TypeError, match="open the queue in the other process"),
    ):
        pool.apply(len, (q,))


# ---------------------------------------------------------------- headers (item 9)


def test_headers_larger_than_max_message_size_are_refused_before_writing(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_message_size=1024) as q:
        with pytest.raises(
            ledgerq.MessageTooLargeError, match=r"headers of \d+ bytes \(encoded\) exceed"
        ):
            q.enqueue(b"x", headers={"k": "v" * 2000})
        with pytest.raises(ledgerq.MessageTooLargeError, match="max_message_size=1024"):
            q.enqueue_batch([b"ok", ledgerq.Item(b"x", headers={"k": "v" * 2000})])
        assert q.stats().enqueued == 0, "nothing written, not even the rest of the batch"
        # The bound is on the encoded headers alone: a full payload still takes small ones.
        assert q.enqueue(b"p" * 1024, headers={"k": "v" * 900}) == 1


def test_a_100_mb_header_is_refused_with_the_default_limit(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", sync="never") as q:
        with pytest.raises(ledgerq.MessageTooLargeError) as info:
            q.enqueue(b"x", headers={"blob": "x" * (100 << 20)})
        assert isinstance(info.value, ValueError)
        assert q.stats().disk_bytes < 1 << 20


# ---------------------------------------------------------------- paths (item 17)


def test_an_empty_path_is_refused_and_the_current_directory_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for call in (
        lambda: ledgerq.open(""),
        lambda: ledgerq.open_sharded("", 2),
        lambda: asyncio.run(_aio_open("")),
    ):
        with pytest.raises(ValueError, match="is empty; name the queue directory"):
            call()
    assert os.listdir(tmp_path) == [], "nothing created in the current directory"
    with ledgerq.open("."):  # said explicitly, the current directory is fine
        pass


async def _aio_open(path: str) -> None:
    q = await ledgerq.aio.open(path)
    await q.close()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory under /tmp every user may search (pytest's tmp_path is root's alone)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as name:
        os.chmod(name, 0o755)
        yield Path(name)


def _open_as_nobody(path: Path) -> str:
    """Open ``path`` in a forked child running as ``nobody``; return what it raised."""
    ledgerq.open(path.parent / ".warm-up").close()  # import every module while root

    def as_nobody() -> str:
        os.setgid(65534)
        os.setuid(65534)
        try:
            ledgerq.open(path).close()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "opened"

    outcome, _ = in_a_forked_child(as_nobody)
    return outcome


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="switching to another user needs root (CI runs as root)"
)


@needs_root
def test_an_unreachable_queue_is_reported_as_permission_denied_not_as_could_not_create(
    shared_dir: Path,
) -> None:
    locked = shared_dir / "locked"
    with ledgerq.open(locked / "q") as q:
        q.enqueue(b"x")
    os.chmod(locked, 0o700)  # root's: nobody may not search it
    outcome = _open_as_nobody(locked / "q")
    assert outcome.startswith("StorageError: could not look up the queue directory"), outcome
    assert f"{locked / 'q'}: Permission denied" in outcome
    assert "could not create" not in outcome
    assert "search permission on every directory above it" in outcome


@needs_root
def test_an_unreadable_queue_directory_names_the_fix(shared_dir: Path) -> None:
    with ledgerq.open(shared_dir / "q") as q:
        q.enqueue(b"x")
    os.chmod(shared_dir / "q", 0o700)
    outcome = _open_as_nobody(shared_dir / "q")
    assert outcome.startswith("StorageError: could not look up the meta file"), outcome
    assert "Permission denied" in outcome
    assert "run as the user that owns the queue" in outcome


@needs_root
def test_a_queue_that_cannot_be_created_says_where_and_why(shared_dir: Path) -> None:
    outcome = _open_as_nobody(shared_dir / "new")
    assert outcome.startswith(
        f"StorageError: could not create the queue directory {shared_dir / 'new'}: "
        "Permission denied"
    ), outcome
    assert f"may not create directories in {shared_dir}; create {shared_dir / 'new'}" in outcome
    assert not (shared_dir / "new").exists()
