"""Long-running and tool commands: worker, serve, import-kestrel, ship."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from ledgerq.cli._common import (
    ByteSize,
    CliError,
    OutputClosed,
    Seconds,
    for_one_run,
    json_option,
    option_overrides,
    options_option,
    positive_int_option,
    queue_argument,
    report_json,
    reporting_if_output_closed,
    require_queue,
    write_json,
    write_labelled,
    write_line,
    write_outcome,
)
from ledgerq.cli._keys import server_key_file_option

__all__ = ["import_kestrel", "serve", "ship", "worker"]


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
@positive_int_option("--processes", default=4, help="Worker processes.")
@click.option(
    "--task-timeout",
    type=Seconds(min_open=True),
    metavar="SECONDS",
    help="A task running longer is killed and counts as a failed delivery (the retry "
    "policy's delay and max_retries apply).",
)
@click.option(
    "--max-tasks-per-child",
    type=click.IntRange(min=1),
    metavar="N",
    help="Replace a worker process by a fresh one after N tasks (default: never).",
)
@click.option(
    "--max-memory-per-child",
    type=ByteSize(),
    metavar="SIZE",
    help="Replace a worker process whose resident size after a task is above SIZE: "
    "bytes, or 200MB (10**6), 200MiB / 200M (2**20); the task itself is not failed.  "
    "A forked process starts near the pool's own size: set it above that.",
)
@click.option(
    "--reader",
    default="default",
    show_default=True,
    metavar="NAME",
    help="The reader to consume (a named reader is created on first use, from the "
    "earliest message).",
)
@click.option("--until-empty", is_flag=True, help="Stop once the queue is empty.")
@click.option(
    "--forward-to",
    metavar="PATH",
    help="Forward what the function returns (bytes, an Item, a list of them; None: "
    "nothing) into the queue at PATH, exactly once, in place of the ack.",
)
@click.option(
    "--rate-limit",
    metavar="N/s|N/m|N/h",
    help="At most N task starts per second, minute or hour for this queue, across every "
    "worker on this machine at once (bursts of up to N).",
)
@click.option(
    "--exclusive",
    is_flag=True,
    help="Open the queue exclusively (a little faster; no other process may open it "
    "meanwhile).  By default it is opened shared: producers in other processes, and "
    "other workers, use it while this one runs.",
)
@json_option
@options_option
def worker(
    queue: str,
    handler_spec: str,
    processes: int,
    task_timeout: float | None,
    max_tasks_per_child: int | None,
    max_memory_per_child: int | None,
    reader: str,
    until_empty: bool,
    forward_to: str | None,
    rate_limit: str | None,
    exclusive: bool,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """Run MODULE:FUNCTION on every message of QUEUE in a pool of worker processes.

    The function gets a ledgerq.Message: returning acks it, raising nacks it with the
    exception's text (ledgerq.workers.Retry(delay): with that delay); a crash or a
    timeout is a failed delivery too, after the queue's retry delay.  The first SIGTERM
    or Ctrl-C lets running tasks finish and leases nothing more; a second kills them and
    releases their messages (not counted as failures).  Prints the report (processed,
    failed, dead-lettered) when the pool stops (signals, or --until-empty).  The queue
    is open in shared mode meanwhile: applications enqueue into it with
    ledgerq.open(QUEUE, shared=True), or with 'ledgerq enqueue'.
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
    if rate_limit is not None:
        try:
            workers.parse_rate_limit(rate_limit)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--rate-limit") from None
    handler = load_handler(handler_spec)
    try:
        report = workers.run(
            queue,
            handler,
            processes=processes,
            task_timeout=task_timeout,
            until_empty=until_empty,
            shared=not exclusive,
            reader=reader,
            max_tasks_per_child=max_tasks_per_child,
            max_memory_per_child=max_memory_per_child,
            forward_to=forward_to,
            rate_limit=rate_limit,
            **for_one_run(options),  # workers.run passes them to ledgerq.open
        )
    except ValueError as exc:
        # A bad --reader is found by the queue (the one check of names); click and run
        # checked every other argument before anything started.
        if "reader name" not in str(exc):
            raise
        raise click.BadParameter(str(exc), param_hint="--reader") from None
    figures = {name: int(getattr(report, name)) for name in _WORKER_FIGURES}
    # The text names the rarer outcomes only when they happened.
    rare = [f"{name.replace('_', ' ')} {figures[name]}" for name in _RARE if figures[name]]
    write_outcome(
        ", ".join(
            [
                f"processed {figures['processed']}",
                f"failed {figures['failed']}",
                f"dead-lettered {figures['dead_lettered']}",
                *rare,
            ]
        ),
        {"queue": queue, **figures} if as_json else None,
    )


