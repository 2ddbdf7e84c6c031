"""Operator commands over a queue's files: dump, verify, compact."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import click

from ledgerq import tools
from ledgerq.cli._common import (
    format_bytes,
    json_option,
    message_json,
    option_overrides,
    options_option,
    payload_option,
    plural,
    positive_int_option,
    progress,
    queue_argument,
    reporting_if_output_closed,
    require_queue,
    using_existing,
    write_bytes,
    write_json,
    write_labelled,
    write_line,
    write_outcome,
)
from ledgerq.cli._keys import (
    KeyFileError,
    current_key,
    key_file_option,
    key_path_option,
    read_key_file,
)
from ledgerq.segment.encryption import stored_block

__all__ = ["compact", "dump", "rekey", "verify"]

_FLUSH_BYTES = 1 << 16


@click.command()
@queue_argument
@positive_int_option("--from-id", default=1, help="Start at this message id.")
@click.option("-n", "--limit", type=click.IntRange(min=1), help="Stop after this many messages.")
@payload_option
@json_option
@key_file_option
def dump(queue: str, from_id: int, limit: int | None, payload_mode: str, as_json: bool) -> None:
    """Print every message retained in QUEUE's segments as JSON lines.

    A log view, read without the queue's lock (it runs beside the process that owns
    the queue): acked and expired messages still on disk are included.  Each line
    holds id, timestamp, expires_at (ns since the epoch), priority (0 low, 1 medium,
    2 high), headers, payload and payload_encoding.  The output is always JSON;
    --json is accepted for uniformity.  An encrypted queue needs --key-file.
    """
    require_queue(queue)
    if _on_read_only_disk(queue):
        click.echo(
            f"ledgerq: {queue}: read without its lock (as always): the file system is read-only",
            err=True,
        )
    mode = payload_mode.lower()
    pending: list[bytes] = []
    size = 0
    messages = tools.iter_messages(queue, from_id, encryption_key=current_key())
    for count, message in enumerate(messages, 1):
        line = json.dumps(message_json(message, mode, attempts=False), ensure_ascii=False)
        data = line.encode("utf-8") + b"\n"
        pending.append(data)
        size += len(data)
        if size >= _FLUSH_BYTES:
            write_bytes(b"".join(pending))
            pending, size = [], 0
        if limit is not None and count >= limit:
            break
    if pending:
        write_bytes(b"".join(pending))


def _on_read_only_disk(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _problem_json(problem: tools.Problem) -> dict[str, Any]:
    """``file``, ``offset``, ``kind``, ``message``: the fields of the problem."""
    return dataclasses.asdict(problem)


def _report_json(report: tools.VerifyReport) -> dict[str, Any]:
    """Every field of the report (its ``path`` as ``queue``), ``ok`` and the problems."""
    fields = dataclasses.asdict(report)
    return {"queue": fields.pop("path"), "ok": report.ok, **fields}


def _summary(report: tools.VerifyReport) -> str:
    checked = (
        f"{plural(report.segments, 'segment')}, {plural(report.entries, 'entry')}, "
        f"{format_bytes(report.bytes_checked)}, {plural(report.index_files, 'index file')}, "
        f"{plural(report.reader_files, 'reader state file')}"
    )
    if report.ok:
        return f"ok: {report.path} ({checked} checked)"
    return f"{plural(len(report.problems), 'problem')} in {report.path} ({checked} checked)"


@click.command()
@queue_argument
@click.option(
    "--repair",
    is_flag=True,
    help="Take the lock and repair: cut torn tails, rebuild bad indexes; never deletes a "
    "valid entry.  Verifies again afterwards.",
)
@json_option
@key_file_option
def verify(queue: str, repair: bool, as_json: bool) -> int:
    """Check every entry CRC, index, reader state file and meta.json of QUEUE.

    Reports each problem as FILE:OFFSET: KIND: MESSAGE and exits 1 when there is
    one (or a --repair step could not run: a read-only file system, a full disk;
    each is printed as "not repaired: ..."), 0 when everything checks out.  Without
    --repair nothing is written and the lock is not taken, so it can run beside the
    process that owns the queue (a torn tail at the end of the newest segment may then
    be a write in flight).  The dead-letter queue in QUEUE/dlq is checked too.

    An encrypted queue is checked without its key as far as the key is not needed
    (checksums, indexes, journals, meta.json, and that every entry is sealed: one that
    is not is an "unsealed" problem), and a note says so; with --key-file every sealed
    message is authenticated too, and one that fails is a problem.
    """
    require_queue(queue)
    key = current_key()
    failed: list[int] = []
    if key is None and stored_block(queue):
        click.echo(
            f"ledgerq: {queue} is encrypted: checksums, indexes, reader journals, "
            "meta.json and that every entry is sealed were checked; the sealed payloads "
            "were not authenticated (pass --key-file to authenticate them)",
            err=True,
        )
    elif key is not None:
        failed = tools.unauthentic_ids(queue, key)
        for message_id in failed:
            click.echo(
                f"{queue}: sealed: message {message_id} fails authentication (tampered, "
                "moved, or sealed under another key); the queue skips it as corrupt",
                err=True,
            )

    with progress("verifying") as update:
        if repair:
            result = tools.repair(queue, on_progress=update)
            report = result.after
        else:
            report = tools.verify(queue, on_progress=update)
    if not repair:
        _print_report(report, None, as_json)  # read-only: a closed stdout is just that
        return 0 if report.ok and not failed else 1
    summary = _summary(report) + (" after repair" if result.complete else "")
    fixed = plural(len(result.fixed), "problem")
    actions = plural(len(result.actions), "repair action")
    with reporting_if_output_closed(lambda: f"fixed {fixed} ({actions}); {summary}"):
        _print_report(report, result, as_json)
    return 0 if report.ok and result.complete and not failed else 1


def _print_report(
    report: tools.VerifyReport, result: tools.RepairReport | None, as_json: bool
) -> None:
    """Print a verification (and what a repair did, when ``result`` is given)."""
    if as_json:
        value = _report_json(report)
        if result is not None:
            value["repairs"] = list(result.actions)
            value["fixed"] = [_problem_json(p) for p in result.fixed]
            value["found_before_repair"] = [_problem_json(p) for p in result.before.problems]
            value["repaired"] = result.complete
            value["not_done"] = list(result.not_done)
        write_json(value)
        return
    if result is not None:
        write_labelled("fixed", result.fixed)
        write_labelled("repair", result.actions)
        write_labelled("not repaired", result.not_done)
    for problem in report.problems:
        write_line(str(problem))
    if result is None:
        write_line(_summary(report))
    elif result.complete:
        write_line(_summary(report) + " after repair")
    else:
        write_line(_summary(report) + " as the files are: the repair could not run")


@click.command()
@queue_argument
@key_path_option(
    "--old-key-file",
    "The key the queue is encrypted with now (32 raw bytes or 64 hex digits).",
)
@key_path_option("--new-key-file", "The key to encrypt it with from now on (same forms).")
@json_option
def rekey(queue: str, old_key_file: str, new_key_file: str, as_json: bool) -> None:
    """Rotate the encryption key of QUEUE (and of its DLQ).

    Every sealed entry is sealed again under the new key, segment by segment (temp
    file, fsync, rename), then meta.json's key check is switched.  It needs the queue
    alone: it refuses while any process has it open.  Killed half-way, the queue
    refuses to open until rekey is run again with the same two key files, which
    finishes the rotation (docs/encryption.md, "Rotation").
    """
    require_queue(queue)
    try:
        old, new = read_key_file(old_key_file), read_key_file(new_key_file)
    except KeyFileError as exc:
        raise click.BadParameter(str(exc)) from None
    with progress("re-encrypting"):
        rewritten = tools.rekey(queue, old, new)
    text = f"{queue}: re-encrypted under the new key ({plural(rewritten, 'segment')} rewritten)"
    write_outcome(text, {"queue": queue, "segments_rewritten": rewritten} if as_json else None)


@click.command()
@queue_argument
@json_option
@options_option
def compact(queue: str, as_json: bool, option_pairs: tuple[str, ...]) -> None:
    """Apply retention to QUEUE (and its dead-letter queue) now.

    Deletes the segments every reader has consumed - honouring the queue's stored
    retention options (retention_max_age, retention_max_bytes), or those given with
    -o for this run only (not stored; 'ledgerq config --set' stores them) - and
    rewrites each reader's journal as a checkpoint.
    """
    with using_existing(queue, option_overrides(option_pairs)) as q:
        has_dlq = tools.has_dlq(q.path)
        before = q.stats()
        dlq_before = q.dlq.stats() if has_dlq else None
        with progress("compacting") as update:
            update(0, 0)
            q.compact()
            if has_dlq:
                q.dlq.compact()
        after = q.stats()
        dlq_after = q.dlq.stats() if has_dlq else None
    value: dict[str, Any] = {
        "queue": queue,
        "segments_before": before.segments,
        "segments_after": after.segments,
        "disk_bytes_before": before.disk_bytes,
        "disk_bytes_after": after.disk_bytes,
    }
    if dlq_before is not None and dlq_after is not None:
        value["dlq_segments_before"] = dlq_before.segments
        value["dlq_segments_after"] = dlq_after.segments
        value["dlq_disk_bytes_before"] = dlq_before.disk_bytes
        value["dlq_disk_bytes_after"] = dlq_after.disk_bytes
    lines = [
        f"{queue}: {before.segments} -> {plural(after.segments, 'segment')}, "
        f"{format_bytes(before.disk_bytes)} -> {format_bytes(after.disk_bytes)}"
    ]
    if dlq_before is not None and dlq_after is not None:
        lines.append(
            f"{os.path.join(queue, 'dlq')}: {dlq_before.segments} -> "
            f"{plural(dlq_after.segments, 'segment')}, {format_bytes(dlq_before.disk_bytes)} -> "
            f"{format_bytes(dlq_after.disk_bytes)}"
        )
    with reporting_if_output_closed(lambda: "compacted " + "; ".join(lines)):
        if as_json:
            write_json(value)
        else:
            for line in lines:
                write_line(line)
