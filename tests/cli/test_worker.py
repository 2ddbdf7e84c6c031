"""``ledgerq worker QUEUE module:function`` runs ``ledgerq.workers.run``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import ledgerq
from ledgerq.cli._common import ByteSize
from tests._child import Children

from ._run import environment, fails, ok

HANDLER = """
def handle(message):
    if message.payload == b"bad":
        raise ValueError("bad payload")
"""


# The rarer outcomes of a run where none happened.
NONE = {"crashed": 0, "timed_out": 0, "released": 0, "recycled": 0}


def test_worker_runs_a_handler_from_the_current_directory(tmp_path: Path) -> None:
    q = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(HANDLER)
    with ledgerq.open(q) as queue:
        queue.enqueue_batch([b"a", b"bad", b"c"])
    args = ("worker", q, "tasks:handle", "--processes", "2", "--until-empty", "--json")
    report = ok(*args, "-o", "max_retries=1", cwd=tmp_path).json()
    assert report == {"queue": str(q), "processed": 2, "failed": 1, "dead_lettered": 1, **NONE}
    with ledgerq.open(q) as queue:
        assert len(queue) == 0
        (dead,) = queue.dlq.peek(5)
        assert dead.headers["dlq.failure_reason"] == "ValueError: bad payload"
        assert queue.options.max_retries == 3  # -o was for that run: nothing stored

    assert "no attribute 'nope'" in fails("worker", q, "tasks:nope", cwd=tmp_path).err
    assert "cannot import module" in fails("worker", q, "nothere:f", cwd=tmp_path).err
    assert "MODULE:FUNCTION" in fails("worker", q, "tasks", cwd=tmp_path, code=2).err


def test_worker_without_the_pool_module_fails_cleanly(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q):
        pass
    code = (
        "import sys; sys.modules['ledgerq.workers'] = None\n"
        "from ledgerq.cli import main\n"
        f"sys.exit(main(['worker', {str(q)!r}, 'tasks:handle']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("ledgerq: error: the worker pool (ledgerq.workers)")
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


ANNOUNCING_HANDLER = """
import sys

def handle(message):
    sys.stdout.write("done %s\\n" % message.payload.decode())
    sys.stdout.flush()
"""

_PRODUCER = """
import sys, ledgerq
with ledgerq.open(sys.argv[1], shared=True) as q:
    q.enqueue_batch([b"job %d" % n for n in range(int(sys.argv[2]))])
print("enqueued", flush=True)
"""


def test_a_producer_process_feeds_a_running_worker(tmp_path: Path, children: Children) -> None:
    q = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(ANNOUNCING_HANDLER)
    with ledgerq.open(q) as queue:
        queue.enqueue(b"first")
    pool = children.start(
        ["-m", "ledgerq.cli", "worker", q, "tasks:handle", "--processes", "2", "--json"],
        cwd=tmp_path,
        env=environment(),
    )
    assert pool.line() == "done first"  # the pool runs, and now waits for work
    producer = children.start(["-c", _PRODUCER, str(q), "20"])  # another process, meanwhile
    assert producer.line() == "enqueued"
    producer.expect_exit(0)
    done = sorted(pool.line() for _ in range(20))
    assert done == sorted(f"done job {n}" for n in range(20))
    pool.signal(signal.SIGTERM)
    report = json.loads(pool.wait_for("{"))
    assert pool.finish() == 0, pool.failure("did not stop cleanly on SIGTERM")
    assert report == {"queue": str(q), "processed": 21, "failed": 0, "dead_lettered": 0, **NONE}
    with ledgerq.open(q) as queue:
        assert queue.stats().acked == 21 and len(queue) == 0


def test_worker_exclusive_keeps_other_processes_out(tmp_path: Path) -> None:
    q = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(HANDLER)
    with ledgerq.open(q):
        pass
    with ledgerq.open(q, shared=True):  # a shared holder refuses an exclusive pool
        result = fails("worker", q, "tasks:handle", "--exclusive", "--until-empty", cwd=tmp_path)
        assert "shared mode" in result.err, result
    report = ok("worker", q, "tasks:handle", "--exclusive", "--until-empty", "--json", cwd=tmp_path)
    assert report.json()["processed"] == 0


PID_HANDLER = """
import os

