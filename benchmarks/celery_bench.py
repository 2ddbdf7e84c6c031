"""10,000 no-op Celery tasks end to end: the ledgerq broker against Redis (and kombu's
filesystem transport).

    python benchmarks/celery_bench.py                      # every broker available, 3 runs
    python benchmarks/celery_bench.py --tasks 2000 --runs 1 --brokers ledgerq

Run by hand (not part of the tests); the table in docs/celery.md comes from it.  Method:

* One ``celery worker -P prefork -c 4`` (4 worker processes; gossip, mingle and
  heartbeat off; ``task_acks_late=True``, prefetch multiplier 4) per run, on a fresh
  broker: a ledgerq directory (``sync="interval"``, the default), a ``redis-server``
  started for the run on a free local port (its default snapshotting; Redis keeps the
  queue in memory), or kombu's ``filesystem://`` transport in a temporary directory.
* The clock starts when the worker answers a ping.  This process then sends
  ``--tasks`` no-op tasks (``send_task``, one publish each, no result backend) while
  the worker consumes; each task appends one byte to a file (``O_APPEND``), and the
  clock stops when the file holds one byte per task.
* Reported per broker: tasks per second end to end (median of ``--runs`` runs, with
  min and max), and the send rate of the producer alone.
* Then the drain: ``--tasks`` tasks are sent before a worker starts, and the rate is
  taken from the first task's run to the last's (the worker's start-up left out): the
  consumer side alone, which the single producer above may hide.

What each broker keeps when the machine or a process dies is not the same: see the
table's notes (docs/celery.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery import Celery

HERE = Path(__file__).resolve().parent

# -- the app the worker imports (this file, as the module celery_bench)

app = Celery("celery_bench", broker=os.environ.get("BENCH_BROKER", "memory://"))
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=4,
    broker_transport_options=json.loads(os.environ.get("BENCH_TRANSPORT_OPTIONS", "{}")),
    broker_connection_retry_on_startup=True,
)
_count_fd: int | None = None


@app.task(name="bench.noop")
def noop() -> None:
    """Count the run: one byte appended to the counter file."""
    global _count_fd
    if _count_fd is None:
        _count_fd = os.open(os.environ["BENCH_COUNT_FILE"], os.O_WRONLY | os.O_APPEND)
    os.write(_count_fd, b".")


# -- the runs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _broker(name: str, workdir: Path) -> tuple[str, dict[str, Any], subprocess.Popen[bytes] | None]:
    if name == "ledgerq":
        return f"ledgerq://{workdir / 'broker'}", {"polling_interval": 1.0}, None
    if name == "redis":
        port = _free_port()
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--dir", str(workdir), "--save", "3600 1"],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.05)
        return f"redis://127.0.0.1:{port}/0", {}, server
    if name == "filesystem":
        folder = workdir / "fs"
        folder.mkdir()
        options = {
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(workdir / "control"),
        }
        return "filesystem://", options, None
    raise SystemExit(f"unknown broker {name}")


def _start_worker(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_bench", "worker", "-P", "prefork",
         "-c", "4", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel=WARNING"],
        cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def _wait_full(counter: Path, tasks: int, started: float, name: str) -> float:
    while counter.stat().st_size < tasks:
        if time.perf_counter() - started > 600:
            raise SystemExit(f"{name}: only {counter.stat().st_size} of {tasks} ran")
        time.sleep(0.005)
    return time.perf_counter()


def run_once(name: str, tasks: int, workdir: Path) -> tuple[float, float, float]:
    """One run: (end-to-end tasks/s, send rate /s, drain tasks/s)."""
    url, options, server = _broker(name, workdir)
    counter = workdir / "count"
    counter.write_bytes(b"")
    env = dict(
        os.environ,
        BENCH_BROKER=url,
        BENCH_TRANSPORT_OPTIONS=json.dumps(options),
        BENCH_COUNT_FILE=str(counter),
    )
    client = Celery("client", broker=url)
    client.conf.broker_transport_options = options
    worker = _start_worker(env)
    try:
        deadline = time.monotonic() + 60
        while not client.control.ping(timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the worker did not start on {url}")
        started = time.perf_counter()
        with client.connection_for_write() as connection:
            producer = client.amqp.Producer(connection)
            for _ in range(tasks):
                client.send_task("bench.noop", producer=producer)
        sent = time.perf_counter()
        done = _wait_full(counter, tasks, started, name)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        # The drain: a full queue first, then a worker.
        counter.write_bytes(b"")
        with client.connection_for_write() as connection:
            producer = client.amqp.Producer(connection)
            for _ in range(tasks):
                client.send_task("bench.noop", producer=producer)
        worker = _start_worker(env)
        began = time.perf_counter()
        while counter.stat().st_size == 0:
            if time.perf_counter() - began > 60:
                raise SystemExit(f"{name}: the drain did not start")
            time.sleep(0.001)
        first = time.perf_counter()
        drained = _wait_full(counter, tasks, first, name)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        client.close()
        if server is not None:
            server.terminate()
            server.wait()
    return tasks / (done - started), tasks / (sent - started), (tasks - 1) / (drained - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    available = ["ledgerq", "filesystem"] + (["redis"] if shutil.which("redis-server") else [])
    parser.add_argument("--brokers", nargs="+", default=available)
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"# load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"# {args.tasks} no-op tasks, 4 prefork worker processes, {args.runs} runs each\n")
    print(
        "| broker | tasks/s end to end (median) | min - max | producer sends/s (median) "
        "| drain tasks/s, preloaded (median) |"
    )
    print("|---|---|---|---|---|")
    for name in args.brokers:
        results = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as workdir:
                results.append(run_once(name, args.tasks, Path(workdir)))
        ends = [r[0] for r in results]
        sends = [r[1] for r in results]
        drains = [r[2] for r in results]
        print(
            f"| {name} | {statistics.median(ends):,.0f} | {min(ends):,.0f} - {max(ends):,.0f} "
            f"| {statistics.median(sends):,.0f} | {statistics.median(drains):,.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
