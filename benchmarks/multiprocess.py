"""Many processes on one queue (issue 16, "Speed"): the multi-process scenarios.

Run one scenario and print its result as one JSON object on stdout, as
``benchmarks/scenarios.py`` does (``run.py`` sends every ``mp_*`` kind here)::

    python -m benchmarks.multiprocess '{"kind": "mp_pc", "adapter": "sqlite", "dir": ...}'

Method.  The scenario's process (the *coordinator*) creates the queue (opens and closes
it once, so that no two processes race to create its files), then starts every worker as
a fresh interpreter (``python -m benchmarks.multiprocess --worker SPEC``) that opens the
queue itself through the adapter's multi-process face (``Adapter.open_shared``: ledgerq
with ``shared=True``, each peer with its own constructor, one connection per process).
The start barrier: a worker whose queue is open writes one byte into the *ready* pipe and
blocks reading one byte from the *go* pipe; once every worker's byte has arrived, the
coordinator writes one byte per worker into the go pipe in a single ``write()``, which
releases them all at once.  Interpreter start-up and opens are never timed.  Every time
is ``time.clock_gettime_ns(CLOCK_MONOTONIC)``: one clock for every process of the machine,
so one process's start and another's end can be subtracted.

``mp_pc``        P producer and C consumer processes, all started by the barrier.  A
                 producer enqueues ``per_producer`` messages one at a time (the first 8
                 bytes say which producer and which message, the rest is the same filler)
                 and reports its count, its start and the time its last enqueue returned.
                 A consumer dequeues + acks one at a time (``get_and_ack_shared``) and
                 reports its count, its start and the time of its last dequeue; when the
                 queue is empty it waits 1 ms on the *done* pipe (which the coordinator
                 closes once every producer has exited) and tries again - the same for
                 every queue - and it stops when the queue is empty after the producers
                 are done.  Aggregate rate = messages / (last end - first start) per side.
                 Both sides stop at ``cap_seconds`` whatever is left.  Each consumer writes
                 the tags it got to a file; the coordinator checks that every produced
                 message was consumed exactly once (lost, duplicated, unexpected counts).
``mp_exclusive`` the same total work in one process on an exclusive ledgerq: enqueue all
                 one at a time, then dequeue + ack all one at a time; both timed, and the
                 whole (``through_rate``: from the start to the last ack, as the consumers
                 of ``mp_pc`` count).
``mp_wake``      wake-up latency: a consumer process blocked in ``dequeue(timeout=...)`` on
                 a shared queue; before each call it writes a byte to the *armed* pipe; a
                 producer process reads that byte, pauses ``pause_seconds`` (so the
                 consumer is inside its wait), reads the clock and enqueues one message
                 carrying that time; the consumer reads the clock when ``dequeue`` returns.
                 Latency = return - enqueue start.  A sample where the consumer entered
                 ``dequeue`` after the enqueue began (it was not blocked) is counted.
``mp_memory``    RSS (``/proc/self/status``) of a fresh consumer process before opening
                 and after opening a queue of ``depth`` pending messages and one dequeue +
                 ack, exclusive and shared (each in its own process, one after the other).
``mp_probe``     whether this tree has shared mode (``ledgerq.open(path, shared=True)``).
"""

from __future__ import annotations

import gc
import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.adapters import get_adapter
from benchmarks.scenarios import _payload, warm_pages

REPO = Path(__file__).resolve().parent.parent
# The first 8 bytes of every message: producer index << 32 | sequence number (in mp_wake:
# the CLOCK_MONOTONIC time just before the enqueue call).
TAG = struct.Struct("<Q")
EMPTY_WAIT_S = 0.001  # a consumer that finds the queue empty waits this long (any queue)
MAX_ERRORS = 1000  # a worker that meets this many errors gives up (and says so)
START_TIMEOUT_S = 120.0  # for every worker to open its queue and reach the barrier


