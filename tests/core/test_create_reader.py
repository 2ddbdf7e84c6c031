"""Creating a reader at a given state: ``Queue.reader(name, start=id)`` and
``ledgerq.tools.create_reader(queue, name, head=, done=)``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ledgerq
from ledgerq.tools import create_reader
from tests.drain import drain_singly


def drain(reader: ledgerq.Reader) -> list[int]:
    """Ids the reader delivers from now on (acked as they come)."""
    return [message.id for message in drain_singly(reader)]


def filled(path: Path, count: int = 10, **options: object) -> ledgerq.Queue:
    q = ledgerq.open(path, **options)  # type: ignore[arg-type]
    for i in range(1, count + 1):
        assert q.enqueue(b"m%d" % i) == i  # one by one: small segments rotate
    return q


# ---------------------------------------------------------------------- reader(start=id)


def test_a_new_reader_starts_at_the_id_given(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        reader = q.reader("from-4", start=4)
        assert q.stats().readers["from-4"].pending == 7
        first = reader.dequeue()
        assert first is not None and (first.id, first.payload) == (4, b"m4")
        reader.ack(first.id)
        assert q.reader("at-tail", start=11).dequeue() is None
        assert q.reader("from-1", start=1).dequeue() is not None
    with ledgerq.open(tmp_path / "q") as q:
        assert drain(q.reader("from-4")) == [5, 6, 7, 8, 9, 10]


def test_start_is_ignored_for_a_reader_that_exists(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        reader = q.reader("r")
        assert q.reader("r", start=9) is reader
    with ledgerq.open(tmp_path / "q") as q:
        assert drain(q.reader("r", start=9)) == list(range(1, 11))


def test_a_start_below_the_oldest_retained_message_starts_there(tmp_path: Path) -> None:
    with filled(tmp_path / "q", segment_size=100) as q:
        assert len(drain(q.reader("default"))) == 10
        q.compact()
        with ledgerq.follow(tmp_path / "q", timeout=0) as retained:
            first_retained = next(retained).id
        assert first_retained > 1, "the test needs deleted segments"
        assert drain(q.reader("late", start=1)) == list(range(first_retained, 11))


@pytest.mark.parametrize(
    ("start", "error", "text"),
    [
        (0, ValueError, "from 1 to the queue's next id 11"),
        (12, ValueError, "got 12"),
        ("middle", ValueError, "'earliest', 'latest' or an id"),
        (True, TypeError, "'earliest', 'latest' or an id"),
        (4.0, TypeError, "'earliest', 'latest' or an id"),
    ],
)
def test_a_bad_start_is_refused_and_creates_nothing(
    tmp_path: Path, start: object, error: type[Exception], text: str
) -> None:
    with filled(tmp_path / "q") as q:
        with pytest.raises(error, match=text):
            q.reader("r", start=start)  # type: ignore[arg-type]
        assert "r" not in q.stats().readers
    assert not (tmp_path / "q" / "readers" / "r.state").exists()


# ---------------------------------------------------------------------- create_reader


def test_create_reader_delivers_exactly_what_is_not_done(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        reader = create_reader(q, "twin", head=3, done=[5, 9, 6])
        assert q.stats().readers["twin"].pending == 5
        assert [m.id for m in reader.peek(10)] == [3, 4, 7, 8, 10]
        message = reader.dequeue()
        assert message is not None and message.id == 3
    with ledgerq.open(tmp_path / "q") as q:
        # The lease was lost on close: 3 comes again, then the rest, never a done id.
        assert drain(q.reader("twin")) == [3, 4, 7, 8, 10]
        assert drain(q) == list(range(1, 11)), "the default reader is not touched"


def test_create_reader_is_durable_when_it_returns(tmp_path: Path) -> None:
    """A process killed right after create_reader (no close) leaves the reader created."""
    path = tmp_path / "q"
    filled(path).close()
    child = textwrap.dedent(
        f"""
        import os, signal, ledgerq
        from ledgerq.tools import create_reader
        q = ledgerq.open({str(path)!r})
        create_reader(q, "twin", head=2, done=[4])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], check=False, timeout=60)
    assert proc.returncode == -9
    with ledgerq.open(path) as q:
        assert drain(q.reader("twin")) == [2, 3, 5, 6, 7, 8, 9, 10]


def test_create_reader_at_the_tail_sees_only_new_messages(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        reader = create_reader(q, "new", head=q.stats().next_id)
        assert reader.dequeue() is None
        q.enqueue(b"later")
        assert drain(reader) == [11]


def test_create_reader_never_replaces_a_reader(tmp_path: Path) -> None:
    with filled(tmp_path / "q") as q:
        existing = q.reader("r")
        assert drain(existing)[:1] == [1]
        with pytest.raises(ValueError, match="reader 'r' exists already"):
            create_reader(q, "r", head=1)
        with pytest.raises(ValueError, match="reader 'default' exists already"):
            create_reader(q, "default", head=1)
    with ledgerq.open(tmp_path / "q") as q:
        # After a reopen the reader is found on disk; its state is as it was.
        with pytest.raises(ValueError, match="exists already"):
            create_reader(q, "r", head=1, done=[2])
        q.enqueue(b"new")
        assert drain(q.reader("r")) == [11]


@pytest.mark.parametrize(
    ("name", "head", "done", "error", "text"),
    [
        ("bad name", 1, (), ValueError, "invalid reader name"),
        (".hidden", 1, (), ValueError, "invalid reader name"),
        ("r", 0, (), ValueError, "first id must be from 1"),
        ("r", 12, (), ValueError, "next id 11, got 12"),
        ("r", "3", (), TypeError, "must be an int"),
        ("r", 3, [3], ValueError, "done id 3 is not above"),
        ("r", 3, [2, 5], ValueError, "done id 2"),
        ("r", 3, [5, 11], ValueError, "done id 11 .* below the queue's next id 11"),
        ("r", 3, [5, 7.0], TypeError, "must be an int"),
        ("r", 3, [True], TypeError, "must be an int"),
    ],
)
def test_create_reader_checks_its_arguments_before_writing(
    tmp_path: Path, name: str, head: object, done: object, error: type[Exception], text: str
) -> None:
    with filled(tmp_path / "q") as q:
        with pytest.raises(error, match=text):
            create_reader(q, name, head=head, done=done)  # type: ignore[arg-type]
        assert set(q.stats().readers) == {"default"}
    assert sorted(p.name for p in (tmp_path / "q" / "readers").iterdir()) == ["default.state"]


def test_create_reader_on_a_closed_queue(tmp_path: Path) -> None:
    q = filled(tmp_path / "q")
    q.close()
    with pytest.raises(ledgerq.QueueClosedError):
        create_reader(q, "r", head=1)


def test_a_created_reader_holds_back_retention_from_its_head_only(tmp_path: Path) -> None:
    with filled(tmp_path / "q", segment_size=100) as q:
        segments = q.stats().segments
        assert segments > 2, "the test needs several segments"
        drain(q.reader("default"))
        create_reader(q, "tail", head=10)
        q.compact()
        assert q.stats().segments < segments  # "tail" does not hold the old segments
        assert drain(q.reader("tail")) == [10]
