"""Small file primitives every durable path goes through.

Each fsync here exists for a reason stated next to it; the rule (after ZODB and
semidbm): a file is replaced only by temp file -> fsync -> rename -> fsync of the
directory, so a crash leaves either the old file or the new one, never a mix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ledgerq._errors import StorageError  # defined with the error tree; the storage layer raises it

__all__ = [
    "StorageError",
    "atomic_write",
    "datasync",
    "fsync_dir",
    "make_durable_dir",
    "pread_exact",
    "replace_and_open",
    "storage_errors",
    "write_all",
    "write_parts",
]


@contextmanager
def storage_errors(action: str, path: str) -> Iterator[None]:
    """Raise an ``OSError`` of the block as a :class:`StorageError`: could not ``action`` ``path``.

    A :class:`StorageError` raised inside (it is an ``OSError`` too) passes unchanged, so
    blocks can nest and the innermost, most precise message wins.
    """
    try:
        yield
    except StorageError:
        raise
    except OSError as exc:
        raise StorageError(action, path, exc) from exc


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` (os.write may write less than asked)."""
    written = os.write(fd, data)
    if written == len(data):
        return
    view = memoryview(data)
    while written < len(view):
        written += os.write(fd, view[written:])


_IOV_MAX = min(getattr(os, "sysconf", lambda _: 1024)("SC_IOV_MAX") or 1024, 1024)


# Below this many bytes, parts are joined and written with one write(): copying small
# entries costs less than the kernel's work per iovec (measured with 100-byte entries:
# 10 us for write(join(300 parts)) against 18 us for writev(300 parts)).
_JOIN_BELOW = 1 << 20


def write_parts(fd: int, parts: list[bytes], total: int | None = None) -> None:
    """Write the concatenation of ``parts`` with one system call where it can.

    Small writes (or more parts than one ``writev`` takes) are joined into one
    buffer; large ones go to ``writev`` without a copy.  ``total`` is their summed
    length when the caller knows it already.
    """
    if total is None:
        total = sum(map(len, parts))
    if total < _JOIN_BELOW or len(parts) > _IOV_MAX:
        write_all(fd, b"".join(parts))
        return
    written = os.writev(fd, parts)
    if written != total:  # a short write: finish it the simple way
        write_all(fd, memoryview(b"".join(parts))[written:])


def datasync(fd: int) -> None:
    """Make the file's data (and its size) durable: fdatasync where it exists."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS and Windows
        os.fsync(fd)


def fsync_dir(path: str) -> None:
    """Make a directory's entries (created, renamed, deleted files) durable."""
    if os.name == "nt":  # pragma: no cover - Windows cannot open (or fsync) a directory
        return
    # An error opening it (EIO, EMFILE) is raised: the entries would not be durable.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable_dir(path: str) -> bool:
    """Create the directory ``path`` (and missing parents) so that it survives a power cut.

    A new directory is an entry of its parent, durable (POSIX) only once the parent is
    fsynced - and so is everything below it.  Returns True if it was created, False if
    it existed (then nothing is synced).  Raises :class:`StorageError`.
    """
    if os.path.isdir(path):
        return False
    parent = os.path.dirname(os.path.abspath(path))
    make_durable_dir(parent)
    with storage_errors("create directory", path):
        try:
            os.mkdir(path)
        except FileExistsError:
            if os.path.isdir(path):
                return False  # created meanwhile by someone else, who syncs it
            raise
    with storage_errors("sync directory", parent):
        fsync_dir(parent)
    return True


def atomic_write(path: str, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new file.

    With ``durable`` the new content is on disk when this returns.
    """
    _replace(path, data, durable=durable, adopt=None)


def replace_and_open(path: str, data: bytes, adopt: Callable[[int], None]) -> None:
    """Durably replace ``path`` with ``data`` (as :func:`atomic_write`) for appending to.

    ``adopt`` receives a descriptor appending to the new file as soon as it holds the
    name.  The descriptor is opened *before* the rename, so no failure - not even of the
    directory's fsync after it - leaves the caller appending to a replaced file, where
    its writes would be lost: if this raises, ``adopt`` was called exactly when the name
    moved.
    """
    _replace(path, data, durable=True, adopt=adopt)


def _replace(path: str, data: bytes, *, durable: bool, adopt: Callable[[int], None] | None) -> None:
    """temp file -> (fsync) -> rename -> (fsync of the directory); ``adopt`` gets the fd."""
    tmp = f"{path}.tmp"
    try:
        # Readable too: a shared-mode handle reads what others append to a file it adopts.
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)  # the content must be on disk before the name points at it
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            raise
        if adopt is None:
            os.close(fd)
        else:
            adopt(fd)
        if durable:
            fsync_dir(os.path.dirname(path) or ".")  # and the rename itself must be durable
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StorageError("write", path, exc) from exc


def pread_exact(fd: int, size: int, offset: int) -> bytes:
    """Read up to ``size`` bytes at ``offset``; fewer only at end of file."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)