def now_ns() -> int:
    """Return CLOCK_MONOTONIC in nanoseconds: the same clock in every process."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


# ----------------------------------------------------------------------- the workers


def _barrier(spec: dict[str, Any]) -> int:
    """Say "ready" and wait for "go"; return the start time (now, if there is no barrier)."""
    if "go_fd" in spec:
        os.write(spec["ready_fd"], b"r")
        if not os.read(spec["go_fd"], 1):
            raise RuntimeError("the coordinator went away before the start")
    return now_ns()


def producer(spec: dict[str, Any]) -> dict[str, Any]:
    """Enqueue ``per_producer`` tagged messages one at a time, after the barrier."""
    adapter = get_adapter(spec["adapter"])
    adapter.open_shared(spec["dir"], spec["level"])
    put, pack = adapter.put, TAG.pack
    index, n = spec["index"], spec["per_producer"]
    filler = _payload(spec["size"] - TAG.size)
    errors, first_error, seq = 0, "", 0
    start = _barrier(spec)
    deadline = start + int(spec["cap_seconds"] * 1e9)
    while seq < n:
        try:
            put(pack(index << 32 | seq) + filler)
        except Exception as exc:  # a peer failing under several processes: count it, retry
            errors += 1
            first_error = first_error or _describe(exc)
            if errors >= MAX_ERRORS:
                break
            continue
        seq += 1
        if not seq & 63 and now_ns() > deadline:
            break
    end = now_ns()
    adapter.close()
    return {
        "role": "producer",
        "index": index,
        "count": seq,
        "start_ns": start,
        "end_ns": end,
        "errors": errors,
        "first_error": first_error,
        "timed_out": seq < n and errors < MAX_ERRORS,
    }


def consumer(spec: dict[str, Any]) -> dict[str, Any]:
    """Dequeue + ack one at a time until the producers are done and the queue is empty;
    write the tags got to ``spec["out"]``."""
    adapter = get_adapter(spec["adapter"])
    adapter.open_shared(spec["dir"], spec["level"])
    take, unpack = adapter.get_and_ack_shared, TAG.unpack_from
    size, done_fd = spec["size"], spec["done_fd"]
    got = array("Q")
    errors, first_error, wrong_size = 0, "", 0
    producers_done = timed_out = False
    start = _barrier(spec)
    end = start
    deadline = start + int(spec["cap_seconds"] * 1e9)
    while True:
        try:
            payload = take()
        except Exception as exc:  # a peer failing under several processes: count it, retry
            errors += 1
            first_error = first_error or _describe(exc)
            if errors >= MAX_ERRORS:
                break
            continue
        if payload is not None:
            end = now_ns()
            got.append(unpack(payload)[0])
            if len(payload) != size:
                wrong_size += 1
            if not len(got) & 63 and end > deadline:
                timed_out = True
                break
            continue
        if producers_done:
            break  # empty after every producer had exited: finished
        if now_ns() > deadline:
            timed_out = True
            break
        # Empty for now: wait on the done pipe (EOF = every producer exited), then retry.
        if select.select([done_fd], [], [], EMPTY_WAIT_S)[0]:
            producers_done = True
    adapter.close()
    with open(spec["out"], "wb") as f:
        got.tofile(f)
    return {
        "role": "consumer",
        "index": spec["index"],
        "count": len(got),
        "start_ns": start,
        "end_ns": end,
        "errors": errors,
        "first_error": first_error,
        "wrong_size": wrong_size,
        "timed_out": timed_out,
    }


def waiter(spec: dict[str, Any]) -> dict[str, Any]:
    """Block in ``dequeue(timeout=...)`` ``samples`` times; report each wake-up latency."""
    import ledgerq

    q = ledgerq.open(spec["dir"], shared=True)
    armed_fd, timeout = spec["armed_fd"], spec["timeout_seconds"]
    latencies: list[int] = []
    not_blocked = 0
    _barrier(spec)
    for _ in range(spec["samples"]):
        os.write(armed_fd, b"a")  # "I am about to wait": the producer pauses, then enqueues
        called = now_ns()
        msg = q.dequeue(timeout=timeout)
        returned = now_ns()
        if msg is None:
            raise RuntimeError(
                f"dequeue(timeout={timeout}) returned None: another process's enqueue "
                "did not wake it"
            )
        enqueued = TAG.unpack_from(msg.payload)[0]
        latencies.append(returned - enqueued)
        if called >= enqueued:
            not_blocked += 1  # it entered dequeue after the enqueue began
        q.ack(msg.id)
    q.close()
    return {"role": "waiter", "latencies_ns": latencies, "not_blocked": not_blocked}


def pinger(spec: dict[str, Any]) -> dict[str, Any]:
    """Enqueue one message each time the waiter is about to wait, after a pause."""
    import ledgerq

    q = ledgerq.open(spec["dir"], shared=True)
    armed_fd, pause = spec["armed_fd"], spec["pause_seconds"]
    filler = _payload(spec["size"] - TAG.size)
    sent = 0
    _barrier(spec)
    for _ in range(spec["samples"]):
        if not os.read(armed_fd, 1):
            break  # the waiter is gone (its error is reported by the coordinator)
        time.sleep(pause)  # the pacing that makes the waiter block, not a synchronisation
        q.enqueue(TAG.pack(now_ns()) + filler)
        sent += 1
    q.close()
    return {"role": "pinger", "sent": sent}


def _status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in bytes."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def rss(spec: dict[str, Any]) -> dict[str, Any]:
    """RSS before and after opening the queue (exclusive or shared) and one dequeue + ack."""
    import ledgerq

    gc.collect()
    before = _status()
    if spec["mode"] == "shared":
        q = ledgerq.open(spec["dir"], shared=True)
    else:
        q = ledgerq.open(spec["dir"])
    msg = q.dequeue()
    if msg is None:
        raise RuntimeError(f"queue {spec['dir']} is empty: nothing to dequeue")
    q.ack(msg.id)
    gc.collect()
    after = _status()
    pending = len(q)
    q.close()
    return {
        "role": "rss",
        "mode": spec["mode"],
        "pending": pending,
        "before": before,
        "after": after,
    }


ROLES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "producer": producer,
    "consumer": consumer,
    "waiter": waiter,
    "pinger": pinger,
    "rss": rss,
}


# ------------------------------------------------------------------ the coordinator


class Workers:
    """The worker processes of one scenario, released together by the pipe barrier."""

    def __init__(self, scratch: str) -> None:
        self.scratch = scratch
        self.ready_r, self.ready_w = os.pipe()
        self.go_r, self.go_w = os.pipe()
        self.procs: list[subprocess.Popen[str]] = []
        self.names: list[str] = []

    def spawn(self, spec: dict[str, Any], *fds: int) -> int:
        """Start a worker with ``spec`` (and the pipe ends ``fds``); return its number."""
        number = len(self.procs)
        name = f"{spec['role']} {spec.get('index', number)}"
        spec = {**spec, "ready_fd": self.ready_w, "go_fd": self.go_r}
        with open(os.path.join(self.scratch, f"worker-{number}.err"), "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.multiprocess", "--worker", json.dumps(spec)],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                pass_fds=(self.ready_w, self.go_r, *fds),  # same numbers in the child
            )
        self.procs.append(proc)
        self.names.append(name)
        return number

    def start(self) -> int:
        """Wait until every worker is ready, release them all; return the release time."""
        n, ready = len(self.procs), 0
        deadline = time.monotonic() + START_TIMEOUT_S
        while ready < n:
            if select.select([self.ready_r], [], [], 0.2)[0]:
                ready += len(os.read(self.ready_r, n - ready))
                continue
            for number, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    raise RuntimeError(self._failure(number, "exited before the start"))
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {ready} of {n} workers reached the start barrier")
        released = now_ns()
        os.write(self.go_w, b"g" * n)  # one write() releases every worker
        return released

    def result(self, number: int, timeout: float) -> dict[str, Any]:
        """Wait for worker ``number`` and return its JSON result."""
        proc = self.procs[number]
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(
                self._failure(number, f"still running after {timeout:.0f} s")
            ) from None
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(self._failure(number, f"exit {proc.returncode}"))
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def kill(self) -> None:
        """Kill every worker still running (only this scenario's own children)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.kill()
        for fd in (self.ready_r, self.ready_w, self.go_r, self.go_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _failure(self, number: int, what: str) -> str:
        err = Path(self.scratch, f"worker-{number}.err").read_text(errors="replace")
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return f"{self.names[number]} {what}: {tail}"


def _create(spec: dict[str, Any]) -> None:
    """Create the queue once, before the workers open it (no race to create its files)."""
    adapter = get_adapter(spec["adapter"])
    adapter.open_shared(spec["dir"], spec["level"])
    adapter.close()


def verify(produced: dict[int, int], consumed: array[int]) -> dict[str, int]:
    """Compare the tags consumed with the messages produced (producer -> count)."""
    seen: set[int] = set()
    duplicated = unexpected = 0
    for tag in consumed:
        index, seq = tag >> 32, tag & 0xFFFFFFFF
        if seq >= produced.get(index, 0):
            unexpected += 1
        elif tag in seen:
            duplicated += 1
        else:
            seen.add(tag)
    return {
        "produced": sum(produced.values()),
        "consumed": len(consumed),
        "distinct": len(seen),
        "missing": sum(produced.values()) - len(seen),
        "duplicated": duplicated,
        "unexpected": unexpected,
    }


def _window(results: list[dict[str, Any]]) -> float:
    """Seconds from the first start to the last end of these workers."""
    return (max(r["end_ns"] for r in results) - min(r["start_ns"] for r in results)) / 1e9


def mp_pc(spec: dict[str, Any]) -> dict[str, Any]:
    """P producer and C consumer processes on one queue; aggregate rates, then verify."""
    path = spec["dir"]
    scratch = path + ".run"
    os.makedirs(scratch)
    warm_pages(os.path.dirname(path), spec.get("warm_bytes", 0))
    _create(spec)
    done_r, done_w = os.pipe()
    workers = Workers(scratch)
    common = {
        k: spec[k] for k in ("adapter", "dir", "level", "size", "per_producer", "cap_seconds")
    }
    try:
        producers = [
            workers.spawn({**common, "role": "producer", "index": i})
            for i in range(spec["producers"])
        ]
        outs = [os.path.join(scratch, f"consumed-{i}.tags") for i in range(spec["consumers"])]
        consumers = [
            workers.spawn(
                {**common, "role": "consumer", "index": i, "done_fd": done_r, "out": out}, done_r
            )
            for i, out in enumerate(outs)
        ]
        os.close(done_r)
        released = workers.start()
        wait = spec["cap_seconds"] + 120
        made = [workers.result(n, wait) for n in producers]
        os.close(done_w)  # EOF on the done pipe: every producer has exited
        done_w = -1
        took = [workers.result(n, wait) for n in consumers]
    finally:
        if done_w >= 0:
            os.close(done_w)
        workers.close()
    consumed = array("Q")
    for out in outs:
        with open(out, "rb") as f:
            consumed.frombytes(f.read())
    check = verify({r["index"]: r["count"] for r in made}, consumed)
    enq_s, deq_s = _window(made), _window(took)
    everyone = made + took
    through_s = (max(r["end_ns"] for r in took) - min(r["start_ns"] for r in everyone)) / 1e9
    return {
        "enqueue_rate": check["produced"] / enq_s,
        "dequeue_rate": check["consumed"] / deq_s,
        # messages through the queue: from the start to the last dequeue + ack
        "through_rate": check["consumed"] / through_s,
        "enqueue_seconds": enq_s,
        "dequeue_seconds": deq_s,
        # how far apart the workers left the barrier, and how long after the release
        "start_spread_us": (
            max(r["start_ns"] for r in everyone) - min(r["start_ns"] for r in everyone)
        )
        / 1e3,
        "start_lag_us": (max(r["start_ns"] for r in everyone) - released) / 1e3,
        **check,
        "errors": sum(r["errors"] for r in everyone),
        "first_error": next((r["first_error"] for r in everyone if r["first_error"]), ""),
        "wrong_size": sum(r["wrong_size"] for r in took),
        "timed_out": any(r["timed_out"] for r in everyone),
        "cap_seconds": spec["cap_seconds"],
        "per_process": [
            {k: r[k] for k in ("role", "index", "count", "errors")}
            | {"seconds": (r["end_ns"] - r["start_ns"]) / 1e9}
            for r in everyone
        ],
    }


def mp_exclusive(spec: dict[str, Any]) -> dict[str, Any]:
    """The same total work in one process, exclusive: enqueue all, then dequeue + ack all."""
    path, total = spec["dir"], spec["messages"]
    warm_pages(os.path.dirname(path), spec.get("warm_bytes", 0))
    adapter = get_adapter("ledgerq")
    adapter.open(path, spec["level"])
    put, take, pack, unpack = adapter.put, adapter.get_and_ack, TAG.pack, TAG.unpack_from
    filler = _payload(spec["size"] - TAG.size)
    gc.collect()
    t0 = now_ns()
    for seq in range(total):
        put(pack(seq) + filler)
    t1 = now_ns()
    consumed = array("Q")
    while (payload := take()) is not None:
        consumed.append(unpack(payload)[0])
    t2 = now_ns()
    adapter.close()
    check = verify({0: total}, consumed)
    return {
        "enqueue_rate": total / ((t1 - t0) / 1e9),
        "dequeue_rate": len(consumed) / ((t2 - t1) / 1e9),  # the dequeue phase alone
        # from the start to the last dequeue + ack, as a 4 + 4 run's consumers count
        "through_rate": len(consumed) / ((t2 - t0) / 1e9),
        "enqueue_seconds": (t1 - t0) / 1e9,
        "dequeue_seconds": (t2 - t1) / 1e9,
        **check,
    }


def percentile(sorted_ns: list[int], q: float) -> int:
    """The nearest-rank ``q`` quantile of an ascending list."""
    rank = max(1, -(-len(sorted_ns) * q // 1))  # ceil(n * q), at least 1
    return sorted_ns[int(rank) - 1]


def mp_wake(spec: dict[str, Any]) -> dict[str, Any]:
    """Wake-up latency of a consumer process blocked in dequeue(timeout=...)."""
    import ledgerq

    path = spec["dir"]
    scratch = path + ".run"
    os.makedirs(scratch)
    ledgerq.open(path, shared=True).close()
    armed_r, armed_w = os.pipe()
    workers = Workers(scratch)
    common = {k: spec[k] for k in ("dir", "size", "samples")}
    try:
        wait_n = workers.spawn(
            {**common, "role": "waiter", "armed_fd": armed_w, "timeout_seconds": 5.0}, armed_w
        )
        ping_n = workers.spawn(
            {
                **common,
                "role": "pinger",
                "armed_fd": armed_r,
                "pause_seconds": spec["pause_seconds"],
            },
            armed_r,
        )
        os.close(armed_r)
        os.close(armed_w)  # so the pinger sees EOF if the waiter dies
        workers.start()
        wait = spec["samples"] * (spec["pause_seconds"] + 5.0) + 60
        woke = workers.result(wait_n, wait)
        workers.result(ping_n, 60)
    finally:
        workers.close()
    lat = sorted(woke["latencies_ns"])
    return {
        "samples": len(lat),
        "not_blocked": woke["not_blocked"],
        "p50_ns": percentile(lat, 0.50),
        "p90_ns": percentile(lat, 0.90),
        "p99_ns": percentile(lat, 0.99),
        "max_ns": lat[-1],
        "min_ns": lat[0],
    }


def mp_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """RSS of a fresh consumer process on a queue of ``depth`` pending messages, per mode."""
    import ledgerq

    path, depth = spec["dir"], spec["depth"]
    payload = _payload(spec["size"])
    with ledgerq.open(path, sync="never") as q:  # built fast; close() syncs
        for start in range(0, depth, 10_000):
            q.enqueue_batch([payload] * min(10_000, depth - start))
    out: dict[str, Any] = {"depth": depth}
    for mode in spec["modes"]:
        worker = json.dumps({"role": "rss", "dir": path, "mode": mode})
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.multiprocess", "--worker", worker],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"rss worker ({mode}) exit {proc.returncode}: {tail}")
        r = json.loads(lines[-1])
        out[mode] = {
            "pending": r["pending"],
            "rss_growth": r["after"]["VmRSS"] - r["before"]["VmRSS"],
            "anon_growth": r["after"]["RssAnon"] - r["before"]["RssAnon"],
            "file_growth": r["after"]["RssFile"] - r["before"]["RssFile"],
            "rss_after": r["after"]["VmRSS"],
            "peak_after": r["after"]["VmHWM"],
        }
    return out


def mp_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Whether ``ledgerq.open(path, shared=True)`` exists in this tree."""
    import ledgerq

    with tempfile.TemporaryDirectory() as tmp:
        try:
            q = ledgerq.open(os.path.join(tmp, "q"), shared=True)
        except TypeError as exc:
            return {
                "shared": False,
                # "unknown option shared; valid options are ...": the first clause says it
                "why": "ledgerq.open(path, shared=True) does not exist in this tree "
                f"({str(exc).split(';')[0]})",
            }
        q.close()
    return {"shared": True, "why": ""}


KINDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "mp_pc": mp_pc,
    "mp_exclusive": mp_exclusive,
    "mp_wake": mp_wake,
    "mp_memory": mp_memory,
    "mp_probe": mp_probe,
}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--worker":
        spec = json.loads(argv[1])
        result = ROLES[spec["role"]](spec)
    else:
        spec = json.loads(argv[0])
        result = KINDS[spec["kind"]](spec)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
