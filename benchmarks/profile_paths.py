"""Where the time of ledgerq's hot paths goes, next to the floor the machine sets.

    .venv/bin/python benchmarks/profile_paths.py [--write PATH]

For each path the issue sets a target on, this prints (or writes as markdown):

* the rate of the path itself (no profiler; best of 3 runs of about 0.3 s, after the
  page-cache warm-up the benchmark uses);
* the rate of the *floor*: the system calls and checksums the path cannot avoid, done
  by a bare loop with the same record sizes (for dequeue + ack: two ``os.write`` of a
  21-byte journal record; for a batch: one CRC-32 per entry and one ``pwrite`` of the
  encoded batch over the same pages);
* the share of the path's time that is Python work above that floor, and the top
  functions of a ``cProfile`` run by own time.

It is not part of ``make bench`` (profiles are not comparisons); docs/benchmarks.md's
analysis section quotes one run of it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import ledgerq  # noqa: E402
from benchmarks.scenarios import warm_pages  # noqa: E402

_SECONDS = 0.3
_WARM_BYTES = 512 << 20


def best_rate(step: Callable[[], int], seconds: float = _SECONDS, runs: int = 3) -> float:
    """Messages per second of ``step`` (which returns how many it handled), best of runs."""
    best = 0.0
    for _ in range(runs):
        done = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in range(64):
                done += step()
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, done / (now - start))
    return best


def top_functions(step: Callable[[], int], calls: int, limit: int = 8) -> list[str]:
    """The ``limit`` functions with the most own time over ``calls`` steps (cProfile)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    rows = []
    total = stats.total_tt  # type: ignore[attr-defined]
    for (filename, line, name), (_, ncalls, tottime, _, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:limit]:
        where = name if filename == "~" else f"{Path(filename).name}:{line}({name})"
        rows.append(f"{100 * tottime / total:5.1f}%  {ncalls:>8,}  {where}")
    return rows


class Scratch:
    """A temporary directory on the same disk as the repository (not tmpfs)."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="ledgerq-profile-", dir=os.environ.get("TMPDIR"))

    def file_fd(self, name: str) -> int:
        return os.open(
            os.path.join(self.path, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        )

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def enqueue_one(scratch: Scratch) -> dict[str, object]:
    payload = os.urandom(100)
    q = ledgerq.open(os.path.join(scratch.path, "enqueue_one"))
    record = b"x" * (26 + len(payload))
    fd = scratch.file_fd("floor_enqueue_one")

    def path() -> int:
        q.enqueue(payload)
        return 1

    def floor() -> int:
        os.write(fd, record)
        return 1

    try:
        return measure("enqueue one at a time, 100 B", path, floor, "one os.write of the entry")
    finally:
        q.close()
        os.close(fd)


def dequeue_ack(scratch: Scratch) -> dict[str, object]:
    payload = os.urandom(100)
    q = ledgerq.open(os.path.join(scratch.path, "dequeue_ack"))
    for _ in range(6000):
        q.enqueue_batch([payload] * 100)
    fd = scratch.file_fd("floor_dequeue_ack")
    record = b"j" * 21

    def path() -> int:
        msg = q.dequeue()
        assert msg is not None, "the profile queue ran dry: raise its fill"
        q.ack(msg.id)
        return 1

    def floor() -> int:
        os.write(fd, record)  # the LEASE record
        os.write(fd, record)  # the ACK record
        return 1

    try:
        return measure(
            "dequeue + ack one at a time, 100 B",
            path,
            floor,
            "two os.write of a 21-byte journal record (lease, ack)",
        )
    finally:
        q.close()
        os.close(fd)


def enqueue_batch(scratch: Scratch, size: int) -> dict[str, object]:
    payloads = [os.urandom(size) for _ in range(100)]
    q = ledgerq.open(os.path.join(scratch.path, f"enqueue_batch_{size}"))
    blob = b"".join(b"h" * 22 + p + b"c" * 4 for p in payloads)
    fd = scratch.file_fd(f"floor_batch_{size}")
    crc32 = zlib.crc32

    def path() -> int:
        q.enqueue_batch(payloads)
        return 100

    def floor() -> int:
        for p in payloads:
            crc32(p)
        os.pwrite(fd, blob, 0)  # the same pages again: no page-cache growth to pay for
        return 100

    try:
        return measure(
            f"enqueue in batches of 100, {size:,} B",
            path,
            floor,
            "one CRC-32 per entry + one write of the batch",
            bytes_per_message=size,
        )
    finally:
        q.close()
        os.close(fd)


def measure(
    title: str,
    path: Callable[[], int],
    floor: Callable[[], int],
    floor_text: str,
    bytes_per_message: int = 0,
) -> dict[str, object]:
    # As in the benchmark: warm page cache for each timed part (see warm_pages).
    warm_pages(tempfile.gettempdir(), _WARM_BYTES)
    path_rate = best_rate(path)
    warm_pages(tempfile.gettempdir(), _WARM_BYTES)
    floor_rate = best_rate(floor)
    profile = top_functions(path, calls=20_000 if bytes_per_message < 1000 else 2_000)
    return {
        "title": title,
        "rate": path_rate,
        "floor": floor_rate,
        "floor_text": floor_text,
        "bytes_per_message": bytes_per_message,
        "profile": profile,
    }


def render(results: list[dict[str, object]]) -> str:
    lines = []
    for r in results:
        rate, floor = float(r["rate"]), float(r["floor"])  # type: ignore[arg-type]
        per_path, per_floor = 1e6 / rate, 1e6 / floor
        lines.append(f"### {r['title']}")
        lines.append("")
        bandwidth = ""
        if r["bytes_per_message"]:
            mib = rate * int(r["bytes_per_message"]) / 2**20  # type: ignore[call-overload]
            bandwidth = f" ({mib:,.0f} MiB/s of payload)"
        lines.append(f"- ledgerq: {rate:,.0f} msg/s{bandwidth} = {per_path:.2f} us per message")
        lines.append(
            f"- floor ({r['floor_text']}): {floor:,.0f} msg/s = {per_floor:.2f} us; "
            f"the rest, {per_path - per_floor:.2f} us ({100 * (1 - per_floor / per_path):.0f}%), "
            "is Python work"
        )
        lines.append("- cProfile, own time (share, calls, function):")
        lines.append("")
        lines.append("```")
        lines.extend(r["profile"])  # type: ignore[arg-type]
        lines.append("```")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="PATH", help="write the markdown here too")
    args = ap.parse_args()
    scratch = Scratch()
    try:
        results = [
            enqueue_one(scratch),
            dequeue_ack(scratch),
            enqueue_batch(scratch, 100),
            enqueue_batch(scratch, 4096),
        ]
    finally:
        scratch.close()
    text = render(results)
    print(text)
    if args.write:
        Path(args.write).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
