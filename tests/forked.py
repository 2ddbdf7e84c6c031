"""Work in a forked child of the test process, its answer sent back through a pipe."""

from __future__ import annotations

import os
from collections.abc import Callable


def in_a_forked_child(work: Callable[[], str]) -> tuple[str, int]:
    """Fork; in the child run ``work`` and send back the text it returns; return that
    text and the child's exit code (0, or 1 if ``work`` raised: the text then names the
    exception).

    The child leaves with ``os._exit``: it never returns into pytest and runs none of
    the cleanup it inherited.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(read_end)
            try:
                text = work()
                code = 0
            except BaseException as exc:
                text = f"the child failed: {exc!r}"
            os.write(write_end, text.encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return text, os.waitstatus_to_exitcode(status)
