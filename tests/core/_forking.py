"""Scenarios of ``tests/core/test_fork.py``, run as ``python -m tests.core._forking NAME PATH``.

Each runs in its own process (a test must not fork pytest itself and let the child
return into it) and prints one line per fact the test checks.  The forked children
exit as programs do - ``sys.exit``, so ``atexit`` handlers and finalizers run - unless
the scenario says otherwise.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from collections.abc import Callable

import ledgerq
import ledgerq.aio


def _attempt(label: str, call: Callable[[], object]) -> None:
    """Print what ``call`` raised (or returned) in this process."""
    try:
        result = call()
    except Exception as exc:
        print(f"{label}: {type(exc).__name__}: {exc}", flush=True)
    else:
        print(f"{label}: returned {result!r}", flush=True)


def _files(path: str) -> list[tuple[str, int, int]]:
    """Every file under ``path`` with its size and modification time."""
    found = []
    for directory, _, names in os.walk(path):
        for name in names:
            st = os.stat(os.path.join(directory, name))
            found.append((os.path.join(directory, name), st.st_size, st.st_mtime_ns))
    return sorted(found)


def use_after_fork(path: str) -> None:
    """The parent enqueues, forks; the child tries every call, closes, drops, exits."""
    q = ledgerq.open(path, sync="interval", max_retries=1)
    q.enqueue_batch([b"parent-1", b"parent-2"])
    leased = q.dequeue()
    assert leased is not None
    reader = q.reader("audit")
    sharded = ledgerq.open_sharded(os.path.join(path + "-sharded"), 2)
    aq = ledgerq.aio.AsyncQueue(q)
    q.sync()  # nothing left for the parent's flusher to write while the child runs
    before = _files(path)
    pid = os.fork()
    if pid == 0:
        _attempt("child enqueue", lambda: q.enqueue(b"child"))
        _attempt("child enqueue_batch", lambda: q.enqueue_batch([b"child"]))
        _attempt("child dequeue", lambda: q.dequeue())
        _attempt("child ack", lambda: q.ack(leased.id))
        _attempt("child nack", lambda: q.nack(leased.id))
        _attempt("child len", lambda: len(q))
        _attempt("child stats", lambda: q.stats())
        _attempt("child sync", lambda: q.sync())
        _attempt("child dlq", lambda: q.dlq)
        _attempt("child reader", lambda: reader.dequeue())
        _attempt("child sharded", lambda: sharded.enqueue(b"child"))
        _attempt("child aio", lambda: asyncio.run(aq.enqueue(b"child")))
        _attempt("child close", lambda: q.close())
        _attempt("child sharded close", lambda: sharded.close())
        del q, reader, aq, sharded
        gc.collect()
        sys.exit(0)  # atexit and finalizers run: they must touch nothing of the parent's
    _, status = os.waitpid(pid, 0)
    print(f"child exit: {os.waitstatus_to_exitcode(status)}", flush=True)
    print(f"files untouched by the child: {_files(path) == before}", flush=True)
    _attempt("open while the parent holds it", lambda: ledgerq.open(path))
    print(f"parent enqueue: {q.enqueue(b'parent-3')}", flush=True)
    q.ack(leased.id)
    q.close()
    sharded.close()
    print("parent closed", flush=True)


def open_in_child(path: str) -> None:
    """The fix the error names: the parent closes, the child opens its own queue."""
    q = ledgerq.open(path)
    q.enqueue(b"from the parent")
    q.close()
    pid = os.fork()
    if pid == 0:
        with ledgerq.open(path) as mine:
            message = mine.dequeue()
            assert message is not None
            mine.ack(message.id)
            print(f"child got: {message.payload.decode()}", flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    with ledgerq.open(path) as q:
        print(f"parent sees pending: {len(q)}", flush=True)


if __name__ == "__main__":
    scenario, target = sys.argv[1], sys.argv[2]
    {"use_after_fork": use_after_fork, "open_in_child": open_in_child}[scenario](target)
