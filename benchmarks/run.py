"""Run ledgerq's benchmark suite against its peers, side by side, and report.

    python benchmarks/run.py                       # full run, prints the tables
    python benchmarks/run.py --write docs/benchmarks.md --json results.json
    python benchmarks/run.py --quick               # smoke run: small counts, 1 repeat
    python benchmarks/run.py --only throughput/enqueue_one --only raw --repeats 5

Every scenario runs in a fresh subprocess (``python -m benchmarks.scenarios SPEC``) on a
fresh directory under ``--dir`` (default: a new temporary directory), one after the
other; the repeats are interleaved (repeat 1 of every scenario, then repeat 2, ...) so
a drift of the machine hits every queue alike.  Results are medians with min-max; every
ratio is computed from the medians of this one run.  ``--only`` takes task ids or
prefixes or glob patterns, e.g. ``throughput``, ``throughput/dequeue_one/100``,
``*/ledgerq``, ``threads``, ``depth``, ``reopen``, ``memory``, ``disk``, ``raw``, ``mp``.

The ``mp/...`` tasks are the shared-mode scenarios of issue 16 (many processes on one
queue, ``benchmarks/multiprocess.py``).  Their ledgerq rows need
``ledgerq.open(path, shared=True)``: in a tree without it they are reported as not
available, not as failures.  To re-run only them into a saved run and its report::

    python benchmarks/run.py --update docs/benchmarks.json --write docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ANALYSIS = REPO / "benchmarks" / "analysis.md"  # hand-written, quoted in the report
# Hand-copied results of the targeted benchmarks (each names its command and run),
# quoted after this run's sections.
TARGETED = REPO / "benchmarks" / "targeted.md"
# analysis.md's part from this heading on is quoted in the shared-mode section instead.
ANALYSIS_MP_HEADING = "### How to read the shared-mode numbers"
if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(REPO))

from benchmarks.adapters import ADAPTERS, LEVELS, describe  # noqa: E402
from benchmarks.charts import Bars, Line, bar_chart, line_chart  # noqa: E402

OPS = {
    "enqueue_one": "enqueue one at a time",
    "dequeue_one": "dequeue + ack one at a time",
    "enqueue_batch": "enqueue in batches of 100",
    "dequeue_batch": "dequeue + ack in batches of 100",
}
SIZES = (100, 4096)
THREADS = (1, 4, 16)
LEVEL_SHORT = {"kill9": "default sync", "power": 'sync="always"'}


@dataclass(frozen=True)
class Counts:
    """How much work each scenario does (full run or --quick)."""

    seconds: float  # time budget of one timed loop
    max_ops: int
    prefill: dict[int, int]  # payload size -> messages put in the queue before a dequeue run
    prefill_seconds: float
    thread_seconds: float
    depths: tuple[int, int]
    depth_seconds: float
    reopen_messages: int
    reopen_leased: int
    memory_messages: int
    disk_messages: dict[int, int]
    seq_bytes: int
    seq_seconds: float
    warm_bytes: int  # written and deleted right before a timed part that writes
    repeats: int
    mp_per_producer: int  # messages each producer process enqueues (4 + 4 processes)
    mp_cap_seconds: float  # a multi-process run stops here, whatever is left
    wake_samples: int
    wake_pause_seconds: float  # between the consumer's "about to wait" and the enqueue


FULL = Counts(
    seconds=0.5,
    max_ops=2_000_000,
    prefill={100: 30_000, 4096: 10_000},
    prefill_seconds=1.5,
    thread_seconds=0.75,
    depths=(10_000, 1_000_000),
    depth_seconds=1.0,
    reopen_messages=10_000_000,
    reopen_leased=10_000,
    memory_messages=1_000_000,
    disk_messages={100: 20_000, 4096: 5_000},
    seq_bytes=512 << 20,
    seq_seconds=1.0,
    warm_bytes=512 << 20,
    repeats=3,
    mp_per_producer=20_000,
    mp_cap_seconds=20.0,
    wake_samples=1_000,
    wake_pause_seconds=0.005,
)
QUICK = Counts(
    seconds=0.1,
    max_ops=200_000,
    prefill={100: 5_000, 4096: 2_000},
    prefill_seconds=0.5,
    thread_seconds=0.2,
    depths=(10_000, 100_000),
    depth_seconds=0.2,
    reopen_messages=200_000,
    reopen_leased=1_000,
    memory_messages=50_000,
    disk_messages={100: 2_000, 4096: 500},
    seq_bytes=64 << 20,
    seq_seconds=0.3,
    warm_bytes=64 << 20,
    repeats=1,
    mp_per_producer=1_000,
    mp_cap_seconds=5.0,
    wake_samples=100,
    wake_pause_seconds=0.005,
)


@dataclass
class Task:
    """One scenario run: ``tid`` names it (also the key of its results)."""

    tid: str
    spec: dict[str, Any]
    once: bool = False  # deterministic: run in the first repeat only
    needs_shared: bool = False  # needs ledgerq.open(path, shared=True)


@dataclass
class Results:
    values: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def add(self, tid: str, result: dict[str, Any]) -> None:
        self.values.setdefault(tid, []).append(result)

    def samples(self, tid: str, key: str = "rate") -> list[float]:
        return [float(r[key]) for r in self.values.get(tid, []) if key in r]

    def median(self, tid: str, key: str = "rate") -> float | None:
        xs = self.samples(tid, key)
        return statistics.median(xs) if xs else None


class Charts:
    """The SVG charts of one report, by file name; :meth:`image` is the markdown that
    shows one (the files go to ``img/`` beside the report: :func:`write_report`)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def image(self, name: str, alt: str, svg: str) -> str:
        self.files[f"bench-{name}.svg"] = svg
        return f"![{alt}](img/bench-{name}.svg)"


def write_report(path: str, text: str, charts: Charts) -> None:
    """Write the report to ``path`` and its charts into ``img/`` beside it."""
    target = Path(path)
    images = target.parent / "img"
    if charts.files:
        images.mkdir(parents=True, exist_ok=True)
    for name, svg in charts.files.items():
        (images / name).write_text(svg)
    target.write_text(text)
    print(f"wrote {path} and {len(charts.files)} chart(s) in {images}", file=sys.stderr)


# ----------------------------------------------------------------------------- plan


def build_plan(c: Counts, adapters: list[str]) -> list[Task]:
    tasks: list[Task] = []
    for op in OPS:
        for size in SIZES:
            for level in LEVELS:
                for key in adapters:
                    if ADAPTERS[key].levels[level] is None:
                        continue
                    spec = {
                        "kind": "throughput",
                        "adapter": key,
                        "op": op,
                        "size": size,
                        "level": level,
                        "seconds": c.seconds,
                        "max_ops": c.max_ops,
                        "prefill": c.prefill[size],
                        "prefill_seconds": c.prefill_seconds,
                        "batch": 100,
                        "warm_bytes": c.warm_bytes,
                    }
                    tasks.append(Task(f"throughput/{op}/{size}/{level}/{key}", spec))
    for n in THREADS:
        for key in adapters:
            cls = ADAPTERS[key]
            if cls.is_thread_safe and cls.levels["power"] is not None:
                spec = {
                    "kind": "threads",
                    "adapter": key,
                    "threads": n,
                    "size": 100,
                    "level": "power",
                    "seconds": c.thread_seconds,
                }
                tasks.append(Task(f"threads/{n}/{key}", spec))
    for d in c.depths:
        for key in ("ledgerq", "sqlite"):
            if key in adapters:
                spec = {
                    "kind": "depth",
                    "adapter": key,
                    "depth": d,
                    "size": 100,
                    "level": "kill9",
                    "seconds": c.depth_seconds,
                }
                tasks.append(Task(f"depth/{d}/{key}", spec))
    if "ledgerq" in adapters:
        spec = {
            "kind": "reopen_suite",
            "n": c.reopen_messages,
            "size": 100,
            "leased": c.reopen_leased,
        }
        tasks.append(Task("reopen/ledgerq", spec))
        spec = {"kind": "prio_memory", "n": c.memory_messages, "size": 100}
        tasks.append(Task("memory/ledgerq", spec, once=True))
    for size in SIZES:
        for key in adapters:
            spec = {"kind": "disk", "adapter": key, "n": c.disk_messages[size], "size": size}
            tasks.append(Task(f"disk/{size}/{key}", spec, once=True))
    for size in SIZES:
        for test in ("write", "fdatasync"):
            spec = {
                "kind": "raw",
                "test": test,
                "size": size,
                "seconds": c.seconds,
                "max_ops": c.max_ops,
                "warm_bytes": c.warm_bytes,
            }
            tasks.append(Task(f"raw/{test}/{size}", spec))
    spec = {
        "kind": "raw",
        "test": "seq1m",
        "max_bytes": c.seq_bytes,
        "seconds": c.seq_seconds,
        "warm_bytes": c.warm_bytes,
    }
    tasks.append(Task("raw/seq1m", spec))
    return tasks + build_mp_plan(c, adapters)


