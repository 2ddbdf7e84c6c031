"""Long-running and not-yet-built commands: worker, serve, import-kestrel, ship, bench."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from ledgerq.cli._common import (
    CliError,
    NotImplementedYetError,
    json_option,
    option_overrides,
    options_option,
    queue_argument,
    require_queue,
    write_json,
    write_line,
)

__all__ = ["bench", "import_kestrel", "serve", "ship", "worker"]


def _not_yet(issue: int) -> NoReturn:
    raise NotImplementedYetError(f"not implemented yet: comes with issue {issue}")


def load_handler(spec: str) -> Callable[..., Any]:
    """Import ``module:function`` (``function`` may be dotted), as ``python -m`` would.

    The current directory goes first on ``sys.path``, so a handler module next to
    where the command runs is found (worker processes inherit the path).
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise click.BadParameter(
            f"expected MODULE:FUNCTION (e.g. tasks:handle), got {spec!r}",
            param_hint="MODULE:FUNCTION",
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import module {module_name!r}: {exc}") from None
    except Exception as exc:  # the user's module failed while importing
        raise CliError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise CliError(f"{spec} is not callable (it is a {type(target).__name__})")
    return target  # type: ignore[no-any-return]


@click.command()
@queue_argument
@click.argument("handler_spec", metavar="MODULE:FUNCTION")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Worker processes.",
)
@click.option(
    "--task-timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="A task running longer is killed and counts as a failed delivery.",
)
@click.option("--until-empty", is_flag=True, help="Stop once the queue is empty.")
@json_option
@options_option
def worker(
    queue: str,
    handler_spec: str,
    processes: int,
    task_timeout: float | None,
    until_empty: bool,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """Run MODULE:FUNCTION on every message of QUEUE in a pool of worker processes.

    The function gets a ledgerq.Message: returning acks it, raising nacks it with the
    exception's text; a crash or a timeout is a failed delivery too.  Prints the
    report (processed, failed, dead-lettered) when the pool stops.
    """
    require_queue(queue)
    options = option_overrides(option_pairs)
    try:
        workers = importlib.import_module("ledgerq.workers")
    except ModuleNotFoundError as exc:
        if exc.name not in ("ledgerq.workers", "ledgerq"):
            raise
        raise CliError(
            "the worker pool (ledgerq.workers) is not part of this ledgerq installation yet"
        ) from None
    handler = load_handler(handler_spec)
    report = workers.run(
        queue,
        handler,
        processes=processes,
        task_timeout=task_timeout,
        until_empty=until_empty,
        **options,
    )
    figures = {
        name: int(getattr(report, name, 0)) for name in ("processed", "failed", "dead_lettered")
    }
    if as_json:
        write_json({"queue": queue, **figures})
    else:
        write_line(
            f"processed {figures['processed']}, failed {figures['failed']}, "
            f"dead-lettered {figures['dead_lettered']}"
        )


@click.command()
@click.argument("data_dir", metavar="DATA_DIR", type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=22133, show_default=True, help="TCP port."
)
def serve(data_dir: str, host: str, port: int) -> None:
    """Serve the queues in DATA_DIR over the memcache (Kestrel) text protocol."""
    _not_yet(7)


@click.command("import-kestrel")
@click.argument("src", metavar="SRC", type=click.Path(path_type=str))
@click.argument("dest_queue", metavar="DEST_QUEUE", type=click.Path(path_type=str))
@click.option("--queue", "queue_name", metavar="NAME", help="The Kestrel queue to import.")
def import_kestrel(src: str, dest_queue: str, queue_name: str | None) -> None:
    """Import a Kestrel journal SRC into the queue DEST_QUEUE."""
    _not_yet(9)


@click.command()
@click.argument("src_queue", metavar="SRC_QUEUE", type=click.Path(path_type=str))
@click.argument("dest_root", metavar="DEST_ROOT", type=click.Path(path_type=str))
@click.option("--client-id", required=True, metavar="ID", help="Names the copy at the hub.")
@click.option("--follow", is_flag=True, help="Keep shipping new messages as they arrive.")
@click.option("--delete-shipped", is_flag=True, help="Delete source segments once shipped.")
def ship(
    src_queue: str, dest_root: str, client_id: str, follow: bool, delete_shipped: bool
) -> None:
    """Copy SRC_QUEUE into DEST_ROOT/<client-id>.<queue-dir-name>/ (read without its lock)."""
    _not_yet(9)


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> int:
    """Run the benchmarks (benchmarks/run.py of a ledgerq checkout, with ARGS)."""
    script = os.path.join("benchmarks", "run.py")
    if os.path.isfile(script):
        return subprocess.call([sys.executable, script, *args])
    _not_yet(5)
