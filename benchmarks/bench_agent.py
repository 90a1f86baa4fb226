"""Cost of the agent on a busy node: one collection pass, one /metrics request, RSS.

Builds a simulated node with 8 GPUs, 64 containers and 256 processes (4 processes per
container, 8 containers per GPU, all attributed through the fixture /proc tree), then:

* runs collection passes in process (attribution cache warm) and reports the median and
  p99 of one pass;
* starts `l9gpu serve` on it at a 1 s interval and times /metrics requests over
  loopback, serially and with 20 concurrent clients (median and p99 of each request);
* reads the agent's resident memory (VmRSS) at the end.

Run: ``python benchmarks/bench_agent.py`` (``--passes``, ``--requests`` to change the
sample sizes). Figures are recorded in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GPUS, CONTAINERS, PROCESSES = 8, 64, 256


def scenario(path: Path) -> Path:
    """Write the benchmark node's scenario file."""
    per_container = PROCESSES // CONTAINERS
    processes = []
    for c in range(CONTAINERS):
        gpu = c % GPUS
        for p in range(per_container):
            processes.append({
                "name": f"worker{p}",
                "gpus": [gpu],
                "pid": 100000 + c * 10 + p,
                "memory_gib": 2,
                "utilization": {"wave": {"min": 0.0, "max": 0.03, "period": f"{20 + c}s"}},
                "workload": {"namespace": f"team-{c % 8}", "pod": f"job-{c}-abcde", "container": "main",
                             "owner": {"kind": "Deployment", "name": f"job-{c}"}, "labels": {"team": f"t{c % 8}"}},
            })
    doc = {"node": "bench-node", "gpus": {"count": GPUS, "model": "NVIDIA H100 80GB HBM3", "memory_gib": 80},
           "processes": processes}
    path.write_text(yaml.safe_dump(doc))
    return path


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def fmt(values: list[float]) -> str:
    median, p99 = statistics.median(values) * 1e3, percentile(values, 0.99) * 1e3
    return f"median {median:.2f} ms, p99 {p99:.2f} ms (n={len(values)})"


def bench_cycle(path: Path, passes: int) -> list[float]:
    from exporter.cli import _collector, _open, build_parser

    args = build_parser().parse_args(["snapshot", "--backend", "simulated", "--scenario", str(path)])
    backend, attributor = _open(args)
    collector, _ = _collector(args, backend, attributor)
    collector.collect_once()  # warm the attribution cache
    gc.collect()
    gc.freeze()  # as `l9gpu serve` does after start-up
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        snap = collector.collect_once()
        times.append(time.perf_counter() - start)
    assert len(snap.workloads) == CONTAINERS and len(snap.processes) == PROCESSES
    attributor.close()
    backend.close()
    return times


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _concurrent(url: str, clients: int, seconds: float, headers: dict[str, str]) -> list[float]:
    """Latency of every request ``clients`` clients send back to back for ``seconds``.

    Several seconds, so the requests meet several collection passes (a pass and the
    pre-rendering after it are what a request can queue behind), not a lucky 0.1 s.
    """
    import aiohttp

    times: list[float] = []

    async def client(session: aiohttp.ClientSession) -> None:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.get(url, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200
            times.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return times


GZIP = {"Accept-Encoding": "gzip"}  # what Prometheus sends


def _serial(url: str, requests: int, headers: dict[str, str]) -> list[float]:
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            resp.read()
        times.append(time.perf_counter() - start)
    return times


def bench_scrapes(path: Path, requests: int,
                  concurrent_seconds: float) -> tuple[dict[str, list[float]], int, int, int]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--backend", "simulated", "--scenario",
                             str(path), "--listen", f"127.0.0.1:{port}", "--interval", "1s", "--log-level", "warning"],
                            env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        size = len(urllib.request.urlopen(url).read())
        gz_size = len(urllib.request.urlopen(urllib.request.Request(url, headers=GZIP)).read())
        results = {
            "serial, plain text": _serial(url, requests, {}),
            "serial, gzip": _serial(url, requests, GZIP),
            "20 concurrent clients, plain text": asyncio.run(_concurrent(url, 20, concurrent_seconds, {})),
            "20 concurrent clients, gzip": asyncio.run(_concurrent(url, 20, concurrent_seconds, GZIP)),
        }
        rss_kib = 0
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
        return results, rss_kib, size, gz_size
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--requests", type=int, default=1000, help="serial requests per encoding")
    parser.add_argument("--concurrent-seconds", type=float, default=5.0,
                        help="how long the 20 concurrent clients run per encoding")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = scenario(Path(tmp) / "bench.yaml")
        cycle = bench_cycle(path, opts.passes)
        scrapes, rss_kib, size, gz_size = bench_scrapes(path, opts.requests, opts.concurrent_seconds)
    print(f"node: {GPUS} GPUs, {CONTAINERS} containers, {PROCESSES} processes; "
          f"/metrics body {size / 1024:.0f} KiB ({gz_size / 1024:.0f} KiB gzipped)")
    print(f"{'collection pass (warm)':<45}{fmt(cycle)}")
    for name, times in scrapes.items():
        print(f"{'/metrics, ' + name:<45}{fmt(times)}")
    print(f"{'agent RSS':<45}{rss_kib / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
