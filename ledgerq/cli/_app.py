"""The ``ledgerq`` command group and its entry point.

Every failure is reported as one line ``ledgerq: error: ...`` on stderr with a
non-zero exit and no traceback: 1 for errors, 2 for usage errors and commands not
built yet, 3 when ``dequeue`` finds no message, 130 on Ctrl-C, 141 when stdout went
away (a closed pipe or a closed stdout; a command that changed a queue says on
stderr what it did, a reading one stays quiet on a broken pipe), 143 on SIGTERM (an
open queue is closed cleanly first).  Set ``LEDGERQ_DEBUG=1`` to get the traceback
of an unexpected error.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

import click

import ledgerq
from ledgerq.cli._bench import bench
from ledgerq.cli._common import EXIT_OUTPUT_CLOSED, OutputClosed
from ledgerq.cli._config import config
from ledgerq.cli._dlq import dlq
from ledgerq.cli._messages import dequeue, enqueue, peek, stats
from ledgerq.cli._periodic import periodic
from ledgerq.cli._purge import purge
from ledgerq.cli._services import import_kestrel, serve, ship, worker
from ledgerq.cli._tools import compact, dump, rekey, verify
from ledgerq.cli._ui import ui

__all__ = ["cli", "main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class _Interrupted(Exception):
    """Ctrl-C inside a command (click would print a blank line and raise Abort)."""


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    ledgerq.__version__, "--version", prog_name="ledgerq", message="%(prog)s %(version)s"
)
def cli() -> None:
    """Operate ledgerq queues: a queue is a directory, given first to every command.

    Commands that print data take --json.  Reading commands never create a queue:
    a missing directory is an error.  See docs/cli.md.
    """


for _command in (
    enqueue,
    dequeue,
    peek,
    stats,
    purge,
    dump,
    verify,
    compact,
    rekey,
    config,
    dlq,
    periodic,
    worker,
    serve,
    ui,
    import_kestrel,
    ship,
    bench,
):
    cli.add_command(_command)


def _one_line(text: str) -> str:
    text = " ".join(text.split()).removesuffix(".")
    if len(text) > 1 and text[0].isupper() and not text[1].isupper():
        text = text[0].lower() + text[1:]
    return text


def _error(message: str) -> None:
    sys.stderr.write(f"ledgerq: error: {_one_line(message)}\n")
    sys.stderr.flush()


def _os_error_text(exc: OSError) -> str:
    if isinstance(exc, ledgerq.StorageError) or not exc.strerror:
        return str(exc)
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror.lower()}{where}"


class _Terminated(SystemExit):
    """SIGTERM: unwind like an exception, so an open queue is closed (synced) on the way."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated(EXIT_TERMINATED)


def _occupy_closed_standard_fds() -> None:
    """Put /dev/null on fds 0-2 when they are closed (``ledgerq ... >&-``).

    Otherwise the next file the queue opens takes fd 1 - a segment, a journal - and
    anything that writes to "stdout" (a worker's handler, a child process) writes into
    it.  Python has already set ``sys.stdout`` to None for a closed fd 1, which is how
    the output helpers still tell that stdout is closed.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so the exit's final flush of stdout meets no EPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        args = ["--help"]
    _occupy_closed_standard_fds()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run(args)
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)


def _locked_text(exc: ledgerq.QueueLockedError) -> str:
    """Why the queue could not be opened, by the mode that holds it, and what to do.

    Commands that read or change messages open the queue shared, so only an exclusive
    holder refuses them; the commands that need the queue to themselves (``verify
    --repair``, ``config --set``, ``import-kestrel``, ``worker --exclusive``) are
    refused by shared holders too.
    """
    readers = "'ledgerq dump' and 'ledgerq verify' read it without the lock"
    if exc.held_by == "exclusive":
        return (
            f"queue {exc.path} is open elsewhere: another process holds it exclusively; "
            "stop it first, or have it open the queue with ledgerq.open(path, shared=True) "
            f"so that the commands that read or change messages work beside it - {readers}"
        )
    if exc.held_by == "shared":
        return (
            f"queue {exc.path} is open elsewhere: processes have it open in shared mode, "
            f"and this command needs the queue to itself; stop them first - {readers}"
        )
    return (
        f"queue {exc.path} is open elsewhere (another process holds its lock); stop it "
        f"first - {readers}"
    )


def _run(args: list[str]) -> int:
    try:
        result = cli.main(args=args, prog_name="ledgerq", standalone_mode=False)
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        _error(exc.format_message().rstrip(".") + hint)
        return EXIT_USAGE
    except click.ClickException as exc:
        if exc.exit_code == EXIT_OUTPUT_CLOSED:
            _silence_stdout()
        _error(exc.format_message())
        return exc.exit_code
    except OutputClosed as exc:
        # A command that only reads: nothing to report but a closed stdout itself
        # (`ledgerq dump q | head` is normal use, and quiet like any other tool).
        _silence_stdout()
        if exc.stdout_closed:
            _error("stdout is closed; nothing was printed (and nothing changed)")
        return EXIT_OUTPUT_CLOSED
    except (_Interrupted, KeyboardInterrupt):
        if sys.stderr.isatty():
            sys.stderr.write("\n")  # after the ^C the terminal echoed
        _error("interrupted")
        return EXIT_INTERRUPTED
    except click.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):
            _error("interrupted")
            return EXIT_INTERRUPTED
        _error("aborted")
        return EXIT_ERROR
    except ledgerq.QueueLockedError as exc:
        _error(_locked_text(exc))
        return EXIT_ERROR
    except BrokenPipeError:
        # Output written past the helpers (click's own echo): stop quietly, as above.
        _silence_stdout()
        return EXIT_OUTPUT_CLOSED
    except ledgerq.LedgerQError as exc:
        _error(str(exc))
        return EXIT_ERROR
    except OSError as exc:
        _error(_os_error_text(exc))
        return EXIT_ERROR
    except _Terminated:
        _error("terminated")
        return EXIT_TERMINATED
    except SystemExit as exc:  # click exits on a broken pipe by itself
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    except Exception as exc:
        if os.environ.get("LEDGERQ_DEBUG"):
            raise
        _error(
            f"unexpected {type(exc).__name__}: {exc} (a bug in ledgerq; run with "
            "LEDGERQ_DEBUG=1 for the traceback and report it)"
        )
        return EXIT_ERROR
    return result if isinstance(result, int) else 0
