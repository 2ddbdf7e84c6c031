"""What the commands share: errors, opening queues, option parsing, output, progress."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

import ledgerq
from ledgerq import tools
from ledgerq.cli._keys import current_key, key_file_option

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

__all__ = [
    "confirm_purge",
    "EXIT_OUTPUT_CLOSED",
    "PAYLOAD_MODES",
    "CliError",
    "OutputClosed",
    "OutputClosedError",
    "Seconds",
    "age_of",
    "encode_payload",
    "for_one_run",
    "format_age",
    "format_bytes",
    "ids_text",
    "json_option",
    "message_json",
    "option_overrides",
    "options_option",
    "parse_duration",
    "payload_option",
    "plural",
    "positive_int_option",
    "printable",
    "progress",
    "queue_argument",
    "report_json",
    "reporting_if_output_closed",
    "require_queue",
    "stderr_console",
    "stdout_console",
    "timeout_option",
    "using_existing",
    "using_queue",
    "write_bytes",
    "write_json",
    "write_labelled",
    "write_line",
    "write_outcome",
    "write_rich",
]

F = TypeVar("F", bound=Callable[..., Any])

PAYLOAD_MODES = ("auto", "utf8", "base64")
EXIT_ERROR = 1
EXIT_USAGE = 2
# stdout went away: what a shell reports for a command killed by SIGPIPE (128 + 13),
# so `set -o pipefail` scripts see what they see with any other tool.
EXIT_OUTPUT_CLOSED = 141


class CliError(click.ClickException):
    """A failure to report as one ``ledgerq: error: ...`` line; exits 1."""

    exit_code = EXIT_ERROR


class OutputClosed(Exception):
    """stdout cannot take output any more: its reader went away, or it was closed.

    Raised by the ``write_*`` helpers.  A command that changed something catches it
    (:func:`reporting_if_output_closed`, :func:`write_outcome`) and says on stderr what
    it did; one that only reads lets it through, and exits 141 without a word for a
    broken pipe (``ledgerq dump q | head`` is normal use).
    """

    def __init__(self, why: str, *, stdout_closed: bool) -> None:
        super().__init__(why)
        self.why = why
        self.stdout_closed = stdout_closed  # else: a broken pipe


class OutputClosedError(CliError):
    """stdout went away after the command did something, which the message says; exits 141."""

    exit_code = EXIT_OUTPUT_CLOSED


# ---------------------------------------------------------------------- arguments


def queue_argument(func: F) -> F:
    """The QUEUE argument every queue command takes first.

    click checks nothing (``readable=False``): an unreadable queue is an error of
    access, reported as such by :func:`require_queue` (exit 1), not a usage error.
    """
    path = click.Path(path_type=str, readable=False)
    return click.argument("queue", metavar="QUEUE", type=path)(func)


def json_option(func: F) -> F:
    """``--json``: machine-readable output."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON instead of a human-readable form."
    )(func)


def payload_option(func: F) -> F:
    """``--payload auto|utf8|base64``: how JSON output carries payload bytes."""
    return click.option(
        "--payload",
        "payload_mode",
        type=click.Choice(PAYLOAD_MODES, case_sensitive=False),
        default="auto",
        show_default=True,
        help="How JSON carries payloads: UTF-8 text, base64, or auto (text when valid "
        "UTF-8, else base64); the payload_encoding field says which.",
    )(func)


def positive_int_option(
    *decls: str,
    default: int,
    help: str,  # noqa: A002 - click's name for it
    metavar: str | None = None,
) -> Callable[[F], F]:
    """An option taking an int >= 1, with a default shown in ``--help``."""
    return click.option(
        *decls,
        type=click.IntRange(min=1),
        default=default,
        show_default=True,
        metavar=metavar,
        help=help,
    )


def options_option(func: F) -> F:
    """``-o NAME=VALUE``: a queue option for ``ledgerq.open``, this command only (repeatable);
    and ``--key-file PATH``, the key of an encrypted queue (``cli._keys``)."""
    func = key_file_option(func)
    return click.option(
        "-o",
        "--option",
        "option_pairs",
        multiple=True,
        metavar="NAME=VALUE",
        help="A queue option for this command only, e.g. -o priorities=true "
        "-o max_retries=5 (repeatable; see docs/usage.md).  Not stored with the queue: "
        "'ledgerq config QUEUE --set NAME=VALUE' does that.",
    )(func)


