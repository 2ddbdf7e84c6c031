"""Commands that move and show messages: enqueue, dequeue, peek, stats."""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, TypeVar

import click

import ledgerq
from ledgerq import StorageError, tools
from ledgerq.cli import _readonly
from ledgerq.cli._common import (
    OutputClosed,
    OutputClosedError,
    Seconds,
    age_of,
    format_age,
    format_bytes,
    ids_text,
    json_option,
    message_json,
    option_overrides,
    options_option,
    payload_option,
    plural,
    positive_int_option,
    printable,
    queue_argument,
    reporting_if_output_closed,
    timeout_option,
    using_existing,
    using_queue,
    write_bytes,
    write_json,
    write_line,
    write_rich,
)
from ledgerq.cli._keys import current_key

__all__ = [
    "PRIORITY_NAMES",
    "dequeue",
    "enqueue",
    "parse_headers",
    "peek",
    "priority_option",
    "stats",
]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_EMPTY = 3  # dequeue found no message in time (1 is taken by errors, 2 by usage errors)
_BATCH = 1000  # lines enqueued per write when the input is a regular file
PRIORITY_NAMES = {p.name.lower(): p for p in ledgerq.Priority}


def priority_option(help: str) -> Callable[[F], F]:  # noqa: A002 - click's name for it
    """``--priority low|medium|high`` (any case; medium by default): a key of
    :data:`PRIORITY_NAMES`."""
    return click.option(
        "--priority",
        type=click.Choice(list(PRIORITY_NAMES), case_sensitive=False),
        default="medium",
        show_default=True,
        help=help,
    )


def parse_headers(pairs: tuple[str, ...]) -> dict[str, str] | None:
    """The headers of ``--header KEY=VALUE`` options (None for none)."""
    headers: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--header")
        headers[key] = value
    return headers or None


def _check_utf8_size(text: str | None, max_bytes: int, option: str) -> None:
    """Refuse ``text`` (the value of ``option``, if given) unless it is 1 to ``max_bytes``
    bytes of UTF-8, as ``enqueue`` would."""
    if text is None:
        return
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        size = 0
    if not 0 < size <= max_bytes:
        raise click.BadParameter(f"must be 1 to {max_bytes} bytes of UTF-8", param_hint=option)


def _strip_eol(line: bytes) -> bytes:
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    return line


def _is_regular(stream: IO[bytes]) -> bool:
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError):
        return False


def _line_batches(stream: IO[bytes]) -> Iterator[list[bytes]]:
    """Lines of ``stream``; batched from a regular file, one at a time from a pipe or tty.

    From a pipe each line is enqueued as soon as it arrives (``tail -f log |
    ledgerq enqueue q --lines`` works); from a file, a thousand lines go in one write.
    """
    size = _BATCH if _is_regular(stream) else 1
    batch: list[bytes] = []
    for line in stream:
        batch.append(_strip_eol(line))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _split_lines(data: bytes) -> Iterator[list[bytes]]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    for start in range(0, len(lines), _BATCH):
        yield [line.removesuffix(b"\r") for line in lines[start : start + _BATCH]]