# The shared-mode scenarios (issue 16, benchmarks/multiprocess.py).
MP_PROCESSES = 4  # producer processes, and as many consumer processes
MP_PEERS = ("sqlite", "litequeue", "pq-sqlite-ack", "diskcache")  # opened by every process
MP_OPS = {"enqueue_one": "enqueue one at a time", "dequeue_one": "dequeue + ack one at a time"}


def build_mp_plan(c: Counts, adapters: list[str]) -> list[Task]:
    tasks: list[Task] = []
    has_ledgerq = "ledgerq" in adapters
    if has_ledgerq:
        for op in MP_OPS:
            for mode in ("exclusive", "shared"):
                spec = {
                    "kind": "throughput",
                    "adapter": "ledgerq",
                    "op": op,
                    "size": 100,
                    "level": "kill9",
                    "seconds": c.seconds,
                    "max_ops": c.max_ops,
                    "prefill": c.prefill[100],
                    "prefill_seconds": c.prefill_seconds,
                    "warm_bytes": c.warm_bytes,
                    "shared": mode == "shared",
                }
                tasks.append(Task(f"mp/single/{op}/{mode}", spec, needs_shared=mode == "shared"))
        spec = {
            "kind": "mp_exclusive",
            "messages": MP_PROCESSES * c.mp_per_producer,
            "size": 100,
            "level": "kill9",
            "warm_bytes": c.warm_bytes,
        }
        tasks.append(Task("mp/pc/ledgerq-exclusive", spec))
    for key in ("ledgerq", *MP_PEERS):
        if key in adapters:
            spec = {
                "kind": "mp_pc",
                "adapter": key,
                "producers": MP_PROCESSES,
                "consumers": MP_PROCESSES,
                "per_producer": c.mp_per_producer,
                "cap_seconds": c.mp_cap_seconds,
                "size": 100,
                "level": "kill9",
                "warm_bytes": c.warm_bytes,
            }
            tasks.append(Task(f"mp/pc/{key}", spec, needs_shared=key == "ledgerq"))
    if has_ledgerq:
        spec = {
            "kind": "mp_wake",
            "samples": c.wake_samples,
            "pause_seconds": c.wake_pause_seconds,
            "size": 100,
        }
        tasks.append(Task("mp/wake/ledgerq", spec, needs_shared=True))
        for d in c.depths:
            spec = {"kind": "mp_memory", "depth": d, "size": 100, "modes": ["exclusive", "shared"]}
            tasks.append(Task(f"mp/memory/{d}", spec, once=True))
    return tasks


def shared_unavailable() -> str | None:
    """Return None when this tree has ``ledgerq.open(path, shared=True)``, else why not."""
    probe = run_scenario({"kind": "mp_probe"}, timeout=120)
    return None if probe["shared"] else str(probe["why"])


def without_shared(tasks: list[Task]) -> list[Task]:
    """The tasks that do not need shared mode; memory measured in exclusive mode only."""
    kept = [t for t in tasks if not t.needs_shared]
    for t in kept:
        if t.spec["kind"] == "mp_memory":
            t.spec["modes"] = ["exclusive"]
    return kept


def selected(tid: str, only: list[str]) -> bool:
    if not only:
        return True
    return any(tid.startswith(f) or fnmatch.fnmatchcase(tid, f) for f in only)


# ---------------------------------------------------------------------- execution


