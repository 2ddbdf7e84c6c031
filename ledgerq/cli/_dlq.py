"""``ledgerq dlq``: list, show, requeue and purge dead-lettered messages."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

import ledgerq
from ledgerq import tools
from ledgerq.cli._common import (
    CliError,
    age_of,
    confirm_purge,
    encode_payload,
    format_age,
    format_bytes,
    json_option,
    message_json,
    option_overrides,
    options_option,
    parse_duration,
    payload_option,
    printable,
    queue_argument,
    using_existing,
    write_bytes,
    write_json,
    write_line,
    write_outcome,
    write_rich,
)

__all__ = ["dlq"]

F = TypeVar("F", bound=Callable[..., Any])


def _has_dlq(q: ledgerq.Queue) -> bool:
    # q.dlq creates the dead-letter queue on first use; looking must not create it.
    return tools.has_dlq(q.path)


def _messages(q: ledgerq.Queue) -> list[ledgerq.Message]:
    """Every message waiting in the dead-letter queue, oldest first."""
    if not _has_dlq(q):
        return []
    dead = q.dlq
    waiting = len(dead)
    return dead.peek(waiting) if waiting else []


def _int_header(message: ledgerq.Message, name: str) -> int | None:
    value = message.headers.get(name, "")
    return int(value) if value.isdigit() else None


def _summary_json(message: ledgerq.Message) -> dict[str, Any]:
    return {
        "id": message.id,
        "original_id": _int_header(message, "dlq.original_id"),
        "retries": _int_header(message, "dlq.retry_count"),
        "reason": message.headers.get("dlq.failure_reason", ""),
        "last_failure": _int_header(message, "dlq.last_failure"),
        "age": round(age_of(message.timestamp), 3),
        "size": len(message.payload),
    }


def _no_such(queue: str, ids: list[int]) -> CliError:
    listed = ", ".join(str(i) for i in ids)
    noun = "message" if len(ids) == 1 else "messages"
    return CliError(f"no {noun} {listed} in the dead-letter queue of {queue}")


def filter_options(func: F) -> F:
    """The options that choose dead letters, the same on list, requeue and purge."""
    decorators = [
        click.option(
            "--reason",
            metavar="REGEX",
            help="Only messages whose last failure reason matches REGEX (searched, ignoring case).",
        ),
        click.option(
            "--older-than",
            metavar="DURATION",
            help="Only messages dead-lettered longer ago than this (30s, 10m, 2h, 7d, 1w).",
        ),
        click.option(
            "--header",
            "header_conditions",
            multiple=True,
            metavar="KEY=VALUE",
            help="Only messages with this header value (repeatable: all must hold).",
        ),
        click.option(
            "--attempts-at-least",
            type=click.IntRange(min=0),
            metavar="N",
            help="Only messages that failed at least N deliveries (dlq.retry_count).",
        ),
    ]
    for decorate in reversed(decorators):
        func = decorate(func)
    return func


def _filter(
    reason: str | None,
    older_than: str | None,
    header_conditions: tuple[str, ...],
    attempts_at_least: int | None,
    *,
    where_reason: str | None = None,
) -> tools.DeadLetterFilter:
    """The filter the options describe; a bad value is a usage error naming its option."""
    min_age = None
    if older_than is not None:
        try:
            min_age = parse_duration(older_than)
        except click.BadParameter as exc:
            exc.param_hint = "--older-than"
            raise
    headers = []
    for text in header_conditions:
        try:
            headers.append(tools.parse_header_condition(text))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--header") from None
    if reason is not None and where_reason is not None:
        raise click.UsageError("give --reason or --where-reason, not both")
    try:
        return tools.DeadLetterFilter(
            reason=reason if where_reason is None else where_reason,
            regex=where_reason is None,
            older_than=min_age,
            headers=tuple(headers),
            attempts_at_least=attempts_at_least,
        )
    except ValueError as exc:
        hint = "--reason" if where_reason is None else "--where-reason"
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _matching(
    messages: list[ledgerq.Message], chosen: tools.DeadLetterFilter
) -> list[ledgerq.Message]:
    if chosen.is_empty:
        return messages
    now = time.time_ns()
    return [m for m in messages if chosen.matches(m, now)]


@click.group()
def dlq() -> None:
    """Inspect and manage the dead-letter queue (QUEUE/dlq)."""


@dlq.command("list")
@queue_argument
@filter_options
@json_option
@options_option
def list_(
    queue: str,
    reason: str | None,
    older_than: str | None,
    header_conditions: tuple[str, ...],
    attempts_at_least: int | None,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """List the dead-lettered messages of QUEUE: id, retries, last failure reason, age.

    Ids are the messages' ids in the dead-letter queue (what show, requeue --id take).
    --reason, --older-than, --header and --attempts-at-least list only the messages
    that meet all of them.  --json prints one object per line: id, original_id,
    retries, reason, last_failure (ns since the epoch), age (seconds in the DLQ), size.
    """
    chosen = _filter(reason, older_than, header_conditions, attempts_at_least)
    with using_existing(queue, option_overrides(option_pairs)) as q:
        messages = _matching(_messages(q), chosen)
    if as_json:
        for message in messages:
            write_json(_summary_json(message))
        return
    if not messages:
        what = "is empty" if chosen.is_empty else f"has no message with {chosen.describe()}"
        write_line(f"{printable(queue)}: the dead-letter queue {what}")
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(f"dead-letter queue of {printable(queue)}"), title_justify="left")
    table.add_column("id", justify="right")
    table.add_column("original id", justify="right")
    table.add_column("retries", justify="right")
    table.add_column("age", justify="right")
    table.add_column("size", justify="right")
    table.add_column("last failure reason")
    for message in messages:
        info = _summary_json(message)
        table.add_row(
            str(message.id),
            str(info["original_id"] or "-"),
            str(info["retries"] if info["retries"] is not None else "-"),
            format_age(info["age"]),
            format_bytes(info["size"]),
            Text(printable(info["reason"])),
        )
    write_rich(table)


@dlq.command()
@queue_argument
@click.argument("message_id", metavar="ID", type=int)
@json_option
@payload_option
@options_option
def show(
    queue: str,
    message_id: int,
    as_json: bool,
    payload_mode: str,
    option_pairs: tuple[str, ...],
) -> None:
    """Show dead-lettered message ID of QUEUE with all its headers and its payload."""
    with using_existing(queue, option_overrides(option_pairs)) as q:
        found = [m for m in _messages(q) if m.id == message_id]
    if not found:
        raise _no_such(queue, [message_id])
    message = found[0]
    if as_json:
        value = message_json(message, payload_mode.lower(), attempts=False)
        value.update({k: v for k, v in _summary_json(message).items() if k != "id"})
        write_json(value)
        return
    info = _summary_json(message)
    rows = [
        ("id", str(message.id)),
        ("original id", str(info["original_id"] or "-")),
        ("retries", str(info["retries"] if info["retries"] is not None else "-")),
        ("last failure", printable(info["reason"]) or "-"),
        ("in the DLQ for", format_age(info["age"])),
        ("priority", message.priority.name.lower()),
        ("expires at", "-" if message.expires_at is None else str(message.expires_at)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, text in rows:
        write_line(f"{name:<{width}}  {text}")
    write_line("headers:")
    for key, header in sorted(message.headers.items()):
        write_line(f"  {printable(key)}: {printable(header)}")
    payload, encoding = encode_payload(message.payload, payload_mode.lower(), message.id)
    shown = printable(payload, keep="\n\t")
    escaped = " with control characters escaped" if shown != payload else ""
    write_line(f"payload ({len(message.payload)} bytes, {encoding}{escaped}):")
    write_bytes(shown.encode("utf-8") + b"\n")


def _ids_option(verb: str) -> Callable[[F], F]:
    return click.option(
        "--id",
        "ids",
        multiple=True,
        type=int,
        metavar="ID",
        help=f"A dead-lettered message to {verb} (repeatable).",
    )


def _chosen_ids(
    queue: str, q: ledgerq.Queue, ids: tuple[int, ...], chosen: tools.DeadLetterFilter
) -> list[int]:
    """The DLQ ids that ``--id`` and the filter pick (every id given must be there)."""
    messages = _messages(q)
    present = {m.id for m in messages}
    missing = sorted(set(ids) - present)
    if missing:
        raise _no_such(queue, missing)
    pool = [m for m in messages if not ids or m.id in ids]
    return [m.id for m in _matching(pool, chosen)]


@dlq.command()
@queue_argument
@_ids_option("requeue")
@click.option(
    "--all",
    "all_",
    is_flag=True,
    help="Requeue every dead-lettered message (what no selection means too).",
)
@filter_options
@click.option(
    "--where-reason",
    metavar="TEXT",
    help="Only messages whose last failure reason contains TEXT (ignoring case).",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    metavar="N",
    help="Requeue at most N messages per second, paced (default: all at once).",
)
@click.option(
    "--delay",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Deliver the requeued messages no earlier than SECONDS from now.",
)
@json_option
@options_option
def requeue(
    queue: str,
    ids: tuple[int, ...],
    all_: bool,
    reason: str | None,
    older_than: str | None,
    header_conditions: tuple[str, ...],
    attempts_at_least: int | None,
    where_reason: str | None,
    rate: float | None,
    delay: float | None,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """Move dead-lettered messages of QUEUE back to it as new messages.

    Without --id or a filter every dead-lettered message goes back, as
    Queue.requeue_dlq() does (--all says so explicitly).  --id (repeatable) and the
    filters (--reason, --older-than, --header, --attempts-at-least; --where-reason
    TEXT is --reason without regular expressions) choose some; together they requeue
    the given ids that match.  Each message comes back with a new id, its original
    payload and headers (the dlq.* ones removed), attempts starting again.  --rate N
    paces the moves at N messages per second; --delay S holds them back S seconds.
    """
    chosen = _filter(
        reason, older_than, header_conditions, attempts_at_least, where_reason=where_reason
    )
    # Requeueing loses nothing (the messages go back to the queue they failed in), so
    # like the API it needs no selection; purge, which deletes, asks for --yes.
    if all_ and (ids or not chosen.is_empty):
        raise click.UsageError("--all requeues everything; do not combine it with --id or a filter")
    with using_existing(queue, option_overrides(option_pairs)) as q:
        if rate is None and not ids and chosen.is_empty:
            # Everything, as the API does (q.dlq would create a missing DLQ: not looked at).
            moved = tools.requeue_dead_letters(q, None, delay=delay) if _has_dlq(q) else 0
        else:
            picked = _chosen_ids(queue, q, ids, chosen)  # an id not there is an error
            moved = tools.paced(
                picked, rate, lambda part: tools.requeue_dead_letters(q, part, delay=delay)
            )
    write_outcome(
        f"requeued {moved} message{'s' if moved != 1 else ''} to {queue}",
        {"queue": queue, "requeued": moved} if as_json else None,
    )


@dlq.command()
@queue_argument
@_ids_option("purge")
@filter_options
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@options_option
def purge(
    queue: str,
    ids: tuple[int, ...],
    reason: str | None,
    older_than: str | None,
    header_conditions: tuple[str, ...],
    attempts_at_least: int | None,
    yes: bool,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> int:
    """Delete dead-lettered messages of QUEUE for good.

    All of them, or those --id and the filters (--reason, --older-than, --header,
    --attempts-at-least) choose.  Asks for confirmation unless --yes is given;
    without a terminal to ask on, it refuses.
    """
    chosen = _filter(reason, older_than, header_conditions, attempts_at_least)
    with using_existing(queue, option_overrides(option_pairs)) as q:
        picked = _chosen_ids(queue, q, ids, chosen)
        if not picked:
            purged = 0
        else:
            n = len(picked)
            what = f"{n} message{'s' if n != 1 else ''} from the dead-letter queue of {queue}"
            if not confirm_purge(what, yes):
                return 1
            purged = q.dlq.purge(picked)
    write_outcome(
        f"purged {purged} message{'s' if purged != 1 else ''}",
        {"queue": queue, "purged": purged} if as_json else None,
    )
    return 0
