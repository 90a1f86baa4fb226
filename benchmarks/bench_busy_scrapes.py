"""/metrics latency with 20 concurrent clients on a busy node, revisions alternating.

A scrape waits for the interpreter while the agent's collector thread runs a pass or
renders; on a node whose cores are busy it also waits for a core. This starts ``l9gpu
serve`` through the NVML backend on the fake node (free calls; 8 GPUs, ``--processes``
processes in ``--containers`` containers), optionally beside a process that keeps one
core busy (``--hog``), and has 20 clients request ``/metrics`` (gzip) back to back for
``--seconds``; each checkout given (this one, and ``--before DIR``) in turn, for
``--rounds`` rounds. Reports each run's median, p99 and maximum, and per checkout the
median of the runs' figures.

Run: ``python benchmarks/bench_busy_scrapes.py --processes 2048 --containers 256 --hog
--before /tmp/before``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_agent import GZIP, _concurrent, percentile, scenario, start_simulated_agent  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2048)
    parser.add_argument("--containers", type=int, default=256)
    parser.add_argument("--hog", action="store_true", help="keep one core busy meanwhile")
    parser.add_argument("--before", type=Path, help="another checkout, measured in turn with this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=20)
    opts = parser.parse_args()
    repos = ([opts.before.resolve()] if opts.before else []) + [REPO]
    runs: dict[Path, list[tuple[float, float, float]]] = {repo: [] for repo in repos}
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if opts.hog else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = scenario(Path(tmp) / "node.yaml", containers=opts.containers, processes_total=opts.processes)
            for round_ in range(opts.rounds):
                for repo in repos:
                    proc, port = start_simulated_agent(path, nvml=True, repo=repo)
                    try:
                        time.sleep(3.0)  # a few passes: the clients meet steady ones
                        times = asyncio.run(_concurrent(f"http://127.0.0.1:{port}/metrics", opts.clients,
                                                        opts.seconds, GZIP))
                    finally:
                        proc.terminate()
                        proc.wait(10)
                    figures = (statistics.median(times) * 1e3, percentile(times, 0.99) * 1e3, max(times) * 1e3)
                    runs[repo].append(figures)
                    print(f"round {round_ + 1}: {repo}: median {figures[0]:.2f} ms, p99 {figures[1]:.2f} ms, "
                          f"max {figures[2]:.1f} ms ({len(times)} requests)", flush=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    print(f"\n8 GPUs, {opts.processes} processes in {opts.containers} containers, free calls, {opts.clients} "
          f"clients{', one core kept busy' if opts.hog else ''}; median of {opts.rounds} runs")
    for repo, figures in runs.items():
        print(f"  {str(repo):<40} median {statistics.median(f[0] for f in figures):.2f} ms, "
              f"p99 {statistics.median(f[1] for f in figures):.2f} ms, "
              f"max {statistics.median(f[2] for f in figures):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
