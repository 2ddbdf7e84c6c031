"""``--key-file``: the encryption key of an encrypted queue, read from a file.

A key file holds the 32 bytes of the key, raw, or as 64 hexadecimal digits (a trailing
newline and surrounding whitespace allowed) - the form ``ledgerq serve
--encryption-key-file`` and the Celery transport's ``encryption_key_file`` take too:
one reader of key files, ``ledgerq.tools.read_key_file``.  The key never travels on
the command line, where ``ps`` and shell histories would show it; its text never
appears in a message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ledgerq.tools import KeyFileError, read_key_file

__all__ = [
    "KEY_META",
    "KeyFileError",
    "current_key",
    "key_file_option",
    "key_path_option",
    "read_key_file",
    "server_key_file_option",
]

F = TypeVar("F", bound=Callable[..., Any])
KEY_META = "ledgerq.encryption_key"  # where --key-file leaves the key in the click context


def _remember_key(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is None:
        return
    try:
        key = read_key_file(value)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    given = ctx.meta.get(KEY_META)
    if given is not None and given != key:
        # serve takes --key-file and --encryption-key-file: two different keys would
        # leave one silently unused.
        raise click.BadParameter(
            "another key file was given too, holding a different key: give one key",
            ctx=ctx,
            param=param,
        )
    ctx.meta[KEY_META] = key


def _key_option(name: str, help: str) -> Callable[[F], F]:  # noqa: A002 - click's name
    """An option ``name PATH`` that reads a key file into the context (not a parameter)."""
    return click.option(name, metavar="PATH", expose_value=False, callback=_remember_key, help=help)


def key_file_option(func: F) -> F:
    """``--key-file PATH``: the queue's encryption key (see the module docstring)."""
    return _key_option(
        "--key-file",
        "The encryption key of an encrypted queue: a file of 32 raw bytes or 64 hex "
        "digits (docs/encryption.md).",
    )(func)


def server_key_file_option(func: F) -> F:
    """``--encryption-key-file PATH``: ``ledgerq serve``'s name for ``--key-file``."""
    return _key_option(
        "--encryption-key-file",
        "The key every queue is encrypted with (as --key-file): new queues are created "
        "encrypted, and a plain queue or one under another key is refused.",
    )(func)


def key_path_option(name: str, help: str) -> Callable[[F], F]:  # noqa: A002 - click's name
    """A required option ``name PATH`` naming a key file the command reads itself (as
    ``rekey`` reads its old and new keys): the path is its parameter, the key unread."""
    return click.option(
        name, metavar="PATH", required=True, type=click.Path(dir_okay=False), help=help
    )


def current_key() -> bytes | None:
    """The key ``--key-file`` gave the running command, if any."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    key = ctx.find_root().meta.get(KEY_META, ctx.meta.get(KEY_META))
    return key if isinstance(key, bytes) else None