# Every option -o may set: not the encryption key, which only --key-file gives (a key
# on the command line would show in ps and shell histories).
_OPTION_FIELDS = {
    f.name: str(f.type) for f in dataclasses.fields(ledgerq.Options) if f.name != "encryption_key"
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _option_value(name: str, text: str, annotation: str) -> Any:
    kinds = [part.strip() for part in annotation.split("|")]
    if "None" in kinds and text.strip().lower() in ("none", "null"):
        return None
    value = text.strip()
    if "bool" in kinds:
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise click.BadParameter(f"{name} takes true or false, got {text!r}", param_hint="-o")
    try:
        if "int" in kinds:
            return int(value.replace("_", ""))
        if "float" in kinds:
            return float(value)
    except ValueError:
        raise click.BadParameter(
            f"{name} takes {' or '.join(kinds)}, got {text!r}", param_hint="-o"
        ) from None
    return value


def option_overrides(pairs: tuple[str, ...], param_hint: str = "-o") -> dict[str, Any]:
    """Parse ``-o NAME=VALUE`` pairs into keyword arguments of ``ledgerq.open``.

    Every problem - a malformed pair, an unknown name, a value of the wrong type or
    out of range - is a usage error (exit 2), found before any queue is touched.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise click.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint=param_hint)
        annotation = _OPTION_FIELDS.get(name)
        if annotation is None:
            valid = ", ".join(sorted(_OPTION_FIELDS))
            raise click.BadParameter(
                f"unknown queue option {name!r} (valid: {valid})", param_hint=param_hint
            )
        try:
            options[name] = _option_value(name, text, annotation)
        except click.BadParameter as exc:
            exc.param_hint = param_hint
            raise
    try:
        ledgerq.Options(**options)  # each value on its own: Options has no cross-checks
    except ledgerq.ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from None
    key = current_key()
    if key is not None:
        options["encryption_key"] = key
    return options


def for_one_run(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for ``ledgerq.open`` used for this command only: not stored.

    ``-o`` changes how one command works on a queue, never what the application gets
    at its next open; ``ledgerq config --set`` is the way to change that.
    """
    return {**options, "remember_options": False}


class Seconds(click.ParamType[float]):
    """A finite number of seconds (``inf`` too when ``allow_inf``), above a minimum.

    ``nan`` is refused as a usage error: click's FloatRange lets it through (every
    comparison with it is false), and the library would call it a bad argument.
    """

    name = "seconds"

    def __init__(self, *, min_open: bool = False, allow_inf: bool = False) -> None:
        self.min_open = min_open
        self.allow_inf = allow_inf

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if math.isnan(number):
            self.fail("nan is not a number of seconds", param, ctx)
        if math.isinf(number) and not (self.allow_inf and number > 0):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        if number < 0 or (self.min_open and number == 0):
            bound = "> 0" if self.min_open else ">= 0"
            self.fail(f"{value!r} must be a number of seconds {bound}", param, ctx)
        return number


def timeout_option(help: str) -> Callable[[F], F]:  # noqa: A002 - click's name for it
    """``--timeout SECONDS``: how long a command waits (0, the default: not at all;
    ``inf``: forever), as the ``timeout`` of the queue's own waits."""
    return click.option(
        "--timeout",
        type=Seconds(allow_inf=True),
        default=0.0,
        show_default=True,
        metavar="SECONDS",
        help=help,
    )


_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


class ByteSize(click.ParamType[int]):
    """A size in bytes > 0: ``1048576``, ``200MB`` (10**6), ``200MiB`` or ``200M`` (2**20).

    Units are case-insensitive: ``kB``/``MB``/``GB``/``TB`` are decimal, ``KiB``/``MiB``/...
    and the bare letters ``K``/``M``/``G``/``T`` (as ``docker -m`` and ``ulimit`` mean
    them) binary.
    """

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            match = _SIZE.match(str(value))
            if match is None or (match.group(3) and not match.group(2)):
                self.fail(
                    f"{value!r} is not a size; use bytes or a number with kB, MB, GB "
                    "(powers of 1000), KiB, MiB, GiB or K, M, G (powers of 1024)",
                    param,
                    ctx,
                )
            digits, unit, binary, b = match.groups()
            decimal = bool(b) and not binary and bool(unit)
            base = 1000 if decimal else 1024
            number = int(digits) * base ** _SIZE_POWERS[unit.lower()]
        if number <= 0:
            self.fail(f"{value!r} must be a size > 0", param, ctx)
        return number


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``30s``, ``10m``, ``2h``, ``7d``, ``1w`` or a plain number of seconds."""
    match = _DURATION.match(text)
    if match is None:
        raise click.BadParameter(
            f"{text!r} is not a duration; use a number with s, m, h, d or w (e.g. 30s, 7d)"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


# ---------------------------------------------------------------------- queues


def require_queue(path: str) -> None:
    """Fail unless ``path`` is an existing queue directory (reading never creates one)."""
    denied = _permission_problem(path)
    if denied is not None:
        raise CliError(denied)
    problem = tools.not_a_queue(path)
    if problem is not None:
        raise CliError(problem)


def _permission_problem(path: str) -> str | None:
    """What this user may not do to look at ``path``, or None.

    ``os.path.exists`` says False for a path behind a directory this user cannot
    search, so "does not exist" would be a lie: ask the system, which says EACCES.
    """
    try:
        os.stat(path)
        if os.path.isdir(path):
            os.listdir(path)
    except PermissionError as exc:
        what = "be listed" if exc.filename == path and os.path.exists(path) else "be reached"
        return (
            f"permission denied: {path!r} cannot {what} by this user; "
            "run as a user who may read the queue"
        )
    except OSError:
        return None  # missing, not a directory, ...: the queue check says which
    return None


@contextmanager
def using_queue(path: str, options: dict[str, Any]) -> Iterator[ledgerq.Queue]:
    """Open (creating if missing) the queue in shared mode with ``options`` for this
    command only.

    Shared, so a command works on the queue of a live application that opened it with
    ``shared=True`` (and on one nobody has open); an application that holds it
    exclusively refuses it (``QueueLockedError``, ``held_by="exclusive"``).  The
    options are not stored (see :func:`for_one_run`).  Closed (and synced) on exit:
    leases the command still holds go back to the queue.
    """
    try:
        queue = ledgerq.open(path, shared=True, **for_one_run(options))
    except TypeError as exc:  # an option of the wrong type
        raise CliError(str(exc)) from None
    try:
        yield queue
    finally:
        queue.close()


@contextmanager
def using_existing(path: str, options: dict[str, Any]) -> Iterator[ledgerq.Queue]:
    """Open an existing queue (see :func:`require_queue`); closed on exit."""
    require_queue(path)
    with using_queue(path, options) as queue:
        yield queue


def confirm_purge(what: str, yes: bool) -> bool:
    """Whether to purge ``what``: yes with ``--yes``, else the answer of a terminal
    (a "no" says nothing was purged); without a terminal to ask on, refuse."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(
            f"refusing to purge {what} without confirmation: stdin is not a terminal; pass --yes"
        )
    if click.confirm(f"Purge {what}?", default=False, err=True):
        return True
    click.echo("ledgerq: nothing purged", err=True)
    return False


