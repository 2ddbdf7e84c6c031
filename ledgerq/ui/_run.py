"""Serving the console: bind the address, announce it, run uvicorn until stopped.

SIGTERM and SIGINT (Ctrl-C) are the ordinary way to stop a server, not errors: the
console stops accepting connections, lets running requests end, cancels its running
jobs after their current slice, and :func:`run` returns - ``ledgerq ui`` exits 0 with
nothing on stderr, as ``ledgerq serve`` does.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn

from ledgerq.ui._app import create_app
from ledgerq.ui._security import check_listen_address

__all__ = ["run"]


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (``port`` 0: one the system picks)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def _stopped_by_signals(server: uvicorn.Server) -> Iterator[None]:
    """SIGTERM and SIGINT ask ``server`` to exit, for the whole of the block.

    uvicorn puts its own handlers in place while it serves and, when it is done,
    raises again each signal that stopped it - with the handlers it found, which
    would be the CLI's (``ledgerq: error: terminated``, exit 143).  These take the
    signal as the request to stop that it is, before uvicorn starts (a signal during
    startup stops it too) and after it ends; the previous handlers come back after.
    Only the main thread can set handlers: elsewhere nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(
    root: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8642,
    token: str | None = None,
    sample_interval_s: float = 2.0,
    history_s: float = 600.0,
    on_ready: Callable[[str], None] | None = None,
    encryption_key: bytes | None = None,
) -> None:
    """Serve the console over the queues at or under ``root`` until SIGINT or SIGTERM,
    then return (see the module).

    ``on_ready`` is called with the console's URL once it accepts connections (with
    ``port`` 0, the port the system picked).  ``encryption_key`` (32 bytes) opens the
    encrypted queues among them (plain ones are read without it; see docs/ui.md).
    Raises ``ValueError`` (an ``InsecureAddressError``) for a non-loopback ``host``
    without a ``token``, ``TypeError`` or ``ConfigError`` for a key that is not 32
    bytes, and ``OSError`` when the address cannot be bound - all before anything is
    served.
    """
    check_listen_address(host, token)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"no directory at {root!r}: give a queue or a directory of queues")
    app = create_app(
        root,
        token=token,
        host=host,
        sample_interval_s=sample_interval_s,
        history_s=history_s,
        encryption_key=encryption_key,
    )
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)

    if on_ready is not None:
        ready = on_ready
        original_startup = server.startup

        async def startup(sockets: list[socket.socket] | None = None) -> None:
            await original_startup(sockets=sockets)
            if server.started:
                ready(f"http://{shown}:{bound_port}/")

        server.startup = startup  # type: ignore[method-assign]
    try:
        with _stopped_by_signals(server):
            server.run(sockets=[sock])
    finally:
        sock.close()