def run_scenario(spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Run one scenario in a fresh interpreter; return its JSON result (last line)."""
    module = "benchmarks.multiprocess" if spec["kind"].startswith("mp_") else "benchmarks.scenarios"
    cmd = [sys.executable, "-m", module, json.dumps(spec)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    expect_kill = spec["kind"] == "reopen_build"
    if (proc.returncode != 0 and not (expect_kill and proc.returncode == -9)) or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit {proc.returncode}: {tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_reopen(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """Build a big queue (dies by SIGKILL with messages leased), time its reopen after
    that crash, then (it closes cleanly) time a reopen after a clean close."""
    build = run_scenario(
        {
            "kind": "reopen_build",
            "dir": path,
            "n": spec["n"],
            "size": spec["size"],
            "leased": spec["leased"],
        }
    )
    half = spec["leased"] // 2
    crash = run_scenario({"kind": "reopen", "dir": path, "lease_after": half})
    clean = run_scenario({"kind": "reopen", "dir": path, "lease_after": half})
    return {
        "seconds": max(crash["seconds"], clean["seconds"]),
        "after_kill": crash["seconds"],
        "after_kill_open": crash["open_seconds"],
        "after_close": clean["seconds"],
        "after_close_open": clean["open_seconds"],
        "build_seconds": build["build_seconds"],
        "disk_bytes": build["disk_bytes"],
        "leased": build["leased"],
        "pending_after_open": crash["pending_after_open"],
    }


def execute(tasks: list[Task], repeats: int, root: str, res: Results) -> None:
    total = sum(repeats if not t.once else 1 for t in tasks)
    done = 0
    for rep in range(repeats):
        for task in tasks:
            if task.once and rep > 0:
                continue
            done += 1
            path = tempfile.mkdtemp(prefix="s-", dir=root)
            started = time.perf_counter()
            try:
                if task.spec["kind"] == "reopen_suite":
                    result = run_reopen(task.spec, os.path.join(path, "q"))
                else:
                    result = run_scenario({**task.spec, "dir": os.path.join(path, "q")})
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                res.errors[task.tid] = str(exc)[:300]
                status = f"FAILED {str(exc)[:120]}"
            else:
                res.add(task.tid, result)
                status = _short(result)
            finally:
                shutil.rmtree(path, ignore_errors=True)
            took = time.perf_counter() - started
            print(
                f"[{done}/{total}] r{rep + 1} {task.tid}: {status} ({took:.1f}s)",
                file=sys.stderr,
                flush=True,
            )


def _short(result: dict[str, Any]) -> str:
    if "enqueue_rate" in result:
        checked = f", {result['missing']} missing, {result['duplicated']} duplicated"
        return (
            f"enqueue {result['enqueue_rate']:,.0f}/s, dequeue + ack "
            f"{result['through_rate']:,.0f}/s{checked}"
        )
    if "p99_ns" in result:
        return f"p50 {result['p50_ns'] / 1e6:.2f} ms, p99 {result['p99_ns'] / 1e6:.2f} ms"
    if "depth" in result:
        return ", ".join(
            f"{m} +{result[m]['rss_growth'] / 2**20:.1f} MiB"
            for m in ("exclusive", "shared")
            if m in result
        )
    if "rate" in result:
        return f"{result['rate']:,.0f}/s"
    if "bytes_per_message" in result:
        return f"{result['bytes_per_message']:.1f} B/msg"
    if "seconds" in result:
        return f"{result['seconds'] * 1000:.0f} ms"
    return json.dumps(result)[:80]


# -------------------------------------------------------------------- environment


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _mount_of(path: str) -> tuple[str, str, str, str]:
    """(device, mount point, fs type, options) of the mount holding ``path``."""
    best = ("?", "/", "?", "")
    real = os.path.realpath(path)
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        dev, mnt, fstype, opts = parts[:4]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
            best = (dev, mnt, fstype, opts)
    return best


def machine(root: str) -> dict[str, str]:
    cpuinfo = _read("/proc/cpuinfo")
    models = [
        ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")
    ]
    mhz = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("cpu MHz")]
    is_vm = " hypervisor" in cpuinfo
    mem_kb = 0
    for ln in _read("/proc/meminfo").splitlines():
        if ln.startswith("MemTotal:"):
            mem_kb = int(ln.split()[1])
    dev, mnt, fstype, opts = _mount_of(root)
    block = os.path.basename(dev)
    rotational = _read(f"/sys/block/{block}/queue/rotational").strip()
    disk = {
        "0": "SSD / virtual (non-rotational)",
        "1": "rotational (or a virtual disk that says so)",
    }
    disk_kind = disk.get(rotational, "unknown")
    virt = []
    for flag, what in (("--vm", "virtual machine"), ("--container", "container")):
        try:
            out = subprocess.run(
                ["systemd-detect-virt", flag], capture_output=True, text=True, timeout=5
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        if out and out != "none":
            virt.append(f"{what}: {out}")
    stat = os.statvfs(root)
    return {
        "cpu": f"{models[0] if models else platform.processor()} x {len(models)}"
        + (f" @ {float(mhz[0]):.0f} MHz" if mhz else ""),
        "virtualised": ", ".join(virt) or ("yes (CPU flag hypervisor)" if is_vm else "no"),
        "nproc": f"{len(os.sched_getaffinity(0))} (os.cpu_count() = {os.cpu_count()})",
        "memory": f"{mem_kb / 1024 / 1024:.1f} GiB",
        "kernel": f"{platform.system()} {platform.release()}",
        "bench_dir": root,
        "filesystem": f"{fstype} on {dev} mounted at {mnt} ({opts})",
        "disk": f"{block}: {disk_kind}; {stat.f_bavail * stat.f_frsize / 2**30:.0f} GiB free",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
    }


def versions() -> dict[str, str]:
    out = {}
    for dist in ("ledgerq", "persist-queue", "diskcache", "litequeue", "queuelib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        rev = ""
    if rev:
        out["ledgerq"] += f" (git {rev})"
    return out


# ------------------------------------------------------------------------ analysis


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:,.1f}"


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def cell(res: Results, tid: str, key: str = "rate", scale: float = 1.0) -> str:
    xs = [x * scale for x in res.samples(tid, key)]
    if not xs:
        return f"failed: {res.errors[tid][:60]}" if tid in res.errors else "-"
    med = statistics.median(xs)
    if len(xs) == 1:
        return fmt_rate(med)
    return f"{fmt_rate(med)} ({fmt_rate(min(xs))}-{fmt_rate(max(xs))})"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fastest_peer(
    res: Results, op: str, size: int, level: str, *, keeps_unacked: bool | None = None
) -> tuple[str | None, float | None]:
    """The fastest peer that really survives kill -9 at this level (median).

    ``keeps_unacked`` True/False picks only the peers that keep / delete a message
    handed out to a consumer (None: both).
    """
    best: tuple[str | None, float | None] = (None, None)
    for key, cls in ADAPTERS.items():
        lv = cls.levels[level]
        if key == "ledgerq" or lv is None or not lv.is_kill9_safe:
            continue
        if keeps_unacked is not None and cls.keeps_unacked != keeps_unacked:
            continue
        m = res.median(f"throughput/{op}/{size}/{level}/{key}")
        if m is not None and (best[1] is None or m > best[1]):
            best = (key, m)
    return best


@dataclass
class Target:
    name: str
    measured: float | None
    bound: float
    is_upper: bool  # measured must be <= bound (else >=)
    unit: str
    basis: str

    @property
    def verdict(self) -> str:
        if self.measured is None:
            return "not measured"
        ok = self.measured <= self.bound if self.is_upper else self.measured >= self.bound
        return "met" if ok else "**NOT met**"


def targets(res: Results) -> list[Target]:
    out: list[Target] = []
    lq = "throughput/{op}/{size}/{level}/ledgerq"

    def med(tid: str, key: str = "rate") -> float | None:
        return res.median(tid, key)

    def peer_target(op: str, label: str, bound: float) -> None:
        consuming = op.startswith("dequeue")
        peer, rate = fastest_peer(res, op, 100, "kill9", keeps_unacked=True if consuming else None)
        mine = med(lq.format(op=op, size=100, level="kill9"))
        basis = (
            f"ledgerq {fmt_rate(mine)} msg/s vs {ADAPTERS[peer].label} {fmt_rate(rate)} msg/s"
            if peer
            else "no crash-safe peer measured"
        )
        if consuming:
            # Shown beside the target, not hidden: the fastest queue that deletes on get.
            other, other_rate = fastest_peer(res, op, 100, "kill9", keeps_unacked=False)
            if other is not None:
                basis += (
                    f"; fastest delete-on-get peer (loses a message whose consumer is killed, "
                    f"one write per message): {ADAPTERS[other].label} {fmt_rate(other_rate)} "
                    f"msg/s, ledgerq {fmt_ratio(_ratio(mine, other_rate))}"
                )
        out.append(Target(label, _ratio(mine, rate), bound, False, "x", basis))

    peer_target(
        "enqueue_one", "enqueue one at a time, 100 B, default sync vs fastest kill -9-safe peer", 7
    )
    mine = med(lq.format(op="enqueue_one", size=100, level="kill9"))
    raw_w = med("raw/write/100")
    out.append(
        Target(
            "enqueue one at a time, 100 B, default sync vs raw os.write loop",
            _ratio(mine, raw_w),
            0.30,
            False,
            "x",
            f"ledgerq {fmt_rate(mine)}/s vs os.write {fmt_rate(raw_w)}/s",
        )
    )
    peer_target("dequeue_one", "dequeue + ack one at a time, 100 B vs fastest crash-safe peer", 4)
    peer_target(
        "enqueue_batch", "enqueue batch of 100, 100 B vs fastest crash-safe peer's batch", 3
    )
    mine_b = med(lq.format(op="enqueue_batch", size=4096, level="kill9"), "bytes_rate")
    seq = med("raw/seq1m")
    out.append(
        Target(
            "enqueue batch of 100, 4 KiB: payload bandwidth vs raw 1 MiB sequential writes",
            _ratio(mine_b, seq),
            0.5,
            False,
            "x",
            f"ledgerq {fmt_mb(mine_b)} vs raw {fmt_mb(seq)}",
        )
    )
    one = med("threads/1/ledgerq")
    sixteen = med("threads/16/ledgerq")
    raw_s = med("raw/fdatasync/100")
    out.append(
        Target(
            'sync="always", 1 thread vs raw write + fdatasync loop',
            _ratio(one, raw_s),
            0.8,
            False,
            "x",
            f"ledgerq {fmt_rate(one)}/s vs write+fdatasync {fmt_rate(raw_s)}/s",
        )
    )
    out.append(
        Target(
            'sync="always", 16 threads vs 1 thread (group commit)',
            _ratio(sixteen, one),
            8,
            False,
            "x",
            f"{fmt_rate(sixteen)}/s vs {fmt_rate(one)}/s",
        )
    )
    depths = sorted({int(t.split("/")[1]) for t in res.values if t.startswith("depth/")})
    if len(depths) >= 2:
        lo, hi = depths[0], depths[-1]
        d_lo, d_hi = med(f"depth/{lo}/ledgerq"), med(f"depth/{hi}/ledgerq")
        basis = f"{fmt_rate(d_hi)}/s at {hi:,} vs {fmt_rate(d_lo)}/s at {lo:,}"
    else:
        d_lo = d_hi = None
        basis = "not measured"
    out.append(
        Target("dequeue rate at depth 1M vs depth 10k", _ratio(d_hi, d_lo), 0.8, False, "x", basis)
    )
    reopen = res.values.get("reopen/ledgerq", [])
    r = med("reopen/ledgerq", "seconds")
    n = reopen[0].get("pending_after_open", 0) if reopen else 0
    out.append(
        Target(
            "reopen (open + first dequeue) with 10M messages, some leased",
            r,
            1.0,
            True,
            "s",
            f"slower of after-kill-9 and after-close; {n:,} pending" if reopen else "not measured",
        )
    )
    mem = med("memory/ledgerq", "bytes_per_message")
    out.append(
        Target(
            "priority index memory per pending message",
            mem,
            40,
            True,
            "B",
            "tracemalloc, priorities=True",
        )
    )
    return out


def fmt_mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f} MiB/s"


def fmt_target_value(t: Target, x: float | None) -> str:
    if x is None:
        return "-"
    if t.unit == "x":
        return f"{x:.2f}x"
    if t.unit == "s":
        return f"{x * 1000:,.0f} ms" if x < 10 else f"{x:.1f} s"
    if t.unit == "ms":
        return f"{x:.2f} ms"
    return f"{x:.1f} {t.unit}"


# --------------------------------------------------------- shared mode (issue 16)

# What a peer's blocking get does when another process enqueues (the wake-up table).
MP_WAKE_PEERS = {
    "sqlite": "no blocking wait: a consumer re-runs its query",
    "litequeue": "no blocking wait: `pop()` returns None at once",
    "pq-sqlite-ack": (
        "`get(timeout=...)` waits on an in-process `threading.Event` that another "
        "process's `put` never sets: it looks again only when its timeout (or a 10 s tick) ends"
    ),
    "diskcache": "no blocking wait: `popleft()` raises IndexError at once",
}


def _mp_peer(res: Results, key: str) -> tuple[str | None, float | None]:
    """The multi-process peer with the highest median ``key`` (enqueue_rate, ...)."""
    best: tuple[str | None, float | None] = (None, None)
    for peer in MP_PEERS:
        m = res.median(f"mp/pc/{peer}", key)
        if m is not None and (best[1] is None or m > best[1]):
            best = (peer, m)
    return best


def _delivery(res: Results, tid: str) -> str:
    """What the delivery check found, over every repeat of a 4 + 4 run."""
    runs = res.values.get(tid, [])
    if not runs:
        return ""
    n = len(runs)
    capped = sum(1 for r in runs if r.get("timed_out"))
    seconds = runs[0].get("cap_seconds", 0)
    cap = f"the {seconds:g} s cap stopped {capped} of {n} run{'s' if n > 1 else ''}"
    late = sum(r["missing"] for r in runs if r.get("timed_out"))
    parts = []
    for count, what in (
        (sum(r["duplicated"] for r in runs), "delivered twice"),
        (sum(r["missing"] for r in runs if not r.get("timed_out")), "lost"),
        (sum(r["unexpected"] for r in runs), "never produced"),
        (sum(r.get("wrong_size", 0) for r in runs), "of the wrong size"),
    ):
        if count:
            parts.append(f"**{count:,} {what}**")
    if late:
        parts.append(
            f"{late:,} not consumed when {cap} (left in the queue or lost: not told apart)"
        )
    if not parts:
        return f"exactly once ({n} of {n} runs)" + (f"; {cap}" if capped else "")
    return (f"over {n} runs: " if n > 1 else "") + "; ".join(parts)


def _errors(res: Results, tid: str) -> str:
    runs = res.values.get(tid, [])
    n = sum(r.get("errors", 0) for r in runs)
    if not n:
        return "none" if runs else ""
    first = next((r["first_error"] for r in runs if r.get("first_error")), "")
    return f"**{n:,}** (retried); first: `{first[:100]}`"


def _ms_cell(res: Results, tid: str, key: str) -> str:
    xs = [x / 1e6 for x in res.samples(tid, key)]
    if not xs:
        return "-"
    med = statistics.median(xs)
    if len(xs) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({min(xs):.2f}-{max(xs):.2f})"


def _mp_cell(res: Results, tid: str, key: str, unavailable: str | None) -> str:
    if tid not in res.values and tid not in res.errors and unavailable:
        return "not available in this tree"
    return cell(res, tid, key)


def mp_memory_slopes(res: Results) -> tuple[dict[str, float], tuple[int, int] | None]:
    """Bytes of RSS per pending message, per mode, between the shallowest and the deepest
    queue measured; and those two depths (pending messages after the first dequeue)."""
    runs = sorted(
        (r[0] for t, r in res.values.items() if t.startswith("mp/memory/") and r),
        key=lambda r: r["depth"],
    )
    if len(runs) < 2:
        return {}, None
    lo, hi = runs[0], runs[-1]
    slopes = {}
    for mode in ("exclusive", "shared"):
        if mode in lo and mode in hi:
            grew = hi[mode]["rss_growth"] - lo[mode]["rss_growth"]
            slopes[mode] = grew / (hi[mode]["pending"] - lo[mode]["pending"])
    return slopes, (lo["exclusive"]["pending"], hi["exclusive"]["pending"])


def mp_targets(res: Results, unavailable: str | None) -> list[Target]:
    """The targets of the shared-engine issue's "Speed" section (issue 26; issue 16 asked
    for less: 0.6x of exclusive in one process, 3x the fastest peer for 4 + 4, 5 ms)."""
    out: list[Target] = []
    med = res.median
    na = "shared mode not available in this tree" if unavailable else "not measured"
    for op, what in MP_OPS.items():
        ex, sh = med(f"mp/single/{op}/exclusive"), med(f"mp/single/{op}/shared")
        basis = f"shared {fmt_rate(sh)}/s vs exclusive {fmt_rate(ex)}/s"
        out.append(
            Target(
                f"shared mode in one process: {what}, 100 B, vs exclusive",
                _ratio(sh, ex),
                0.85,
                False,
                "x",
                basis if sh is not None else f"{na}; exclusive {fmt_rate(ex)}/s",
            )
        )
    for key, what in (("enqueue_rate", "enqueue"), ("through_rate", "dequeue + ack")):
        mine = med("mp/pc/ledgerq", key)
        one = med("mp/pc/ledgerq-exclusive", key)
        shown = f"ledgerq 4 + 4 {fmt_rate(mine)}/s" if mine is not None else na
        basis = f"{shown} vs one exclusive process {fmt_rate(one)}/s"
        if key == "through_rate":
            basis += " (both from the start to the last ack)"
        out.append(
            Target(
                f"4 + 4 processes, aggregate {what}: vs one exclusive process, same work",
                _ratio(mine, one),
                1.0,
                False,
                "x",
                basis,
            )
        )
        peer, rate = _mp_peer(res, key)
        them = f"{ADAPTERS[peer].label} {fmt_rate(rate)}/s" if peer else "no peer measured"
        if peer:
            them += f" (delivery: {_delivery(res, f'mp/pc/{peer}').replace('**', '')})"
        out.append(
            Target(
                f"4 + 4 processes, aggregate {what}: vs the fastest multi-process peer",
                _ratio(mine, rate),
                5.0 if key == "enqueue_rate" else 2.0,
                False,
                "x",
                f"{shown} vs {them}",
            )
        )
    p99 = med("mp/wake/ledgerq", "p99_ns")
    p50 = med("mp/wake/ledgerq", "p50_ns")
    out.append(
        Target(
            "wake-up of a consumer blocked in dequeue(timeout) by another process's enqueue: p99",
            None if p99 is None else p99 / 1e6,
            1.0,
            True,
            "ms",
            na if p99 is None else f"p50 {p50 / 1e6:.2f} ms" if p50 is not None else "",
        )
    )
    slopes, depths = mp_memory_slopes(res)
    if "shared" in slopes and depths:
        diff: float | None = slopes["shared"] - slopes["exclusive"]
        basis = (
            f"RSS per pending message: shared {slopes['shared']:.2f} B, exclusive "
            f"{slopes['exclusive']:.2f} B ({depths[0]:,} to {depths[1]:,} pending)"
        )
    else:
        diff, basis = None, na
    out.append(
        Target(
            "memory of a consumer process per pending message: shared minus exclusive",
            diff,
            1.0,
            True,
            "B",
            basis,
        )
    )
    return out


def analysis() -> tuple[str, str]:
    """benchmarks/analysis.md split in two: the part quoted after the issue-5 targets,
    and the part quoted in the shared-mode section (from ``ANALYSIS_MP_HEADING`` on)."""
    text = ANALYSIS.read_text() if ANALYSIS.exists() else ""
    head, mark, tail = text.partition(ANALYSIS_MP_HEADING)
    return head.rstrip(), (mark + tail).rstrip()


def mp_report(
    res: Results, mp: dict[str, Any] | None, env: dict[str, str], charts: Charts | None = None
) -> list[str]:
    """The shared-mode section of the report (method first, then targets and tables)."""
    lines: list[str] = []
    add = lines.append
    add("## Many processes on one queue (shared mode, issue 16)")
    add("")
    if not mp or not any(t.startswith("mp/") for t in [*res.values, *res.errors]):
        add("Not run (`run.py --only mp`, or `run.py --update JSON` to add it to a saved run).")
        add("")
        return lines
    c = QUICK if mp["quick"] else FULL
    unavailable = mp.get("unavailable", {}).get("shared")
    total = MP_PROCESSES * c.mp_per_producer
    if mp["quick"]:
        add(
            "> **A `--quick` smoke run of this section:** small counts and one repeat; the "
            "numbers only show that the scenarios work."
        )
        add("")
    if unavailable:
        add(
            f"> **ledgerq's shared mode is not available in the tree measured** ({unavailable}): "
            "its rows say so; the peers and exclusive ledgerq were measured."
        )
        add("")
    add("### Method")
    add("")
    add(
        "- Every process is a fresh interpreter started by the scenario's process "
        "(`benchmarks/multiprocess.py`), which first creates the queue (opens and closes it "
        "once, so no two processes race to create its files). Each process then opens the "
        "queue itself: ledgerq with `ledgerq.open(path, shared=True)`, each peer with its own "
        "constructor (one connection per process; what each promises for several processes "
        "is in the table below). The start: a process whose queue is open writes one byte "
        "into a *ready* pipe and blocks reading a *go* pipe; when every byte has arrived, one "
        "`write()` of one byte per process releases them all. Start-up and opens are not "
        "timed. Every time is `time.clock_gettime_ns(CLOCK_MONOTONIC)`, one clock for all "
        "processes."
    )
    add(
        f"- **4 + 4**: {MP_PROCESSES} producer processes each enqueue {c.mp_per_producer:,} "
        f"messages of 100 B one at a time (default sync; the first 8 bytes name the producer "
        f"and the message) while {MP_PROCESSES} consumer processes dequeue + ack one at a "
        "time. Each process reports its count, its start and the time its last operation "
        "returned; a side's rate is all its messages over (last end - first start). A "
        "consumer that finds the queue empty waits 1 ms on a pipe that is closed once every "
        "producer has exited, then tries again (the same for every queue), and stops when "
        "the queue is empty after that. The dequeue + ack window starts at the same barrier, "
        "so it includes the consumers' wait for the producers: it is the rate at which "
        "messages get through the queue, and cannot be much above the enqueue rate. Both "
        f"sides stop at {c.mp_cap_seconds:g} s whatever is left. Each consumer records the "
        "messages it got; afterwards every produced message must have been consumed exactly "
        "once (the *delivery* column)."
    )
    add(
        f"- **One exclusive process, same work**: {total:,} messages enqueued one at a time "
        "into an exclusive ledgerq, then all dequeued + acked one at a time. Its enqueue rate "
        "is the first phase's; its dequeue + ack rate counts from its start, both phases, as "
        "the consumers' rate above does."
    )
    add(
        f"- **Shared mode alone**: the suite's throughput scenario (100 B, default sync, about "
        f"{c.seconds} s; dequeues from a prefilled queue) with the queue opened "
        "`shared=True`, against the same scenario opened exclusively."
    )
    add(
        f"- **Wake-up**: a consumer process blocks in `dequeue(timeout=5)` on a shared queue; "
        f"before each call it writes a byte into a pipe; a producer process reads that byte, "
        f"pauses {c.wake_pause_seconds * 1000:g} ms (so the consumer is inside its wait), "
        f"reads the clock and enqueues one message carrying that time; the consumer reads the "
        f"clock when `dequeue` returns. {c.wake_samples:,} samples a run; nearest-rank "
        "percentiles. *Not blocked* counts samples where the consumer entered `dequeue` "
        "after the enqueue began."
    )
    add(
        "- **Memory**: a queue of N pending 100 B messages is built (batches, "
        '`sync="never"`) and closed; then a fresh process opens it (exclusive, then in '
        "another process shared) and dequeues + acks one message; the growth of its RSS "
        "(`VmRSS` in `/proc/self/status`, anonymous memory in brackets) from just before "
        "the open is shown. Bytes per pending message = the growth between the two depths "
        "over the messages between them. Measured once."
    )
    add(
        f"- Repeats: {mp['repeats']}, interleaved (repeat 1 of every scenario, then repeat "
        "2, ...); tables show the median and (min-max). No means."
    )
    add("")
    if mp.get("separate"):
        add(
            "These numbers come from a separate run of this section only (`--update`), "
            f"which took {mp['wall'] / 60:.1f} minutes:"
        )
        add("")
        add("```sh")
        add(mp["command"])
        add("```")
        add("")
        differs = {k: v for k, v in mp["machine"].items() if env.get(k) != v and k != "bench_dir"}
        add("Its machine where it differs from the one above, and the versions it ran:")
        add("")
        add("| | |")
        add("|---|---|")
        for k, v in [*differs.items(), *mp.get("versions", {}).items()]:
            add(f"| {k} | {v} |")
        add("")
    else:
        add("Measured in the same run as the rest of this report (command and machine above).")
        add("")

    add("### Targets (issue 26)")
    add("")
    add("| target | measured | required | verdict | basis |")
    add("|---|---|---|---|---|")
    for t in mp_targets(res, unavailable):
        req = ("<= " if t.is_upper else ">= ") + fmt_target_value(t, t.bound)
        add(f"| {t.name} | {fmt_target_value(t, t.measured)} | {req} | {t.verdict} | {t.basis} |")
    add("")
    if analysis()[1]:
        add(analysis()[1])  # written by hand: how to read what follows
        add("")

    add("### Shared mode alone: one process, `shared=True` against exclusive")
    add("")
    add("| 100 B, default sync | exclusive | `shared=True` | shared ÷ exclusive |")
    add("|---|---|---|---|")
    for op, what in MP_OPS.items():
        ex, sh = f"mp/single/{op}/exclusive", f"mp/single/{op}/shared"
        r = _ratio(res.median(sh), res.median(ex))
        add(
            f"| {what} | {cell(res, ex)} | {_mp_cell(res, sh, 'rate', unavailable)} "
            f"| {fmt_ratio(r)} |"
        )
    if charts is not None:
        add("")
        rows = [
            Bars(
                what,
                [res.median(f"mp/single/{op}/exclusive"), res.median(f"mp/single/{op}/shared")],
                note="not available in this tree" if unavailable else "not measured",
            )
            for op, what in MP_OPS.items()
        ]
        svg = bar_chart(
            "One process: exclusive against shared=True (100 B)",
            rows,
            ["exclusive", "shared=True"],
            unit="messages per second (median)",
        )
        add(charts.image("shared-single", "one process, exclusive against shared", svg))
    add("")

    add(
        f"### {MP_PROCESSES} producer + {MP_PROCESSES} consumer processes "
        "(100 B, default sync, messages per second)"
    )
    add("")
    add(
        "`ledgerq ÷` is ledgerq shared's median divided by that row's. *Delivery* is what the "
        "check after each run found; a peer that loses or repeats messages, or fails, under "
        "several processes is shown with what failed."
    )
    add("")
    add(
        "| queue | enqueue, all producers | ledgerq ÷ | dequeue + ack, all consumers, from the "
        "start | ledgerq ÷ | delivery | errors |"
    )
    add("|---|---|---|---|---|---|---|")
    rows = [("ledgerq", "ledgerq `shared=True`")]
    rows += [(k, ADAPTERS[k].label) for k in MP_PEERS]
    rows.append(
        ("ledgerq-exclusive", "ledgerq exclusive, one process: all enqueues, then all dequeues")
    )
    for key, label in rows:
        tid = f"mp/pc/{key}"
        if (
            tid not in res.values
            and tid not in res.errors
            and not (key == "ledgerq" and unavailable)
        ):
            continue
        cols = []
        for rate in ("enqueue_rate", "through_rate"):
            mine = res.median("mp/pc/ledgerq", rate)
            ratio = "" if key == "ledgerq" else fmt_ratio(_ratio(mine, res.median(tid, rate)))
            cols += [_mp_cell(res, tid, rate, unavailable if key == "ledgerq" else None), ratio]
        add(
            f"| {label} | " + " | ".join(cols) + f" | {_delivery(res, tid)} | {_errors(res, tid)} |"
        )
    if charts is not None:
        short = {
            "ledgerq": "ledgerq shared=True",
            "ledgerq-exclusive": "ledgerq exclusive, 1 process",
        }
        bars = [
            Bars(
                short.get(key, label),
                [
                    res.median(f"mp/pc/{key}", "enqueue_rate"),
                    res.median(f"mp/pc/{key}", "through_rate"),
                ],
                key.startswith("ledgerq"),
                "not available in this tree"
                if key == "ledgerq" and unavailable
                else "not measured",
            )
            for key, label in rows
            if f"mp/pc/{key}" in res.values or key == "ledgerq"
        ]
        svg = bar_chart(
            f"{MP_PROCESSES} producer + {MP_PROCESSES} consumer processes (100 B, default sync)",
            bars,
            ["enqueue, all producers", "dequeue + ack, all consumers"],
            unit="messages per second (median)",
        )
        add("")
        add(charts.image("shared-processes", "producer and consumer processes on one queue", svg))
    alone = res.median("mp/pc/ledgerq-exclusive", "dequeue_rate")
    if alone is not None:
        add("")
        add(
            "The exclusive row does the same work in one process, one phase after the other: "
            "its dequeue + ack column, like the consumers', counts from the start (its "
            f"enqueue phase included); its dequeue + ack phase alone ran at {fmt_rate(alone)}/s."
        )
    spread = [
        f"{ADAPTERS[k].label if k in ADAPTERS else k} {m / 1000:.1f} ms"
        for k in ("ledgerq", *MP_PEERS)
        if (m := res.median(f"mp/pc/{k}", "start_spread_us")) is not None
    ]
    if spread:
        add("")
        add(
            "From the first process to leave the barrier to the last (8 processes on this "
            "machine's cores; median): " + ", ".join(spread) + "."
        )
    add("")
    add("| queue | several processes: what the library says, how it is opened | get |")
    add("|---|---|---|")
    for key in ("ledgerq", *MP_PEERS):
        cls = ADAPTERS[key]
        add(f"| {cls.label} | {cls.multiprocess} | {cls.semantics} |")
    add("")

    add("### Wake-up latency: a consumer blocked in one process, an enqueue in another")
    add("")
    add("Milliseconds from just before the enqueue call to the consumer's return.")
    add("")
    add("| queue | p50 | p90 | p99 | max | samples (not blocked) |")
    add("|---|---|---|---|---|---|")
    tid = "mp/wake/ledgerq"
    if tid in res.values:
        runs = res.values[tid]
        n = sum(r["samples"] for r in runs)
        nb = sum(r["not_blocked"] for r in runs)
        add(
            f"| ledgerq `shared=True` | {_ms_cell(res, tid, 'p50_ns')} | "
            f"{_ms_cell(res, tid, 'p90_ns')} | {_ms_cell(res, tid, 'p99_ns')} | "
            f"{_ms_cell(res, tid, 'max_ns')} | {n:,} in {len(runs)} run"
            f"{'s' if len(runs) > 1 else ''} ({nb:,}) |"
        )
    elif tid in res.errors:
        add(f"| ledgerq `shared=True` | failed: {res.errors[tid][:100]} | | | | |")
    else:
        shown = "not available in this tree" if unavailable else "-"
        add(f"| ledgerq `shared=True` | {shown} | | | | |")
    for key, how in MP_WAKE_PEERS.items():
        add(f"| {ADAPTERS[key].label} | polls, skipped ({how}) | | | | |")
    if charts is not None and tid in res.values:
        percentiles = ("p50_ns", "p90_ns", "p99_ns", "max_ns")
        medians = [res.median(tid, k) for k in percentiles]
        svg = bar_chart(
            "Wake-up latency across processes: ledgerq shared=True",
            [Bars("ledgerq shared=True", [None if m is None else m / 1e6 for m in medians], True)],
            ["p50", "p90", "p99", "max"],
            unit="milliseconds (median of the runs)",
            log=False,
        )
        add("")
        add(charts.image("wake-latency", "wake-up latency percentiles", svg))
    add("")

    add("### Memory of a consumer process against queue depth")
    add("")
    mem = sorted(
        (r[0] for t, r in res.values.items() if t.startswith("mp/memory/") and r),
        key=lambda r: r["depth"],
    )
    mem_errors = {t: e for t, e in res.errors.items() if t.startswith("mp/memory/")}
    if mem:
        slopes, _ = mp_memory_slopes(res)
        add(
            "| mode | "
            + " | ".join(f"RSS growth, {r['depth']:,} pending" for r in mem)
            + " | bytes per pending message |"
        )
        add("|---|" + "---|" * (len(mem) + 1))
        for mode, label in (("exclusive", "exclusive"), ("shared", "`shared=True`")):
            cols = []
            for r in mem:
                if mode in r:
                    m = r[mode]
                    cols.append(
                        f"{m['rss_growth'] / 2**20:,.1f} MiB ({m['anon_growth'] / 2**20:,.1f})"
                    )
                else:
                    cols.append("not available in this tree" if unavailable else "-")
            slope = f"{slopes[mode]:.2f} B" if mode in slopes else "-"
            add(f"| {label} | " + " | ".join(cols) + f" | {slope} |")
    for t, e in sorted(mem_errors.items()):
        add(f"- `{t}` failed: {e}")
    if not mem and not mem_errors:
        add("Not run.")
    add("")
    return lines


# -------------------------------------------------------------------------- report


def throughput_chart(
    charts: Charts, res: Results, adapters: list[str], op: str, title: str, size: int
) -> str:
    """The chart of one throughput table: every queue's median at both levels."""
    rows = []
    for key in adapters:
        values = [
            None
            if ADAPTERS[key].levels[level] is None
            else res.median(f"throughput/{op}/{size}/{level}/{key}")
            for level in LEVELS
        ]
        if any(v is not None for v in values):
            rows.append(Bars(ADAPTERS[key].label, values, key == "ledgerq"))
    svg = bar_chart(
        f"{title}, {size:,} B",
        rows,
        [LEVEL_SHORT[level] for level in LEVELS],
        unit="messages per second (median)",
    )
    return charts.image(f"{op}-{size}", f"{title}, {size:,} B: messages per second", svg)


