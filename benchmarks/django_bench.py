"""10,000 no-op Django tasks end to end, 4 worker processes: ledgerq's backend against
django-tasks-db's database backend on SQLite.

    python benchmarks/django_bench.py                      # both backends, 3 runs each
    python benchmarks/django_bench.py --tasks 2000 --runs 1 --backends ledgerq
    python benchmarks/django_bench.py --runs 1 --drain-tasks 2000    # a busy machine

Run by hand (not part of the tests); the table in docs/benchmarks.md comes from it.
Method, per run, on a fresh directory (the project is ``benchmarks/djangobench``):

* ledgerq: one ``manage.py ledgerq_worker --processes 4`` (default options:
  ``sync="interval"``, results in SQLite with ``synchronous=NORMAL``).  django-tasks-db:
  ``migrate``, then 4 ``manage.py db_worker --no-startup-delay`` processes (its default
  1 s ``--interval`` when idle; a worker that finds a task takes the next at once), on
  an SQLite database in WAL mode with a 30 s busy timeout.  Both at ``--verbosity 0``
  (no log line per task).
* End to end: the clock starts when the workers are up; one producer process
  (``djangobench.produce``, ``task.enqueue()`` in a loop) sends ``--tasks`` tasks while
  they work; each task appends one byte to a file and the clock stops when the file
  holds one byte per task.  Reported: tasks per second (median of ``--runs``, min and
  max) and the producer's own rate.
* Drain: ``--tasks`` tasks enqueued before the workers start, timed from the first
  task's byte to the last: the consumer side alone.

The two do not promise the same: docs/django.md says what each keeps on a kill -9.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROCESSES = 4


def _env(backend: str, workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="djangobench.settings",
        BENCH_BACKEND=backend,
        BENCH_DIR=str(workdir),
        BENCH_COUNT_FILE=str(workdir / "count"),
        PYTHONPATH=os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]),
    )
    return env


def _django(env: dict[str, str], *args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args, "--verbosity", "0"]


def _start_workers(backend: str, env: dict[str, str], log: Path) -> list[subprocess.Popen[bytes]]:
    if backend == "ledgerq":
        commands = [_django(env, "ledgerq_worker", "--processes", str(PROCESSES))]
    else:
        commands = [_django(env, "db_worker", "--no-startup-delay")] * PROCESSES
    out = open(log, "ab")  # noqa: SIM115 - handed to the children, closed with them
    workers = [
        subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for cmd in commands
    ]
    out.close()
    return workers


def _wait_up(backend: str, workdir: Path, workers: list[subprocess.Popen[bytes]]) -> None:
    """Until each worker has started: one probe task per worker process has run."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(w.poll() is not None for w in workers):
            raise SystemExit(f"a {backend} worker exited: see {workdir / 'workers.log'}")
        if (workdir / "count").stat().st_size >= 1:
            return
        time.sleep(0.01)
    raise SystemExit(f"the {backend} workers did not start")


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


def _count(workdir: Path) -> int:
    return (workdir / "count").stat().st_size


def _wait_count(workdir: Path, count: int) -> tuple[float, float]:
    """Poll the counter until it holds ``count`` bytes; return (first byte, last byte)."""
    first_at = None
    while True:
        size = _count(workdir)
        now = time.perf_counter()
        if first_at is None and size > 0:
            first_at = now
        if size >= count:
            return first_at or now, now
        time.sleep(0.001)


def _prepare(backend: str, env: dict[str, str], workdir: Path) -> None:
    (workdir / "count").write_bytes(b"")
    if backend == "db":
        subprocess.run(_django(env, "migrate"), env=env, check=True)


def _produce(env: dict[str, str], count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "djangobench.produce", str(count)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def end_to_end(backend: str, count: int) -> tuple[float, float]:
    """Tasks per second end to end, and the producer's sends per second."""
    with tempfile.TemporaryDirectory(prefix=f"django-bench-{backend}-") as tmp:
        workdir = Path(tmp)
        env = _env(backend, workdir)
        _prepare(backend, env, workdir)
        workers = _start_workers(backend, env, workdir / "workers.log")
        try:
            probe = _produce(env, 1)  # the workers are up when it has run
            probe.communicate()
            _wait_up(backend, workdir, workers)
            started = time.perf_counter()
            producer = _produce(env, count)
            _, last = _wait_count(workdir, count + 1)
            out, _ = producer.communicate()
            return count / (last - started), count / float(out)
        finally:
            _stop(workers)


def drain(backend: str, count: int) -> float:
    """Tasks per second from the first task's run to the last, with all enqueued first."""
    with tempfile.TemporaryDirectory(prefix=f"django-bench-{backend}-") as tmp:
        workdir = Path(tmp)
        env = _env(backend, workdir)
        _prepare(backend, env, workdir)
        _produce(env, count).communicate()
        workers = _start_workers(backend, env, workdir / "workers.log")
        try:
            first, last = _wait_count(workdir, count)
            return (count - 1) / (last - first)
        finally:
            _stop(workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--drain-tasks", type=int, default=None, help="tasks of the drain (default: --tasks)"
    )
    parser.add_argument(
        "--backends", nargs="+", default=["ledgerq", "db"], choices=["ledgerq", "db"]
    )
    args = parser.parse_args()
    import django

    from ledgerq.django._compat import FRAMEWORK

    print(
        f"# {platform.python_implementation()} {platform.python_version()}, Django "
        f"{django.get_version()} ({FRAMEWORK}), {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; {args.tasks} tasks, {PROCESSES} worker processes"
    )
    rows = {}
    for _ in range(args.runs):  # alternating: the machine's load falls on both alike
        for backend in args.backends:
            rate, sends = end_to_end(backend, args.tasks)
            rows.setdefault(backend, []).append((rate, sends))
            print(f"  {backend}: {rate:,.0f} tasks/s end to end (producer {sends:,.0f}/s)")
    drained = args.drain_tasks or args.tasks
    drains = {backend: drain(backend, drained) for backend in args.backends}
    print(
        "\n| backend | tasks/s end to end (median) | min - max | producer sends/s "
        f"| drain of {drained:,} tasks/s, preloaded |"
    )
    print("|---|---|---|---|---|")
    for backend, runs in rows.items():
        rates = [r for r, _ in runs]
        name = "ledgerq (`ledgerq.django`)" if backend == "ledgerq" else "django-tasks-db on SQLite"
        print(
            f"| {name} | {statistics.median(rates):,.0f} | {min(rates):,.0f} - {max(rates):,.0f} "
            f"| {statistics.median(s for _, s in runs):,.0f} | {drains[backend]:,.0f} |"
        )
    if len(rows) == 2:
        ratio = statistics.median(r for r, _ in rows["ledgerq"]) / statistics.median(
            r for r, _ in rows["db"]
        )
        print(f"\nledgerq / django-tasks-db, end to end: {ratio:.2f}x")


if __name__ == "__main__":
    main()
