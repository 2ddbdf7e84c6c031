"""``ledgerq config``: show the options a queue stored, and change them on purpose.

A queue remembers the options it was last opened with (in ``meta.json``), and
``ledgerq.open(path)`` reopens it so.  Every other command's ``-o`` is for that
command only; this one is the explicit way to change what is stored.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

import ledgerq
from ledgerq.cli._common import (
    json_option,
    option_overrides,
    queue_argument,
    reporting_if_output_closed,
    require_queue,
    write_json,
    write_line,
)
from ledgerq.cli._keys import key_file_option
from ledgerq.segment.readonly import stored_options

__all__ = ["config"]

_NOT_SHOWN = "encryption_key"  # never stored, never printed
_DEFAULTS = {k: v for k, v in dataclasses.asdict(ledgerq.Options()).items() if k != _NOT_SHOWN}


def _stored_view(options: ledgerq.Options) -> dict[str, Any]:
    """The options as stored with the queue: every one but the encryption key."""
    return {k: v for k, v in dataclasses.asdict(options).items() if k != _NOT_SHOWN}


def _text(value: Any) -> str:
    """A value as ``-o``/``--set`` take it back: true/false, none, plain numbers and words."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


def _show(queue: str, options: dict[str, Any], changed: dict[str, Any], as_json: bool) -> None:
    if as_json:
        write_json({"queue": queue, "options": options, "set": changed})
        return
    width = max(len(name) for name in options)
    for name, value in options.items():
        mark = "  (default)" if value == _DEFAULTS[name] else ""
        write_line(f"{name:<{width}}  {_text(value)}{mark}")


@click.command()
@queue_argument
@click.option(
    "--set",
    "set_pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Store this option with the queue (repeatable), as ledgerq.open(QUEUE, "
    "NAME=VALUE) would: the application gets it at its next open.  Needs the queue "
    "to itself: refused while it is open elsewhere, in either mode (a shared handle "
    "closing last would store its own options over it).",
)
@json_option
@key_file_option
def config(queue: str, set_pairs: tuple[str, ...], as_json: bool) -> None:
    """Show the options QUEUE stored (what ledgerq.open(QUEUE) uses); --set changes them.

    Without --set it only reads meta.json (no lock: it runs beside the owner) and
    prints every option with its value, marking defaults.  --json prints one object:
    queue, options (name -> value) and set (what --set changed).  Values are checked
    as ledgerq.open checks them; a bad one is a usage error and nothing is stored.
    """
    require_queue(queue)
    changed = option_overrides(set_pairs, param_hint="--set")
    key = changed.pop("encryption_key", None)  # --key-file: to open it, never shown
    if changed:
        # remembers: that is the point here
        with ledgerq.open(queue, encryption_key=key, **changed) as q:
            options = _stored_view(q.options)
    else:
        options = _stored_view(ledgerq.Options.from_kwargs(None, {}, stored_options(queue)))
    if not changed:
        _show(queue, options, changed, as_json)  # read-only: a closed stdout is just that
        return
    stored = ", ".join(f"{name}={_text(value)}" for name, value in changed.items())
    with reporting_if_output_closed(lambda: f"stored {stored} with {queue}"):
        _show(queue, options, changed, as_json)
