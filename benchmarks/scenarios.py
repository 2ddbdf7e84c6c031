"""Run one benchmark scenario and print its result as one JSON object on stdout.

Usage (from the repository root; ``run.py`` does this for every scenario, each in a fresh
process on a fresh directory)::

    python -m benchmarks.scenarios '{"kind": "throughput", "adapter": "ledgerq", ...}'

Every time is taken with ``time.perf_counter``.  A timed loop checks the clock after a
chunk of operations (1, 2, 4, ... up to 1024 while a chunk takes under 5 ms), so the clock
costs next to nothing and a slow queue still stops near its time budget.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.adapters import get_adapter

perf = time.perf_counter
MiB = 1 << 20


def _payload(size: int) -> bytes:
    # Not all one byte, so no layer can compress it into nothing.
    return (os.urandom(16) * (size // 16 + 1))[:size]


def timed_loop(step: Callable[[], int], max_ops: int, seconds: float) -> tuple[int, float]:
    """Call ``step`` (which returns how many operations it did; 0 = nothing left) until
    ``max_ops`` operations or ``seconds`` have passed; return (operations, elapsed)."""
    done = 0
    chunk = 1
    start = perf()
    deadline = start + seconds
    last = start
    finished = False
    while done < max_ops and not finished:
        for _ in range(chunk):
            n = step()
            if n == 0:
                finished = True
                break
            done += n
            if done >= max_ops:
                break
        now = perf()
        if now >= deadline:
            break
        if chunk < 1024 and now - last < 0.005:
            chunk *= 2
        last = now
    return done, perf() - start


def dir_bytes(path: str) -> tuple[int, int]:
    """Return (apparent bytes, allocated bytes) of every file under ``path``."""
    apparent = allocated = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def drop_file_cache(path: str) -> None:
    """Evict the (clean, already fsynced) pages of every file under ``path`` from the page
    cache, so a reopen reads them from the disk.  Touches only these files."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def warm_pages(path: str, nbytes: int) -> None:
    """Write and delete ``nbytes`` just before a timed part that writes a lot.

    On a virtual machine whose freed memory goes back to the host (free page reporting),
    the first write into such memory faults every page in from the hypervisor and runs
    several times slower than a write into memory the guest just used - and how much
    freed memory is still warm depends on what ran before.  Freeing a warm batch of pages
    right before the timed part makes the page cache allocate warm pages for every queue
    alike, as on a long-running machine whose memory is all in use."""
    if nbytes <= 0:
        return
    os.makedirs(path, exist_ok=True)
    scratch = os.path.join(path, "warm.scratch")
    block = os.urandom(MiB)
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(nbytes // MiB):
            os.write(fd, block)
    finally:
        os.close(fd)
        os.unlink(scratch)


# ------------------------------------------------------------------------- throughput


def _prefill(adapter_key: str, path: str, size: int, count: int, seconds: float) -> int:
    """Fill a queue with up to ``count`` messages (batches of 100, default sync level),
    for at most ``seconds``; return how many."""
    adapter = get_adapter(adapter_key)
    adapter.open(path, "kill9")
    payload = _payload(size)
    batch = [payload] * 100
    filled = 0
    deadline = perf() + seconds
    while filled < count and perf() < deadline:
        adapter.put_batch(batch)
        filled += len(batch)
    adapter.close()
    return filled


def throughput(spec: dict[str, Any]) -> dict[str, Any]:
    """One operation of the uniform interface, timed: enqueue_one, dequeue_one,
    enqueue_batch or dequeue_batch (batches of ``batch``), at one durability level."""
    op, size, path = spec["op"], spec["size"], spec["dir"]
    batch_n = spec.get("batch", 100)
    result: dict[str, Any] = {}
    if op.startswith("dequeue"):
        # Filled at the default level (fast for every peer), reopened at the level measured.
        result["prefilled"] = _prefill(
            spec["adapter"], path, size, spec["prefill"], spec["prefill_seconds"]
        )
    warm_pages(os.path.dirname(path), spec.get("warm_bytes", 0))
    adapter = get_adapter(spec["adapter"])
    take = adapter.get_and_ack
    if spec.get("shared"):
        # The multi-process face in one process (ledgerq: shared=True), against the
        # same scenario without it: what shared mode costs a process that is alone.
        adapter.open_shared(path, spec["level"])
        take = adapter.get_and_ack_shared
    else:
        adapter.open(path, spec["level"])
    payload = _payload(size)
    batch = [payload] * batch_n
    gc.collect()
    if op == "enqueue_one":

        def step() -> int:
            adapter.put(payload)
            return 1

    elif op == "enqueue_batch":

        def step() -> int:
            adapter.put_batch(batch)
            return batch_n

    elif op == "dequeue_one":

        def step() -> int:
            return 0 if take() is None else 1

    elif op == "dequeue_batch":

        def step() -> int:
            return len(adapter.get_batch_and_ack(batch_n))

    else:
        raise ValueError(f"unknown op {op!r}")
    ops, elapsed = timed_loop(step, spec["max_ops"], spec["seconds"])
    if op.startswith("dequeue"):
        got = take()
        if got is not None and len(got) != size:
            raise AssertionError(f"dequeued {len(got)} bytes, expected {size}")
    adapter.close()
    result.update(ops=ops, seconds=elapsed, rate=ops / elapsed, bytes_rate=ops * size / elapsed)
    return result


# ---------------------------------------------------------------------------- threads


def threads(spec: dict[str, Any]) -> dict[str, Any]:
    """``threads`` producer threads enqueue one message at a time into one queue for
    ``seconds``; the rate is every thread's enqueues over the wall time."""
    adapter = get_adapter(spec["adapter"])
    adapter.open(spec["dir"], spec["level"])
    payload = _payload(spec["size"])
    n_threads = spec["threads"]
    counts = [0] * n_threads
    barrier = threading.Barrier(n_threads + 1)
    box: dict[str, float] = {}

    def producer(i: int) -> None:
        put = adapter.put
        barrier.wait()
        deadline = box["deadline"]
        n = 0
        while perf() < deadline:
            put(payload)
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=producer, args=(i,)) for i in range(n_threads)]
    for w in workers:
        w.start()
    start = perf()
    box["deadline"] = start + spec["seconds"]
    barrier.wait()
    for w in workers:
        w.join()
    elapsed = perf() - start
    adapter.close()
    ops = sum(counts)
    return {"ops": ops, "seconds": elapsed, "rate": ops / elapsed, "per_thread": counts}


