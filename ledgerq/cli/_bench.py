"""``ledgerq bench``: how fast ledgerq is on this disk, with this queue's options.

The benchmarks of a checkout (``benchmarks/run.py``, ``make bench``) race ledgerq
against its peers; this command answers the question a user has on a machine of their
own: what rates to expect here.  It builds a scratch queue on the disk in question -
beside an existing queue (its stored options, plus ``-o`` overrides) or inside a
directory - runs the common operations against it, prints the rates and removes it.
The queue itself is only read (its options), never written.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import click

import ledgerq
from ledgerq import tools
from ledgerq._options import NEVER_STORED, Options
from ledgerq.cli._common import (
    ByteSize,
    CliError,
    for_one_run,
    json_option,
    option_overrides,
    options_option,
    progress,
    write_json,
    write_line,
)
from ledgerq.segment.readonly import stored_options

__all__ = ["bench"]

_BATCH = 100
_FSYNC_SAMPLES = 50
_FSYNC_BLOCK = 4096
_SYNC_ALWAYS_MAX = 500  # each one waits for an fsync: a few hundred say enough


def _target(path: str) -> tuple[str, dict[str, Any]]:
    """The directory the scratch queue goes in, and the options it starts from."""
    if tools.not_a_queue(path) is None:
        # Read from its files, not opened: an open would write (its lock file's pid, a
        # shared session's files), and this command promises to leave the queue alone.
        known = {f.name for f in dataclasses.fields(Options)} - NEVER_STORED
        options = {k: v for k, v in stored_options(path).items() if k in known}
        return os.path.dirname(os.path.abspath(path)) or ".", options
    if os.path.isdir(path):
        return path, {}
    raise CliError(
        f"{path!r} is neither a queue nor a directory: give a queue (its options and its "
        "disk are measured) or a directory on the disk to measure"
    )


def _rate(count: int, started_ns: int) -> float:
    return count / max((time.perf_counter_ns() - started_ns) / 1e9, 1e-9)


def _fsync_ms(directory: str) -> list[float]:
    """How long a 4 KiB write + fsync takes in ``directory`` (ms, one per sample)."""
    fd, name = tempfile.mkstemp(prefix=".ledgerq-bench-", dir=directory)
    block = b"\0" * _FSYNC_BLOCK
    samples = []
    try:
        for _ in range(_FSYNC_SAMPLES):
            started = time.perf_counter_ns()
            os.write(fd, block)
            os.fsync(fd)
            samples.append((time.perf_counter_ns() - started) / 1e6)
    finally:
        os.close(fd)
        os.unlink(name)
    return samples


def _measure(
    queue_dir: str,
    options: dict[str, Any],
    messages: int,
    size: int,
    shared: bool,
    update: Callable[[int, int], None],
) -> dict[str, float]:
    payload = os.urandom(size)
    rates: dict[str, float] = {}
    total = 4 * messages + min(messages, _SYNC_ALWAYS_MAX)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        update(done * size, total * size)

    with ledgerq.open(queue_dir, shared=shared, **options) as q:
        started = time.perf_counter_ns()
        for _ in range(messages):
            q.enqueue(payload)
        rates["enqueue"] = _rate(messages, started)
        advance(messages)
        started = time.perf_counter_ns()
        while (msg := q.dequeue()) is not None:
            q.ack(msg.id)
        rates["dequeue_ack"] = _rate(messages, started)
        advance(messages)
        started = time.perf_counter_ns()
        for first in range(0, messages, _BATCH):
            q.enqueue_batch([payload] * min(_BATCH, messages - first))
        rates["enqueue_batch"] = _rate(messages, started)
        advance(messages)
        started = time.perf_counter_ns()
        while batch := q.dequeue_batch(_BATCH):
            q.ack_batch([m.id for m in batch])
        rates["dequeue_ack_batch"] = _rate(messages, started)
        advance(messages)
    durable = {**options, "sync": "always"}
    shutil.rmtree(queue_dir)
    with ledgerq.open(queue_dir, shared=shared, **durable) as q:
        count = min(messages, _SYNC_ALWAYS_MAX)
        started = time.perf_counter_ns()
        for _ in range(count):
            q.enqueue(payload)
        rates["enqueue_sync_always"] = _rate(count, started)
        advance(count)
    return rates


_LABELS = {
    "enqueue": "enqueue, one at a time",
    "dequeue_ack": "dequeue + ack, one at a time",
    "enqueue_batch": f"enqueue_batch of {_BATCH}",
    "dequeue_ack_batch": f"dequeue_batch + ack_batch of {_BATCH}",
    "enqueue_sync_always": 'enqueue with sync="always" (an fsync each)',
}


@click.command()
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option(
    "-n",
    "--messages",
    type=click.IntRange(min=100, max=10_000_000),
    default=20_000,
    show_default=True,
    help="Messages per measurement.",
)
@click.option(
    "--size",
    type=ByteSize(),
    default="100",
    show_default=True,
    help="Payload size (e.g. 100, 4KiB).",
)
@click.option("--shared", is_flag=True, help="Open the scratch queue with shared=True.")
@options_option
@json_option
def bench(
    path: str,
    messages: int,
    size: int,
    shared: bool,
    option_pairs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Measure ledgerq on this disk: enqueue, dequeue + ack, batches, fsync.

    PATH is a queue - a scratch queue with its stored options (and -o overrides) is
    made beside it, on the same disk; the queue itself is only read - or a directory
    to make the scratch queue in (default: the current directory).  The scratch queue
    is removed at the end.  The figures of ledgerq against other queues come from
    benchmarks/run.py in a ledgerq checkout (make bench).
    """
    directory, options = _target(path)
    options = {**options, **option_overrides(option_pairs)}
    scratch = tempfile.mkdtemp(prefix=".ledgerq-bench-", dir=directory)
    try:
        queue_dir = os.path.join(scratch, "q")
        with progress("benchmarking") as update:
            try:
                rates = _measure(queue_dir, for_one_run(options), messages, size, shared, update)
            except (TypeError, ledgerq.ConfigError) as exc:
                raise CliError(f"bad option: {exc}") from None
            except ledgerq.MessageTooLargeError as exc:
                raise click.BadParameter(str(exc), param_hint="--size") from None
            fsync = _fsync_ms(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    fsync_median = statistics.median(fsync)
    fsync_worst = max(fsync)
    if as_json:
        write_json(
            {
                "directory": os.path.abspath(directory),
                "messages": messages,
                "size": size,
                "shared": shared,
                "options": {k: v for k, v in options.items() if _plain(v)},
                "rates": {k: round(v, 1) for k, v in rates.items()},
                "fsync_ms": {"median": round(fsync_median, 3), "max": round(fsync_worst, 3)},
            }
        )
        return
    write_line(
        f"ledgerq {ledgerq.__version__} on {os.path.abspath(directory)}: "
        f"{messages:,} messages of {size:,} B, {'shared' if shared else 'exclusive'}"
    )
    width = max(len(label) for label in _LABELS.values())
    for key, rate in rates.items():
        write_line(f"  {_LABELS[key]:<{width}}  {rate:>12,.0f} messages/s")
    write_line(
        f"  {'a 4 KiB write + fsync':<{width}}  {fsync_median:>9.3f} ms median, "
        f"{fsync_worst:.3f} ms at worst ({_FSYNC_SAMPLES} samples)"
    )


def _plain(value: object) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))
