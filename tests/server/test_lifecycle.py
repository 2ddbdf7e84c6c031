"""Start, stop, restart: graceful shutdown, persistence, the data-directory lock, flags."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerq
from tests.server._harness import Raw, ServerProcess, environment, until, waiters


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_data_and_open_reads_survive_a_restart(tmp_path: Path, sig: int) -> None:
    data = tmp_path / "data"
    with ServerProcess(data) as first, first.client() as c:
        for i in range(5):
            assert c.set("jobs", b"job%d" % i, flags=i) == b"STORED"
        assert c.get_one("jobs") == b"job0"  # consumed for good
        assert c.get_one("jobs/open") == b"job1"  # open when the server stops
        c.set("other", b"o")
        assert c.call(b"delete other\r\n") == b"DELETED"
        with first.client() as waiting:
            waiting.send(b"get empty/t=60000\r\n")
            until(lambda: waiters(c, "empty") == 1, "a waiting client")
            assert first.stop(sig) == 0, first.stderr
            assert waiting.values() == []  # answered before the server went away
        assert c.is_closed_by_server()
    assert "Traceback" not in first.stderr
    with ServerProcess(data) as second, second.client() as c:
        got = [c.get("jobs")[0] for _ in range(4)]
        assert [(data, flags) for _, flags, data, _ in got] == [
            (b"job1", 1),  # the open read came back first
            (b"job2", 2),
            (b"job3", 3),
            (b"job4", 4),
        ]
        assert c.get("jobs", "other") == []
    # Every queue was closed cleanly: the library opens it at once.
    with ledgerq.open(data / "jobs") as q:
        assert len(q) == 0


def test_a_second_server_on_the_same_data_dir_fails(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data):
        result = subprocess.run(
            [sys.executable, "-m", "ledgerq.cli", "serve", str(data), "--port", "0"],
            capture_output=True,
            env=environment(),
            timeout=20,
            check=False,
        )
    assert result.returncode == 1
    assert b"already served by another ledgerq serve" in result.stderr
    assert b"Traceback" not in result.stderr


def test_a_busy_port_fails_cleanly(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "a") as first:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "ledgerq.cli",
                "serve",
                str(tmp_path / "b"),
                "--port",
                str(first.port),
            ],
            capture_output=True,
            env=environment(),
            timeout=20,
            check=False,
        )
    assert result.returncode == 1
    assert result.stderr.startswith(b"ledgerq: error: ")
    assert b"Traceback" not in result.stderr


def test_queue_locked_by_another_process_is_a_server_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data) as proc, proc.client() as c:
        c.set("mine", b"x")
        # Another owner takes "theirs" before the server ever opens it.
        with ledgerq.open(data / "theirs") as theirs:
            theirs.enqueue(b"private")
            reply = c.call(b"set theirs 0 0 1\r\ny\r\n")
            assert reply == b"SERVER_ERROR queue theirs is locked by another process"
            c.send(b"get theirs\r\n")
            assert c.line().startswith(b"SERVER_ERROR")
        assert c.get_one("theirs") == b"private"  # opened once the lock is free
        assert c.get_one("mine") == b"x"


def test_shutdown_command_when_allowed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data, "--allow-shutdown") as proc:
        with proc.client() as c:
            c.set("q", b"kept")
            c.send(b"shutdown\r\n")
            assert c.is_closed_by_server()
        assert proc.wait() == 0, proc.stderr
    with ServerProcess(data) as proc, proc.client() as c:
        assert c.get_one("q") == b"kept"


def test_bare_keys_put_the_queue_name_on_value_lines(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", "--bare-keys") as proc, proc.client() as c:
        c.set("q", b"a")
        c.set("q", b"b")
        assert c.get("q/open") == [(b"q", 0, b"a", None)]
        assert c.get("q/close/open/t=5") == [(b"q", 0, b"b", None)]


def _canceled(client: Raw, label: str) -> int:
    return int(client.stats().get(f"queue_{label}_canceled_transactions", "0"))


def test_aborts_and_disconnects_are_no_failed_deliveries(tmp_path: Path) -> None:
    # max_retries=1 for this run: one failed delivery would dead-letter the item.
    data = tmp_path / "data"
    with ServerProcess(data, "-o", "max_retries=1") as proc, proc.client() as c:
        c.set("q", b"a")
        for _ in range(5):
            assert c.get_one("q/open") == b"a"
            assert c.get("q/abort") == []
        with proc.client() as leaving:
            assert leaving.get_one("q/open") == b"a"
        until(lambda: _canceled(c, "q") == 6, "the disconnect's open read given back")
        assert c.get_one("q/open") == b"a"
        assert c.get("q/abort") == []
    with ledgerq.open(data / "q") as q:
        stats = q.stats()
        assert (stats.nacked, stats.dead_lettered) == (0, 0)
        msg = q.dequeue()
        assert msg is not None and msg.payload == b"a" and msg.attempts == 1


def test_queue_options_apply_for_the_run_and_are_not_stored(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ledgerq.open(data / "old", max_retries=5, max_message_size=100):
        pass
    flags = ("-o", "sync=always", "-o", "max_message_size=10")
    with ServerProcess(data, *flags) as proc, proc.client() as c:
        assert c.set("old", b"x" * 10) == b"STORED"
        assert c.set("old", b"x" * 11).startswith(b"SERVER_ERROR")  # -o applies
        assert c.set("new", b"y") == b"STORED"  # a queue the server creates
    with ledgerq.open(data / "old") as q:
        assert (q.options.max_retries, q.options.max_message_size) == (5, 100)
        assert q.options.sync == "interval"
        assert len(q) == 1
    with ledgerq.open(data / "new") as q:
        assert q.options == ledgerq.Options()  # nothing stored: the defaults
        assert len(q) == 1


def test_serve_help_documents_every_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ledgerq.cli", "serve", "--help"],
        capture_output=True,
        env=environment(),
        timeout=20,
        check=True,
    )
    text = result.stdout.decode()
    for flag in (
        "--host",
        "--port",
        "--max-item-size",
        "--max-connections",
        "--max-open-reads",
        "--bare-keys",
        "--allow-shutdown",
        "--threads",
        "--option",
    ):
        assert flag in text, flag


def test_a_closed_stdout_does_not_stop_the_server(tmp_path: Path) -> None:
    # The address goes to stderr instead, and the server serves.
    command = [sys.executable, "-m", "ledgerq.cli", "serve", str(tmp_path / "data"), "--port", "0"]
    with subprocess.Popen(
        ["sh", "-c", 'exec "$0" "$@" >&-', *command],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=environment(),
    ) as proc:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        found = re.search(r"ledgerq: warning: stdout is closed; listening on 127.0.0.1:(\d+)", line)
        assert found is not None, line
        with Raw(int(found[1])) as c:
            assert c.set("q", b"a") == b"STORED"
            assert c.get_one("q") == b"a"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert b"Traceback" not in proc.stderr.read()
