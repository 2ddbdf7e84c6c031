"""``ledgerq ui``: serve the web console over a queue or a directory of queues."""

from __future__ import annotations

import os

import click

from ledgerq.cli._common import CliError, OutputClosed, write_line
from ledgerq.cli._keys import current_key, key_file_option

__all__ = ["ui"]


@click.command()
@click.argument("path", metavar="PATH", type=click.Path(path_type=str))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; any but a loopback address needs --token.",
)
@click.option(
    "--port",
    default=8642,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to listen on (0: one the system picks; the ready line says which).",
)
@click.option(
    "--token",
    envvar="LEDGERQ_UI_TOKEN",
    metavar="TOKEN",
    help="Require this token of every request (also LEDGERQ_UI_TOKEN): open the console "
    "once as URL/?token=TOKEN, or send 'Authorization: Bearer TOKEN'.",
)
@click.option(
    "--interval",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="How often the charts sample every queue (0: only when a page is looked at).",
)
@click.option(
    "--history",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=10),
    metavar="SECONDS",
    help="How far back the charts go (samples are kept in memory only).",
)
@key_file_option
def ui(path: str, host: str, port: int, token: str | None, interval: float, history: float) -> None:
    """Serve a web console over the queue PATH, or every queue under the directory PATH.

    Pages for each queue (figures, rates and charts, readers, the next messages, any
    message by id) and its dead letters (filters; requeue and purge, each confirmed),
    and the same data as JSON under /api/.  It reads the files without the queues'
    locks, so it runs beside the application; an action opens the queue for that
    action only.  With --key-file, the encrypted queues among them are read with that
    key (plain ones without it); an encrypted queue it does not open is listed with its
    figures and marked 'encrypted: key needed' (or 'wrong key').  Prints 'serving
    http://HOST:PORT/' once it accepts connections; Ctrl-C or SIGTERM stops it.  Needs
    the ui extra: pip install 'ledgerq[ui]'.  See docs/ui.md.
    """
    if not os.path.isdir(path):
        what = "does not exist" if not os.path.exists(path) else "is not a directory"
        raise CliError(f"{path} {what}: give a queue directory or a directory of queues")
    try:
        from ledgerq import ui as console
    except ImportError as exc:
        raise CliError(str(exc)) from None
    try:
        console.check_listen_address(host, token)
    except console.InsecureAddressError as exc:
        raise click.UsageError(str(exc)) from None

    def ready(address: str) -> None:
        login = " (open it once with ?token=TOKEN)" if token else ""
        line = f"serving {address}{login} over {os.path.abspath(path)}"
        try:
            write_line(line)
        except OutputClosed as exc:  # serving needs no stdout: say it where it can be read
            click.echo(f"ledgerq: warning: {exc.why}; {line}", err=True)

    try:
        console.run(
            path,
            host=host,
            port=port,
            token=token,
            sample_interval_s=interval,
            history_s=history,
            on_ready=ready,
            encryption_key=current_key(),
        )
    except OSError as exc:
        raise CliError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
