"""``ledgerq dlq``: list, show, requeue and purge dead-lettered messages."""

from __future__ import annotations

import sys
from typing import Any

import click

import ledgerq
from ledgerq import tools
from ledgerq.cli._common import (
    CliError,
    age_of,
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


@click.group()
def dlq() -> None:
    """Inspect and manage the dead-letter queue (QUEUE/dlq)."""


@dlq.command("list")
@queue_argument
@json_option
@options_option
def list_(queue: str, as_json: bool, option_pairs: tuple[str, ...]) -> None:
    """List the dead-lettered messages of QUEUE: id, retries, last failure reason, age.

    Ids are the messages' ids in the dead-letter queue (what show, requeue --id take).
    --json prints one object per line: id, original_id, retries, reason,
    last_failure (ns since the epoch), age (seconds in the DLQ), size.
    """
    with using_existing(queue, option_overrides(option_pairs)) as q:
        messages = _messages(q)
    if as_json:
        for message in messages:
            write_json(_summary_json(message))
        return
    if not messages:
        write_line(f"{printable(queue)}: the dead-letter queue is empty")
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


@dlq.command()
@queue_argument
@click.option(
    "--id",
    "ids",
    multiple=True,
    type=int,
    metavar="ID",
    help="A dead-lettered message to requeue (repeatable).",
)
@click.option(
    "--all",
    "all_",
    is_flag=True,
    help="Requeue every dead-lettered message (what no selection means too).",
)
@click.option(
    "--where-reason",
    metavar="TEXT",
    help="Requeue the messages whose last failure reason contains TEXT (ignoring case).",
)
@json_option
@options_option
def requeue(
    queue: str,
    ids: tuple[int, ...],
    all_: bool,
    where_reason: str | None,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """Move dead-lettered messages of QUEUE back to it as new messages.

    Without --id or --where-reason every dead-lettered message goes back, as
    Queue.requeue_dlq() does (--all says so explicitly).  --id (repeatable) and
    --where-reason choose some; together they requeue the given ids whose reason
    matches.  Each message comes back with a new id, its original payload and headers
    (the dlq.* ones removed), attempts starting again.
    """
    # Requeueing loses nothing (the messages go back to the queue they failed in), so
    # like the API it needs no selection; purge, which deletes, asks for --yes.
    if all_ and (ids or where_reason is not None):
        raise click.UsageError(
            "--all requeues everything; do not combine it with --id or --where-reason"
        )
    all_ = all_ or not (ids or where_reason is not None)
    with using_existing(queue, option_overrides(option_pairs)) as q:
        messages = _messages(q)
        present = {m.id for m in messages}
        missing = sorted(set(ids) - present)
        if missing:
            raise _no_such(queue, missing)
        chosen: list[int] | None
        if all_:
            chosen = None
        else:
            pool = [m for m in messages if not ids or m.id in ids]
            if where_reason is not None:
                needle = where_reason.casefold()
                pool = [
                    m for m in pool if needle in m.headers.get("dlq.failure_reason", "").casefold()
                ]
            chosen = [m.id for m in pool]
        moved = 0 if chosen == [] or not _has_dlq(q) else q.requeue_dlq(chosen)
    write_outcome(
        f"requeued {moved} message{'s' if moved != 1 else ''} to {queue}",
        {"queue": queue, "requeued": moved} if as_json else None,
    )


@dlq.command()
@queue_argument
@click.option(
    "--older-than",
    metavar="DURATION",
    help="Only messages dead-lettered longer ago than this (30s, 10m, 2h, 7d, 1w).",
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@options_option
def purge(
    queue: str,
    older_than: str | None,
    yes: bool,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> int:
    """Delete dead-lettered messages of QUEUE for good.

    Asks for confirmation unless --yes is given; without a terminal to ask on, it
    refuses.
    """
    try:
        min_age = None if older_than is None else parse_duration(older_than)
    except click.BadParameter as exc:
        exc.param_hint = "--older-than"
        raise
    with using_existing(queue, option_overrides(option_pairs)) as q:
        messages = _messages(q)
        if min_age is not None:
            messages = [m for m in messages if age_of(m.timestamp) > min_age]
        if not messages:
            purged = 0
        else:
            n = len(messages)
            what = f"{n} message{'s' if n != 1 else ''} from the dead-letter queue of {queue}"
            if not yes:
                if not sys.stdin.isatty():
                    raise CliError(
                        f"refusing to purge {what} without confirmation: stdin is not a "
                        "terminal; pass --yes"
                    )
                if not click.confirm(f"Purge {what}?", default=False, err=True):
                    click.echo("ledgerq: nothing purged", err=True)
                    return 1
            purged = q.dlq.purge([m.id for m in messages])
    write_outcome(
        f"purged {purged} message{'s' if purged != 1 else ''}",
        {"queue": queue, "purged": purged} if as_json else None,
    )
    return 0