@click.command()
@queue_argument
@click.argument("data", required=False)
@click.option(
    "--file",
    "file_path",
    type=click.Path(exists=True, dir_okay=False, path_type=str),
    help="Read the payload from this file instead of DATA or stdin.",
)
@click.option("--lines", is_flag=True, help="One message per input line (the newline removed).")
@click.option(
    "--header",
    "header_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A message header (repeatable).",
)
@priority_option("Delivery priority (used when the queue has priorities on).")
@click.option(
    "--ttl",
    type=Seconds(min_open=True),
    metavar="SECONDS",
    help="Drop the message if it is not delivered within this time (a finite number > 0).",
)
@click.option(
    "--delay",
    type=Seconds(),
    metavar="SECONDS",
    help="Do not deliver the message before this many seconds from now.",
)
@click.option(
    "--group",
    metavar="NAME",
    help="Message group: its messages are delivered one at a time, in order "
    "(1 to 255 bytes of UTF-8).",
)
@click.option(
    "--unique-key",
    metavar="KEY",
    help="A unique job: while the message enqueued with this key is not finished (acked, "
    "dead-lettered, expired), add nothing and print its id (1 to 1024 bytes of UTF-8).",
)
@timeout_option(
    "In a bounded queue (max_pending, max_pending_bytes), wait up to this long for "
    "room ('inf' waits forever); 0 fails at once when the queue is full."
)
@options_option
def enqueue(
    queue: str,
    data: str | None,
    file_path: str | None,
    lines: bool,
    header_pairs: tuple[str, ...],
    priority: str,
    ttl: float | None,
    delay: float | None,
    group: str | None,
    unique_key: str | None,
    timeout: float,
    option_pairs: tuple[str, ...],
) -> None:
    """Add messages to QUEUE (created if missing); print their ids.

    The payload is DATA, the content of --file, or stdin when DATA is omitted or
    '-'.  With --lines every line is a message of its own.  If stdout is closed
    (or its pipe's reader left), it stops, says on stderr which ids it enqueued,
    and exits 141.  A full bounded queue fails the command (exit 1, the ids
    enqueued so far printed) unless --timeout lets it wait for room.
    """
    wait = None if math.isinf(timeout) else timeout
    if file_path is not None and data not in (None, "-"):
        raise click.UsageError("give DATA or --file, not both")
    headers = parse_headers(header_pairs)
    level = PRIORITY_NAMES[priority.lower()]
    # Checked before the queue is opened (or created).
    _check_utf8_size(group, 255, "--group")
    _check_utf8_size(unique_key, 1024, "--unique-key")
    options = option_overrides(option_pairs)
    enqueued: list[int] = []

    def done() -> str:
        if not enqueued:
            return "nothing was enqueued"
        return f"enqueued {plural(len(enqueued), 'message')} ({ids_text(enqueued)}) to {queue}"

    with using_queue(queue, options) as q, reporting_if_output_closed(done):
        for batch in _batches(data, file_path, lines):
            if len(batch) == 1:
                ids = [
                    q.enqueue(
                        batch[0],
                        headers=headers,
                        priority=level,
                        ttl=ttl,
                        delay=delay,
                        group=group,
                        timeout=wait,
                        unique_key=unique_key,
                    )
                ]
            else:
                items = [
                    ledgerq.Item(
                        p,
                        headers=headers,
                        priority=level,
                        ttl=ttl,
                        delay=delay,
                        group=group,
                        unique_key=unique_key,
                    )
                    for p in batch
                ]
                ids = q.enqueue_batch(items, timeout=wait)
            enqueued.extend(ids)
            write_bytes(b"".join(b"%d\n" % i for i in ids))


def _batches(data: str | None, file_path: str | None, lines: bool) -> Iterator[list[bytes]]:
    """The payloads to enqueue, in batches that each go in one write."""
    if data not in (None, "-"):
        assert data is not None
        payload = os.fsencode(data)  # the argument's bytes, even when not valid UTF-8
        yield from _split_lines(payload) if lines else [[payload]]
    elif file_path is not None:
        with open(file_path, "rb") as stream:
            yield from _stream_batches(stream, lines)
    else:
        yield from _stream_batches(sys.stdin.buffer, lines)


def _stream_batches(stream: IO[bytes], lines: bool) -> Iterator[list[bytes]]:
    if lines:
        yield from _line_batches(stream)
    else:
        yield [stream.read()]


