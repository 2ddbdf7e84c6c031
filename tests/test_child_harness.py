"""The child-process harness the crash, torture, follow and ship tests stand on."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests._child import Child, Children

# Writes what it is told, on stdout or stderr, until stdin closes: "raw TEXT" writes
# TEXT (backslash escapes decoded) to stdout in one os.write; "exit N" exits.
_ECHO = """
import os, sys
for line in sys.stdin:
    word, _, rest = line.rstrip("\\n").partition(" ")
    if word == "out":
        print(rest, flush=True)
    elif word == "err":
        print(rest, file=sys.stderr, flush=True)
    elif word == "raw":
        os.write(1, rest.encode().decode("unicode_escape").encode())
    elif word == "exit":
        sys.exit(int(rest))
"""


def test_lines_go_both_ways(children: Children) -> None:
    child = children.start(["-c", _ECHO])
    child.send("out first")
    child.send("out second")
    assert child.line() == "first"
    child.send("out ready: go")
    assert child.wait_for("ready") == "ready: go"
    child.send("exit 0")
    child.expect_exit(0)


def test_a_child_that_ends_early_fails_with_its_exit_code_and_stderr(
    children: Children,
) -> None:
    child = children.start(["-c", _ECHO])
    child.send("err the reason it gave up")
    child.send("exit 3")
    with pytest.raises(AssertionError, match=r"ended early \(exit 3\)") as info:
        child.line()
    assert "the reason it gave up" in str(info.value)


def test_the_watchdog_kills_a_hung_child_and_says_so(children: Children) -> None:
    child = children.start(["-c", _ECHO], watchdog_seconds=0.5)
    child.send("err still alive")
    with pytest.raises(AssertionError) as info:
        child.line()  # the child waits for input that never comes
    message = str(info.value)
    assert "killed by the watchdog after 0.5 s" in message
    assert f"exit {-signal.SIGKILL}" in message and "still alive" in message


def test_kill_is_sigkill_and_keeps_the_whole_lines_written_before(children: Children) -> None:
    child = children.start(["-c", _ECHO])
    child.send("out one")
    # One write to a pipe (under PIPE_BUF) is all there or not at all: once "burst" is
    # read, the rest of that write - two lines and a cut one - is in the pipe too.
    child.send("raw burst\\nfour\\nfive\\ntor")
    assert child.line() == "one"
    assert child.line() == "burst"
    assert child.kill_and_drain() == ["four", "five"]  # the cut line is dropped
    assert child.proc.returncode == -signal.SIGKILL


def test_kill_and_drain_fails_when_the_child_had_exited_by_itself(children: Children) -> None:
    child = children.start(["-c", _ECHO])
    child.send("exit 0")
    child.wait()
    with pytest.raises(AssertionError, match="exited by itself with 0"):
        child.kill_and_drain()


def test_children_are_all_reaped_at_the_end(tmp_path: Path) -> None:
    running = Children(tmp_path)
    started = [running.start(["-c", _ECHO]) for _ in range(3)]
    running.close()
    assert all(child.proc.returncode == -signal.SIGKILL for child in started)
    assert sorted(p.name for p in tmp_path.glob("child-*.stderr")) == [
        "child-0.stderr",
        "child-1.stderr",
        "child-2.stderr",
    ]


def test_a_child_is_a_context_manager(tmp_path: Path) -> None:
    with Child(["-c", _ECHO], stderr_path=tmp_path / "err") as child:
        child.send("out hello")
        assert child.line() == "hello"
    assert child.proc.returncode == -signal.SIGKILL
