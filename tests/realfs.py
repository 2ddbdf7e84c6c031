"""Real faults on a real file system: a small tmpfs that fills up, a read-only remount.

The injected-fault suite (``tests/faults``) makes a fake ``os`` raise; these tests meet
the kernel's own errors instead.  A :class:`SmallDisk` is a tmpfs mounted by the test
(root only: the tests that need one are skipped with a reason otherwise), which a
*ballast* file fills to ENOSPC and frees again, and which can be remounted read-only
(EROFS) - the faults an edge device's disk really produces.

A crash is a real one: :func:`crash_child` runs a script in a child Python process
that ends with ``os._exit`` - no ``close()``, no ``atexit``, no flush of anything the
queue did not write already - and hands back what the script reported.  The child
fills and frees the same disk through a :class:`Ballast` of its mount point.

Used by ``tests/faults/test_real_faults.py``, the real-ENOSPC sweep
(``tests/faults/_realsweep.py``) and the shared-mode fault tests.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from tests._child import REPO, child_environment

__all__ = [
    "Ballast",
    "SmallDisk",
    "can_mount",
    "crash_child",
    "drain_until_enqueue_works",
    "fill_with_messages",
    "small_disk",
]

_CHUNK = 64 * 1024
_BALLAST_PREFIX = ".ballast-"


def can_mount() -> str | None:
    """None if this process can mount a tmpfs, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CI runs as root)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount/umount are not installed"
    return None


class Ballast:
    """Files that fill the file system holding ``path`` (a directory) and free it again.

    Works on any mounted disk, from any process: a child fills the test's disk with
    its own ``Ballast(disk.path)``, and :meth:`free` with no count deletes every
    ballast file there, whoever wrote it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ballast: list[Path] = []

    def fill(self, leave_bytes: int = 0) -> int:
        """Write ballast until the disk is full (or ``leave_bytes`` are left); return bytes.

        Each call adds a new ballast file, so :meth:`free` can give back the most
        recent one alone.
        """
        target = self.path / f"{_BALLAST_PREFIX}{uuid.uuid4().hex[:8]}"
        self._ballast.append(target)
        written = 0
        with open(target, "wb", buffering=0) as f:
            while True:
                room = self.free_bytes() - leave_bytes
                if room <= 0:
                    break
                try:
                    written += f.write(b"\0" * min(_CHUNK, room))
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        if leave_bytes == 0:
            # tmpfs counts whole pages: top up byte by byte so not one byte is left.
            with open(target, "ab", buffering=0) as f, contextlib.suppress(OSError):
                while f.write(b"\0"):
                    written += 1
        return written

    def free(self, count: int | None = None) -> None:
        """Delete the newest ``count`` ballast files of this object, or (no count) every
        ballast file on the disk, a child's included."""
        if count is None:
            self._ballast.clear()
            for stale in self.path.glob(f"{_BALLAST_PREFIX}*"):
                stale.unlink(missing_ok=True)
            return
        for _ in range(min(count, len(self._ballast))):
            self._ballast.pop().unlink(missing_ok=True)

    def give_back(self, nbytes: int) -> None:
        """Free ``nbytes`` (a page, say) by cutting the newest ballast file of this object."""
        newest = self._ballast[-1]
        os.truncate(newest, max(0, newest.stat().st_size - nbytes))

    def free_bytes(self) -> int:
        """Bytes a non-root writer could still allocate."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def is_full(self) -> bool:
        """Whether not one more byte can be written."""
        probe = self.path / ".probe"
        try:
            with open(probe, "wb", buffering=0) as f:
                f.write(b"x")
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                probe.unlink(missing_ok=True)
                return True
            raise
        probe.unlink()
        return False


class SmallDisk(Ballast):
    """A tmpfs of ``size_bytes`` mounted at ``mountpoint`` (by the caller's test)."""

    def __init__(self, mountpoint: Path, size_bytes: int) -> None:
        super().__init__(mountpoint)
        self.size_bytes = size_bytes
        mountpoint.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mountpoint))
        self.mounted = True

    def remount(self, *, read_only: bool) -> None:
        """Remount read-only (writes then fail with EROFS) or read-write again."""
        mode = "ro" if read_only else "rw"
        _run("mount", "-o", f"remount,{mode}", str(self.path))

    def unmount(self) -> None:
        """Unmount (idempotent); the mountpoint directory is left empty."""
        if self.mounted:
            self.mounted = False
            _run("umount", "-l", str(self.path))


def fill_with_messages(q: ledgerq.Queue, disk: Ballast) -> list[int]:
    """Enqueue 1,000-byte messages into ``q`` until the disk refuses them, then fill
    what is left with ballast; return the ids enqueued."""
    ids: list[int] = []
    try:
        while True:
            ids += q.enqueue_batch([b"x" * 1000] * 16)
    except ledgerq.StorageError:
        pass
    disk.fill()
    assert disk.is_full()
    return ids


def drain_until_enqueue_works(
    takers: Sequence[ledgerq.Queue],
    into: ledgerq.Queue,
    drained: list[int],
    payload: bytes = b"new",
) -> int:
    """Dequeue and ack a message (from each of ``takers`` in turn), appending its id to
    ``drained``, and after each ack try to enqueue ``payload`` into ``into``, until one goes
    through; return its id.  Fails if the queue empties first."""
    turn = 0
    while True:
        q = takers[turn % len(takers)]
        turn += 1
        message = q.dequeue()
        assert message is not None, "drained the whole queue, enqueues still refused"
        q.ack(message.id)
        drained.append(message.id)
        try:
            return into.enqueue(payload)
        except ledgerq.StorageError:
            continue


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


# What every crash_child script starts with: ARGS (the keywords given), a Ballast of the
# disk, fill_with_messages(), report() (one JSON line per call, written at once), and ledgerq.
_PRELUDE = """\
import json, os, sys
from pathlib import Path
import ledgerq
from tests.realfs import Ballast, fill_with_messages
ARGS = json.loads(sys.argv[1])
disk = Ballast(Path(ARGS["disk"]))

def report(*values):
    os.write(1, (json.dumps(values) + "\\n").encode())

"""


def crash_child(disk: Path, script: str, *, timeout: float = 120.0, **args: Any) -> list[Any]:
    """Run ``script`` in a child process that then crashes; return what it reported.

    The script sees ``ARGS`` (``args`` and ``disk``, JSON-decoded), ``disk`` (a
    :class:`Ballast` of ``disk``), ``ledgerq``, ``fill_with_messages`` and
    ``report(*values)``; after its last
    line the child ends with ``os._exit(0)``: the queue is neither closed nor synced,
    as after a crash.  Each ``report`` call is one list in the result.  Fails the test
    (with the child's stderr) if the script raised.
    """
    code = _PRELUDE + textwrap.dedent(script) + "\nos._exit(0)\n"
    config = json.dumps({"disk": str(disk), **args})
    result = subprocess.run(
        [sys.executable, "-c", code, config],
        capture_output=True,
        cwd=REPO,
        env=child_environment(),
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"the crash child failed (exit {result.returncode}); stderr:\n"
            + result.stderr.decode(errors="replace")
        )
    return [json.loads(line) for line in result.stdout.decode().splitlines()]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """An 8 MiB tmpfs for this test (skipped where it cannot be mounted)."""
    reason = can_mount()
    if reason is not None:
        pytest.skip(reason)
    disk = SmallDisk(tmp_path / "disk", 8 * 1024 * 1024)
    try:
        yield disk
    finally:
        disk.unmount()