def _reader(q: ledgerq.Queue, name: str | None) -> ledgerq.Queue | ledgerq.Reader:
    if name is None:
        return q
    try:
        return q.reader(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--reader") from None


def _check_ready_fd(ctx: click.Context, param: click.Parameter, fd: int | None) -> int | None:
    """Refuse a --ready-fd that is not open, before the queue is touched."""
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            raise click.BadParameter(
                f"{fd} is not an open file descriptor (pass one, e.g. '3>FILE' in a shell)",
                param_hint="--ready-fd",
            ) from None
    return fd


def _notify_ready(fd: int) -> None:
    """Write the readiness line to ``fd`` and close it (s6's notification-fd protocol).

    Called with the queue open and the SIGTERM handler in place, just before the first
    look for messages: a signal sent once the line was read stops the command cleanly
    (exit 130/143, the queue closed), whether or not the wait itself had started.
    """
    try:
        os.write(fd, b"ready\n")  # 6 bytes: one write, atomic on a pipe
    except BrokenPipeError:
        pass  # nobody listens any more; the command goes on all the same
    finally:
        os.close(fd)


@click.command()
@queue_argument
@click.option(
    "--no-ack",
    is_flag=True,
    help="Do not ack: the message stays leased until the command exits, then comes back "
    "(attempts + 1; a lost lease counts as a failed delivery).",
)
@timeout_option("Wait up to this long for a message ('inf' waits forever).")
@click.option("--reader", "reader_name", metavar="NAME", help="Consume as this named reader.")
@click.option(
    "--ready-fd",
    type=click.IntRange(min=3),
    metavar="FD",
    callback=_check_ready_fd,
    help="Once the queue is open and the command starts to look for messages, write "
    "'ready' and a newline to this inherited file descriptor and close it (for scripts "
    "and supervisors that must not signal or enqueue before the wait began).",
)
@click.option(
    "-n",
    "--count",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Take up to this many messages.",
)
@json_option
@payload_option
@options_option
def dequeue(
    queue: str,
    no_ack: bool,
    timeout: float,
    reader_name: str | None,
    ready_fd: int | None,
    count: int,
    as_json: bool,
    payload_mode: str,
    option_pairs: tuple[str, ...],
) -> int:
    """Take the next message of QUEUE, print its payload and ack it.

    Prints each payload followed by a newline (--json: one JSON object per line with
    id, timestamp, expires_at, priority, attempts, headers, payload, payload_encoding).
    Each message is acked once its output was written (flushed); messages not
    printed - the output closed, Ctrl-C, SIGTERM - are given back with
    Queue.release, not counted as failed deliveries, and a closed output exits 141
    after saying on stderr what was acked and given back.  Exits 3 when no message
    came within --timeout.  --ready-fd FD tells a script when the wait has begun.
    """
    options = option_overrides(option_pairs)
    with using_existing(queue, options) as q:
        source = _reader(q, reader_name)
        if ready_fd is not None:
            _notify_ready(ready_fd)
        messages = source.dequeue_batch(count, None if math.isinf(timeout) else timeout)
        if not messages:
            click.echo(f"ledgerq: no message in {queue}", err=True)
            return EXIT_EMPTY
        mode = payload_mode.lower() if as_json else None
        _deliver(source, messages, mode=mode, ack=not no_ack)
    return 0


def _deliver(
    source: ledgerq.Queue | ledgerq.Reader,
    messages: Sequence[ledgerq.Message],
    *,
    mode: str | None,
    ack: bool,
) -> None:
    """Print each message (JSON in payload ``mode``, else the payload), then ack it.

    Whatever was not printed when this stops early goes back with ``release``: the
    consumer never saw it, so it is no failed delivery.
    """
    printed = 0
    try:
        for message in messages:
            if mode is None:
                write_bytes(message.payload + b"\n")
            else:
                write_json(message_json(message, mode))
            printed += 1
            if ack:
                source.ack(message.id)
    except OutputClosed as exc:
        unreleased = _give_back(source, messages[printed:])
        raise OutputClosedError(
            f"{exc.why}; {_delivery_outcome(printed, len(messages), unreleased, ack=ack)}"
        ) from None
    except BaseException:  # Ctrl-C, SIGTERM, a failed ack or payload encoding
        _give_back(source, messages[printed:])
        raise


def _give_back(source: ledgerq.Queue | ledgerq.Reader, rest: Sequence[ledgerq.Message]) -> int:
    """Release ``rest``; return how many could not be (they come back as failures)."""
    failed = 0
    for message in rest:
        try:
            source.release(message.id)
        except (ledgerq.LedgerQError, OSError):
            failed += 1
    return failed


def _delivery_outcome(printed: int, total: int, unreleased: int, *, ack: bool) -> str:
    done = "printed and acked" if ack else "printed and left leased (--no-ack)"
    text = f"of {plural(total, 'message')} taken, {printed} {done}"
    rest = total - printed
    if rest:
        text += f", {rest - unreleased} not printed and given back (no failed delivery)"
    if unreleased:
        text += f", {unreleased} could not be given back (they come back as failed deliveries)"
    return text


def _preview(payload: bytes, width: int = 48) -> str:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(payload)} bytes, binary>"
    text = printable(text)
    return text if len(text) <= width else text[: width - 1] + "…"


