"""Errors: one ``ledgerq: error:`` line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ledgerq

from ._run import fails, ok

READING_COMMANDS = [
    ["dequeue", "Q"],
    ["peek", "Q"],
    ["stats", "Q", "--json"],
    ["dump", "Q"],
    ["verify", "Q"],
    ["compact", "Q"],
    ["dlq", "list", "Q"],
    ["worker", "Q", "tasks:handle"],
]


@pytest.mark.parametrize("command", READING_COMMANDS, ids=" ".join)
def test_reading_a_missing_queue_fails_and_creates_nothing(
    tmp_path: Path, command: list[str]
) -> None:
    missing = tmp_path / "nope"
    result = fails(*(missing if arg == "Q" else arg for arg in command), code=1)
    assert "does not exist" in result.err and str(missing) in result.err
    assert not missing.exists()


def test_a_directory_that_is_not_a_queue_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    assert "not a ledgerq queue" in fails("stats", tmp_path / "plain").err
    assert not (tmp_path / "plain" / "meta.json").exists()


def test_a_locked_queue_says_it_is_open_elsewhere(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q) as queue:
        queue.enqueue(b"x")
        for args in (["stats", q], ["dequeue", q], ["enqueue", q, "y"], ["verify", q, "--repair"]):
            result = fails(*args, code=1)
            assert "open elsewhere" in result.err and str(q) in result.err
            # Commands open queues shared: the holder's mode is the obstacle, and the fix.
            assert "exclusively" in result.err and "shared=True" in result.err, result
        assert len(queue) == 1


def test_bad_ids_options_and_values(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q):
        pass
    assert "not a valid integer" in fails("dlq", "show", q, "x1", code=2).err
    assert "no message 7" in fails("dlq", "requeue", q, "--id", "7", code=1).err
    assert "no such option" in fails("peek", q, "--bogus", code=2).err
    assert "unknown queue option" in fails("peek", q, "-o", "colour=red", code=2).err
    assert "max_retries" in fails("peek", q, "-o", "max_retries=many", code=2).err
    assert "segment_size" in fails("peek", q, "-o", "segment_size=0", code=2).err
    assert "no such command" in fails("frobnicate", code=2).err


def test_help_lists_every_command_and_the_version(tmp_path: Path) -> None:
    listing = ok("--help").out
    for name in (
        "enqueue",
        "dequeue",
        "peek",
        "stats",
        "dump",
        "verify",
        "compact",
        "dlq",
        "serve",
        "worker",
        "import-kestrel",
        "ship",
        "bench",
    ):
        assert f"  {name} " in listing, name
    dlq_help = ok("dlq", "--help").out
    assert all(f"  {name} " in dlq_help for name in ("list", "show", "requeue", "purge"))
    assert ok().out == listing  # no arguments: the help
    assert ok("--version").out == f"ledgerq {ledgerq.__version__}\n"
    script = Path(sys.executable).with_name("ledgerq")
    if script.exists():  # the console script of an installed ledgerq
        proc = subprocess.run([script, "--version"], capture_output=True, text=True, check=False)
        assert (proc.returncode, proc.stdout) == (0, f"ledgerq {ledgerq.__version__}\n")
    # bench measures a scratch queue in a directory (see test_bench.py); not in a file.
    (tmp_path / "file").write_bytes(b"")
    assert fails("bench", tmp_path / "file", code=2).err.startswith("ledgerq: error:")
    assert "--client-id" in fails("ship", tmp_path / "q", tmp_path / "hub", code=2).err
    assert not (tmp_path / "q").exists()


def test_main_is_callable_and_returns_the_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    from ledgerq.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"ledgerq {ledgerq.__version__}\n"
    assert main(["stats", "/nonexistent/ledgerq-queue"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ledgerq: error:") and err.count("\n") == 1