# ---------------------------------------------------------------------- output


def write_line(text: str) -> None:
    """Write one line of text to stdout as UTF-8, whatever the locale."""
    write_bytes(text.encode("utf-8", "surrogateescape") + b"\n")


def write_labelled(label: str, items: Iterable[object]) -> None:
    """Write each of ``items`` as its own line, ``label: item``."""
    for item in items:
        write_line(f"{label}: {item}")


def write_bytes(data: bytes) -> None:
    """Write raw bytes to stdout (after anything already written as text) and flush.

    When this returns, the bytes are with the OS (a pipe's buffer, a file).  Raises
    :class:`OutputClosed` when stdout was closed (``>&-``: Python then has no
    ``sys.stdout``) or its reader went away (EPIPE).
    """
    stdout = sys.stdout
    if stdout is None:
        raise OutputClosed("stdout is closed", stdout_closed=True)
    try:
        stdout.flush()
        stdout.buffer.write(data)
        stdout.buffer.flush()
    except BrokenPipeError:
        raise OutputClosed(
            "the output pipe was closed by its reader", stdout_closed=False
        ) from None


def write_rich(*renderables: Any) -> None:
    """Print rich renderables (tables) to stdout through :func:`write_bytes`.

    Rendered first, then written: rich itself turns a broken pipe into ``SystemExit``.
    Colour and width follow stdout, as a plain ``Console().print`` would.
    """
    console = stdout_console()
    with console.capture() as capture:
        for renderable in renderables:
            console.print(renderable)
    write_bytes(capture.get().encode("utf-8", "surrogateescape"))