# ------------------------------------------------------------------------------ depth


def depth(spec: dict[str, Any]) -> dict[str, Any]:
    """Dequeue + ack one at a time from a queue held at ``depth`` pending messages: after
    every chunk of 1000 dequeues (timed) 1000 messages are enqueued again (not timed)."""
    key, path, size, n = spec["adapter"], spec["dir"], spec["size"], spec["depth"]
    payload = _payload(size)
    started = perf()
    if key == "ledgerq":
        import ledgerq

        with ledgerq.open(path, sync="never") as q:  # build fast; close() syncs
            for start in range(0, n, 10_000):
                q.enqueue_batch([payload] * min(10_000, n - start))
    else:
        adapter = get_adapter(key)
        adapter.open(path, "kill9")
        for start in range(0, n, 10_000):
            adapter.put_batch([payload] * min(10_000, n - start))
        adapter.close()
    build = perf() - started
    gc.collect()
    adapter = get_adapter(key)
    adapter.open(path, spec["level"])
    refill = [payload] * 1000
    for _ in range(1000):  # warm up: the first dequeues after open may set things up
        adapter.get_and_ack()
    adapter.put_batch(refill)
    timed = 0.0
    ops = 0
    while timed < spec["seconds"]:
        t0 = perf()
        for _ in range(1000):
            if adapter.get_and_ack() is None:
                raise AssertionError("queue ran empty")
        timed += perf() - t0
        ops += 1000
        adapter.put_batch(refill)
    adapter.close()
    return {"ops": ops, "seconds": timed, "rate": ops / timed, "build_seconds": build}


# ----------------------------------------------------------------------------- reopen


