"""Retry backoff: a consumer whose downstream is down backs off instead of spinning.

An uploader sends jobs to a "server" that is offline for its first second. Each
failure is a nack; the queue's retry policy (retry_delay, retry_backoff) brings the job
back later and later - 0.1 s, 0.2 s, 0.4 s ... - so the loop makes a handful of attempts
instead of thousands, and a job that must wait for a while uses `delay`. A message
group keeps one customer's jobs in order while others flow.

Run: python examples/retry_backoff.py [QUEUE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import ledgerq

ONLINE_AFTER = 1.0  # seconds the pretend server is offline


def main(path: Path) -> None:
    started = time.monotonic()
    uploaded: list[str] = []
    attempts = 0

    def upload(payload: bytes) -> None:
        if time.monotonic() - started < ONLINE_AFTER:
            raise ConnectionError("server offline")
        uploaded.append(payload.decode())

    with ledgerq.open(
        path, retry_delay=0.1, retry_backoff=2.0, retry_delay_max=2.0, max_retries=0
    ) as q:
        q.enqueue(b"alice: create", group="alice")
        q.enqueue(b"alice: update", group="alice")  # after "create", whatever happens
        q.enqueue(b"bob: create", group="bob")
        q.enqueue(b"report", delay=0.5)  # not before half a second from now
        while len(uploaded) < 4:
            msg = q.dequeue(timeout=5)  # sleeps until the next retry falls due
            if msg is None:
                raise SystemExit("nothing came back in time")
            attempts += 1
            try:
                upload(msg.payload)
            except ConnectionError as exc:
                q.nack(msg.id, str(exc))  # back after 0.1 s, 0.2 s, 0.4 s, ...
                print(f"  {msg.payload.decode():<14} attempt {msg.attempts}: {exc}")
            else:
                q.ack(msg.id)
                print(f"  {msg.payload.decode():<14} uploaded on attempt {msg.attempts}")
        stats = q.stats()
    assert uploaded.index("alice: create") < uploaded.index("alice: update")
    print(
        f"{len(uploaded)} jobs uploaded in {attempts} attempts over "
        f"{time.monotonic() - started:.1f} s ({stats.nacked} nacks, none busy-looped)"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "uploads")
