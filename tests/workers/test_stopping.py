"""Stopping a pool with signals: drain on the first, stop at once on the second.

The pool runs in a real child process (its own process group, so a signal can reach
the whole group as systemd's stop does); the test synchronises only on its lines: the
handlers say when a task runs, the owner's log says when it has seen a signal, and a
FIFO per task, held open by the test, is its word for the task to end (the close).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import ledgerq
from tests._child import Child, Children, child_environment
from tests.workers import _handlers

# The owner: its own process group, the pool's log on stdout, then its report.
_OWNER = """
import faulthandler, logging, os, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the watchdog's dump of a hang
import ledgerq.workers as w
from tests.workers import _handlers as h
os.setpgrp()
logging.basicConfig(stream=sys.stdout, format="%(message)s")
r = w.run(sys.argv[1], getattr(h, sys.argv[2]), processes=2)
print("report", r.processed, r.failed, r.crashed, r.released, flush=True)
"""


# The same owner, with SIGTERM blocked in its main thread: the kernel delivers it to
# another thread (as it may at any time to a queue's housekeeper thread).
_OWNER_SIGNALLED_ELSEWHERE = """
import logging, os, signal, sys, threading
import ledgerq.workers as w
from tests.workers import _handlers as h
os.setpgrp()
logging.basicConfig(stream=sys.stdout, format="%(message)s")
idle = threading.Event()
threading.Thread(target=idle.wait, daemon=True).start()  # SIGTERM unblocked here
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
r = w.run(sys.argv[1], getattr(h, sys.argv[2]), processes=2)
print("report", r.processed, r.failed, r.crashed, r.released, flush=True)
"""


def _start(
    children: Children, path: Path, handler: str, env: dict[str, str], owner: str = _OWNER
) -> Child:
    return children.start(["-c", owner, str(path), handler], env=child_environment(env))


def _report(owner: Child) -> list[int]:
    line = owner.wait_for("report")
    assert owner.finish() == 0, owner.failure("did not stop cleanly")
    return [int(n) for n in line.split()[1:]]


def test_a_signal_to_the_process_group_lets_tasks_finish_and_retries_nothing(
    tmp_path: Path, children: Children
) -> None:
    # systemd (KillMode=control-group) and kill -TERM -PGID signal the children too: they
    # must leave it to the owner, not die mid-task as crashes.
    log = tmp_path / "done.log"
    go = tmp_path / "go"
    go.mkdir()
    held = {}
    for name in ("ok", "fail"):
        os.mkfifo(go / f"go-{name}")
        # Held open for writing: the task's open does not wait, its read waits for
        # our close, and our close never waits (for a task that died, say).
        held[name] = os.open(go / f"go-{name}", os.O_RDWR)
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch([b"ok", b"fail"])
    env = {_handlers.DONE_LOG: str(log), _handlers.GO_DIR: str(go)}
    owner = _start(children, path, "wait_for_go", env)
    assert sorted(owner.line().split()[1] for _ in range(2)) == ["fail", "ok"]
    os.killpg(owner.proc.pid, signal.SIGTERM)
    assert owner.wait_for("ledgerq worker: stopping:").startswith(
        "ledgerq worker: stopping: 2 running task(s) finish first"
    )
    for fd in held.values():
        os.close(fd)  # the end of the file: go
    processed, failed, crashed, released = _report(owner)
    assert (processed, failed, crashed, released) == (1, 1, 0, 0)
    # The failed task ran once: nacked (toward the DLQ) but not retried on shutdown.
    assert sorted(line.split()[1] for line in log.read_text().splitlines()) == ["fail", "ok"]
    with ledgerq.open(path) as q:
        stats = q.stats()
        assert (stats.acked, stats.nacked, stats.pending) == (1, 1, 1)
        again = q.dequeue()
        assert again is not None and again.payload == b"fail" and again.attempts == 2


@pytest.mark.parametrize("owner_code", [_OWNER, _OWNER_SIGNALLED_ELSEWHERE], ids=["main", "other"])
def test_a_second_signal_kills_the_tasks_and_releases_their_messages(
    tmp_path: Path, children: Children, owner_code: str
) -> None:
    # "other": a signal delivered to another thread still wakes the pool's main thread,
    # asleep while its tasks block (a second SIGTERM once went unanswered that way).
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        ids = q.enqueue_batch([b"1", b"2"])
    owner = _start(children, path, "block", {}, owner_code)
    assert [owner.line().split()[0] for _ in range(2)] == ["running", "running"]
    owner.signal(signal.SIGTERM)
    owner.wait_for("ledgerq worker: stopping:")  # seen: the next one is a second signal
    owner.signal(signal.SIGTERM)
    assert owner.wait_for("ledgerq worker: stopping at once:")
    processed, failed, crashed, released = _report(owner)
    assert (processed, failed, crashed, released) == (0, 0, 0, 2)
    with ledgerq.open(path) as q:
        assert q.stats().nacked == 0
        again = [q.dequeue(), q.dequeue()]
        # Released, not failed: the same attempts as before the stop.
        assert sorted(m.id for m in again if m is not None) == ids
        assert [m.attempts for m in again if m is not None] == [1, 1]