def reopen_build(spec: dict[str, Any]) -> dict[str, Any]:
    """Build a ledgerq queue of ``n`` messages (batches of 10,000, sync="never"), lease
    ``leased`` of them and ack every other one, fsync, then die by SIGKILL."""
    import ledgerq

    path, n, size = spec["dir"], spec["n"], spec["size"]
    payload = _payload(size)
    started = perf()
    q = ledgerq.open(path, sync="never")
    for start in range(0, n, 10_000):
        q.enqueue_batch([payload] * min(10_000, n - start))
    msgs = q.dequeue_batch(spec["leased"])
    for msg in msgs[::2]:
        q.ack(msg.id)
    q.sync()
    build = perf() - started
    apparent, _ = dir_bytes(path)
    out = {"build_seconds": build, "messages": n, "leased": len(msgs) - len(msgs[::2])}
    out["disk_bytes"] = apparent
    print(json.dumps(out), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # a crash with messages leased
    raise AssertionError("unreachable")


def reopen(spec: dict[str, Any]) -> dict[str, Any]:
    """Time ``ledgerq.open`` plus the first dequeue, with the queue's files evicted from
    the page cache first; then lease ``lease_after`` more messages and close cleanly."""
    import ledgerq

    path = spec["dir"]
    drop_file_cache(path)
    gc.collect()
    t0 = perf()
    q = ledgerq.open(path)
    t1 = perf()
    msg = q.dequeue()
    t2 = perf()
    if msg is None:
        raise AssertionError("reopened queue is empty")
    pending = len(q)
    in_flight = q.stats().in_flight
    q.ack(msg.id)
    for m in q.dequeue_batch(spec.get("lease_after", 0)):
        if m.id % 2:
            q.ack(m.id)
    q.close()
    return {
        "seconds": t2 - t0,
        "open_seconds": t1 - t0,
        "first_dequeue_seconds": t2 - t1,
        "pending_after_open": pending,
        "in_flight_after_open": in_flight,
        "first_attempts": msg.attempts,
    }


# ----------------------------------------------------------------- priority memory


def prio_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Memory of the priority index per pending message: the method of
    benchmarks/priority_memory.py (tracemalloc around the first peek after a reopen,
    which builds the index), plus the untraced build time."""
    import ledgerq
    from ledgerq import Item, Priority

    path, n = spec["dir"], spec["n"]
    payload = _payload(spec["size"])
    with ledgerq.open(path, priorities=True, sync="never") as q:
        for start in range(0, n, 10_000):
            count = min(10_000, n - start)
            q.enqueue_batch([Item(payload, priority=Priority(i % 3)) for i in range(count)])
    with ledgerq.open(path, priorities=True, sync="never") as q:
        gc.collect()
        t0 = perf()
        q.peek(1)
        build = perf() - t0
    with ledgerq.open(path, priorities=True, sync="never") as q:
        gc.collect()
        tracemalloc.start()
        q.peek(1)
        retained, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {"messages": n, "bytes_per_message": retained / n, "build_seconds": build}


# ------------------------------------------------------------------------------- disk


def disk(spec: dict[str, Any]) -> dict[str, Any]:
    """Bytes on disk per message after ``n`` enqueues (batches of 100) and a close."""
    adapter = get_adapter(spec["adapter"])
    path, n, size = spec["dir"], spec["n"], spec["size"]
    adapter.open(path, "kill9")
    payload = _payload(size)
    for start in range(0, n, 100):
        adapter.put_batch([payload] * min(100, n - start))
    adapter.close()
    apparent, allocated = dir_bytes(path)
    return {
        "messages": n,
        "bytes_per_message": apparent / n,
        "allocated_per_message": allocated / n,
        "overhead_per_message": apparent / n - size,
    }


# -------------------------------------------------------------------------------- raw


def ledgerq_record_size(path: str, size: int) -> int:
    """Bytes ledgerq appends to its segment for one message of ``size`` bytes."""
    import ledgerq

    n = 1000
    with ledgerq.open(path, sync="never") as q:
        q.enqueue_batch([_payload(size)] * n)
    logs = [p.stat().st_size for p in Path(path).rglob("*.log") if p.parent.name == "segments"]
    return round(sum(logs) / n) if logs else size


def raw(spec: dict[str, Any]) -> dict[str, Any]:
    """The machine's limits, measured the same way as the queues: a loop of os.write of
    one record (the size ledgerq writes for the payload) on an O_APPEND file, the same
    with fdatasync after each write, and 1 MiB sequential writes."""
    path = spec["dir"]
    os.makedirs(path, exist_ok=True)
    test = spec["test"]
    if test != "seq1m":
        record_size = ledgerq_record_size(os.path.join(path, "probe"), spec["size"])
    warm_pages(path, spec.get("warm_bytes", 0))
    fd = os.open(os.path.join(path, "raw.dat"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if test == "seq1m":
            block = os.urandom(MiB)
            total = spec["max_bytes"] // MiB

            def step() -> int:
                os.write(fd, block)
                return 1

            blocks, elapsed = timed_loop(step, total, spec["seconds"])
            t0 = perf()
            os.fdatasync(fd)
            sync = perf() - t0
            return {
                "ops": blocks,
                "seconds": elapsed,
                "rate": blocks * MiB / elapsed,
                "rate_with_final_fdatasync": blocks * MiB / (elapsed + sync),
            }
        record = _payload(record_size)
        if test == "write":

            def step() -> int:
                os.write(fd, record)
                return 1

        elif test == "fdatasync":

            def step() -> int:
                os.write(fd, record)
                os.fdatasync(fd)
                return 1

        else:
            raise ValueError(f"unknown raw test {test!r}")
        ops, elapsed = timed_loop(step, spec["max_ops"], spec["seconds"])
        return {
            "ops": ops,
            "seconds": elapsed,
            "rate": ops / elapsed,
            "record_bytes": record_size,
        }
    finally:
        os.close(fd)


KINDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "throughput": throughput,
    "threads": threads,
    "depth": depth,
    "reopen_build": reopen_build,
    "reopen": reopen,
    "prio_memory": prio_memory,
    "disk": disk,
    "raw": raw,
}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    result = KINDS[spec["kind"]](spec)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
