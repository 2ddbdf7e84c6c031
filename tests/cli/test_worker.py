"""``ledgerq worker QUEUE module:function`` runs ``ledgerq.workers.run``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ledgerq

from ._run import fails, ok

HANDLER = """
def handle(message):
    if message.payload == b"bad":
        raise ValueError("bad payload")
"""


def test_worker_runs_a_handler_from_the_current_directory(tmp_path: Path) -> None:
    q = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(HANDLER)
    with ledgerq.open(q) as queue:
        queue.enqueue_batch([b"a", b"bad", b"c"])
    args = ("worker", q, "tasks:handle", "--processes", "2", "--until-empty", "--json")
    report = ok(*args, "-o", "max_retries=1", cwd=tmp_path).json()
    assert report == {"queue": str(q), "processed": 2, "failed": 1, "dead_lettered": 1}
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
