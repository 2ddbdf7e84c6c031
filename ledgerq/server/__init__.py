"""``ledgerq serve``: queues over the memcache text protocol, as Kestrel and Darner serve them.

>>> from ledgerq.server import ServerConfig, run
>>> run(ServerConfig("data", port=22133))       # doctest: +SKIP

Layers: :mod:`ledgerq.server.protocol` is sans-IO (bytes in, commands and replies
out); ``_connection`` runs one client's commands on the event loop; ``_registry``
opens each queue once and parks waiting requests; ``_server`` listens, counts, and
shuts down in order.  See docs/server.md for the protocol as implemented.
"""

from __future__ import annotations

from ledgerq.server._server import (
    DEFAULT_PORT,
    DataDirLockedError,
    Server,
    ServerConfig,
    ServerStats,
    run,
)

__all__ = [
    "DEFAULT_PORT",
    "DataDirLockedError",
    "Server",
    "ServerConfig",
    "ServerStats",
    "run",
]