def _label(key: str, level: str) -> str:
    cls = ADAPTERS[key]
    lv = cls.levels[level]
    mark = "" if lv is None or lv.is_kill9_safe else " (NOT kill -9 safe)"
    return f"{cls.label}{mark}"


def report(
    res: Results,
    env: dict[str, str],
    vers: dict[str, str],
    command: str,
    c: Counts,
    repeats: int,
    adapters: list[str],
    unavailable: dict[str, str],
    wall: float,
    mp: dict[str, Any] | None = None,
    charts: Charts | None = None,
) -> str:
    """Render the whole report; ``mp`` describes the run of the shared-mode section.

    With ``charts``, each table is followed by its chart (collected there, to be
    written beside the report by :func:`write_report`)."""
    lines: list[str] = []
    add = lines.append
    add("# Benchmarks: ledgerq and its peers")
    add("")
    add(
        "Written by `benchmarks/run.py`; do not edit by hand - re-run `make bench` instead. "
        "Every number below comes from one run of that command on the machine described "
        "here, and every ratio compares medians of that same run."
    )
    add("")
    if c is QUICK:
        add(
            "> **A `--quick` smoke run:** small counts and one repeat. The numbers only show "
            "that the suite works; the targets are not judged at their full scale here."
        )
        add("")
    add("## Method")
    add("")
    add(
        f"- Each scenario runs in a fresh Python process (`python -m benchmarks.scenarios`) "
        f"on a fresh directory under the benchmark directory, one at a time (nothing else of "
        f"the suite runs beside it). The whole list runs {repeats} time(s), interleaved "
        f"(repeat 1 of everything, then repeat 2, ...); tables show the **median** and, in "
        f"brackets, **min-max** of the repeats. No means."
    )
    add(
        f"- Times are `time.perf_counter()`. A timed loop runs for about {c.seconds} s (or "
        f"until the queue is empty) and checks the clock after chunks of 1, 2, 4 ... 1024 "
        f"operations. Rates count messages, so a batch of 100 counts 100."
    )
    add(
        "- Each queue is driven through one small adapter (`benchmarks/adapters.py`): "
        "`put`, `put_batch`, `get_and_ack`, `get_batch_and_ack`, all with the library's "
        "public API where it has one (the exceptions are named in the durability table). "
        "Payloads are 100 B and 4 KiB of random-looking bytes, the same for every queue."
    )
    add(
        f"- Dequeue scenarios first fill the queue with up to "
        f"{c.prefill[100]:,} (100 B) / {c.prefill[4096]:,} (4 KiB) messages in batches of "
        f"100 at the default level (at most {c.prefill_seconds} s of filling), close it, "
        f"reopen it at the level measured, then time dequeue + ack until the time budget "
        f"is spent or the queue is empty."
    )
    add(
        "- The two durability levels are each queue's configuration for *survives kill -9* "
        '(ledgerq: the default `sync="interval"`) and for *survives power loss* '
        '(ledgerq: `sync="always"`); what each configuration really guarantees is in the '
        "durability table. A queue that cannot be configured for a level is not run at it; "
        "a queue that loses data on kill -9 is marked NOT kill -9 safe and never counts as "
        "the fastest crash-safe peer. For dequeue + ack, a *delete on get* queue (its get "
        "removes the message, so a consumer killed before it finishes loses it) does not "
        "count as crash-safe either; the fastest of those is named beside the target."
    )
    add(
        f"- Right before each timed throughput or raw-syscall loop, the scenario writes and "
        f"deletes {c.warm_bytes >> 20:,} MiB next to the queue. This machine is a virtual "
        f"machine that hands freed memory back to its host: the first write into such "
        f"memory runs several times slower (the page cache measured 0.3 to 1.4 GB/s for 1 MiB "
        f"writes without it, 3 to 4 GB/s with it), and how much of it is still warm depends on "
        f"what ran before. The warm-up gives every queue the same warm page cache, as on a "
        f"long-running machine whose memory is all in use."
    )
    add(
        "- The reopen scenario builds the queue with `enqueue_batch` (10,000 per batch, "
        '`sync="never"`), leases messages and acks every other one, fsyncs and kills itself '
        "with SIGKILL; then a new process evicts the queue's files from the page cache "
        "(`posix_fadvise(DONTNEED)`), times `ledgerq.open` + the first `dequeue`, leases more "
        "and closes cleanly, and a third process times the reopen after that clean close. "
        "The target uses the slower of the two."
    )
    add("")
    add("### Machine")
    add("")
    add("| | |")
    add("|---|---|")
    for k, v in env.items():
        add(f"| {k} | {v} |")
    for k, v in vers.items():
        add(f"| {k} | {v} |")
    add("")
    add("### Command")
    add("")
    add("```sh")
    add("make bench")
    add(f"# which runs: {command}")
    add("```")
    add("")
    add(f"The whole run took {wall / 60:.1f} minutes.")
    if unavailable:
        add("")
        for key, why in unavailable.items():
            add(f"- **{ADAPTERS[key].label} was not run:** {why}")
    add("")

    # durability
    add("## What each configuration survives")
    add("")
    add(
        "*kill -9*: the process dies, the machine does not (the OS page cache survives). "
        "*power loss*: the machine dies; only what was fsynced survives. *delete on get*: the "
        "get itself removes the message (one write), so a consumer that dies while "
        "processing loses it; *lease + ack* queues deliver it again (two writes)."
    )
    add("")
    add("| queue | level | configuration | survives kill -9 | survives power loss |")
    add("|---|---|---|---|---|")
    for key in adapters:
        cls = ADAPTERS[key]
        for level in LEVELS:
            lv = cls.levels[level]
            if lv is None:
                add(
                    f"| {cls.label} | {LEVEL_SHORT[level]} | not available | - "
                    "| cannot be made safe |"
                )
            else:
                add(
                    f"| {cls.label} | {LEVEL_SHORT[level]} | {lv.config} | {lv.survives_kill9} | "
                    f"{lv.survives_power} |"
                )
    add("")
    add("| queue | get semantics | batches | note |")
    add("|---|---|---|---|")
    for key in adapters:
        d = describe(key)
        add(f"| {d['label']} | {d['semantics']} | {d['batch']} | {d['note']} |")
    add("")

    # targets
    add("## Targets (issue 5)")
    add("")
    add("| target | measured | required | verdict | basis |")
    add("|---|---|---|---|---|")
    for t in targets(res):
        req = ("<= " if t.is_upper else ">= ") + fmt_target_value(t, t.bound)
        add(f"| {t.name} | {fmt_target_value(t, t.measured)} | {req} | {t.verdict} | {t.basis} |")
    add("")
    if analysis()[0]:
        # Written by hand from a profile run (it names its own command and numbers):
        # why a target is not met, and what the floor of that path is.
        add(analysis()[0])
        add("")

    # throughput
    add("## Throughput (messages per second)")
    add("")
    add(
        "`ledgerq ÷` is ledgerq's median divided by that queue's median at the same level "
        "(above 1: ledgerq is faster)."
    )
    for op, title in OPS.items():
        for size in SIZES:
            add("")
            add(f"### {title}, {size:,} B")
            add("")
            add(
                f"| queue | {LEVEL_SHORT['kill9']} | ledgerq ÷ "
                f"| {LEVEL_SHORT['power']} | ledgerq ÷ |"
            )
            add("|---|---|---|---|---|")
            for key in adapters:
                cols = []
                for level in LEVELS:
                    tid = f"throughput/{op}/{size}/{level}/{key}"
                    if ADAPTERS[key].levels[level] is None:
                        cols += ["n/a", ""]
                        continue
                    mine = res.median(f"throughput/{op}/{size}/{level}/ledgerq")
                    ratio = "" if key == "ledgerq" else fmt_ratio(_ratio(mine, res.median(tid)))
                    cols += [cell(res, tid), ratio]
                label = _label(key, "kill9")
                if op.startswith("dequeue") and not ADAPTERS[key].keeps_unacked:
                    label += " (delete on get)"
                add(f"| {label} | " + " | ".join(cols) + " |")
            if charts is not None:
                add("")
                add(throughput_chart(charts, res, adapters, op, title, size))

    # threads
    add("")
    add('## sync="always" with producer threads (100 B, enqueue one at a time)')
    add("")
    add(
        "Each thread enqueues one message at a time into the same queue for "
        f"{c.thread_seconds} s; the rate is all threads' enqueues over the wall time. "
        "ledgerq shares one fsync among concurrent callers (group commit); the SQLite "
        "queues serialise writers and fsync every commit."
    )
    add("")
    add(
        "| queue | "
        + " | ".join(f"{n} thread{'s' if n > 1 else ''}" for n in THREADS)
        + f" | {THREADS[-1]} ÷ 1 |"
    )
    add("|---|" + "---|" * (len(THREADS) + 1))
    for key in adapters:
        if not any(
            f"threads/{n}/{key}" in res.values or f"threads/{n}/{key}" in res.errors
            for n in THREADS
        ):
            continue
        cols = [cell(res, f"threads/{n}/{key}") for n in THREADS]
        r = _ratio(res.median(f"threads/{THREADS[-1]}/{key}"), res.median(f"threads/1/{key}"))
        add(f"| {ADAPTERS[key].label} | " + " | ".join(cols) + f" | {fmt_ratio(r)} |")
    threads_lines = [
        Line(ADAPTERS[k].label, [res.median(f"threads/{n}/{k}") for n in THREADS], k == "ledgerq")
        for k in adapters
        if any(res.median(f"threads/{n}/{k}") is not None for n in THREADS)
    ]
    if charts is not None and threads_lines:
        add("")
        svg = line_chart(
            'sync="always": enqueues per second against producer threads',
            THREADS,
            threads_lines,
            x_label="producer threads",
            unit="messages per second (median)",
        )
        add(charts.image("threads", "enqueue rate against producer threads", svg))

    # depth
    add("")
    add("## Dequeue + ack rate against queue depth (100 B, default sync)")
    add("")
    add(
        'The queue is built to the depth (batches of 10,000; ledgerq with `sync="never"`), '
        "closed and reopened; after 1,000 warm-up dequeues, chunks of 1,000 dequeue + ack are "
        "timed and each is followed by an untimed batch of 1,000 enqueues, so the depth holds."
    )
    add("")
    depths = sorted(
        {
            int(t.split("/")[1])
            for t in list(res.values) + list(res.errors)
            if t.startswith("depth/")
        }
    )
    if depths:
        add("| queue | " + " | ".join(f"depth {d:,}" for d in depths) + " | deepest ÷ shallowest |")
        add("|---|" + "---|" * (len(depths) + 1))
        for key in ("ledgerq", "sqlite"):
            if key not in adapters:
                continue
            cols = [cell(res, f"depth/{d}/{key}") for d in depths]
            r = _ratio(
                res.median(f"depth/{depths[-1]}/{key}"), res.median(f"depth/{depths[0]}/{key}")
            )
            add(f"| {ADAPTERS[key].label} | " + " | ".join(cols) + f" | {fmt_ratio(r)} |")
    else:
        add("Not run.")

    # reopen
    add("")
    add("## Reopen of a big queue (ledgerq)")
    add("")
    rv = res.values.get("reopen/ledgerq", [])
    if rv:
        add(
            f"{c.reopen_messages:,} messages of 100 B "
            f"({rv[0]['disk_bytes'] / 2**30:.2f} GiB on disk), "
            f"{rv[0]['leased']:,} leased when the builder was killed. Milliseconds; open + first "
            f"dequeue (open alone)."
        )
        add("")
        add("| state | open + first dequeue | open alone |")
        add("|---|---|---|")
        for name, k in (("after kill -9", "after_kill"), ("after clean close", "after_close")):
            add(
                f"| {name} | {cell(res, 'reopen/ledgerq', k, 1000)} ms | "
                f"{cell(res, 'reopen/ledgerq', k + '_open', 1000)} ms |"
            )
        add(f"\nBuilding it took {cell(res, 'reopen/ledgerq', 'build_seconds')} s.")
    else:
        add(res.errors.get("reopen/ledgerq", "Not run."))

    # memory and disk
    add("")
    add("## Memory and disk")
    add("")
    mv = res.values.get("memory/ledgerq", [])
    if mv:
        add(
            f"Priority index (`priorities=True`), {mv[0]['messages']:,} pending 100 B messages "
            f"of three priorities: **{mv[0]['bytes_per_message']:.1f} bytes per pending message** "
            f"(tracemalloc around the first `peek` after a reopen, the method of "
            f"`benchmarks/priority_memory.py`); building the index took "
            f"{mv[0]['build_seconds']:.2f} s. Measured once (deterministic)."
        )
    else:
        add("Priority memory: " + res.errors.get("memory/ledgerq", "not run."))
    add("")
    add(
        "Disk bytes per message after enqueueing (batches of 100, default level) and closing: "
        "every file of the queue's directory, apparent size; measured once."
    )
    add("")
    add("| queue | 100 B: bytes/msg | overhead | 4 KiB: bytes/msg | overhead |")
    add("|---|---|---|---|---|")
    for key in adapters:
        cols = []
        for size in SIZES:
            tid = f"disk/{size}/{key}"
            cols += [cell(res, tid, "bytes_per_message"), cell(res, tid, "overhead_per_message")]
        add(f"| {ADAPTERS[key].label} | " + " | ".join(cols) + " |")

    # shared mode (issue 16)
    add("")
    lines += mp_report(res, mp, env, charts)

    # raw
    add("## The machine's limits (raw syscalls, same run)")
    add("")
    add(
        "A loop of `os.write` of one record on an `O_APPEND` file, the record being the bytes "
        "ledgerq appends for one message of that payload (measured in the same process); "
        "the same loop with `os.fdatasync` after each write; and 1 MiB `os.write`s "
        f"(up to {c.seq_bytes >> 20:,} MiB, into the page cache, as a default-sync queue writes)."
    )
    add("")
    add("| test | rate | record |")
    add("|---|---|---|")
    for size in SIZES:
        rec = res.values.get(f"raw/write/{size}", [{}])[0].get("record_bytes", "?")
        add(
            f"| os.write loop, {size:,} B payload | {cell(res, f'raw/write/{size}')} /s | {rec} B |"
        )
        add(
            f"| os.write + fdatasync loop, {size:,} B payload | "
            f"{cell(res, f'raw/fdatasync/{size}')} /s | {rec} B |"
        )
    add(f"| 1 MiB sequential os.write | {cell(res, 'raw/seq1m', scale=1 / 2**20)} MiB/s | 1 MiB |")
    add(
        f"| 1 MiB sequential os.write incl. final fdatasync | "
        f"{cell(res, 'raw/seq1m', 'rate_with_final_fdatasync', 1 / 2**20)} MiB/s | 1 MiB |"
    )
    if TARGETED.exists():
        add("")
        add(TARGETED.read_text().rstrip())
    if res.errors:
        add("")
        add("## Failures")
        add("")
        for tid, err in sorted(res.errors.items()):
            add(f"- `{tid}`: {err}")
    add("")
    return "\n".join(lines)


