"""How the drain rate of one queue grows with its consumer processes (issue 26, item 3).

    python benchmarks/consumer_scaling.py                       # 1, 2, 4, 8 consumers
    python benchmarks/consumer_scaling.py --messages 20000 --runs 3 --consumers 1 2 4

Method.  For each queue (ledgerq shared with lock words, ledgerq shared on the ``flock``
fallback - ``LEDGERQ_LOCKING=flock`` - and plain SQLite in WAL mode with delete-on-get in
``BEGIN IMMEDIATE``, the peer of docs/benchmarks.md) and each consumer count C: a fresh
queue is preloaded with ``--messages`` messages of 100 B (one process, batches), then C
consumer processes are started (fresh interpreters, each opening the queue itself,
through ``benchmarks/adapters.py``'s multi-process face), wait at a barrier (a pipe)
and drain: dequeue + ack one at a time until the queue is empty.  Rate = messages /
(the last consumer's end - the first one's start), on ``CLOCK_MONOTONIC``, which every
process shares.  The median of ``--runs``; the queues alternate within a run, so each
sees the same kind of machine.  Every message is checked to be taken exactly once.
Run by hand; the table in docs/benchmarks.md ("Targeted benchmarks") comes from it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUEUES = {
    # name: (adapter key, extra environment)
    "ledgerq shared (lock words)": ("ledgerq", {"LEDGERQ_LOCKING": ""}),
    "ledgerq shared (flock fallback)": ("ledgerq", {"LEDGERQ_LOCKING": "flock"}),
    "plain SQLite (WAL)": ("sqlite", {}),
}

_CONSUMER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from benchmarks.adapters import get_adapter
adapter = get_adapter(sys.argv[2])
adapter.open_shared(sys.argv[3], "kill9")
os.write(int(sys.argv[4]), b"r")
os.read(int(sys.argv[5]), 1)
start = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
taken = []
while (payload := adapter.get_and_ack_shared()) is not None:
    taken.append(int.from_bytes(payload[:8], "little"))
end = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
adapter.close()
print(json.dumps({"start": start, "end": end, "taken": taken}))
"""


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in extra.items():
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _preload(adapter_key: str, path: str, messages: int, env: dict[str, str]) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from benchmarks.adapters import get_adapter\n"
        "a = get_adapter(sys.argv[2]); a.open_shared(sys.argv[3], 'kill9')\n"
        "n = int(sys.argv[4]); filler = bytes(92)\n"
        "for start in range(0, n, 1000):\n"
        "    a.put_batch([i.to_bytes(8, 'little') + filler"
        " for i in range(start, min(n, start + 1000))])\n"
        "a.close()\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(REPO), adapter_key, path, str(messages)],
        env=env,
        check=True,
    )


def drain_rate(adapter_key: str, env_extra: dict[str, str], consumers: int, messages: int) -> float:
    """Messages per second that ``consumers`` processes drain from a preloaded queue."""
    env = _environment(env_extra)
    with tempfile.TemporaryDirectory(prefix="lq-scaling-") as scratch:
        path = os.path.join(scratch, "q")
        _preload(adapter_key, path, messages, env)
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _CONSUMER,
                    str(REPO),
                    adapter_key,
                    path,
                    str(ready_w),
                    str(go_r),
                ],
                env=env,
                stdout=subprocess.PIPE,
                pass_fds=(ready_w, go_r),
            )
            for _ in range(consumers)
        ]
        os.close(ready_w)
        os.close(go_r)
        for _ in range(consumers):
            if os.read(ready_r, 1) != b"r":
                raise RuntimeError("a consumer died before the barrier")
        os.write(go_w, b"g" * consumers)
        reports = []
        for proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"a consumer exited with {proc.returncode}")
            reports.append(json.loads(out))
        os.close(ready_r)
        os.close(go_w)
    taken = sorted(t for r in reports for t in r["taken"])
    if taken != list(range(messages)):
        raise RuntimeError(f"{adapter_key}: {len(taken)} taken of {messages}, not each once")
    elapsed = (max(r["end"] for r in reports) - min(r["start"] for r in reports)) / 1e9
    return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    rates: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.runs):
        for consumers in args.consumers:
            for name, (key, env) in QUEUES.items():
                rate = drain_rate(key, env, consumers, args.messages)
                rates.setdefault((name, consumers), []).append(rate)
                print(f"  {name}, {consumers} consumer(s): {rate:,.0f}/s", file=sys.stderr)
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    names = list(QUEUES)
    print("| consumers | " + " | ".join(names) + " | lock words / SQLite |")
    print("|---|" + "---|" * (len(names) + 1))
    for consumers in args.consumers:
        medians = [statistics.median(rates[(name, consumers)]) for name in names]
        cells = " | ".join(f"{m:,.0f}" for m in medians)
        print(f"| {consumers} | {cells} | {medians[0] / medians[-1]:.2f}x |")


if __name__ == "__main__":
    main()
