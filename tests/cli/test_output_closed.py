"""stdout going away: ``| head``, a closed stdout (``>&-``).

A command that changed a queue says on stderr what it did and exits 141 (as a command
killed by SIGPIPE does), so a script knows not to redo it; ``dequeue`` acks each
message once its output is written and gives back the rest with ``release`` - no
failed deliveries, nothing pushed towards the dead-letter queue.  A command that
only reads exits 141 too, quietly for a broken pipe.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import ledgerq

from ._run import COMMAND, environment, ok

EXIT_OUTPUT_CLOSED = 141


def _run_with_stdout_closed(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """Run ``ledgerq ARGS >&-`` (fd 1 closed, as a shell does it)."""
    return subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" >&-', *COMMAND, *(str(a) for a in args)],
        input=b"",
        capture_output=False,
        stderr=subprocess.PIPE,
        env=environment(),
        timeout=60,
        check=False,
    )


def _run_reading_one_line(*args: str | Path) -> tuple[int, bytes, str]:
    """Run ``ledgerq ARGS | head -1``: read one line of its stdout, then close the pipe."""
    with subprocess.Popen(
        [*COMMAND, *(str(a) for a in args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(),
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        return proc.wait(timeout=60), first, err


def _only_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ledgerq: error: "), err
    assert "bug in ledgerq" not in err and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("as_json", [False, True], ids=["payloads", "json"])
def test_dequeue_into_a_closed_pipe_fails_no_delivery(tmp_path: Path, as_json: bool) -> None:
    q = tmp_path / "q"
    total = 5000
    with ledgerq.open(q, max_retries=1) as queue:  # one failed delivery dead-letters
        queue.enqueue_batch([b"message %04d " % i + b"x" * 100 for i in range(total)])
    code, first, err = _run_reading_one_line("dequeue", q, "-n", total, *(["--json"] * as_json))
    assert code == EXIT_OUTPUT_CLOSED
    assert b"message 0000" in first
    line = _only_error_line(err)
    found = re.search(r"(\d+) printed and acked, (\d+) not printed and given back", line)
    assert found is not None, line
    acked, given_back = int(found[1]), int(found[2])
    assert acked >= 1 and acked + given_back == total
    with ledgerq.open(q) as queue:
        stats = queue.stats()
        assert (stats.acked, stats.nacked, stats.dead_lettered) == (acked, 0, 0)
        rest = queue.dequeue_batch(total)
        assert len(rest) == given_back
        assert {m.attempts for m in rest} == {1}
        assert rest[0].payload.startswith(b"message %04d" % acked)


def test_dequeue_gives_back_what_it_could_not_print(tmp_path: Path) -> None:
    # --payload utf8 refuses the second message: the first was printed and acked,
    # the second and third go back unused.
    q = tmp_path / "q"
    with ledgerq.open(q, max_retries=1) as queue:
        queue.enqueue_batch([b"fine", b"\xff binary", b"later"])
    result = subprocess.run(
        [*COMMAND, "dequeue", str(q), "-n", "3", "--json", "--payload", "utf8"],
        capture_output=True,
        env=environment(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "not valid UTF-8" in _only_error_line(result.stderr.decode())
    assert [json.loads(line)["payload"] for line in result.stdout.splitlines()] == ["fine"]
    with ledgerq.open(q) as queue:
        assert queue.stats().acked == 1
        rest = queue.dequeue_batch(5)
        assert [(m.payload, m.attempts) for m in rest] == [(b"\xff binary", 1), (b"later", 1)]


def test_enqueue_with_stdout_closed_says_what_it_enqueued(tmp_path: Path) -> None:
    q = tmp_path / "q"
    result = _run_with_stdout_closed("enqueue", q, "payload")
    assert result.returncode == EXIT_OUTPUT_CLOSED
    line = _only_error_line(result.stderr.decode())
    assert "stdout is closed" in line and f"enqueued 1 message (id 1) to {q}" in line
    with ledgerq.open(q) as queue:
        assert [m.payload for m in queue.peek(5)] == [b"payload"]
    assert ok("verify", q).code == 0  # no queue file took the closed stdout's place


def test_enqueue_lines_into_a_closed_pipe_stops_and_says_so(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with subprocess.Popen(
        [*COMMAND, "enqueue", str(q), "--lines"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment(),
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(b"first\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"1\n"
        proc.stdout.close()  # the id reader went away; the next line's id has nowhere to go
        proc.stdin.write(b"second\n")
        proc.stdin.flush()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == EXIT_OUTPUT_CLOSED
    assert f"enqueued 2 messages (ids 1 to 2) to {q}" in _only_error_line(err)
    with ledgerq.open(q) as queue:
        assert len(queue) == 2


READING = [
    ["peek", "Q"],
    ["stats", "Q"],
    ["stats", "Q", "--json"],
    ["dump", "Q"],
    ["dlq", "list", "Q"],
    ["config", "Q"],
    ["verify", "Q"],
]


@pytest.fixture
def busy_queue(tmp_path: Path) -> Path:
    q = tmp_path / "q"
    with ledgerq.open(q, max_retries=1) as queue:
        queue.enqueue_batch([b"m%d" % i for i in range(20)])
        msg = queue.dequeue()
        assert msg is not None
        queue.nack(msg.id, "failed")
    return q


@pytest.mark.parametrize("command", READING, ids=" ".join)
def test_reading_commands_with_stdout_closed(busy_queue: Path, command: list[str]) -> None:
    args = [busy_queue if arg == "Q" else arg for arg in command]
    result = _run_with_stdout_closed(*args)
    assert result.returncode == EXIT_OUTPUT_CLOSED
    assert "stdout is closed; nothing was printed" in _only_error_line(result.stderr.decode())


def test_a_reading_command_into_a_closed_pipe_is_quiet(busy_queue: Path) -> None:
    code, first, err = _run_reading_one_line("dump", busy_queue, "--payload", "utf8")
    assert b'"payload": "m0"' in first
    assert code in (0, EXIT_OUTPUT_CLOSED)  # 0 if everything fit in the pipe first
    assert err == ""


def test_dlq_requeue_with_stdout_closed_says_what_it_moved(busy_queue: Path) -> None:
    result = _run_with_stdout_closed("dlq", "requeue", busy_queue)
    assert result.returncode == EXIT_OUTPUT_CLOSED
    line = _only_error_line(result.stderr.decode())
    assert f"stdout is closed; requeued 1 message to {busy_queue}" in line
    with ledgerq.open(busy_queue) as queue:
        assert len(queue.dlq) == 0 and len(queue) == 20