@click.command()
@queue_argument
@positive_int_option("-n", "count", default=10, help="How many messages to show.")
@json_option
@payload_option
@options_option
def peek(
    queue: str, count: int, as_json: bool, payload_mode: str, option_pairs: tuple[str, ...]
) -> None:
    """Show the next messages of QUEUE without leasing them.

    --json prints one JSON object per line (as dequeue --json).  On a read-only file
    system the queue is read without its lock (a note on stderr says so).
    """
    note = None
    try:
        with using_existing(queue, option_overrides(option_pairs)) as q:
            messages = q.peek(count)
    except StorageError as exc:
        if not _readonly.is_read_only_error(exc):
            raise
        messages, note = _readonly.peek(queue, count, current_key()), _readonly.NOTE
    if note is not None:
        click.echo(f"ledgerq: {queue}: {note}", err=True)
    if as_json:
        for message in messages:
            write_json(message_json(message, payload_mode.lower()))
        return
    if not messages:
        write_line(f"{printable(queue)}: no pending message")
        return
    from rich.table import Table
    from rich.text import Text

    title = f"next {len(messages)} of {printable(queue)}"
    if note is not None:
        title += " (read without its lock: read-only file system)"
    table = Table(title=Text(title), title_justify="left")
    for name in ("id", "age", "priority", "attempt", "size"):
        table.add_column(name, justify="right" if name != "priority" else "left")
    with_groups = any(message.group is not None for message in messages)
    if with_groups:
        table.add_column("group")
    table.add_column("headers")
    table.add_column("payload")
    for message in messages:
        table.add_row(
            str(message.id),
            format_age(age_of(message.timestamp)),
            message.priority.name.lower(),
            str(message.attempts),
            format_bytes(len(message.payload)),
            *((Text(printable(message.group or "")),) if with_groups else ()),
            Text(printable(", ".join(f"{k}={v}" for k, v in message.headers.items()))),
            Text(_preview(message.payload)),
        )
    write_rich(table)


def _dlq_pending(q: ledgerq.Queue) -> int:
    if not tools.has_dlq(q.path):
        return 0  # never look through q.dlq here: it would create the DLQ
    return len(q.dlq)


