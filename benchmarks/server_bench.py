"""Throughput and latency of ``ledgerq serve`` over loopback: set and get, 1/8/32 connections.

    python benchmarks/server_bench.py                       # defaults below
    python benchmarks/server_bench.py --ops 40000 --size 1024 --connections 1 8 32
    python benchmarks/server_bench.py --sync always --threads 32

Run by hand (not part of the tests); the results table in docs/server.md comes from
it.  Method:

* One server process (``python -m ledgerq.cli serve DIR --port 0 -o sync=MODE``) on a
  fresh temporary directory, on 127.0.0.1.
* Clients are separate processes (``--client-procs``, default 2), each running its
  share of the connections on one asyncio loop; a connection sends one request, reads
  its reply, and sends the next (no pipelining), as a memcache client does.
* For each connection count, the set phase sends ``--ops`` ``set`` requests in total
  (split evenly over the connections) of ``--size`` random bytes to one queue; then
  the get phase sends as many plain ``get`` requests (each a dequeue + ack), which
  empties the queue again; then the reliable phase takes ``--ops`` items back (set
  again first) with ``get q/close/open``.  Every request must succeed.
* Throughput is requests / wall time of the phase (from the common start to the last
  connection's end).  Latency is per request; reported as median, p90, p99 and max
  (no means), over all connections of the phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------- client process


async def _connection(
    port: int, op: str, count: int, payload: bytes, start_at: float
) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    latencies = []
    if op == "set":
        request = b"set bench 0 0 %d\r\n%b\r\n" % (len(payload), payload)
    elif op == "get":
        request = b"get bench\r\n"
    else:
        request = b"get bench/close/open\r\n"
    await asyncio.sleep(max(0.0, start_at - time.time()))
    try:
        for _ in range(count):
            began = time.perf_counter()
            writer.write(request)
            line = await reader.readline()
            if op == "set":
                if line != b"STORED\r\n":
                    raise RuntimeError(f"set failed: {line!r}")
            else:
                if not line.startswith(b"VALUE "):
                    raise RuntimeError(f"{op} found no item: {line!r}")
                size = int(line.split()[3])
                await reader.readexactly(size + 2)
                if await reader.readline() != b"END\r\n":
                    raise RuntimeError("no END")
            latencies.append(time.perf_counter() - began)
        if op == "open":
            writer.write(b"get bench/close\r\n")
            await reader.readline()
    finally:
        writer.close()
        await writer.wait_closed()
    return latencies


async def _client(
    port: int, op: str, counts: list[int], size: int, start_at: float
) -> dict[str, object]:
    payload = os.urandom(size)
    results = await asyncio.gather(*(_connection(port, op, n, payload, start_at) for n in counts))
    return {"latencies": [x for r in results for x in r], "end": time.time()}


def client_main(argv: list[str]) -> None:
    port, op, size, start_at = int(argv[0]), argv[1], int(argv[2]), float(argv[3])
    counts = [int(n) for n in argv[4].split(",")]
    json.dump(asyncio.run(_client(port, op, counts, size, start_at)), sys.stdout)


# ---------------------------------------------------------------------- driver


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_phase(
    port: int, op: str, ops: int, connections: int, size: int, procs: int
) -> dict[str, float]:
    per_connection = _split(ops, connections)
    groups = [per_connection[i::procs] for i in range(min(procs, connections))]
    start_at = time.time() + 0.5
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--client",
                str(port),
                op,
                str(size),
                repr(start_at),
                ",".join(map(str, g)),
            ],
            stdout=subprocess.PIPE,
        )
        for g in groups
    ]
    results = []
    for child in children:
        out, _ = child.communicate()
        if child.returncode:
            raise SystemExit(f"a client process failed ({op}, {connections} connections)")
        results.append(json.loads(out))
    latencies = sorted(x for r in results for x in r["latencies"])
    wall = max(r["end"] for r in results) - start_at

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6

    return {
        "ops_per_s": len(latencies) / wall,
        "median_us": statistics.median(latencies) * 1e6,
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
        "max_us": latencies[-1] * 1e6,
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"model name\s*:\s*(.*)", f.read())
            if found:
                cpu = found.group(1).strip()
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {os.cpu_count()} CPUs, {system}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=20_000, help="requests per phase")
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--sync", default="interval", choices=["always", "interval", "never"])
    parser.add_argument("--threads", type=int, default=16, help="the server's --threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ledgerq-serve-bench-") as tmp:
        server = subprocess.Popen(
            [
                *(sys.executable, "-m", "ledgerq.cli", "serve", os.path.join(tmp, "data")),
                *("--port", "0", "--threads", str(args.threads), "-o", f"sync={args.sync}"),
            ],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        try:
            assert server.stdout is not None
            found = re.search(rb":(\d+) ", server.stdout.readline())
            if found is None:
                raise SystemExit("the server did not start")
            port = int(found.group(1))
            print(f"machine: {machine()}")
            print(
                f"command: python benchmarks/server_bench.py --ops {args.ops} --size {args.size} "
                f"--connections {' '.join(map(str, args.connections))} "
                f"--client-procs {args.client_procs} --sync {args.sync} --threads {args.threads}"
            )
            print()
            print("| op | connections | requests/s | median | p90 | p99 | max |")
            print("|---|---|---|---|---|---|---|")
            for connections in args.connections:
                for op, label in (
                    ("set", "set"),
                    ("get", "get"),
                    ("set", None),
                    ("open", "get /close/open"),
                ):
                    row = run_phase(port, op, args.ops, connections, args.size, args.client_procs)
                    if label is None:
                        continue  # refill for the reliable phase
                    print(
                        f"| {label} | {connections} | {row['ops_per_s']:,.0f} | "
                        f"{row['median_us']:.0f} µs | {row['p90_us']:.0f} µs | "
                        f"{row['p99_us']:.0f} µs | {row['max_us'] / 1000:.1f} ms |",
                        flush=True,
                    )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
            if server.stdout is not None:
                server.stdout.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
    else:
        main()
