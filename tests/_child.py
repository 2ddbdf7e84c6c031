"""Python child processes for the tests: a line protocol over pipes, watched and reaped.

The crash, torture, follow and ship tests run workloads in real processes and
synchronise with them only through their output: the child reports each event on one
line of stdout, the test acts when it has read a given line (and may write lines to
the child's stdin).  :class:`Child` is that harness, once:

* a watchdog kills a child still running after ``watchdog_seconds`` (a hang fails the
  test instead of stalling the run) and the failure says so;
* :meth:`Child.kill` is SIGKILL - a crash, not a shutdown;
* stderr goes to a file, shown in every failure the harness raises.

:class:`Children` starts the children of one test and reaps them all at its end (the
``children`` fixture in ``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = [
    "REPO",
    "WATCHDOG_SECONDS",
    "Child",
    "Children",
    "child_environment",
    "run_python",
    "start_logged",
]

REPO = Path(__file__).resolve().parents[1]
WATCHDOG_SECONDS = 120.0


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment with the checkout first on the path (children import ``tests``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    if extra:
        env.update(extra)
    return env


def run_python(
    *args: str | os.PathLike[str],
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in the checkout to its end (a child that lives past
    ``timeout`` seconds raises ``subprocess.TimeoutExpired``); return it, its stdout
    and stderr as text.  ``env`` defaults to :func:`child_environment`."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=child_environment() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_logged(
    args: Sequence[str | os.PathLike[str]], *, log: Path, cwd: Path, env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    """Start ``python ARGS`` in a session of its own (its process group can be killed
    whole), its stdout and stderr appended to ``log``; the caller stops and reaps it."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Child:
    """One Python child process: ``python ARGS`` (a script and its arguments, ``-m
    module ...`` or ``-c code``), its stdout read line by line, its stdin written to.

    Always end it with :meth:`close` (or use it as a context manager, or start it
    through :class:`Children`): that kills it if it still runs and reaps it.
    """

    def __init__(
        self,
        args: Sequence[str | os.PathLike[str]],
        *,
        stderr_path: Path,
        stdin: bool = True,
        cwd: Path = REPO,
        env: Mapping[str, str] | None = None,
        watchdog_seconds: float = WATCHDOG_SECONDS,
    ) -> None:
        self.args = [str(a) for a in args]
        self.stderr_path = stderr_path
        self.timed_out = False
        self._watchdog_seconds = watchdog_seconds
        self._dumped = threading.Event()  # never set: _expire's bounded pause
        with open(stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, *self.args],
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=cwd,
                env=child_environment() if env is None else dict(env),
            )
        self._watchdog = threading.Timer(watchdog_seconds, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    # ------------------------------------------------------------------ failures

    def _expire(self) -> None:
        self.timed_out = True
        with contextlib.suppress(OSError):
            pid = self.proc.pid
            if os.getpgid(pid) == pid:
                # A child leading its own process group (a pool's owner) may have asked
                # faulthandler to dump every thread on SIGUSR1 (its forked processes
                # inherit that): their stacks reach the stderr the failure shows.  A
                # signal nobody handles ends the group, which the SIGKILL does anyway.
                os.killpg(pid, signal.SIGUSR1)
                self._dumped.wait(2.0)
            self.proc.send_signal(signal.SIGKILL)

    def stderr_text(self) -> str:
        """What the child wrote on stderr so far."""
        return self.stderr_path.read_text(errors="replace")

    def failure(self, what: str) -> str:
        """A message for an assertion: the child, what went wrong, and its stderr."""
        late = (
            f" (killed by the watchdog after {self._watchdog_seconds:g} s)"
            if self.timed_out
            else ""
        )
        return f"child {' '.join(self.args)[:300]} {what}{late}; stderr:\n{self.stderr_text()}"

    # ------------------------------------------------------------------ the line protocol

    def read_line(self) -> str | None:
        """The next whole line, or None at the end of the output (a cut last line too)."""
        assert self.proc.stdout is not None
        raw = self.proc.stdout.readline()
        if not raw.endswith(b"\n"):
            return None
        return raw.decode().rstrip("\n")

    def line(self) -> str:
        """The next whole line; fails the test (with stderr) if the child ends first."""
        found = self.read_line()
        if found is None:
            code = self.proc.wait()
            raise AssertionError(self.failure(f"ended early (exit {code})"))
        return found

    def wait_for(self, prefix: str) -> str:
        """Skip lines up to the first that starts with ``prefix``; return it."""
        while not (found := self.line()).startswith(prefix):
            pass
        return found

    def send(self, text: str) -> None:
        """Write one line to the child's stdin."""
        assert self.proc.stdin is not None, "started with stdin=False"
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    # ------------------------------------------------------------------ endings

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the child (nothing if it is gone)."""
        with contextlib.suppress(OSError):
            self.proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL the child; its lines written before stay readable."""
        self.signal(signal.SIGKILL)

    def kill_and_drain(self) -> list[str]:
        """SIGKILL the child, check that the kill (not an exit) ended it, and return
        the whole lines it wrote that were not read yet."""
        self.kill()
        code = self.proc.wait()
        assert code == -signal.SIGKILL, self.failure(f"exited by itself with {code} first")
        assert self.proc.stdout is not None
        rest = self.proc.stdout.read()
        return [line.decode() for line in rest.split(b"\n")[:-1]]  # a partial last line: dropped

    def wait(self) -> int:
        """Wait for the child to end (the watchdog still runs); its exit status."""
        return self.proc.wait()

    def finish(self) -> int:
        """Let the child end (its further output read and dropped); reap it and release
        its pipes and watchdog; return its exit status (``-signal`` if killed)."""
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdout.read()
        code = self.proc.wait()
        self.close()
        return code

    def expect_exit(self, code: int = 0) -> None:
        """Wait for the child to end by itself with ``code``; fail with its stderr if not."""
        got = self.finish()
        assert got == code, self.failure(f"exited with {got}, not {code}")

    def close(self) -> None:
        """Kill the child if it still runs, reap it, release its pipes (idempotent)."""
        self._watchdog.cancel()
        if self.proc.poll() is None:
            self.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Children:
    """The children of one test: stderr files numbered in ``directory``, all reaped."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._started: list[Child] = []

    def start(self, args: Sequence[str | os.PathLike[str]], **options: object) -> Child:
        """Start ``python ARGS`` (see :class:`Child` for ``options``)."""
        path = self.directory / f"child-{len(self._started)}.stderr"
        child = Child(args, stderr_path=path, **options)  # type: ignore[arg-type]
        self._started.append(child)
        return child

    def close(self) -> None:
        """Kill and reap every child still running."""
        for child in self._started:
            child.close()

    def __iter__(self) -> Iterator[Child]:
        return iter(self._started)
