"""``--key-file``: the encryption key of an encrypted queue, read from a file.

A key file holds the 32 bytes of the key, raw, or as 64 hexadecimal digits (a trailing
newline and surrounding whitespace allowed) - the form ``ledgerq serve
--encryption-key-file`` takes too.  The key never travels on the command line, where
``ps`` and shell histories would show it; its text never appears in a message.
"""

from __future__ import annotations

import os
import stat
import string
from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = [
    "KEY_META",
    "KeyFileError",
    "current_key",
    "key_file_option",
    "read_key_file",
    "server_key_file_option",
]

F = TypeVar("F", bound=Callable[..., Any])
KEY_META = "ledgerq.encryption_key"  # where --key-file leaves the key in the click context
_KEY_SIZE = 32
_HEX = frozenset(string.hexdigits.encode())


class KeyFileError(ValueError):
    """A key file that cannot be read or holds no key; the message names the file."""


def read_key_file(path: str) -> bytes:
    """Return the key held by the file at ``path`` (32 raw bytes or 64 hex digits).

    Raises :class:`KeyFileError` naming the file (never its content) when it cannot be
    read or holds anything else.
    """
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise KeyFileError(f"key file {path} is not a regular file")
            data = f.read(4096)
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror or exc}") from None
    if len(data) == _KEY_SIZE:
        return data
    text = data.strip()
    if len(text) == 2 * _KEY_SIZE and set(text) <= _HEX:
        return bytes.fromhex(text.decode("ascii"))
    raise KeyFileError(
        f"key file {path} must hold a 32-byte key: 32 raw bytes, or 64 hexadecimal digits "
        f"(it holds {len(data)} bytes)"
    )


def _remember_key(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        try:
            ctx.meta[KEY_META] = read_key_file(value)
        except KeyFileError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def key_file_option(func: F) -> F:
    """``--key-file PATH``: the queue's encryption key (see the module docstring)."""
    return click.option(
        "--key-file",
        metavar="PATH",
        expose_value=False,
        callback=_remember_key,
        help="The encryption key of an encrypted queue: a file of 32 raw bytes or 64 hex "
        "digits (docs/encryption.md).",
    )(func)


def server_key_file_option(func: F) -> F:
    """``--encryption-key-file PATH``: ``ledgerq serve``'s name for ``--key-file``."""
    return click.option(
        "--encryption-key-file",
        metavar="PATH",
        expose_value=False,
        callback=_remember_key,
        help="The key every queue is encrypted with (as --key-file): new queues are created "
        "encrypted, and a plain queue or one under another key is refused.",
    )(func)


def current_key() -> bytes | None:
    """The key ``--key-file`` gave the running command, if any."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    key = ctx.find_root().meta.get(KEY_META, ctx.meta.get(KEY_META))
    return key if isinstance(key, bytes) else None
