"""A real ``ledgerq serve`` process on 127.0.0.1 and a raw-socket memcache client.

The server is started with ``--port 0`` and prints the address it bound; every
process is stopped (SIGTERM, then SIGKILL past a guard) and reaped, every socket
closed.  No sleeps: a test that needs a request to be *waiting* polls the server's
own ``stats`` (``queue_<name>_waiters``) until it says so.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Generator
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

GUARD_S = 20.0  # a hang guard, never a timing assertion
_ROOT = str(Path(__file__).resolve().parents[2])
_LISTENING = re.compile(rb"listening on (\S+):(\d+)")


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LEDGERQ_DEBUG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH", "")]))
    return env


class ServerProcess:
    """``python -m ledgerq.cli serve DATA_DIR --port 0 FLAGS...`` as a context manager."""

    def __init__(self, data_dir: Path, *flags: str) -> None:
        self.data_dir = data_dir
        self.flags = flags
        self.port = 0
        self.returncode: int | None = None
        self._stderr_path = data_dir.parent / f"{data_dir.name}.serve-{os.getpid()}-{id(self)}.err"
        self._proc: subprocess.Popen[bytes] | None = None
        self.first_line = b""

    def start(self) -> Self:
        with open(self._stderr_path, "wb") as err:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "ledgerq.cli",
                    "serve",
                    str(self.data_dir),
                    "--port",
                    "0",
                    *list(self.flags),
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=environment(),
            )
        assert self._proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            if not selector.select(GUARD_S):
                self.stop(signal.SIGKILL)
                raise AssertionError("the server printed no address in time")
        line = self._proc.stdout.readline()
        found = _LISTENING.search(line)
        if found is None:
            self.stop(signal.SIGKILL)
            raise AssertionError(f"server did not start: {line!r} {self.stderr}")
        assert found.group(1) == b"127.0.0.1"
        self.first_line = line
        self.port = int(found.group(2))
        return self

    @property
    def stderr(self) -> str:
        try:
            return self._stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def is_running(self) -> bool:
        """True while the server process has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float = GUARD_S) -> int:
        """Wait for the process to exit by itself; return its exit code."""
        assert self._proc is not None
        self.returncode = self._proc.wait(timeout)
        self._close_pipes()
        return self.returncode

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the server, wait for it (SIGKILL past the guard), reap it."""
        proc = self._proc
        if proc is None:
            return self.returncode or 0
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(GUARD_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.returncode = proc.returncode
        self._close_pipes()
        return self.returncode

    def _close_pipes(self) -> None:
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()

    def client(self) -> Raw:
        return Raw(self.port)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._stderr_path.unlink(missing_ok=True)


def serving(
    tmp_path_factory: pytest.TempPathFactory, name: str, *args: str
) -> Generator[ServerProcess, None, ServerProcess]:
    """The body of a module-scoped server fixture (``yield from``): a server with
    ``args`` over a new data directory; once it is stopped it must have exited 0."""
    data = tmp_path_factory.mktemp(name) / "data"
    with ServerProcess(data, *args) as proc:
        yield proc
    assert proc.returncode == 0, proc.stderr
    return proc


Value = tuple[bytes, int, bytes, int | None]  # key, flags, data, cas


class Raw:
    """A memcache client speaking raw bytes, reading replies by the protocol's rules."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=GUARD_S)
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return False
        self._buf += chunk
        return True

    def line(self) -> bytes:
        """One reply line, without CRLF; raises EOFError if the server hung up."""
        while b"\r\n" not in self._buf:
            if not self._fill():
                raise EOFError(f"connection closed (unread: {self._buf!r})")
        line, _, self._buf = self._buf.partition(b"\r\n")
        return line

    def exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not self._fill():
                raise EOFError("connection closed inside a data block")
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def values(self) -> list[Value]:
        """Read VALUE blocks up to END; raises AssertionError on any other line."""
        found: list[Value] = []
        while True:
            line = self.line()
            if line == b"END":
                return found
            parts = line.split(b" ")
            assert parts[0] == b"VALUE", line
            size = int(parts[3])
            data = self.exact(size + 2)
            assert data.endswith(b"\r\n")
            cas = int(parts[4]) if len(parts) > 4 else None
            found.append((parts[1], int(parts[2]), data[:-2], cas))

    def call(self, request: bytes) -> bytes:
        """Send one request and return its one-line reply."""
        self.send(request)
        return self.line()

    def set(self, key: str, data: bytes, flags: int = 0, exptime: int = 0) -> bytes:
        return self.call(
            b"set %b %d %d %d\r\n%b\r\n" % (key.encode(), flags, exptime, len(data), data)
        )

    def get(self, *keys: str) -> list[Value]:
        self.send(b"get " + b" ".join(k.encode() for k in keys) + b"\r\n")
        return self.values()

    def get_one(self, key: str) -> bytes | None:
        found = self.get(key)
        assert len(found) <= 1
        return found[0][2] if found else None

    def stats(self) -> dict[str, str]:
        self.send(b"stats\r\n")
        found: dict[str, str] = {}
        while True:
            line = self.line()
            if line == b"END":
                return found
            tag, name, value = line.decode().split(" ", 2)
            assert tag == "STAT", line
            found[name] = value

    def is_closed_by_server(self) -> bool:
        """True when the server has closed the connection (reads EOF)."""
        try:
            while self._fill():
                pass
        except ConnectionResetError:
            pass
        return True


def until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (each call a round trip to the server) until true; fail past the guard."""
    deadline = time.monotonic() + GUARD_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")


def waiters(client: Raw, label: str) -> int:
    return int(client.stats().get(f"queue_{label}_waiters", "0"))
