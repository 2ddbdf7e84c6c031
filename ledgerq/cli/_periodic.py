"""``ledgerq periodic``: list, add and remove a queue's periodic jobs."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import click

import ledgerq
from ledgerq.cli._common import (
    CliError,
    Seconds,
    encode_payload,
    json_option,
    option_overrides,
    options_option,
    payload_option,
    printable,
    queue_argument,
    using_existing,
    using_queue,
    write_json,
    write_outcome,
    write_rich,
)
from ledgerq.cli._messages import PRIORITY_NAMES, parse_headers, priority_option

__all__ = ["job_json", "periodic"]


def _utc(ns: int | None) -> str:
    if ns is None:
        return "-"
    moment = _dt.datetime.fromtimestamp(ns / 1e9, _dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def job_json(job: ledgerq.PeriodicJob, payload_mode: str = "auto") -> dict[str, Any]:
    """One periodic job as the JSON of ``periodic list`` and ``stats`` show it."""
    text, encoding = encode_payload(job.payload, payload_mode, 0)
    return {
        "name": job.name,
        "every": job.every,
        "cron": job.cron,
        "schedule": job.schedule,
        "next_run": job.next_run_ns,
        "last_run": job.last_run_ns,
        "priority": job.priority.name.lower(),
        "headers": job.headers,
        "payload": text,
        "payload_encoding": encoding,
    }


def jobs_table(jobs: list[ledgerq.PeriodicJob]) -> Any:
    """The rich table of ``jobs`` (also under ``stats``)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="periodic jobs", title_justify="left")
    for name in ("job", "schedule", "next run", "last run"):
        table.add_column(name)
    for job in jobs:
        table.add_row(
            Text(printable(job.name)),
            Text(printable(job.schedule)),
            _utc(job.next_run_ns),
            _utc(job.last_run_ns),
        )
    return table


@click.group()
def periodic() -> None:
    """List, add and remove the periodic jobs of QUEUE (each enqueues a message per tick)."""


@periodic.command("list")
@queue_argument
@json_option
@payload_option
@options_option
def list_jobs(queue: str, as_json: bool, payload_mode: str, option_pairs: tuple[str, ...]) -> None:
    """Show the periodic jobs of QUEUE: schedule, next and last run (UTC).

    --json prints {"queue": ..., "periodic": [...]}, one object per job: name, every
    (seconds) or cron, schedule, next_run and last_run (ns since the epoch; last_run
    null before the first), priority, headers, payload and payload_encoding.
    """
    with using_existing(queue, option_overrides(option_pairs)) as q:
        jobs = q.periodic()
    if as_json:
        write_json({"queue": queue, "periodic": [job_json(j, payload_mode) for j in jobs]})
        return
    write_rich(jobs_table(jobs))


@periodic.command("add")
@queue_argument
@click.argument("name")
@click.argument("data")
@click.option(
    "--every", type=Seconds(min_open=True), metavar="SECONDS", help="Run every this many seconds."
)
@click.option(
    "--cron", metavar="EXPR", help="Run on a 5-field cron expression, in UTC ('*/5 * * * *')."
)
@click.option(
    "--header", "header_pairs", multiple=True, metavar="KEY=VALUE", help="A header (repeatable)."
)
@priority_option("The messages' priority.")
@json_option
@options_option
def add(
    queue: str,
    name: str,
    data: str,
    every: float | None,
    cron: str | None,
    header_pairs: tuple[str, ...],
    priority: str,
    as_json: bool,
    option_pairs: tuple[str, ...],
) -> None:
    """Add the periodic job NAME to QUEUE (created if missing), or replace it: a
    message with payload DATA is enqueued on every tick, once.

    Give --every or --cron.  The job runs while some process has the queue open
    (a worker, an application, 'ledgerq ui'); ticks missed while none had give one
    message at the next open.
    """
    if (every is None) == (cron is None):
        raise click.UsageError("give exactly one of --every and --cron")
    headers = parse_headers(header_pairs)
    with using_queue(queue, option_overrides(option_pairs)) as q:
        try:
            q.add_periodic(
                name,
                data.encode(),
                every=every,
                cron=cron,
                headers=headers,
                priority=PRIORITY_NAMES[priority.lower()],
            )
        except (TypeError, ValueError) as exc:
            raise CliError(str(exc)) from None
        (job,) = [j for j in q.periodic() if j.name == name]
    write_outcome(
        f"periodic job {printable(name)} of {queue}: {job.schedule}, next run "
        f"{_utc(job.next_run_ns)}",
        {"queue": queue, "added": job_json(job)} if as_json else None,
    )


@periodic.command("remove")
@queue_argument
@click.argument("name")
@json_option
@options_option
def remove(queue: str, name: str, as_json: bool, option_pairs: tuple[str, ...]) -> int:
    """Remove the periodic job NAME from QUEUE (messages it enqueued stay)."""
    with using_existing(queue, option_overrides(option_pairs)) as q:
        removed = q.remove_periodic(name)
    if not removed and not as_json:
        raise CliError(f"no periodic job {printable(name)!r} in {queue}")
    write_outcome(
        f"removed periodic job {printable(name)} from {queue}",
        {"queue": queue, "removed": removed} if as_json else None,
    )
    return 0 if removed else 1
