"""What the deadlines on driver calls cost a normal pass (`exporter.core.bulkhead`).

Two figures, in process:

* the hand-off alone: `Bulkhead.run` of 10 reads that do nothing, a millisecond apart
  (the worker thread wakes, runs them, the pass wakes): wall and CPU per pass;
* the collector's pass on the benchmark nodes of ``bench_agent.py`` (8 GPUs x 16 and x 256
  processes, NVML fake, free calls, live sleeping processes), with the bulkhead as the
  agent runs it and with the same reads run inline in the collector's thread (no
  deadline), alternating ``--rounds`` times in one process so that both meet the same
  machine: the median of each run's median CPU per pass.

Run: ``python benchmarks/bench_bulkhead.py`` (about a minute). Figures are in
docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from exporter import bulkhead  # noqa: E402


def bench_hand_off(runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `Bulkhead.run` over 10 empty reads."""
    box = bulkhead.Bulkhead()
    reads = [bulkhead.Read(i, f"GPU {i}", list) for i in range(10)]
    for _ in range(100):
        box.run(reads)
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        box.run(reads)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        time.sleep(0.001)
    box.close()
    return statistics.median(walls), statistics.median(cpus)


def _inline(self: bulkhead.Bulkhead, reads: Any) -> list[Any]:
    out: list[Any] = []
    for read in reads:
        try:
            out.append(read.run())
        except Exception as exc:  # noqa: BLE001 - as the bulkhead reports it
            out.append(bulkhead.Failed(exc))
    return out


def bench_pass(path: Path, passes: int, rounds: int) -> dict[str, list[float]]:
    """Per mode, each run's median CPU seconds per collector pass."""
    import fake_nvml_agent

    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_collector, open_sources
    from exporter.attribution import procfs
    from exporter.devices import close_backends

    plain_init = procfs.ProcCache.__init__
    fake_nvml_agent.install(str(path), False)
    args = build_parser().parse_args(["snapshot", "--backend", "nvml", "--kubernetes", "off"])
    backends, attributor = open_sources(args)
    collector, _ = build_collector(args, backends, attributor)
    collector.collect_once()
    gc.collect()
    out: dict[str, list[float]] = {"bulkhead": [], "inline": []}
    real_run = bulkhead.Bulkhead.run
    try:
        for mode in ("bulkhead", "inline") * rounds:
            bulkhead.Bulkhead.run = real_run if mode == "bulkhead" else _inline  # type: ignore[method-assign]
            cpus = []
            for i in range(passes):
                cpu = time.process_time()
                collector.collect_once()
                cpus.append(time.process_time() - cpu)
                time.sleep(0.01 if i % 10 else 0.0)
            out[mode].append(statistics.median(cpus))
    finally:
        bulkhead.Bulkhead.run = real_run  # type: ignore[method-assign]
        procfs.ProcCache.__init__ = plain_init  # type: ignore[method-assign]
        sys.modules.pop("pynvml", None)
        collector.stop()
        attributor.close()
        close_backends(backends)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=400, help="passes per run")
    parser.add_argument("--rounds", type=int, default=6, help="runs of each mode, alternating")
    opts = parser.parse_args()
    import bench_agent
    from processes import live_processes

    wall, cpu = bench_hand_off(2000)
    print(f"hand-off (10 empty reads): wall {wall * 1e6:.1f} us, CPU {cpu * 1e6:.1f} us per pass (median)")
    with live_processes(16 + bench_agent.PROCESSES) as pids, tempfile.TemporaryDirectory() as tmp:
        nodes = {
            "8 GPUs x 16 processes": bench_agent.scenario(Path(tmp) / "n16.yaml", containers=16, processes_total=16,
                                                          pids=pids[:16]),
            "8 GPUs x 256 processes": bench_agent.scenario(Path(tmp) / "n256.yaml", pids=pids[16:]),
        }
        for label, path in nodes.items():
            runs = bench_pass(path, opts.passes, opts.rounds)
            text = ", ".join(f"{mode} {statistics.median(v) * 1e3:.3f} ms (runs {min(v) * 1e3:.3f}-"
                             f"{max(v) * 1e3:.3f})" for mode, v in runs.items())
            print(f"{label}, free calls, pass CPU: {text}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
