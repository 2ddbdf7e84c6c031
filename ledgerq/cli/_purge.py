"""``ledgerq purge``: empty a queue of everything not leased (``Queue.purge``)."""

from __future__ import annotations

import click

from ledgerq.cli._common import (
    confirm_purge,
    json_option,
    option_overrides,
    options_option,
    plural,
    queue_argument,
    using_existing,
    write_outcome,
)

__all__ = ["purge"]


@click.command()
@queue_argument
@click.option(
    "--id",
    "ids",
    multiple=True,
    type=click.IntRange(min=1),
    metavar="ID",
    help="Only this message (repeatable); default: every one not leased.",
)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@options_option
def purge(
    queue: str, ids: tuple[int, ...], yes: bool, as_json: bool, option_pairs: tuple[str, ...]
) -> int:
    """Remove the messages of QUEUE that are not leased, for good.

    Ready, delayed, waiting for a retry, held behind their group: all of them, or the
    --id ones.  A leased message stays (its holder's ack still works), and so does the
    dead-letter queue ('ledgerq dlq purge' empties that).  Works beside the processes
    that have the queue open in shared mode.  Asks for confirmation unless --yes is
    given; without a terminal to ask on, it refuses.
    """
    with using_existing(queue, option_overrides(option_pairs)) as q:
        what = (
            f"{plural(len(set(ids)), 'chosen message')} of {queue}"
            if ids
            else f"every message of {queue} that is not leased ({len(q)} pending now)"
        )
        if not confirm_purge(what, yes):
            return 1
        purged = q.purge(list(ids) if ids else None)
    write_outcome(
        f"purged {plural(purged, 'message')} from {queue}",
        {"queue": queue, "purged": purged} if as_json else None,
    )
    return 0