# What `ledgerq worker` reports (--json: every one; the text: the last four when not 0).
_RARE = ("crashed", "timed_out", "released", "recycled")
_WORKER_FIGURES = ("processed", "failed", "dead_lettered", *_RARE)


@click.command()
@click.argument("data_dir", metavar="DATA_DIR", type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=22133,
    show_default=True,
    help="TCP port; 0 picks a free one (the bound address is printed on stdout).",
)
@positive_int_option(
    "--max-item-size",
    default=16 << 20,
    metavar="BYTES",
    help="Largest item a set may store; a larger one is refused with "
    "'SERVER_ERROR object too large for cache' and its data skipped unread.",
)
@positive_int_option(
    "--max-connections",
    default=4096,
    help="Connections served at once; one more is answered "
    "'SERVER_ERROR too many open connections' and closed.",
)
@positive_int_option(
    "--max-open-reads",
    default=1,
    help="Open reads (get q/open) one connection may hold per queue; one more is a "
    "CLIENT_ERROR that leaves the open reads as they were.",
)
@click.option(
    "--bare-keys",
    is_flag=True,
    help="Put the bare queue name on VALUE lines, as Kestrel does (default: the key as "
    "requested, options included, which memcache clients need to match replies).",
)
@click.option(
    "--allow-shutdown",
    is_flag=True,
    help="Let a client stop the server with the 'shutdown' command (refused otherwise).",
)
@positive_int_option(
    "--threads",
    default=16,
    help="Threads doing blocking queue work (writes, fsyncs, acks) off the event loop.",
)
@click.option(
    "--shared",
    is_flag=True,
    help="Open the queues in shared mode, so Python processes use them directly with "
    "ledgerq.open(DATA_DIR/<name>, shared=True) while the server runs.",
)
@options_option
@server_key_file_option
def serve(
    data_dir: str,
    host: str,
    port: int,
    max_item_size: int,
    max_connections: int,
    max_open_reads: int,
    bare_keys: bool,
    allow_shutdown: bool,
    threads: int,
    shared: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """Serve the queues in DATA_DIR over the memcache (Kestrel) text protocol.

    One queue per name, stored in DATA_DIR/<name>/ (created on first set); any
    memcache client is a producer (set) or a worker (get, with /t=<ms> to wait and
    /open, /close, /abort for reliable reads).  Prints 'listening on HOST:PORT' once
    it accepts connections.  SIGTERM or Ctrl-C stops it cleanly: open reads go back
    to their queues and every queue is synced and closed.  With --shared, Python
    processes (and ledgerq commands) use the same queues beside it; a 'delete' of a
    queue another process has open is refused.  With --encryption-key-file every
    queue is encrypted at rest with that key (docs/encryption.md).  See docs/server.md.
    """
    from ledgerq.server import ServerConfig, run

    config = ServerConfig(
        data_dir,
        host=host,
        port=port,
        max_item_size=max_item_size,
        max_connections=max_connections,
        max_open_reads=max_open_reads,
        bare_keys=bare_keys,
        allow_shutdown=allow_shutdown,
        threads=threads,
        queue_options=option_overrides(option_pairs),
        shared=shared,
    )

    def ready(bound_host: str, bound_port: int) -> None:
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        line = f"listening on {shown}:{bound_port} (serving {os.path.abspath(data_dir)})"
        try:
            write_line(line)
        except OutputClosed as exc:  # serving needs no stdout: say it where it can be read
            click.echo(f"ledgerq: warning: {exc.why}; {line}", err=True)

    run(config, on_ready=ready)


@click.command("import-kestrel")
@click.argument("src", metavar="SRC", type=click.Path(path_type=str))
@click.argument("dest_queue", metavar="DEST_QUEUE", type=click.Path(path_type=str))
@click.option(
    "--queue",
    "queue_name",
    metavar="NAME",
    help="The Kestrel queue to import (SRC may hold several).",
)
@click.option(
    "--reader",
    "reader_name",
    metavar="NAME",
    help=(
        "Kestrel 3: import only what this reader has not read, for the default reader "
        "(default: every reader, each as the ledgerq reader of its name)."
    ),
)
@click.option(
    "--keep-expired", is_flag=True, help="Also import items whose expiry has passed (with no TTL)."
)
@click.option(
    "--children-as-queues",
    is_flag=True,
    help="Import fan-out children q+x into the queues DEST_QUEUE+x instead of readers x.",
)
@json_option
@options_option
def import_kestrel(
    src: str,
    dest_queue: str,
    queue_name: str | None,
    reader_name: str | None,
    keep_expired: bool,
    children_as_queues: bool,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """Import what a Kestrel queue still holds (journal dir or file SRC) into DEST_QUEUE.

    Reads Kestrel 1.x/2.x journals (replayed op by op; open transactions come first)
    and Kestrel 3 writer and reader files (what the readers have not read; each
    reader becomes the ledgerq reader of its name).  Running it again imports nothing
    twice.  Prints what was imported and skipped.  A torn record at the end of the
    newest journal file (crash residue, which Kestrel cuts too) is cut and reported;
    any other damage makes it exit 1 (everything readable is imported).  See
    docs/kestrel.md.
    """
    from ledgerq.cli._common import progress
    from ledgerq.kestrel import KESTREL3, ImportReport, JournalDamage
    from ledgerq.kestrel import import_kestrel as run_import

    options = option_overrides(option_pairs)
    with progress("importing") as update:
        report = run_import(
            src,
            dest_queue,
            queue=queue_name,
            reader=reader_name,
            keep_expired=keep_expired,
            children_as_queues=children_as_queues,
            on_progress=update,
            **for_one_run(options),  # go to ledgerq.open for DEST_QUEUE
        )

    def damage_json(d: JournalDamage) -> dict[str, Any]:
        return {"file": d.file, "offset": d.offset, "message": d.message}

    def as_dict(r: ImportReport) -> dict[str, Any]:
        return report_json(
            r,
            ignored=[{"file": f, "reason": why} for f, why in r.ignored],
            damage=[damage_json(d) for d in r.damage],
            cut=[damage_json(d) for d in r.cut],
            readers=[{"reader": n, "result": what} for n, what in r.readers],
            children=[as_dict(c) for c in r.children],
            ok=r.ok,
        )

    def describe(r: ImportReport) -> None:
        reader = f", reader {r.reader!r}" if r.reader else ""
        write_line(
            f"imported {r.imported} of {r.found} items of {r.format} queue {r.queue!r}{reader} "
            f"into {r.dest}"
        )
        skipped = [
            f"{n} {why}"
            for n, why in (
                (r.already_imported, "already imported"),
                (r.expired_dropped, "expired (--keep-expired imports them)"),
                (
                    r.read_by_reader,
                    f"already read by {'every' if r.reader is None else 'the'} reader",
                ),
            )
            if n
        ]
        if skipped:
            write_line("skipped: " + ", ".join(skipped))
        if r.expired_kept:
            write_line(f"kept {r.expired_kept} expired items (no TTL)")
        if r.open_transactions:
            write_line(f"restored {r.open_transactions} open transactions as pending messages")
        if r.files:
            write_line("replayed: " + " ".join(r.files))
        for name, why in r.ignored:
            write_line(f"ignored {name}: {why}")
        for name, what in r.readers:
            if r.format == KESTREL3:
                write_line(f"reader {name!r}: {what}")
            else:
                write_line(f"fan-out child {r.queue}+{name}: {what}")
        write_labelled("quirk", r.quirks)
        write_labelled("cut", r.cut)
        write_labelled("damaged", r.damage)
        for child in r.children:
            describe(child)

    def outcome() -> str:
        imported = sum(r.imported for r in (report, *report.children))
        return f"imported {imported} messages into {report.dest}"

    with reporting_if_output_closed(outcome):
        if as_json:
            write_json(as_dict(report))
        else:
            describe(report)
    for r in (report, *report.children):
        for torn in r.cut:
            click.echo(
                f"ledgerq: warning: cut a torn record at the end of the newest journal file "
                f"({torn}): what a Kestrel crash leaves, and Kestrel cuts too",
                err=True,
            )
    if not report.ok:
        damaged = [report, *report.children]
        where = "; ".join(str(d) for r in damaged for d in r.damage)
        raise CliError(
            f"the journal is damaged ({where}); what came before the damage was imported "
            f"({report.imported} messages)"
        )


@click.command()
@click.argument("src_queue", metavar="SRC_QUEUE", type=click.Path(path_type=str))
@click.argument("dest_root", metavar="DEST_ROOT", type=click.Path(path_type=str))
@click.option("--client-id", required=True, metavar="ID", help="Names the copy at the hub.")
@click.option("--follow", is_flag=True, help="Keep shipping new messages as they arrive.")
@click.option(
    "--delete-shipped",
    is_flag=True,
    help="Delete source segments once shipped, fsynced and consumed by every reader.",
)
@click.option(
    "--timeout",
    type=Seconds(),
    metavar="SECONDS",
    help="With --follow: stop after this many seconds without new data (default: never).",
)
@json_option
def ship(
    src_queue: str,
    dest_root: str,
    client_id: str,
    follow: bool,
    delete_shipped: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Copy SRC_QUEUE into DEST_ROOT/<client-id>.<queue-dir-name>/ (read without its lock).

    Sealed segments are copied once, the active one up to its last complete message;
    every message's CRC is checked; an interrupted run resumes where it stopped.
    The copy is a queue directory (ledgerq.follow, Spark, ledgerq.open).  With
    --follow, prints one line (or JSON object) per pass.  See docs/ship.md.
    """
    from ledgerq.cli._common import format_bytes, progress
    from ledgerq.ship import ShipReport, ship_queue

    require_queue(src_queue)

    def as_dict(r: ShipReport) -> dict[str, Any]:
        corrupt = [{"file": f, "offset": o, "length": n} for f, o, n in r.corrupt]
        return report_json(r, corrupt=corrupt)

    def describe(r: ShipReport) -> None:
        if as_json:
            write_json(as_dict(r))
            return
        line = (
            f"shipped {r.messages} messages ({format_bytes(r.bytes)}) to {r.dest}, "
            f"last id {r.last_id}"
        )
        if r.deleted_segments:
            line += (
                f"; deleted {r.deleted_segments} shipped source segments "
                f"({format_bytes(r.deleted_bytes)})"
            )
        write_line(line)

    def on_pass(r: ShipReport) -> None:
        describe(r)

    shipped: list[ShipReport] = []

    def outcome() -> str:
        if not shipped:  # a pass's line could not be printed: ship stopped after it
            return "stopped shipping; what was shipped stays, and the next run resumes"
        r = shipped[-1]
        return f"shipped {r.messages} messages to {r.dest}, last id {r.last_id}"

    with reporting_if_output_closed(outcome):
        with progress("shipping") as update:
            report = ship_queue(
                src_queue,
                dest_root,
                client_id,
                follow=follow,
                delete_shipped=delete_shipped,
                timeout=timeout,
                on_progress=update,
                on_pass=on_pass if follow else None,
            )
        shipped.append(report)
        describe(report)
        if not as_json:
            for name, offset, length in report.corrupt:
                write_line(f"damaged: {name}:{offset}: {length} bytes copied as they are")
            write_labelled("note", report.notes)
