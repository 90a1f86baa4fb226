"""Agent CPU per interval, side by side, in alternating runs under the same load.

On a shared machine one run of each is not a comparison: the load moves between them.
This runs each contestant's ``serve`` on the same fake NVML node in turn, round after
round (as `bench_agent.bench_serve_cpu` does: 1 s interval, scraped like Prometheus
every 15 s, CPU of the whole process over ``--seconds`` after two scrape periods), and
reports each one's median and range, and the ratios of the medians.

Contestants: the agent of this checkout; ``--before DIR``, the agent of another checkout
(e.g. ``git worktree add /tmp/before REV``, or ``git archive REV | tar -x -C DIR``); and
``--peer DIR``, nvitop-exporter installed there (``pip install --target DIR
nvitop-exporter``) on the same node (`fake_nvml_peer`).

Nodes (8 GPUs each, processes attributed through the real code as in bench_agent):
``16`` (16 containers of one process, two per GPU), ``16-one-owner`` (8 containers of two
processes, one per GPU), ``256`` (64 containers of 4, eight per GPU), ``256-one-owner``
(8 containers of 32).

Run: ``python benchmarks/bench_side_by_side.py --node 16-one-owner --peer /tmp/peer-site
--before /tmp/before --rounds 3``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_agent import bench_serve_cpu, scenario  # noqa: E402
from processes import live_processes  # noqa: E402

NODES = {"16": (16, 16), "16-one-owner": (8, 16), "256": (64, 256), "256-one-owner": (8, 256)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", choices=sorted(NODES), default="16-one-owner")
    parser.add_argument("--free", action="store_true", help="NVML calls cost nothing (default: H200 call costs)")
    parser.add_argument("--before", type=Path, help="another checkout whose agent runs too")
    parser.add_argument("--peer", type=Path, help="a directory with nvitop-exporter installed (pip --target)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="CPU measured over this long per run")
    opts = parser.parse_args()
    containers, processes = NODES[opts.node]
    contestants: list[tuple[str, dict]] = [("agent", {})]
    if opts.before is not None:
        contestants.insert(0, (f"agent ({opts.before})", {"repo": opts.before.resolve()}))
    if opts.peer is not None:
        contestants.append(("nvitop-exporter", {"peer": opts.peer.resolve()}))
    results: dict[str, list[float]] = {name: [] for name, _ in contestants}
    with live_processes(processes) as pids, tempfile.TemporaryDirectory() as tmp:
        path = scenario(Path(tmp) / "node.yaml", containers=containers, processes_total=processes, pids=pids)
        for round_ in range(opts.rounds):
            for name, kwargs in contestants:
                cpu_ms, scrapes, _ = bench_serve_cpu(path, not opts.free, opts.seconds, **kwargs)
                results[name].append(cpu_ms)
                print(f"round {round_ + 1}: {name}: {cpu_ms:.2f} ms CPU per 1 s interval ({scrapes} scrapes)",
                      flush=True)
    costs = "free calls" if opts.free else "H200 call costs"
    print(f"\n8 GPUs, {processes} processes in {containers} containers, {costs}; "
          f"{opts.rounds} alternating runs of {opts.seconds:.0f} s each")
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, values in results.items():
        print(f"  {name:<40} median {medians[name]:6.2f} ms  (runs {min(values):.2f}-{max(values):.2f})")
    agent = medians["agent"]
    for name, median in medians.items():
        if name != "agent" and median:
            print(f"  agent / {name}: {agent / median:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