@click.command()
@queue_argument
@json_option
@options_option
def stats(queue: str, as_json: bool, option_pairs: tuple[str, ...]) -> None:
    """Show the figures of QUEUE and of each of its readers.

    --json prints one object: pending, in_flight, enqueued, acked, nacked,
    dead_lettered, expired, duplicates, dropped, corrupt_skipped, lost, segments,
    disk_bytes (integers), oldest_pending_age (seconds), next_id, readers (an object
    per reader), dlq (messages waiting in the dead-letter queue), periodic (the
    periodic jobs, as 'ledgerq periodic list --json' shows them), rate_limit (the
    worker pools' start-rate limit: limit, count, period, starts, current_rate; null
    without one) and progress (what the handlers of in-flight messages reported with
    ledgerq.workers.progress: reader, id, attempts, fraction, note, updated).  On a read-only
    file system the queue is read without its lock, and the output says so (--json:
    read_without_lock).
    """
    note = None
    try:
        with using_existing(queue, option_overrides(option_pairs)) as q:
            figures = q.stats()
            dlq = _dlq_pending(q)
            jobs: list[ledgerq.PeriodicJob] | None = q.periodic()
    except StorageError as exc:
        if not _readonly.is_read_only_error(exc):
            raise
        figures, dlq, note = _readonly.stats(queue), _readonly.dlq_pending(queue), _readonly.NOTE
        jobs = None  # (not read without the lock)
    from ledgerq.cli._periodic import job_json, jobs_table
    from ledgerq.cli._pool import pool_json, progress_rows, rate_limit_text

    if as_json:
        value = dataclasses.asdict(figures)
        for reader in value["readers"].values():
            reader.pop("name", None)
        value["dlq"] = dlq
        if jobs is not None:
            value["periodic"] = [job_json(job) for job in jobs]
        value.update(pool_json(queue))
        if note is not None:
            value["read_without_lock"] = note
        write_json({"queue": queue, **value})
        return
    from rich.table import Table
    from rich.text import Text

    summary = Table.grid(padding=(0, 2))
    summary.add_column()
    summary.add_column(justify="right")
    rows: list[tuple[str, str | Text]] = [
        ("queue", Text(printable(queue))),
        ("pending", str(figures.pending)),
        ("delayed", str(figures.delayed)),
        ("in flight", str(figures.in_flight)),
        ("dead-letter queue", str(dlq)),
        ("oldest pending", format_age(figures.oldest_pending_age)),
        ("enqueued", str(figures.enqueued)),
        ("expired", str(figures.expired)),
        ("duplicates", str(figures.duplicates)),
        ("dropped", str(figures.dropped)),
        ("corrupt skipped", str(figures.corrupt_skipped)),
        ("lost", str(figures.lost)),
        ("disk", f"{format_bytes(figures.disk_bytes)} in {plural(figures.segments, 'segment')}"),
        ("next id", str(figures.next_id)),
    ]
    limit = rate_limit_text(queue)
    if limit is not None:
        rows.append(("rate limit", limit))
    for name, value_text in rows:
        summary.add_row(name, value_text)
    readers = Table(title="readers", title_justify="left")
    readers.add_column("reader")
    # A delayed column only when a reader has delayed messages: the table stays narrow.
    with_delayed = any(reader.delayed for reader in figures.readers.values())
    columns = ("pending", "delayed", "in flight", "acked", "nacked", "to DLQ", "expired", "oldest")
    for name in columns:
        if name != "delayed" or with_delayed:
            readers.add_column(name, justify="right")
    for name, reader in sorted(figures.readers.items()):
        delayed = (str(reader.delayed),) if with_delayed else ()
        readers.add_row(
            Text(name),
            str(reader.pending),
            *delayed,
            str(reader.in_flight),
            str(reader.acked),
            str(reader.nacked),
            str(reader.dead_lettered),
            str(reader.expired),
            format_age(reader.oldest_pending_age),
        )
    tables = [summary, readers]
    reported = progress_rows(queue)
    if reported:
        progress = Table(title="in-flight progress", title_justify="left")
        for name in ("reader", "id", "done", "note"):
            progress.add_column(name, justify="right" if name in ("id", "done") else "left")
        for reader_name, message_id, done, text in reported:
            progress.add_row(Text(reader_name), message_id, done, Text(printable(text)))
        tables.append(progress)
    if jobs:
        tables.append(jobs_table(jobs))
    if note is not None:
        write_rich(Text(f"note: {note}"), *tables)
    else:
        write_rich(*tables)
