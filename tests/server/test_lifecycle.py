"""Start, stop, restart: graceful shutdown, persistence, the data-directory lock, flags."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerq
from tests.server._harness import ServerProcess, environment, until, waiters


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


def test_queue_options_apply_and_new_queues_never_dead_letter(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data, "-o", "sync=always") as proc, proc.client() as c:
        c.set("q", b"a")
        for _ in range(5):  # more aborts than the library's default max_retries
            assert c.get_one("q/open") == b"a"
            assert c.get("q/abort") == []
        assert c.get_one("q") == b"a"
    with ledgerq.open(data / "q") as q:
        assert q.options.sync == "always"
        assert q.options.max_retries == 0
        assert q.stats().dead_lettered == 0


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
