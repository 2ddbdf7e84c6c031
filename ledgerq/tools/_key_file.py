"""An encryption key read from a file, the way every way in takes one (``--key-file``,
``serve --encryption-key-file``, the Celery transport's ``encryption_key_file``).
"""

from __future__ import annotations

import os
import stat
import string

from ledgerq._errors import ConfigError

KEY_SIZE = 32  # bytes of an encryption key (AES-256)
_HEX_DIGITS = frozenset(string.hexdigits.encode())


class KeyFileError(ConfigError):
    """A key file that cannot be read or holds no key; the message names the file,
    never its content."""


def key_from_bytes(data: bytes) -> bytes | None:
    """The key ``data`` holds - 32 raw bytes, or 64 hexadecimal digits (surrounding
    whitespace and a trailing newline allowed) - or None when it holds neither."""
    if len(data) == KEY_SIZE:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_SIZE and set(text) <= _HEX_DIGITS:
        return bytes.fromhex(text.decode("ascii"))
    return None


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """Return the key held by the file at ``path`` (32 raw bytes or 64 hex digits).

    Raises :class:`KeyFileError` naming the file (never its content) when it cannot be
    read or holds anything else.
    """
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise KeyFileError(f"key file {os.fspath(path)} is not a regular file")
            data = f.read(4096)
    except OSError as exc:
        raise KeyFileError(
            f"cannot read key file {os.fspath(path)}: {exc.strerror or exc}"
        ) from None
    key = key_from_bytes(data)
    if key is None:
        raise KeyFileError(
            f"key file {os.fspath(path)} must hold a 32-byte key: 32 raw bytes, or 64 "
            f"hexadecimal digits (it holds {len(data)} bytes)"
        )
    return key
