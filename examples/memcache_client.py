"""Queues over the memcache protocol: run `ledgerq serve`, produce and work over a socket.

    python examples/memcache_client.py [DATA_DIR]

Starts `ledgerq serve DATA_DIR --port 0` (the OS picks a free port; the server prints
the address it bound), then talks to it the way any memcache client would: `set` to
produce, `get` to consume, `/open` + `/close` for reliable reads, `/t=<ms>` to wait,
`queue+reader` for fan-out.  A real application would use its language's memcache
client (e.g. pymemcache: `Client(("127.0.0.1", port)).get("jobs/open")`); this example
speaks the bytes itself so you can see them.  See docs/server.md.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import tempfile


class MemcacheConnection:
    """Just enough of a memcache text-protocol client for queues."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def line(self) -> bytes:
        return self.file.readline().rstrip(b"\r\n")

    def set(self, key: str, value: bytes, flags: int = 0, exptime: int = 0) -> bytes:
        head = f"set {key} {flags} {exptime} {len(value)}\r\n".encode()
        self.sock.sendall(head + value + b"\r\n")
        return self.line()  # b"STORED"

    def get(self, key: str) -> bytes | None:
        """One item (or None); ``key`` may carry options such as ``jobs/t=500/open``."""
        self.sock.sendall(f"get {key}\r\n".encode())
        line = self.line()
        if line == b"END":
            return None
        _, echoed, _flags, size = line.split()
        assert echoed == key.encode()  # the server echoes the key as requested
        value = self.file.read(int(size) + 2)[:-2]
        assert self.line() == b"END"
        return value

    def command(self, text: str) -> bytes:
        self.sock.sendall(text.encode() + b"\r\n")
        return self.line()

    def stats(self) -> dict[str, str]:
        self.sock.sendall(b"stats\r\n")
        found = {}
        while (line := self.line()) != b"END":
            _, name, value = line.decode().split(" ", 2)
            found[name] = value
        return found


def start_server(data_dir: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledgerq.cli", "serve", data_dir, "--port", "0"],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    banner = proc.stdout.readline().decode()
    found = re.search(r"listening on 127\.0\.0\.1:(\d+)", banner)
    if found is None:
        proc.kill()
        proc.wait()
        raise SystemExit(f"the server did not start: {banner!r}")
    print(f"server: {banner.strip()}")
    return proc, int(found.group(1))


def main(data_dir: str) -> None:
    proc, port = start_server(data_dir)
    try:
        producer = MemcacheConnection(port)
        worker = MemcacheConnection(port)
        try:
            # Fan-out: a reader named "audit" sees every item set from now on.
            assert producer.get("jobs+audit") is None

            for n in range(3):
                reply = producer.set("jobs", f"resize image {n}".encode(), flags=n)
                print(f"set jobs 'resize image {n}' -> {reply.decode()}")

            # A reliable worker: /open takes an item, /close confirms it and opens the
            # next; a crash (disconnect) before /close would give the item back.
            item = worker.get("jobs/t=1000/open")
            while item is not None:
                print(f"worker: got {item.decode()!r}, done with it")
                item = worker.get("jobs/t=100/close/open")

            # /abort gives an open read back to the head of the queue.
            producer.set("jobs", b"flaky job")
            print(f"worker: opened {worker.get('jobs/open')!r}, aborts it")
            worker.get("jobs/abort")
            print(f"worker: took {worker.get('jobs')!r} again with a plain get (get + ack)")

            audit = []
            while (seen := producer.get("jobs+audit")) is not None:
                audit.append(seen.decode())
            print(f"audit reader saw {len(audit)} items: {audit}")

            stats = producer.stats()
            print(
                f"stats: jobs items={stats['queue_jobs_items']} "
                f"total_items={stats['queue_jobs_total_items']} "
                f"cmd_get={stats['cmd_get']} cmd_set={stats['cmd_set']}"
            )
            print(f"version: {producer.command('version')}")
        finally:
            producer.close()
            worker.close()
    finally:
        proc.send_signal(signal.SIGTERM)  # graceful: queues are synced and closed
        code = proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    print(f"server stopped (exit code {code}); the queues stay in {data_dir}")
    if code != 0:
        raise SystemExit(code)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
