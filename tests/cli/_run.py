"""Run the ``ledgerq`` command line in a real subprocess (as a user would)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

COMMAND = [sys.executable, "-m", "ledgerq.cli"]


class Result:
    """Exit code, stdout and stderr of one run."""

    def __init__(self, proc: subprocess.CompletedProcess[bytes]) -> None:
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.out = proc.stdout.decode("utf-8")
        self.err = proc.stderr.decode("utf-8")

    def json(self) -> Any:
        """stdout as one JSON document."""
        return json.loads(self.out)

    def json_lines(self) -> list[Any]:
        """stdout as JSON Lines."""
        return [json.loads(line) for line in self.out.splitlines()]

    def __repr__(self) -> str:
        return f"<Result code={self.code} stdout={self.stdout[:300]!r} stderr={self.err!r}>"


def run(
    *args: str | Path, stdin: bytes | None = None, cwd: Path | None = None, timeout: float = 60
) -> Result:
    """Run ``ledgerq ARGS``; stdin is empty (not a terminal) unless given."""
    proc = subprocess.run(
        [*COMMAND, *(str(a) for a in args)],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        cwd=cwd,
        env=environment(),
        timeout=timeout,
        check=False,
    )
    return Result(proc)


_ROOT = str(Path(__file__).resolve().parents[2])


def environment() -> dict[str, str]:
    """The environment of a run: this checkout first on the path, no debug tracebacks."""
    env = dict(os.environ)
    env.pop("LEDGERQ_DEBUG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH", "")]))
    return env


def start_ready(*args: str | Path, timeout: float = 30) -> subprocess.Popen[bytes]:
    """Start ``ledgerq ARGS --ready-fd N``; return once the command wrote its ready line.

    For tests of a command that waits (a signal, an enqueue from elsewhere): what the
    test does next happens after the queue is open, never before.
    """
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [*COMMAND, *(str(a) for a in args), "--ready-fd", str(write_end)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # faulthandler: a hung command dumps its threads on SIGABRT (see finish)
            env={**environment(), "PYTHONFAULTHANDLER": "1"},
            pass_fds=(write_end,),
        )
    finally:
        os.close(write_end)  # the child's copy is the only one: EOF if it dies unready
    with os.fdopen(read_end, "rb") as ready:
        readable, _, _ = select.select([ready], [], [], timeout)
        line = ready.readline() if readable else b""
    if line != b"ready\n":
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"ledgerq {' '.join(map(str, args))} was not ready after {timeout} s "
            f"(read {line!r}; exit {proc.returncode}; stdout {out[:300]!r}; stderr {err!r})"
        )
    return proc


def ok(*args: str | Path, **kwargs: Any) -> Result:
    """Run and assert success with nothing on stderr."""
    result = run(*args, **kwargs)
    assert result.code == 0, result
    assert "Traceback" not in result.err, result
    return result


def fails(*args: str | Path, code: int | None = None, **kwargs: Any) -> Result:
    """Run and assert a failure reported as one ``ledgerq: error:`` line on stderr."""
    result = run(*args, **kwargs)
    assert result.code != 0, result
    if code is not None:
        assert result.code == code, result
    assert "Traceback" not in result.err, result
    lines = result.err.splitlines()
    assert len(lines) == 1, result
    assert lines[0].startswith("ledgerq: error: "), result
    return result


def finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[bytes, bytes]:
    """Wait for a command :func:`start_ready` started to exit; return (stdout, stderr).

    One that has not exited after ``timeout`` seconds is made to dump every thread's
    stack (SIGABRT, faulthandler) and killed, and the test fails with that dump: a hang
    says where it hung, and leaves no process behind for the next test.
    """
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        raise AssertionError(
            f"the command did not exit within {timeout} s; its threads:\n"
            + err.decode(errors="replace")
        ) from None
