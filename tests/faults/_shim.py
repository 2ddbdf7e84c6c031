"""A Python-level interposer on the ``os`` calls that change files.

ledgerq reaches the file system only through module attributes of ``os`` looked up at
call time (``os.write(fd, ...)``, ``os.replace(...)``, ...), so replacing those
attributes interposes on every such call without LD_PRELOAD.  Subclasses decide what
happens around the real call: count it and fail it (fault injection), record it
(power-loss simulation), or kill the process before it (crash torture).

Calls through the builtin ``open`` are not interposed here (ledgerq uses it to read
files, and to cut a torn tail on recovery); :mod:`tests.torture._powerloss` handles the
latter itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["FAMILIES", "Interposer", "quiet_ledgerq", "scratch_dir"]

# Each interposed function and its *family*: the kind of site it is.
FAMILIES: dict[str, str] = {
    "open": "open",
    "write": "write",
    "writev": "write",
    "pwrite": "write",
    "fsync": "fsync",
    "fdatasync": "fsync",
    "ftruncate": "truncate",
    "replace": "rename",
    "rename": "rename",
    "unlink": "unlink",
    "remove": "unlink",
    "mkdir": "mkdir",
}
_BOOKKEEPING = ("close", "dup")
_FD_CALLS = frozenset(("write", "writev", "pwrite", "fsync", "fdatasync", "ftruncate"))
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class Interposer:
    """Replace the ``os`` functions of :data:`FAMILIES` while installed.

    Only calls on paths under ``root`` (or on descriptors opened under it while
    installed) are passed to :meth:`around`; every other call goes straight through.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.real: dict[str, Callable[..., Any]] = {}
        self.fds: dict[int, str] = {}  # descriptor -> path it was opened with
        self.lock = threading.RLock()
        self._installed = False

    # ------------------------------------------------------------------ hooks

    def around(self, name: str, path: str, call: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        """Run ``call`` (the real function); subclasses wrap it.  ``path`` is the target."""
        return call()

    def on_dup(self, old: int, new: int) -> None:
        """``new`` is a duplicate of ``old`` (an fd opened under root)."""

    def on_close(self, fd: int) -> None:
        """``fd`` (opened under root) is being closed."""

    @staticmethod
    def is_mutating_open(flags: int) -> bool:
        """Whether an ``os.open`` with ``flags`` can change the file system."""
        return bool(flags & _WRITE_FLAGS)

    # ------------------------------------------------------------------ plumbing

    def _under_root(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def _path_of(self, name: str, args: tuple[Any, ...]) -> str | None:
        if name in _FD_CALLS:
            return self.fds.get(args[0])
        if name in ("replace", "rename"):
            return os.path.abspath(os.fspath(args[1]))
        return os.path.abspath(os.fspath(args[0]))

    def _follow_rename(self, src: str, dst: str) -> None:
        # A descriptor follows its file: one opened as ``x.tmp`` writes to ``x`` now.
        with self.lock:
            for fd, opened in self.fds.items():
                if opened == src:
                    self.fds[fd] = dst

    def _make(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("dir_fd") is not None:
                return real(*args, **kwargs)
            if name == "close":
                with self.lock:
                    if self.fds.pop(args[0], None) is not None:
                        self.on_close(args[0])
                return real(*args, **kwargs)
            if name == "dup":
                fd = real(*args, **kwargs)
                with self.lock:
                    if args[0] in self.fds:
                        self.fds[fd] = self.fds[args[0]]
                        self.on_dup(args[0], fd)
                return fd
            path = self._path_of(name, args)
            if path is None or not self._under_root(path):
                return real(*args, **kwargs)
            result = self.around(name, path, lambda: real(*args, **kwargs), args)
            if name == "open":
                with self.lock:
                    self.fds[result] = path
            elif name in ("replace", "rename"):
                self._follow_rename(os.path.abspath(os.fspath(args[0])), path)
            return result

        wrapper.__name__ = name
        wrapper.__qualname__ = f"Interposer.{name}"
        return wrapper

    def install(self) -> None:
        """Replace the ``os`` functions (idempotent)."""
        if self._installed:
            return
        for name in (*FAMILIES, *_BOOKKEEPING):
            real = getattr(os, name)
            self.real[name] = real
            setattr(os, name, self._make(name, real))
        self._installed = True

    def uninstall(self) -> None:
        """Put the real ``os`` functions back (idempotent)."""
        if not self._installed:
            return
        for name, real in self.real.items():
            setattr(os, name, real)
        self._installed = False

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Interpose for the duration of a ``with`` block."""
        self.install()
        try:
            yield
        finally:
            self.uninstall()


@contextmanager
def scratch_dir(fallback: Path) -> Iterator[Path]:
    """A directory for crash states: on tmpfs when there is one (fsync is free there)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="ledgerq-powerloss-", dir=shm))
    else:
        path = Path(tempfile.mkdtemp(prefix="ledgerq-powerloss-", dir=fallback))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def quiet_ledgerq() -> Iterator[None]:
    """Silence the ``ledgerq`` logger (thousands of torn-tail warnings) for a while."""
    log = logging.getLogger("ledgerq")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)