def handle(message):
    with open("pids.log", "a") as log:
        log.write("%d %d\\n" % (message.id, os.getpid()))
"""


def test_worker_recycles_children_and_consumes_a_named_reader(tmp_path: Path) -> None:
    q = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(PID_HANDLER)
    with ledgerq.open(q) as queue:
        ids = queue.enqueue_batch([b"%d" % n for n in range(6)])
    args = ("worker", q, "tasks:handle", "--processes", "1", "--until-empty", "--json")
    limits = ("--max-tasks-per-child", "2", "--max-memory-per-child", "64GiB")
    report = ok(*args, *limits, "--reader", "audit", cwd=tmp_path).json()
    assert report == {
        "queue": str(q),
        "processed": 6,
        "failed": 0,
        "dead_lettered": 0,
        **NONE,
        "recycled": 3,  # each child after its second task
    }
    pids = [int(line.split()[1]) for line in (tmp_path / "pids.log").read_text().splitlines()]
    assert len(pids) == 6 and len(set(pids)) == 3, "one child per 2 tasks, each in order"
    with ledgerq.open(q) as queue:
        assert queue.reader("audit").stats().acked == 6
        assert [m.id for m in queue.peek(10)] == ids  # the default reader took nothing


def test_worker_refuses_bad_limits_and_reader_names(tmp_path: Path) -> None:
    q = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(HANDLER)
    with ledgerq.open(q):
        pass
    base = ("worker", q, "tasks:handle", "--until-empty")
    for flag, value in [
        ("--max-memory-per-child", "12XB"),
        ("--max-memory-per-child", "0"),
        ("--max-memory-per-child", "5iB"),
        ("--max-tasks-per-child", "0"),
        ("--reader", "../elsewhere"),
        ("--rate-limit", "20"),
        ("--rate-limit", "0/s"),
        ("--rate-limit", "20/day"),
    ]:
        result = fails(*base, flag, value, cwd=tmp_path, code=2)
        assert flag in result.err and "Traceback" not in result.err, result


def test_worker_with_a_rate_limit(tmp_path: Path) -> None:
    """--rate-limit reaches the pool: its start times are in the queue's shared/."""
    q = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(HANDLER)
    with ledgerq.open(q) as queue:
        queue.enqueue_batch([b"a", b"c"])
    args = ("worker", q, "tasks:handle", "--until-empty", "--rate-limit", "1000/s", "--json")
    assert ok(*args, cwd=tmp_path).json()["processed"] == 2
    from ledgerq.segment.readonly import read_rate_state

    state = read_rate_state(str(q), 0)
    assert state is not None and (state.count, state.period_ns) == (1000, 10**9)
    assert state.starts >= 2


def test_byte_sizes_read_as_documented() -> None:
    size = ByteSize()
    assert size.convert("1048576", None, None) == 1 << 20
    assert size.convert("200MB", None, None) == 200 * 10**6
    assert size.convert("200 mb", None, None) == 200 * 10**6
    assert size.convert("200MiB", None, None) == 200 << 20
    assert size.convert("200M", None, None) == 200 << 20
    assert size.convert("3kB", None, None) == 3000
    assert size.convert("1G", None, None) == 1 << 30
    assert size.convert("7B", None, None) == 7


FORWARDING = """
def handle(message):
    return [message.payload + b".1", message.payload + b".2"]
"""


def test_worker_forwards_into_another_queue(tmp_path: Path) -> None:
    q, out = tmp_path / "q", tmp_path / "out"
    (tmp_path / "stage.py").write_text(FORWARDING)
    with ledgerq.open(q) as queue:
        queue.enqueue_batch([b"a", b"b"])
    args = ("worker", q, "stage:handle", "--processes", "2", "--until-empty", "--json")
    report = ok(*args, "--forward-to", out, cwd=tmp_path).json()
    assert report == {"queue": str(q), "processed": 2, "failed": 0, "dead_lettered": 0, **NONE}
    with ledgerq.open(out) as target:
        assert sorted(m.payload for m in target.peek(10)) == [b"a.1", b"a.2", b"b.1", b"b.2"]
    with ledgerq.open(q) as queue:
        assert len(queue) == 0
        assert queue.stats().acked == 2