def print_summary(res: Results, mp_unavailable: str | None = None) -> None:
    print("\nTargets:")
    tids = [*res.values, *res.errors]
    mp_run = any(t.startswith("mp/") for t in tids)
    base_run = any(not t.startswith("mp/") for t in tids)
    shown = (targets(res) if base_run else []) + (mp_targets(res, mp_unavailable) if mp_run else [])
    for t in shown:
        req = ("<= " if t.is_upper else ">= ") + fmt_target_value(t, t.bound)
        verdict = t.verdict.replace("**", "")
        print(f"  {verdict:13} {fmt_target_value(t, t.measured):>10} (need {req}) {t.name}")
    print(
        "\nThroughput medians (msg/s), ledgerq ÷ fastest kill -9-safe peer "
        "(for dequeues: of those that keep a message until it is acked):"
    )
    for op in OPS:
        for size in SIZES:
            for level in LEVELS:
                mine = res.median(f"throughput/{op}/{size}/{level}/ledgerq")
                consuming = True if op.startswith("dequeue") else None
                peer, rate = fastest_peer(res, op, size, level, keeps_unacked=consuming)
                if mine is None and peer is None:
                    continue
                pl = ADAPTERS[peer].label if peer else "-"
                print(
                    f"  {op:14} {size:5} {level:6} ledgerq {fmt_rate(mine):>10}  "
                    f"{pl:30} {fmt_rate(rate):>10}  {fmt_ratio(_ratio(mine, rate))}"
                )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smoke run: small counts, 1 repeat")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="SCENARIO",
        help="task id prefix or glob; repeatable",
    )
    ap.add_argument(
        "--adapters", help="comma-separated adapter keys (default: all): " + ",".join(ADAPTERS)
    )
    ap.add_argument("--repeats", type=int, help="repeats (default 3, --quick 1)")
    ap.add_argument("--write", metavar="PATH", help="write the markdown report here")
    ap.add_argument("--json", metavar="PATH", help="write every raw result here")
    ap.add_argument("--dir", help="where the scenario directories go (default: a temp dir)")
    ap.add_argument("--list", action="store_true", help="list the task ids and exit")
    ap.add_argument(
        "--report-from",
        metavar="JSON",
        help="run nothing: write the report (--write) from the raw results a --json run saved",
    )
    ap.add_argument(
        "--update",
        metavar="JSON",
        help="run the shared-mode scenarios only (--only mp, or a part of them) and replace "
        "their results in a run that --json saved (the file is rewritten); --write then "
        "writes the whole report from it, the other sections unchanged",
    )
    args = ap.parse_args()
    if args.report_from:
        return rerender(Path(args.report_from), args.write)
    if args.update and not args.only:
        args.only = ["mp"]

    c = QUICK if args.quick else FULL
    repeats = args.repeats or c.repeats
    wanted = args.adapters.split(",") if args.adapters else list(ADAPTERS)
    unknown = [k for k in wanted if k not in ADAPTERS]
    if unknown:
        ap.error(f"unknown adapters: {', '.join(unknown)}")
    unavailable = {k: why for k in wanted if (why := ADAPTERS[k].is_available()) is not None}
    adapters = [k for k in wanted if k not in unavailable]
    tasks = [t for t in build_plan(c, adapters) if selected(t.tid, args.only)]
    if args.update and (outside := [t.tid for t in tasks if not t.tid.startswith("mp/")]):
        ap.error(f"--update re-runs shared-mode scenarios (mp/...) only, not {outside[0]}")
    mp_unavailable: dict[str, str] = {}
    if any(t.needs_shared for t in tasks) and (why := shared_unavailable()) is not None:
        # The ledgerq rows of the shared-mode section wait for ledgerq.open(shared=True).
        mp_unavailable["shared"] = why
        tasks = without_shared(tasks)
        print(f"warning: ledgerq shared mode not measured: {why}", file=sys.stderr)
    if args.list:
        for t in tasks:
            print(t.tid)
        return 0
    if not tasks:
        ap.error("--only selected no task (use --list)")
    for key, why in unavailable.items():
        print(f"warning: {ADAPTERS[key].label} skipped: {why}", file=sys.stderr)

    root = tempfile.mkdtemp(prefix="ledgerq-bench-", dir=args.dir)
    env = machine(root)
    if "tmpfs" in env["filesystem"]:
        print("warning: the benchmark directory is on tmpfs; use --dir on a disk", file=sys.stderr)
    command = shlex.join([os.path.relpath(sys.executable, REPO), *sys.argv])
    started = time.perf_counter()
    res = Results()
    saved: dict[str, Any] = {}
    if args.update:
        saved = json.loads(Path(args.update).read_text())
        res = Results(values=saved["results"], errors=saved["errors"])
        for tid in [*res.values, *res.errors]:
            if tid.startswith("mp/") and selected(tid, args.only):
                res.values.pop(tid, None)  # replaced below, or gone with what is unavailable
                res.errors.pop(tid, None)
    try:
        execute(tasks, repeats, root, res)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    wall = time.perf_counter() - started
    print(
        f"\nran {len(tasks)} scenarios x {repeats} repeat(s) in {wall / 60:.1f} min",
        file=sys.stderr,
    )
    print_summary(res, mp_unavailable.get("shared"))
    vers = versions()
    mp = None
    if any(t.tid.startswith("mp/") for t in tasks):
        mp = {
            "unavailable": mp_unavailable,
            "command": command,
            "machine": env,
            "versions": vers,
            "quick": c is QUICK,
            "repeats": repeats,
            "wall": wall,
            "separate": bool(args.update),
        }
    if args.update:
        saved.update(results=res.values, errors=res.errors, mp=mp)
        for path in {args.update, args.json} - {None}:
            Path(path).write_text(json.dumps(saved, indent=1))
        if args.write:
            charts = Charts()
            write_report(args.write, _report_saved(saved, charts), charts)
        return 0
    if args.json:
        saved = {
            "machine": env,
            "versions": vers,
            "command": command,
            "quick": c is QUICK,
            "repeats": repeats,
            "adapters": adapters,
            "unavailable": unavailable,
            "wall": wall,
            "results": res.values,
            "errors": res.errors,
            "mp": mp,
        }
        Path(args.json).write_text(json.dumps(saved, indent=1))
    if args.write:
        charts = Charts()
        text = report(
            res, env, vers, command, c, repeats, adapters, unavailable, wall, mp=mp, charts=charts
        )
        write_report(args.write, text, charts)
    return 0


def rerender(saved_path: Path, write: str | None) -> int:
    """Write the report again from a saved run (e.g. after benchmarks/analysis.md changed),
    with its charts when written to a file."""
    saved = json.loads(saved_path.read_text())
    if write:
        charts = Charts()
        write_report(write, _report_saved(saved, charts), charts)
    else:
        print(_report_saved(saved))
    return 0


def _report_saved(saved: dict[str, Any], charts: Charts | None = None) -> str:
    """The report of a run saved by --json (and perhaps --update)."""
    return report(
        Results(values=saved["results"], errors=saved["errors"]),
        saved["machine"],
        saved["versions"],
        saved["command"],
        QUICK if saved["quick"] else FULL,
        saved["repeats"],
        saved["adapters"],
        saved["unavailable"],
        saved["wall"],
        mp=saved.get("mp"),
        charts=charts,
    )


if __name__ == "__main__":
    sys.exit(main())