@contextmanager
def reporting_if_output_closed(done: Callable[[], str]) -> Iterator[None]:
    """Turn :class:`OutputClosed` inside into an error that says what was ``done()``.

    For commands that change a queue before (or while) printing: a script that sees
    exit 141 learns from stderr what happened, and need not guess whether to retry.
    """
    try:
        yield
    except OutputClosed as exc:
        raise OutputClosedError(f"{exc.why}; {done()}") from None


def write_outcome(text: str, value: dict[str, Any] | None = None) -> None:
    """Print what a command did (``value`` as JSON when given, else ``text``).

    If stdout is gone, ``text`` goes to stderr in the error line instead (exit 141).
    """
    with reporting_if_output_closed(lambda: text):
        if value is None:
            write_line(text)
        else:
            write_json(value)


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with every non-printable character escaped (``\x1b`` for ESC).

    Message data (headers, failure reasons, payload previews) is written only so:
    raw, an escape sequence in it would drive the terminal.  Characters in ``keep``
    (e.g. a newline) stay as they are.
    """
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


def ids_text(ids: list[int]) -> str:
    """``[7]`` -> ``id 7``; ``[5, 6, 7]`` -> ``ids 5 to 7`` (ids given in increasing order)."""
    if len(ids) == 1:
        return f"id {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"ids {ids[0]} to {ids[-1]}"
    return "ids " + ", ".join(str(i) for i in ids)


def write_json(value: Any) -> None:
    """Write one JSON document on one line."""
    write_line(json.dumps(value, ensure_ascii=False))


def encode_payload(payload: bytes, mode: str, message_id: int) -> tuple[str, str]:
    """Return the payload as JSON text and its encoding ("utf8" or "base64")."""
    if mode != "base64":
        try:
            return payload.decode("utf-8"), "utf8"
        except UnicodeDecodeError:
            if mode == "utf8":
                raise CliError(
                    f"message {message_id} is not valid UTF-8; use --payload base64 or auto"
                ) from None
    return base64.b64encode(payload).decode("ascii"), "base64"


def message_json(message: ledgerq.Message, mode: str, *, attempts: bool = True) -> dict[str, Any]:
    """A message as a JSON object (the shape of dequeue, peek, dump and dlq output)."""
    payload, encoding = encode_payload(message.payload, mode, message.id)
    value: dict[str, Any] = {
        "id": message.id,
        "timestamp": message.timestamp,
        "expires_at": message.expires_at,
        "priority": int(message.priority),
        "group": message.group,
    }
    if attempts:
        value["attempts"] = message.attempts
    value["headers"] = message.headers
    value["payload"] = payload
    value["payload_encoding"] = encoding
    return value


def report_json(report: Any, **fields: Any) -> dict[str, Any]:
    """A report (a dataclass) as a JSON object: its fields, tuples as lists, and ``fields``.

    ``fields`` replace the fields whose JSON form is not the value itself (pairs that
    read better as objects, nested reports) or add some (properties such as ``ok``).
    """
    value = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
    value.update(fields)
    return value


def plural(n: int, noun: str) -> str:
    """``plural(1, "segment")`` -> ``1 segment``; ``plural(2, "entry")`` -> ``2 entries``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def format_bytes(size: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_age(seconds: float) -> str:
    """``3725`` -> ``1h 2m``: two units at most."""
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    total = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
    return " ".join(parts[:2])


def age_of(timestamp_ns: int) -> float:
    """Seconds since ``timestamp_ns`` (never negative)."""
    return max(0.0, (time.time_ns() - timestamp_ns) / 1e9)


def stdout_console() -> Console:
    """A rich console on stdout (colour only on a terminal)."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def stderr_console() -> Console:
    """A rich console on stderr."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


@contextmanager
def progress(description: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr when it is a terminal; yields ``update(done, total)``.

    When stderr is not a terminal (piped, captured, CI) nothing is drawn and the
    callback does nothing.
    """
    console = stderr_console()
    if not console.is_terminal:
        yield _no_progress
        return
    bar = _make_progress(console)
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total or None)

    with bar:
        yield update


def _no_progress(done: int, total: int) -> None:
    pass


def _make_progress(console: Console) -> Progress:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
