"""A queue dropped without ``close()`` is closed when collected (issue 15 item 16).

Its sync thread used to keep it alive, and with it the directory lock, for the life of
the process: in a notebook, opening the path again failed.  Now the thread holds it
weakly, and a ``weakref.finalize`` closes it as ``close()`` does - sync, reader state,
features, ``meta.json`` saved clean, lock released - and warns (``ResourceWarning``, as
an unclosed file does).  pytest turns warnings into errors: each test catches it.
"""

from __future__ import annotations

import gc
import json
import textwrap
from pathlib import Path

import pytest

import ledgerq
from tests._child import run_python


def _meta(path: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((path / "meta.json").read_text())
    return loaded


@pytest.mark.parametrize("sync", ["interval", "never", "always"])
def test_a_dropped_queue_is_closed_when_collected(tmp_path: Path, sync: str) -> None:
    path = tmp_path / "q"
    q = ledgerq.open(path, sync=sync)  # type: ignore[arg-type]
    ids = q.enqueue_batch([b"a", b"b", b"c"])
    first = q.dequeue()
    assert first is not None
    q.ack(first.id)
    del q, first  # the queue and its readers refer to each other: the collector frees them
    with pytest.warns(ResourceWarning, match=r"unclosed ledgerq queue .* closed when collected"):
        gc.collect()
    meta = _meta(path)
    assert meta["clean"] is True, "saved as a close saves it"
    with ledgerq.open(path, sync="never") as again:  # the lock was released
        assert [m.id for m in again.dequeue_batch(5)] == ids[1:], "the ack was kept"
        assert again.stats().enqueued == 3


def test_the_sync_thread_does_not_keep_a_queue_alive(tmp_path: Path) -> None:
    q = ledgerq.open(tmp_path / "q", sync="interval", sync_interval=0.01)
    q.enqueue(b"x")
    flusher = q._flusher
    assert flusher is not None and flusher.is_alive()
    gc.disable()  # collected here, not by an automatic pass before the warns block
    try:
        del q
        with pytest.warns(ResourceWarning):
            gc.collect()
    finally:
        gc.enable()
    flusher.join(30)
    assert not flusher.is_alive(), "the thread ended with its queue"


def test_opening_again_collects_an_unreferenced_queue_of_this_process(tmp_path: Path) -> None:
    path = tmp_path / "q"
    q = ledgerq.open(path)
    q.reader("audit")  # readers refer to their queue: a reference cycle
    q.enqueue(b"x")
    del q  # only the cyclic collector can free it now
    with pytest.warns(ResourceWarning), ledgerq.open(path) as again:
        assert len(again) == 1


def test_a_queue_still_referenced_is_named_as_open_in_this_process(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        with pytest.raises(ledgerq.QueueLockedError, match="is open in this process") as info:
            ledgerq.open(path)
        assert "close it first" in str(info.value)
        q.enqueue(b"still mine")


def test_the_dlq_of_a_dropped_queue_is_closed_with_it(tmp_path: Path) -> None:
    path = tmp_path / "q"
    q = ledgerq.open(path, max_retries=1)
    q.enqueue(b"poison")
    message = q.dequeue()
    assert message is not None
    q.nack(message.id, "boom")
    assert len(q.dlq) == 1
    del q, message
    with pytest.warns(ResourceWarning):
        gc.collect()
    with ledgerq.open(path / "dlq") as dlq:  # its lock was released too
        assert [m.payload for m in dlq.peek(5)] == [b"poison"]


def test_a_closed_queue_is_not_closed_again_nor_warned_about(tmp_path: Path) -> None:
    q = ledgerq.open(tmp_path / "q")
    q.close()
    del q
    gc.collect()  # a warning here would fail the test (warnings are errors)


def test_a_queue_left_open_at_exit_is_closed_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "q"
    script = textwrap.dedent(
        f"""
        import ledgerq
        q = ledgerq.open({str(path)!r}, sync="never")
        q.enqueue_batch([b"a", b"b"])
        m = q.dequeue()
        q.ack(m.id)
        print("done", flush=True)
        """
    )
    proc = run_python("-X", "dev", "-c", script, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ResourceWarning: unclosed ledgerq queue" in proc.stderr
    assert _meta(path)["clean"] is True
    with ledgerq.open(path) as q:
        assert [m.payload for m in q.dequeue_batch(5)] == [b"b"]


@pytest.mark.parametrize("closing", ["close", "collect"])
def test_a_removed_reader_stays_removed_whichever_way_the_queue_closes(
    tmp_path: Path, closing: str
) -> None:
    path = tmp_path / "q"
    q = ledgerq.open(path, segment_size=200, retention_max_bytes=400)
    q.reader("gone")
    assert q.remove_reader("gone")
    q.enqueue_batch([b"x" * 100] * 10)  # retention drops segments: no reader state rewritten
    if closing == "close":
        q.close()
    else:
        del q
        with pytest.warns(ResourceWarning):
            gc.collect()
    assert not (path / "readers" / "gone.state").exists()
    with ledgerq.open(path) as again:
        assert set(again.stats().readers) == {"default"}
